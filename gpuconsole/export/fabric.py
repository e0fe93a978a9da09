"""Fabric metrics: node_exporter's node_infiniband_* names, plus port roles, problems and
GPUDirect pairing (with the NIC a GPU falls back to, by `facts.pairing`) as gpuconsole_*
series.

node_exporter's InfiniBand collector exports nothing when sysfs cannot be read, so the
node_infiniband_* series here appear only while the fabric source is fresh; the
gpuconsole_* series keep the last good reading (gpuconsole_source_stale_seconds says how
old it is).
"""

from __future__ import annotations

from collections import Counter

from gpuconsole.export import names
from gpuconsole.export.families import Families, Labels
from gpuconsole.facts.pairing import gpu_nics
from gpuconsole.readings.base import Severity
from gpuconsole.readings.fabric import (
    FabricDevice,
    FabricPort,
    FabricReading,
    port_deltas,
    port_problems,
    port_rates,
)
from gpuconsole.readings.snapshot import NodeSnapshot

# procfs turns "400 Gb/sec (4X NDR)" into bytes per second this way
BYTES_PER_S_PER_GBPS = 125_000_000
_SEVERITY = {Severity.INFO: 0.0, Severity.WARNING: 1.0, Severity.CRITICAL: 2.0}
_INFO = ("node", "device", "board_id", "firmware_version", "hca_type")
_PORT_INFO = (
    *names.IB_PORT_LABELS,
    "role",
    "role_from",
    "link_layer",
    "netdev",
    "pci_bus_id",
    "numa_node",
)
_PROBLEM = (*names.IB_PORT_LABELS, "problem", "severity")
_HW = (*names.IB_PORT_LABELS, "stat")
_PEGGED = (*names.IB_PORT_LABELS, "counter")
# what _counters writes after the port's state: skipped where none of it is wanted
_COUNTER_SPECS = (
    *names.IB_COUNTERS.values(),
    *names.IB_LEGACY_COUNTERS.values(),
    names.IB_LIFESPAN,
    names.FABRIC_HW_STAT,
)
_NETDEV = (*names.IB_PORT_LABELS, "netdev")
_AFFINITY = ("node", "gpu", "uuid", "pci_bus_id", "nic", "level", "numa")
_FLAG = ("node", "gpu", "uuid", "pci_bus_id", "flag")
_FALLBACK = ("node", "gpu", "uuid", "pci_bus_id", "nic", "level")


def fabric_metrics(out: Families, node: NodeSnapshot) -> None:
    """Every series of a node's RDMA devices, ports and GPU-NIC pairing."""
    reading = node.fabric
    if reading is None:
        return
    status = node.status("fabric")
    fresh = status is None or status.ok
    if reading.peermem_loaded is not None:
        out.gauge(names.FABRIC_PEERMEM, ("node",), (node.node,), float(reading.peermem_loaded))
    for device in reading.devices:
        if fresh:
            info = (
                node.node,
                device.name,
                device.board_id or "",
                device.fw_ver or "",
                device.hca_type or "",
            )
            out.gauge(names.IB_INFO, _INFO, info, 1.0)
        for port in device.ports:
            values = (node.node, device.name, str(port.port))
            _counters(out, values, port, fresh)
            _port_state(out, node, device, port, values)
    _affinity(out, node, reading)


def _counters(out: Families, values: Labels, port: FabricPort, fresh: bool) -> None:
    labels = names.IB_PORT_LABELS
    if fresh:
        if port.state_id is not None:
            out.gauge(names.IB_STATE, labels, values, float(port.state_id))
        if port.phys_state_id is not None:
            out.gauge(names.IB_PHYSICAL_STATE, labels, values, float(port.phys_state_id))
        if port.rate_gbps is not None:
            rate = int(port.rate_gbps * BYTES_PER_S_PER_GBPS)
            out.gauge(names.IB_RATE, labels, values, float(rate))
    if not out.wants(*_COUNTER_SPECS):
        return
    if fresh:
        for folder, specs in (
            (port.counters, names.IB_COUNTERS),
            (port.counters_ext, names.IB_LEGACY_COUNTERS),
        ):
            for file, value, _bits in folder:
                spec = specs.get(file)
                if spec is not None:
                    scale = 4 if file in names.IB_DATA_COUNTERS else 1
                    out.counter(spec, labels, values, float(value * scale))
    if fresh and port.hw_counters_lifespan_ms is not None:
        # milliseconds in sysfs; whole seconds, as node_exporter divides them (10 ms: 0)
        out.gauge(names.IB_LIFESPAN, labels, values, float(port.hw_counters_lifespan_ms // 1000))
    for file, value, _bits in port.hw_counters:
        spec = names.IB_COUNTERS.get(file)
        if spec is None:
            out.counter(names.FABRIC_HW_STAT, _HW, (*values, file), float(value))
        elif fresh:
            out.counter(spec, labels, values, float(value))


def _problem_key(port: FabricPort, counter: str | None, what: str) -> str:
    """A stable name for a problem: its counter, else the link state it is about."""
    if counter is not None:
        return counter
    if not port.active:
        return "link_down"
    if what.startswith("downtrained"):
        return "downtrained"
    return "netdev_down"


def _port_state(
    out: Families, node: NodeSnapshot, device: FabricDevice, port: FabricPort, values: Labels
) -> None:
    info = (
        *values,
        port.role.value,
        port.role_from,
        port.link_layer,
        port.netdev or "",
        device.pci_bus_id or "",
        "" if device.numa_node is None else str(device.numa_node),
    )
    out.gauge(names.FABRIC_PORT_INFO, _PORT_INFO, info, 1.0)
    if port.expected_rate_gbps is not None:
        expected = float(int(port.expected_rate_gbps * BYTES_PER_S_PER_GBPS))
        out.gauge(names.FABRIC_PORT_EXPECTED_RATE, names.IB_PORT_LABELS, values, expected)
    problems = (
        port_problems(port, port_rates(node.rate, port), port_deltas(node.delta, port))
        if out.wants(names.FABRIC_PORT_SEVERITY, names.FABRIC_PORT_PROBLEM)
        else ()
    )
    worst = _SEVERITY[problems[0].severity] if problems else 0.0
    out.gauge(names.FABRIC_PORT_SEVERITY, names.IB_PORT_LABELS, values, worst)
    for counter, _value in port.pegged:
        out.gauge(names.FABRIC_PORT_COUNTER_PEGGED, _PEGGED, (*values, counter), 1.0)
    keys = Counter((_problem_key(port, p.counter, p.what), p.severity.value) for p in problems)
    for (key, severity), _count in keys.items():
        out.gauge(names.FABRIC_PORT_PROBLEM, _PROBLEM, (*values, key, severity), 1.0)
    stats = port.netdev_stats
    if stats is not None:
        netdev = (*values, stats.ifname)
        up = float(stats.operstate in ("UP", "UNKNOWN"))
        out.gauge(names.FABRIC_NETDEV_UP, _NETDEV, netdev, up)
        if stats.carrier is not None:
            out.gauge(names.FABRIC_NETDEV_CARRIER, _NETDEV, netdev, float(stats.carrier))


def _affinity(out: Families, node: NodeSnapshot, reading: FabricReading) -> None:
    """The NIC each GPU should pair with for GPUDirect RDMA, what is wrong with it, and the
    NIC it falls back to while its rail is down (the one the console names)."""
    if not out.wants(names.GPU_NIC_AFFINITY, names.GPU_GPUDIRECT_FLAG, names.GPU_NIC_FALLBACK):
        return
    by_bus = {g.pci_bus_id: g for g in node.gpus}
    used = gpu_nics(reading)
    for affinity in reading.gpus:
        gpu = by_bus.get(affinity.pci_bus_id)
        index = "" if gpu is None else str(gpu.index)
        uuid = "" if gpu is None else gpu.uuid
        if affinity.best_device is not None:
            values: Labels = (
                node.node,
                index,
                uuid,
                affinity.pci_bus_id,
                affinity.best_device,
                affinity.best_level or "",
                "" if affinity.numa_node is None else str(affinity.numa_node),
            )
            out.gauge(names.GPU_NIC_AFFINITY, _AFFINITY, values, 1.0)
        for flag in affinity.flags:
            values = (node.node, index, uuid, affinity.pci_bus_id, flag.name.lower())
            out.gauge(names.GPU_GPUDIRECT_FLAG, _FLAG, values, 1.0)
        choice = used[affinity.pci_bus_id]
        if choice.falls_back and choice.nic is not None:
            values = (node.node, index, uuid, affinity.pci_bus_id, choice.nic, choice.level or "")
            out.gauge(names.GPU_NIC_FALLBACK, _FALLBACK, values, 1.0)
