"""A simulated BMC per simulated node: the pyghmi-shaped layer under the IPMI link.

`SimIpmiSession` answers what `gpuconsole.sources.bmc.ipmi.PyghmiSession` answers
(sensor readings with pyghmi's health bitmask and states, power state, SEL records as
dicts), computed from the node's physics, so the demo runs the real link, totals and SEL
code. Power follows the GPUs (sum of GPU power + the rest of the server), exhaust
follows power, inlet stays near 24 °C, fan RPM follows load. Scenarios (node-level, the
number is 1-based): `psu:N` a failed PSU, `fan:N` a fan at 0 RPM, `bmcsilent:0@S` a
BMC that stops answering S seconds in.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuconsole.readings.bmc import Thresholds
from gpuconsole.sim.node import SimNode, xid_of
from gpuconsole.sim.profiles import GpuSlot
from gpuconsole.sources.bmc.ipmi import IpmiLink, IpmiSensorData

OK, WARNING, CRITICAL, FAILED = 0, 1, 2, 4  # pyghmi.constants.Health


@dataclass(frozen=True, slots=True)
class BmcLayout:
    """What a server's BMC watches: fans, PSUs, and what the rest of the box draws."""

    fans: int
    psus: int
    psu_capacity_w: float
    base_w: float  # CPUs, memory, NICs, NVSwitches, fans at idle
    max_w: float  # the nameplate
    fan_rpm_idle: float
    fan_rpm_max: float
    hgx: bool  # HGX baseboard: per-SXM GPU sensors


LAYOUTS = {
    "dgx-h100": BmcLayout(12, 6, 3300.0, 2500.0, 10200.0, 5200.0, 15500.0, True),
    "dgx-a100": BmcLayout(12, 6, 3000.0, 2000.0, 6500.0, 4800.0, 14000.0, True),
    "apollo-pcie": BmcLayout(14, 4, 3000.0, 1300.0, 6000.0, 4000.0, 13000.0, False),
    # DGX-1: four 1,600 W supplies (3+1), 3,500 W at most, four fan modules
    "dgx-1v": BmcLayout(4, 4, 1600.0, 800.0, 3500.0, 4500.0, 12000.0, True),
}
DEFAULT_LAYOUT = LAYOUTS["dgx-h100"]
INLET_C = 24.0

# name: (lower nr, lower crit, lower nc, upper nc, upper crit, upper nr)
_TEMP_INLET = Thresholds(upper_non_critical=35.0, upper_critical=40.0, upper_non_recoverable=45.0)
_TEMP_EXHAUST = Thresholds(upper_non_critical=70.0, upper_critical=80.0)
_TEMP_CPU = Thresholds(upper_non_critical=90.0, upper_critical=100.0)
_FAN = Thresholds(lower_critical=1000.0, lower_non_critical=2000.0)
_P12V = Thresholds(
    lower_critical=10.8, lower_non_critical=11.4, upper_non_critical=12.6, upper_critical=13.2
)


class BmcSilent(TimeoutError):
    """The simulated BMC stopped answering."""

    def __str__(self) -> str:
        return "no answer (simulated BMC is silent)"


class SimIpmiSession:
    """A simulated BMC for one SimNode (an IpmiSession)."""

    def __init__(self, node: SimNode, layout: BmcLayout | None = None) -> None:
        self.node = node
        self.layout = layout or LAYOUTS.get(node.profile.name, DEFAULT_LAYOUT)
        self.powered = True
        for s in node.scenarios:
            if s.kind == "fan" and not 1 <= s.gpu <= self.layout.fans:
                raise ValueError(f"scenario {s}: {node.profile.name} has no FAN {s.gpu}")
            if s.kind == "psu" and not 1 <= s.gpu <= self.layout.psus:
                raise ValueError(f"scenario {s}: {node.profile.name} has no PSU {s.gpu}")
        self._thresholds: dict[str, Thresholds] = {}

    # --- scenarios -------------------------------------------------------------------

    def _active(self, kind: str) -> set[int]:
        t = self.node.elapsed()
        return {s.gpu for s in self.node.scenarios if s.kind == kind and t >= s.at_s}

    def _answer(self) -> None:
        if self._active("bmcsilent"):
            raise BmcSilent()

    # --- sensors ---------------------------------------------------------------------

    def sensor_data(self) -> Iterable[IpmiSensorData]:
        self._answer()
        node, lay = self.node, self.layout
        t = node.elapsed()
        gpus = [node.gpu(i) for i in range(len(node.profile.gpus))] if self.powered else []
        gpu_w = sum(g.power_w for g in gpus)
        load = gpu_w / (len(node.profile.gpus) * node.model.tdp_w) if gpus else 0.0
        failed_fans, failed_psus = self._active("fan"), self._active("psu")
        total_w = min(lay.max_w, lay.base_w * (0.7 + 0.3 * load) + gpu_w) if gpus else 18.0
        inlet = round(INLET_C + 0.4 * math.sin(t / 97.0), 1)
        exhaust = round(inlet + 9.0 + 23.0 * load + (2.0 if failed_fans else 0.0), 1)
        out: list[IpmiSensorData] = []
        number = iter(range(1, 1000))

        def add(
            name: str,
            type_: str,
            value: float | None,
            units: str,
            th: Thresholds | None,
            states: tuple[str, ...] = (),
            health: int | None = None,
        ) -> None:
            sid = str(next(number))
            if th is not None:
                self._thresholds[sid] = th
            mask = _health(value, th) if health is None else health
            missing = value is None and not states
            out.append(IpmiSensorData(sid, name, type_, value, units, mask, states, missing))

        add("Inlet Temp", "Temperature", inlet, "°C", _TEMP_INLET)
        add("Exhaust Temp", "Temperature", exhaust, "°C", _TEMP_EXHAUST)
        for cpu in range(node.profile.sockets):
            temp = round(38.0 + 22.0 * load + 1.5 * cpu, 1) if gpus else None
            add(f"CPU{cpu} Temp", "Temperature", temp, "°C", _TEMP_CPU)
        spin = lay.fan_rpm_idle + (lay.fan_rpm_max - lay.fan_rpm_idle) * min(1.0, load)
        if failed_fans:
            spin *= 1.08  # the others make up for it
        for fan in range(1, lay.fans + 1):
            rpm = 0.0 if fan in failed_fans else round(spin * (1 + 0.01 * (fan % 4)), -1)
            add(f"FAN {fan}", "Fan", rpm if self.powered else None, "RPM", _FAN)
        working = [p for p in range(1, lay.psus + 1) if p not in failed_psus]
        for psu in range(1, lay.psus + 1):
            share = total_w / len(working) if psu in working and working else 0.0
            add(f"PSU{psu} Power", "Power", round(share, 0), "W", None)
            states = ("Present", "Failure") if psu in failed_psus else ("Present",)
            health = CRITICAL if psu in failed_psus else OK
            add(f"PSU{psu} Status", "Power Supply", None, "", None, states, health)
        add("Total Power", "Power", round(total_w, 0), "W", None)
        add("P12V", "Voltage", 12.0 if self.powered else None, "V", _P12V)
        add("Total Current", "Current", round(total_w / 230.0, 1), "A", None)
        if lay.hgx:
            for i, slot in enumerate(node.profile.gpus):
                g = gpus[i] if gpus else None
                sxm = f"HGX_GPU_SXM_{slot.module_id}"
                limit = Thresholds(upper_critical=float(node.model.temp_slowdown_c))
                add(f"{sxm}_TEMP_0", "Temperature", g.temp_c if g else None, "°C", limit)
                add(f"{sxm}_Power_0", "Power", round(g.power_w, 1) if g else None, "W", None)
        return out

    def thresholds(self) -> Mapping[str, Thresholds]:
        if not self._thresholds:
            list(self.sensor_data())
        return dict(self._thresholds)

    # --- power -----------------------------------------------------------------------

    def get_power(self) -> Mapping[str, Any]:
        self._answer()
        return {"powerstate": "on" if self.powered else "off"}

    def set_power(self, powerstate: str, wait: bool = False) -> Mapping[str, Any]:
        self._answer()
        if powerstate == "on":
            self.powered = True
        elif powerstate in ("off", "softoff", "shutdown"):
            self.powered = False
        elif powerstate in ("cycle", "reset"):
            self.powered = True
            self.node.power_cycle()
        else:
            raise ValueError(f"unknown power state {powerstate!r}")
        return {"pendingpowerstate": powerstate}

    # --- event log -------------------------------------------------------------------

    def sel_signature(self) -> tuple[int, ...] | None:
        self._answer()
        return (len(self._records()),)

    def get_event_log(self) -> Iterable[Mapping[str, Any]]:
        self._answer()
        return self._records()

    def sel_time(self) -> float | None:
        self._answer()
        return self.node.clock()  # the clock its records are stamped with

    def _records(self) -> list[dict[str, Any]]:
        node = self.node
        t = node.elapsed()
        boot = _record(1, node.t0, "System Event", "System Event", "OEM System boot event", OK)
        records: list[dict[str, Any]] = [boot]
        happened = sorted((s for s in node.scenarios if t >= s.at_s), key=lambda s: s.at_s)
        for s in happened:
            at = node.t0 + s.at_s
            number = len(records) + 1
            if s.kind == "fan":
                fan = f"FAN {s.gpu}"
                limit = _FAN.lower_critical
                crossing = {"triggered_value": 0.0, "threshold_value": limit}
                records.append(
                    _record(number, at, fan, "Fan", "Lower critical", CRITICAL, crossing)
                )
            elif s.kind == "psu":
                psu = f"PSU{s.gpu} Status"
                records.append(_record(number, at, psu, "Power Supply", "Failure", CRITICAL))
            elif xid_of(s.kind) == 79:  # off the bus, for now (xid79) or for good
                records.append(_pcie_fatal(number, at, node.profile.gpus[s.gpu]))
        return records

    def logout(self) -> None:
        pass


def _health(value: float | None, th: Thresholds | None) -> int:
    """The health bitmask a BMC derives from thresholds."""
    if value is None or th is None:
        return OK
    for limit, mask, below in (
        (th.lower_non_recoverable, FAILED, True),
        (th.upper_non_recoverable, FAILED, False),
        (th.lower_critical, CRITICAL, True),
        (th.upper_critical, CRITICAL, False),
        (th.lower_non_critical, WARNING, True),
        (th.upper_non_critical, WARNING, False),
    ):
        if limit is not None and (value <= limit if below else value >= limit):
            return mask
    return OK


def _pcie_fatal(record_id: int, at: float, slot: GpuSlot) -> dict[str, Any]:
    """What the BMC logs as a GPU falls off the bus (XID 79): a fatal PCIe error at the
    GPU's slot, its bus, device and function in the event data as the BIOS reports them."""
    _domain, bus, place = slot.bus_id.lower().split(":")
    device, _, function = place.partition(".")
    return _record(
        record_id,
        at,
        f"PCIe SXM{slot.module_id}",
        "Critical Interrupt",
        f"Bus Fatal Error (bus {bus} dev {device} fn {function})",
        CRITICAL,
    )


def _record(
    record_id: int,
    at: float,
    component: str,
    component_type: str,
    event: str,
    severity: int,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A SEL record shaped like pyghmi's get_event_log() entries."""
    record: dict[str, Any] = {
        "record_id": record_id,
        "timestamp": dt.datetime.fromtimestamp(at).strftime("%Y-%m-%dT%H:%M:%S"),
        "component": component,
        "component_type": component_type,
        "event": event,
        "severity": severity,
        "deassertion": False,
    }
    record.update(extra or {})
    return record


def sim_link(node: SimNode) -> IpmiLink:
    """The IPMI link over a node's simulated BMC, read on the node's clock (its BMC's)."""
    session = SimIpmiSession(node)
    return IpmiLink(f"sim://{node.name}-bmc", lambda: session, clock=node.clock)
