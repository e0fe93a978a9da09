"""FabricSource: every RDMA port of one node, its netdev, its role, and GPU-NIC affinity.

sysfs is read in a worker thread; netdev statistics and link notifications go through
rtnetlink on the hub's loop. A port whose netdev cannot be read says why and keeps its
sysfs reading; a source with no /sys/class/infiniband at all is unavailable.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import msgspec

from gpuconsole.config import DEFAULTS
from gpuconsole.readings.base import Event, Severity, safe_strings
from gpuconsole.readings.fabric import (
    ERROR_RULES,
    FABRIC_ERROR_WINDOW_S,
    FabricDevice,
    FabricPort,
    FabricReading,
    MissingPort,
    NetdevStats,
    NicLevel,
    PortRole,
    counter_words,
    pegged_counters,
)
from gpuconsole.sources.base import EmitEvent, SourceUnavailable
from gpuconsole.sources.climb import ClimbWindow
from gpuconsole.sources.fabric.affinity import (
    GpuPlace,
    gpu_affinity,
    nic_levels,
    parse_roles,
    port_role,
)
from gpuconsole.sources.fabric.infiniband import IbDevice, IbPort, InfinibandReader
from gpuconsole.sources.fabric.netlink import LinkWatcher, NetdevReader, NetlinkUnavailable
from gpuconsole.sources.pci import find_gpus, socket_of_numa

PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
_ERROR_COUNTERS = tuple(rule.counter for rule in ERROR_RULES)
HcaModel = tuple[str | None, str | None]  # (hca_type, board_id)


def expected_rates(
    devices: Sequence[IbDevice], roles: Mapping[tuple[str, int], tuple[PortRole, str]]
) -> dict[tuple[str, int], float]:
    """The rate each InfiniBand port should run at: the fastest active port of the same HCA
    model (hca_type and board_id) and role on this node.

    sysfs shows a port's current rate only, not what it could do; its siblings of the same
    card and network show what the fabric trains to. A node's other cards (an Omni-Path
    HFI, an older ConnectX beside the rails) say nothing about it, and a card without a
    sibling is only compared with itself.
    """
    fastest: dict[tuple[HcaModel, PortRole], float] = {}
    keys: dict[tuple[str, int], tuple[HcaModel, PortRole]] = {}
    for d in devices:
        # a card that names neither is its own model
        model = (d.hca_type, d.board_id) if d.hca_type or d.board_id else (None, d.name)
        for p in d.ports:
            if p.link_layer != "InfiniBand":
                continue
            key = keys[(d.name, p.port)] = (model, roles[(d.name, p.port)][0])
            if p.state == "ACTIVE" and p.rate_gbps:
                fastest[key] = max(fastest.get(key, 0.0), p.rate_gbps)
    return {port: fastest[key] for port, key in keys.items() if key in fastest}


class FabricSource:
    """Reads the compute, storage and management ports of one node."""

    kind: ClassVar[str] = "fabric"

    def __init__(
        self,
        node: str,
        *,
        sysfs_root: str = DEFAULTS.host.sysfs_root,
        interval_s: float = DEFAULTS.fabric.interval_s,
        timeout_s: float = DEFAULTS.fabric.timeout_s,
        roles: Mapping[str, str] | None = None,
        netlink: bool = DEFAULTS.fabric.netlink,
        netns: str | None = None,
        simulated: bool = False,
        prepare: Callable[[], None] | None = None,
        rescan_every: int = 30,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.sysfs_root = sysfs_root
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.simulated = simulated
        self.roles = parse_roles(roles or {})
        self.netlink = netlink
        self.netns = netns or None
        self.rescan_every = max(1, rescan_every)
        self._prepare = prepare
        self._clock = clock
        self._ib: InfinibandReader | None = None
        self._netdevs = NetdevReader(self.netns)
        self._watcher: LinkWatcher | None = None
        self._watch_error: str | None = None
        self._emit: EmitEvent | None = None
        self._gpus: tuple[GpuPlace, ...] = ()
        self._nic_levels: tuple[tuple[object, ...], dict[str, tuple[NicLevel, ...]]] = ((), {})
        self._sockets: dict[int, int | None] = {}
        self._reads = 0
        self._last_states: dict[tuple[str, int], tuple[str, PortRole]] = {}
        self._pegged: dict[tuple[str, int], frozenset[str]] = {}  # counters at their maximum
        self._by_netdev: dict[str, FabricPort] = {}
        self._watched: set[str] = set()
        # each port's error counters, sampled over the window its health counts them in
        self._climbs: ClimbWindow[tuple[str, int]] = ClimbWindow(FABRIC_ERROR_WINDOW_S)
        # every port read in this run, by its HCA's PCI address (its name where it has
        # none) and number: its name and role, and since when it is gone where it is
        self._known: dict[tuple[str, int], tuple[str, PortRole, str | None]] = {}
        self._gone: dict[tuple[str, int], float] = {}

    # --- lifecycle -------------------------------------------------------------------

    async def start(self, emit: EmitEvent) -> None:
        self._emit = emit
        if self.netlink:
            watcher = LinkWatcher(self._link_changed, self.netns)
            try:
                await watcher.start()
            except NetlinkUnavailable as exc:
                self._watch_error = f"link notifications unavailable: {exc}"
            else:
                self._watcher = watcher

    async def poll(self) -> FabricReading:
        devices, peermem = await asyncio.to_thread(self._read_sysfs)
        stats: dict[str, NetdevStats] = {}
        netlink_error: str | None = None
        if not self.netlink:
            netlink_error = "netlink disabled in the config"
        elif any(p.link_layer == "Ethernet" and p.netdev for d in devices for p in d.ports):
            try:
                stats = await self._netdevs.read()
            except NetlinkUnavailable as exc:
                netlink_error = str(exc)
            if self._watcher is not None:
                self._watcher.seed({name: s.operstate for name, s in stats.items()})
        # names and values from sysfs and netlink, safe to show before events quote them
        reading = safe_strings(self._assemble(devices, peermem, stats, netlink_error))
        self._note_changes(reading)
        return reading

    async def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await watcher.close()
        self._netdevs.close()

    # --- sysfs (worker thread) -------------------------------------------------------

    def _read_sysfs(self) -> tuple[tuple[IbDevice, ...], bool | None]:
        if self._prepare is not None:
            self._prepare()
        if self._ib is None or self._ib.sysfs_root != self.sysfs_root:
            self._ib = InfinibandReader(self.sysfs_root, rescan_every=self.rescan_every)
        ib = self._ib
        if not ib.present:
            raise SourceUnavailable(
                f"no RDMA devices: {ib.class_dir} is absent (no HCA, or its driver is not loaded)"
            )
        if self._reads % self.rescan_every == 0:
            self._sockets.clear()
            self._gpus = tuple(
                GpuPlace(pci, self._socket(pci.numa_node)) for pci in find_gpus(self.sysfs_root)
            )
        self._reads += 1
        modules = os.path.join(self.sysfs_root, "module")
        peermem: bool | None = None
        if os.path.isdir(modules):
            peermem = any(os.path.isdir(os.path.join(modules, m)) for m in PEERMEM_MODULES)
        return ib.read(), peermem

    def _socket(self, numa: int | None) -> int | None:
        if numa is None:
            return None
        if numa not in self._sockets:
            self._sockets[numa] = socket_of_numa(self.sysfs_root, numa)
        return self._sockets[numa]

    # --- assembling the reading ------------------------------------------------------

    def _assemble(
        self,
        devices: Sequence[IbDevice],
        peermem: bool | None,
        stats: Mapping[str, NetdevStats],
        netlink_error: str | None,
    ) -> FabricReading:
        gpus = self._gpus
        roles = {
            (d.name, p.port): port_role(d, p, gpus, self.roles) for d in devices for p in d.ports
        }
        expected = expected_rates(devices, roles)
        placed = tuple((d.name, d.pci) for d in devices)
        if self._nic_levels[0] != placed:  # PCIe does not move between polls
            self._nic_levels = (placed, nic_levels(devices))
        levels = self._nic_levels[1]
        now = self._clock()
        out_devices = []
        all_ports: list[FabricPort] = []
        sockets: list[tuple[IbDevice, int | None]] = []
        for d in devices:
            numa = d.pci.numa_node if d.pci is not None else None
            socket = self._socket(numa)
            sockets.append((d, socket))
            port_list = []
            for p in d.ports:
                key = (d.name, p.port)
                port = self._port(p, *roles[key], expected.get(key), stats, netlink_error)
                port_list.append(self._climbed(now, port))
            ports = tuple(port_list)
            all_ports.extend(ports)
            out_devices.append(
                FabricDevice(
                    name=d.name,
                    pci_bus_id=d.pci.bus_id if d.pci is not None else None,
                    numa_node=numa,
                    socket=socket,
                    board_id=d.board_id,
                    fw_ver=d.fw_ver,
                    hca_type=d.hca_type,
                    node_guid=d.node_guid,
                    ports=ports,
                    levels=levels.get(d.name, ()),
                )
            )
        self._climbs.forget((p.device, p.port) for p in all_ports)
        affinity = gpu_affinity(gpus, sockets, all_ports, peermem)
        eth = any(p.link_layer == "Ethernet" and p.netdev for p in all_ports)
        return FabricReading(
            at=now,
            devices=tuple(out_devices),
            missing=self._missing(now, out_devices),
            gpus=affinity,
            peermem_loaded=peermem,
            netlink_error=netlink_error if eth else None,
            link_events_error=self._events_error() if eth else None,
            simulated=self.simulated,
        )

    def _missing(self, now: float, devices: Sequence[FabricDevice]) -> tuple[MissingPort, ...]:
        """The ports read before in this run that sysfs lists no more, and since when."""
        known, gone = self._known, self._gone
        here: set[tuple[str, int]] = set()
        for d in devices:
            for p in d.ports:
                key = (d.pci_bus_id or d.name, p.port)
                here.add(key)
                known[key] = (d.name, p.role, d.pci_bus_id)
                gone.pop(key, None)
        if len(here) == len(known):
            return ()
        missing = []
        for key, (name, role, pci) in known.items():
            if key not in here:
                since = gone.setdefault(key, now)
                missing.append(MissingPort(name, key[1], role, since, pci))
        return tuple(missing)

    def _climbed(self, now: float, port: FabricPort) -> FabricPort:
        """The port with how far its error counters climbed over the window."""
        stats = port.netdev_stats
        read = {n: v for folder in (port.counters, port.hw_counters) for n, v, _bits in folder}
        values = tuple(
            (getattr(stats, name[7:]) if stats is not None else None)
            if name.startswith("netdev.")
            else read.get(name)
            for name in _ERROR_COUNTERS
        )
        moved = self._climbs.add(now, (port.device, port.port), values)
        if moved is None:
            return msgspec.structs.replace(port, errors_climbed_s=0.0)
        climbed, span_s = moved
        return msgspec.structs.replace(
            port,
            errors_climbed=tuple(
                (n, c) for n, c in zip(_ERROR_COUNTERS, climbed, strict=True) if c > 0
            ),
            errors_climbed_s=span_s,
        )

    def _events_error(self) -> str | None:
        if not self.netlink:
            return None
        if self._watcher is not None:
            return self._watcher.error
        return self._watch_error

    def _port(
        self,
        p: IbPort,
        role: PortRole,
        role_from: str,
        expected_gbps: float | None,
        stats: Mapping[str, NetdevStats],
        netlink_error: str | None,
    ) -> FabricPort:
        netdev_stats: NetdevStats | None = None
        netdev_error: str | None = None
        if p.link_layer == "Ethernet":
            if p.netdev is None:
                netdev_error = "netdev stats unavailable: no netdev behind this port"
            elif netlink_error is not None:
                netdev_error = f"netdev stats unavailable: {netlink_error}"
            else:
                netdev_stats = stats.get(p.netdev)
                if netdev_stats is None:
                    where = f" in network namespace {self.netns}" if self.netns else ""
                    netdev_error = f"netdev stats unavailable: no netdev {p.netdev}{where}"
        return FabricPort(
            device=p.device,
            port=p.port,
            state=p.state,
            state_id=p.state_id,
            phys_state=p.phys_state,
            phys_state_id=p.phys_state_id,
            link_layer=p.link_layer,
            role=role,
            role_from=role_from,
            rate_gbps=p.rate_gbps,
            rate_text=p.rate_text,
            width=p.width,
            speed=p.speed,
            expected_rate_gbps=expected_gbps,
            lid=p.lid,
            sm_lid=p.sm_lid,
            netdev=p.netdev,
            netdev_stats=netdev_stats,
            netdev_error=netdev_error,
            counters=p.counters,
            hw_counters=p.hw_counters,
            no_pma=p.no_pma,
            hw_counters_lifespan_ms=p.lifespan_ms,
            counters_ext=p.counters_ext,
            pegged=pegged_counters(p.counters),
        )

    # --- events ----------------------------------------------------------------------

    def _post(self, kind: str, severity: Severity, message: str) -> None:
        if self._emit is not None:
            self._emit(Event(self._clock(), self.node, self.kind, kind, severity, message))

    def _note_changes(self, reading: FabricReading) -> None:
        """Port state changes seen in sysfs, for ports netlink does not already report."""
        by_netdev = {p.netdev: p for p in reading.ports if p.netdev is not None}
        self._by_netdev = by_netdev
        self._watched = {
            p.netdev for p in reading.ports if p.netdev is not None and p.netdev_stats is not None
        }
        watching = self._watcher is not None
        now: dict[tuple[str, int], tuple[str, PortRole]] = {}
        pegged: dict[tuple[str, int], frozenset[str]] = {}
        for port in reading.ports:
            key = (port.device, port.port)
            now[key] = (port.state, port.role)
            pegged[key] = self._note_pegged(port, self._pegged.get(key, frozenset()))
            before = self._last_states.get(key)
            if before is None or before[0] == port.state:
                continue
            if watching and port.netdev in self._watched:
                continue
            self._post_state(port, f"{port.name} ({port.role})", port.state, "sysfs")
        for key, (_state, role) in self._last_states.items():
            if key not in now:
                self._post(
                    "port_gone",
                    Severity.WARNING,
                    f"{key[0]}/{key[1]} ({role}) is gone from sysfs",
                )
        self._last_states = now
        self._pegged = pegged

    def _note_pegged(self, port: FabricPort, before: frozenset[str]) -> frozenset[str]:
        """An event for each counter of the port found at its maximum (from the first
        reading on: a counter pegged before the source started counts nothing either), and
        one when it is cleared; the counters pegged now."""
        found = port.pegged
        names = frozenset(name for name, _value in found)
        if names == before:
            return names
        who = f"{port.name} ({port.role})"
        for name, value in found:
            if name not in before:
                self._post(
                    "counter_pegged",
                    Severity.WARNING,
                    f"{who} {counter_words(name)} counter pegged at {value}, its maximum: "
                    "it counts no more until it is cleared (perfquery -R)",
                )
        for name in sorted(before - names):
            self._post(
                "counter_cleared", Severity.INFO, f"{who} {counter_words(name)} counts again"
            )
        return names

    def _post_state(self, port: FabricPort, who: str, state: str, how: str) -> None:
        up = state in ("ACTIVE", "UP")
        if up:
            self._post("link_up", Severity.INFO, f"{who} link up ({how})")
            return
        severity = Severity.WARNING if port.role is PortRole.MANAGEMENT else Severity.CRITICAL
        self._post("link_down", severity, f"{who} link {state.lower()} ({how})")

    def _link_changed(self, ifname: str, before: str | None, now: str) -> None:
        """A netlink notification: only netdevs behind our ports become events."""
        port = self._by_netdev.get(ifname)
        if port is None or before is None:
            return
        who = f"{port.name} ({ifname}, {port.role})"
        if now == "GONE":
            self._post("link_gone", Severity.WARNING, f"{who} netdev removed (netlink)")
            return
        if (before == "UP") == (now == "UP"):
            return  # e.g. DOWN -> LOWERLAYERDOWN: still down
        self._post_state(port, who, now, "netlink")
