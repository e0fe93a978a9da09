"""BMC metrics: ipmi_exporter's names and labels, plus node totals and HGX GPU board sensors.

ipmi_exporter exports nothing but `ipmi_up 0` when its BMC does not answer, so the ipmi_*
sensor series here (and gpuconsole_bmc_part_up, what was read of the BMC) appear only
while the bmc source is fresh and vanish (Prometheus marks them stale) when it is not.
The other gpuconsole_bmc_* and the gpuconsole_gpu_board_* series keep the last good
reading, like every gpuconsole_* series; gpuconsole_source_stale_seconds says how old it is.
"""

from __future__ import annotations

import math
from urllib.parse import urlsplit, urlunsplit

from gpuconsole.export import names
from gpuconsole.export.families import Families, Labels, Spec
from gpuconsole.facts.summaries import source_health
from gpuconsole.readings.bmc import BmcReading, BmcSensor, PowerState, SensorHealth, SensorKind
from gpuconsole.readings.snapshot import NodeSnapshot

# unit -> (value metric, state metric, scale), as ipmi_exporter's collector_ipmi.go picks
_TYPED: dict[str, tuple[Spec, Spec, float]] = {
    "RPM": (names.IPMI_FAN_RPM, names.IPMI_FAN_STATE, 1.0),
    "C": (names.IPMI_TEMPERATURE, names.IPMI_TEMPERATURE_STATE, 1.0),
    "A": (names.IPMI_CURRENT, names.IPMI_CURRENT_STATE, 1.0),
    "V": (names.IPMI_VOLTAGE, names.IPMI_VOLTAGE_STATE, 1.0),
    "W": (names.IPMI_POWER, names.IPMI_POWER_STATE, 1.0),
}
_FAN_PERCENT = (names.IPMI_FAN_RATIO, names.IPMI_FAN_STATE, 0.01)
_STATE = {
    SensorHealth.OK: 0.0,
    SensorHealth.WARNING: 1.0,
    SensorHealth.CRITICAL: 2.0,
    SensorHealth.FAILED: 2.0,
}
_BMC_STATES = ("ok", "warning", "critical", "stale")
_GENERIC = ("node", "id", "name", "type")
_BOARD: dict[SensorKind, Spec] = {
    SensorKind.TEMPERATURE: names.GPU_BOARD_TEMPERATURE,
    SensorKind.POWER: names.GPU_BOARD_POWER,
    SensorKind.VOLTAGE: names.GPU_BOARD_VOLTAGE,
}
# What _sensors and _gpu_board write: skipped where none of them is wanted (an evaluation
# of alert rules reads a few families of a node's hundreds)
_SENSOR_SPECS = (
    *(spec for typed in (*_TYPED.values(), _FAN_PERCENT) for spec in typed[:2]),
    names.IPMI_SENSOR_VALUE,
    names.IPMI_SENSOR_STATE,
)
_BOARD_SPECS = (*_BOARD.values(), names.GPU_BOARD_ENERGY)


def sensor_state(sensor: BmcSensor) -> float:
    """ipmi_exporter's state: 0 nominal, 1 warning, 2 critical, NaN when the BMC has none."""
    if sensor.value is None and not sensor.states and sensor.health is SensorHealth.OK:
        return math.nan  # no reading and nothing asserted: freeipmi's "N/A"
    return _STATE[sensor.health]


def without_credentials(address: str) -> str:
    """A BMC address with any user:password@ taken out."""
    parts = urlsplit(address)
    if "@" not in parts.netloc:
        return address
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def bmc_metrics(out: Families, node: NodeSnapshot) -> None:
    """ipmi_* while the BMC answers; gpuconsole_bmc_* and board sensors from the last reading."""
    status = node.status("bmc")
    reading = node.bmc
    if status is None and reading is None:
        return  # no BMC configured for this node
    fresh = reading is not None and (status is None or status.ok)
    name = node.node
    out.gauge(names.IPMI_UP, ("node", "collector"), (name, "ipmi"), float(fresh))
    known = reading is not None and reading.power_state is not PowerState.UNKNOWN
    out.gauge(names.IPMI_UP, ("node", "collector"), (name, "chassis"), float(fresh and known))
    if reading is None:
        return
    if fresh:
        if known:
            on = float(reading.power_state is PowerState.ON)
            out.gauge(names.IPMI_CHASSIS_POWER, ("node",), (name,), on)
        _sensors(out, name, reading)
        for part in reading.parts:
            if part.enabled:
                out.gauge(names.BMC_PART_UP, ("node", "part"), (name, part.part), float(part.ok))
    # the BMC's light as every console shows it: from the verdict's BMC findings (a critical
    # SEL record included), stale while the source is
    if out.wants(names.BMC_HEALTH):
        health = source_health(node, "bmc").value
        for state in _BMC_STATES:
            out.gauge(names.BMC_HEALTH, ("node", "state"), (name, state), float(state == health))
    _totals(out, name, reading)
    _gpu_board(out, node, reading)


def _sensors(out: Families, node: str, reading: BmcReading) -> None:
    if not out.wants(*_SENSOR_SPECS):
        return
    seen: set[tuple[str, str, str]] = set()
    for sensor in reading.sensors:
        typed = _TYPED.get(sensor.unit)
        if typed is None and sensor.unit == "%" and sensor.kind is SensorKind.FAN:
            typed = _FAN_PERCENT
        value_spec, state_spec = (
            typed[:2] if typed else (names.IPMI_SENSOR_VALUE, names.IPMI_SENSOR_STATE)
        )
        key = (value_spec[0], sensor.sensor_id, sensor.name)
        if key in seen:
            continue  # one series per (id, name), as Prometheus requires
        seen.add(key)
        scale = typed[2] if typed else 1.0
        value = math.nan if sensor.value is None else sensor.value * scale
        state = sensor_state(sensor)
        labels: Labels
        values: Labels
        if typed is not None:
            labels, values = names.IPMI_SENSOR_LABELS, (node, sensor.sensor_id, sensor.name)
        else:
            labels, values = _GENERIC, (node, sensor.sensor_id, sensor.name, sensor.type)
        out.gauge(value_spec, labels, values, value)
        out.gauge(state_spec, labels, values, state)


def _totals(out: Families, node: str, reading: BmcReading) -> None:
    out.gauge(names.BMC_INFO, ("node", "bmc"), (node, without_credentials(reading.bmc)), 1.0)
    for spec, value in (
        (names.BMC_INLET, reading.inlet_c),
        (names.BMC_EXHAUST, reading.exhaust_c),
        (names.BMC_POWER, reading.power_w),
    ):
        if value is not None:
            out.gauge(spec, ("node",), (node,), value)
    out.gauge(names.BMC_FANS, ("node",), (node,), float(reading.fans_present))
    out.gauge(names.BMC_FANS_FAILED, ("node",), (node,), float(reading.fans_failed))
    out.gauge(names.BMC_PSUS, ("node",), (node,), float(reading.psus_present))
    out.gauge(names.BMC_PSUS_FAILED, ("node",), (node,), float(reading.psus_failed))
    out.gauge(names.BMC_PSUS_NO_INPUT, ("node",), (node,), float(reading.psus_no_input))
    if reading.clock_skew_s is not None:
        out.gauge(names.BMC_CLOCK_SKEW, ("node",), (node,), reading.clock_skew_s)


def _gpu_board(out: Families, node: NodeSnapshot, reading: BmcReading) -> None:
    """HGX baseboard sensors, matched to NVML's GPUs by module id (SXM n)."""
    if not out.wants(*_BOARD_SPECS):
        return
    by_module = {g.module_id: g for g in node.gpus if g.module_id is not None}
    for sensor in reading.sensors:
        module = sensor.gpu_module_id
        if module is None or sensor.value is None:
            continue
        gpu = by_module.get(module)
        values = (
            node.node,
            "" if gpu is None else str(gpu.index),
            "" if gpu is None else gpu.uuid,
            str(module),
            sensor.name,
        )
        spec = _BOARD.get(sensor.kind)
        if spec is not None:
            out.gauge(spec, names.GPU_BOARD_LABELS, values, sensor.value)
        elif sensor.unit == "J":
            out.counter(names.GPU_BOARD_ENERGY, names.GPU_BOARD_LABELS, values, sensor.value)
