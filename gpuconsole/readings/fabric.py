"""fabric readings: RDMA ports, their netdevs, and which NIC each GPU should use.

Counters keep the sysfs file names (`port_xmit_data`, `np_cnp_sent`) and raw values as
read, so the exporter can map them to node_exporter's names; the hub derives rates, and
for error and congestion counters how far each moved over the interval (its delta).
`port_problems` is the one place that turns a port plus its rates and deltas into worries,
and `FabricReading.delta_events` the one place that turns climbing errors into events.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

import msgspec

from gpuconsole.readings.base import CounterSample, Event, Key, Severity, normal_bus_id

# port_{xmit,rcv}_data count octets divided by 4.
DATA_OCTETS_PER_UNIT = 4
# counters/* narrower than this are PortCounters, which saturate: a value that went back
# was cleared, not wrapped (to the hub they are as wide as 64-bit ones: they never wrap)
SATURATES_BELOW = 64
# How far back a port's error counters are counted for its health (FabricPort.errors_climbed):
# a link that went down once is in the verdict this long, not for one poll.
FABRIC_ERROR_WINDOW_S = 600.0
# Topology levels as nvidia-smi prints them, nearest first.
LEVELS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")

RateLookup = Callable[[str], float | None]
DeltaLookup = Callable[[str], int | None]


class PortRole(enum.StrEnum):
    """Which of the node's three networks a port belongs to."""

    COMPUTE = "compute"
    STORAGE = "storage"
    MANAGEMENT = "management"


class NetdevStats(msgspec.Struct, frozen=True):
    """A netdev's link state and 64-bit kernel statistics, as rtnetlink reports them."""

    ifname: str
    operstate: str  # UP, DOWN, LOWERLAYERDOWN, ...
    carrier: bool | None = None
    mtu: int | None = None
    rx_bytes: int = 0
    tx_bytes: int = 0
    rx_packets: int = 0
    tx_packets: int = 0
    rx_errors: int = 0
    tx_errors: int = 0
    rx_dropped: int = 0
    tx_dropped: int = 0
    multicast: int = 0


NETDEV_COUNTERS = (
    "rx_bytes",
    "tx_bytes",
    "rx_packets",
    "tx_packets",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "multicast",
)


class FabricPort(msgspec.Struct, frozen=True):
    """One port of an RDMA device: link, rate, role and raw counters."""

    device: str  # mlx5_0
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED, ...
    state_id: int | None
    phys_state: str  # LinkUp, Disabled, Polling, ...
    phys_state_id: int | None
    link_layer: str  # InfiniBand or Ethernet
    role: PortRole
    role_from: str  # "config" or the rule that chose it
    rate_gbps: float | None = None
    rate_text: str = ""  # "400 Gb/sec (4X NDR)"
    width: int | None = None  # lanes: the 4 of 4X
    speed: str | None = None  # NDR, HDR, ...
    # what a healthy port of this HCA model and role runs at on this node
    expected_rate_gbps: float | None = None
    lid: int | None = None
    sm_lid: int | None = None
    netdev: str | None = None
    netdev_stats: NetdevStats | None = None
    netdev_error: str | None = None  # why netdev_stats is missing
    # (sysfs file name, raw value, width in bits) for counters/* and hw_counters/*: the
    # counters/* are PortCounters, which saturate at their width's maximum (`pegged`)
    counters: tuple[tuple[str, int, int], ...] = ()
    hw_counters: tuple[tuple[str, int, int], ...] = ()
    no_pma: bool = False  # counters/* read "N/A (no PMA)"
    # hw_counters/lifespan: how long (ms) the driver caches hw_counters reads; a setting
    hw_counters_lifespan_ms: int | None = None
    # counters_ext/*: the 64-bit data and packet counters of kernels before 4.5 (mlx4),
    # beside the 32-bit ones in counters/; node_exporter's node_infiniband_legacy_*
    counters_ext: tuple[tuple[str, int, int], ...] = ()
    # The error counters (ERROR_RULES, by their names) that climbed within
    # FABRIC_ERROR_WINDOW_S and how far, and the seconds that covers: 0 where none climbed,
    # None where they were not counted so (an older agent, a port read from Prometheus): the
    # last interval's deltas are judged then.
    errors_climbed: tuple[tuple[str, int], ...] = ()
    errors_climbed_s: float | None = None
    # The counters/* at their maximum, (name, value) each (`pegged_counters`), worked out
    # once by the source: each counts nothing more until it is cleared
    pegged: tuple[tuple[str, int], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def downtrained(self) -> bool:
        """Up, but slower than it is expected to run (its siblings of the same HCA model and
        role); a lane count alone says nothing: 1X and 2X ports exist by design."""
        if not self.active or self.rate_gbps is None:
            return False
        expected = self.expected_rate_gbps
        return expected is not None and self.rate_gbps < expected

    def counter(self, name: str) -> int | None:
        """The raw value of a counters/*, hw_counters/* or counters_ext/* file, by its name."""
        for folder in (self.counters, self.hw_counters, self.counters_ext):
            for key, value, _bits in folder:
                if key == name:
                    return value
        return None

    @property
    def xmit_bytes_total(self) -> int | None:
        data = self.counter("port_xmit_data")
        return None if data is None else data * DATA_OCTETS_PER_UNIT


class FabricDevice(msgspec.Struct, frozen=True):
    """One RDMA device (an HCA or one function of a dual-port card) and its ports."""

    name: str
    pci_bus_id: str | None = None  # 0000:18:00.0
    numa_node: int | None = None
    socket: int | None = None
    board_id: str | None = None
    fw_ver: str | None = None
    hca_type: str | None = None
    node_guid: str | None = None
    ports: tuple[FabricPort, ...] = ()
    levels: tuple[NicLevel, ...] = ()  # to every RDMA device of the node, itself ("X") too


class NicLevel(msgspec.Struct, frozen=True):
    """How far a GPU, or another RDMA device, is from one RDMA device over PCIe."""

    device: str
    level: str  # PIX, PXB, PHB, NODE, SYS


class AffinityFlag(enum.StrEnum):
    """Why a GPU's GPUDirect RDMA pairing is not what it should be."""

    CROSS_SOCKET = "crosses the socket link"
    NO_NEAR_NIC = "no NIC under its PCIe switch"
    RAIL_DOWN = "its rail is down"
    RAIL_DOWNTRAINED = "its rail is downtrained"
    NO_PEERMEM = "nvidia-peermem not loaded"


class GpuAffinity(msgspec.Struct, frozen=True):
    """One GPU's place on PCIe and the NIC it should use for GPUDirect RDMA."""

    pci_bus_id: str
    numa_node: int | None = None
    socket: int | None = None
    levels: tuple[NicLevel, ...] = ()
    best_device: str | None = None
    best_level: str | None = None
    flags: tuple[AffinityFlag, ...] = ()


class MissingPort(msgspec.Struct, frozen=True):
    """A port read before in this run that sysfs no longer lists: its HCA left the PCIe bus,
    or its driver was unloaded. Known by its HCA's PCI address, so a device renamed (mlx5_9
    back as mlx5_12) is not one."""

    device: str  # the name it had
    port: int
    role: PortRole
    since: float  # the first reading without it
    pci_bus_id: str | None = None

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


class FabricReading(msgspec.Struct, frozen=True):
    """The fabric source's partial reading of one node."""

    at: float
    devices: tuple[FabricDevice, ...] = ()
    missing: tuple[MissingPort, ...] = ()  # ports that were there and are gone
    gpus: tuple[GpuAffinity, ...] = ()
    peermem_loaded: bool | None = None
    netlink_error: str | None = None  # netdev stats unavailable for every port, and why
    link_events_error: str | None = None  # link notifications unavailable, and why
    simulated: bool = False

    @property
    def ports(self) -> tuple[FabricPort, ...]:
        return tuple(port for device in self.devices for port in device.ports)

    def port(self, device: str, port: int = 1) -> FabricPort | None:
        for dev in self.devices:
            if dev.name == device:
                for p in dev.ports:
                    if p.port == port:
                        return p
        return None

    def device(self, name: str) -> FabricDevice | None:
        for dev in self.devices:
            if dev.name == name:
                return dev
        return None

    def gpu(self, pci_bus_id: str) -> GpuAffinity | None:
        wanted = normal_bus_id(pci_bus_id)
        for gpu in self.gpus:
            if gpu.pci_bus_id == wanted:
                return gpu
        return None

    def counters(self) -> Iterator[CounterSample]:
        for dev in self.devices:
            for port in dev.ports:
                number = str(port.port)
                for name, value, _bits in port.counters:
                    yield CounterSample(
                        port_key(dev.name, number, name),
                        value,
                        64,  # saturating, or 64-bit: never wraps
                        name in _HISTORY,
                        name in _DELTAS,
                    )
                for name, value, bits in port.hw_counters:
                    yield CounterSample(
                        port_key(dev.name, number, name), value, bits, False, name in _DELTAS
                    )
                stats = port.netdev_stats
                if stats is not None:
                    for name in NETDEV_COUNTERS:
                        yield CounterSample(
                            netdev_key(dev.name, number, name),
                            getattr(stats, name),
                            64,
                            name in _HISTORY,
                            f"netdev.{name}" in _DELTAS,
                        )

    def series(self) -> Iterator[tuple[Key, float]]:
        return iter(())

    def delta_events(
        self,
        node: str,
        at: float,
        deltas: Mapping[Key, int],
        before: Mapping[Key, int],
        interval_s: float,
    ) -> Iterator[Event]:
        """Error counters that started to climb this interval, one event each, with the
        rule's severity; the hub calls this with the deltas it derived.

        A counter that keeps climbing is one event when it starts, not one per poll: the
        port's problems say that it still climbs.
        """
        for port in self.ports:
            number = str(port.port)
            for rule in ERROR_RULES:
                key = _counter_key(port.device, number, rule.counter)
                moved = deltas.get(key)
                if moved is None or not rule.erring(moved, interval_s):
                    continue
                if rule.erring(before.get(key, 0), interval_s):
                    continue  # it was climbing already
                yield Event(
                    at,
                    node,
                    "fabric",
                    "port_errors",
                    rule.severity,
                    f"{port.name} ({port.role}) {rule.words} +{moved} in {interval_s:.3g} s",
                )


_HISTORY = frozenset({"port_xmit_data", "port_rcv_data", "rx_bytes", "tx_bytes"})


@functools.lru_cache(maxsize=65536)
def port_key(device: str, port: str, name: str) -> Key:
    """The rate key of a port counter: ("fabric", "mlx5_0", "1", "port_xmit_data")."""
    return ("fabric", device, port, name)


@functools.lru_cache(maxsize=65536)
def netdev_key(device: str, port: str, name: str) -> Key:
    """The rate key of a netdev counter behind a port: (..., "netdev", "tx_bytes")."""
    return ("fabric", device, port, "netdev", name)


def _counter_key(device: str, port: str, name: str) -> Key:
    """The rate key of a counter named as the rules name it ("netdev.rx_errors")."""
    if name.startswith("netdev."):
        return netdev_key(device, port, name[7:])
    return port_key(device, port, name)


def port_rates(rates: Callable[..., float | None], port: FabricPort) -> RateLookup:
    """A rate lookup for one port from NodeSnapshot.rate: name -> per-second rate."""
    number = str(port.port)

    def lookup(name: str) -> float | None:
        return rates(*_counter_key(port.device, number, name))

    return lookup


def port_deltas(deltas: Callable[..., int | None], port: FabricPort) -> DeltaLookup:
    """A delta lookup for one port from NodeSnapshot.delta: name -> how far the counter
    moved over the last interval (error and congestion counters)."""
    number = str(port.port)

    def lookup(name: str) -> int | None:
        return deltas(*_counter_key(port.device, number, name))

    return lookup


def port_traffic(port: FabricPort, rate: RateLookup) -> tuple[float | None, float | None]:
    """(transmit, receive) bytes per second: IB data counters, else the netdev's."""
    tx, rx = rate("port_xmit_data"), rate("port_rcv_data")
    if tx is not None or rx is not None:
        return (
            None if tx is None else tx * DATA_OCTETS_PER_UNIT,
            None if rx is None else rx * DATA_OCTETS_PER_UNIT,
        )
    return rate("netdev.tx_bytes"), rate("netdev.rx_bytes")


class PortProblem(msgspec.Struct, frozen=True):
    """One thing wrong with a port, in the words an operator reads."""

    severity: Severity
    what: str
    counter: str | None = None  # the counter behind it, when there is one
    per_s: float | None = None
    delta: int | None = None  # how far that counter moved over the last interval


class ErrorRule(NamedTuple):
    """An error counter: any climb past `floor_per_s` is a problem of `severity`."""

    counter: str  # sysfs file name, or "netdev.<stat>" for the netdev's statistics
    words: str
    severity: Severity
    floor_per_s: float = 0.0  # counters that climb a little under healthy load

    def erring(self, moved: int, interval_s: float) -> bool:
        return moved > 0 and moved / interval_s > self.floor_per_s


class CongestionRule(NamedTuple):
    """A congestion counter: a warning past `warn_per_s`, critical past `critical_per_s`."""

    counter: str
    words: str
    warn_per_s: float
    critical_per_s: float


ERROR_RULES: tuple[ErrorRule, ...] = (
    ErrorRule("link_downed", "link downed", Severity.CRITICAL),
    ErrorRule("link_error_recovery", "link error recovery", Severity.WARNING),
    ErrorRule("symbol_error", "symbol errors", Severity.WARNING),
    ErrorRule("port_rcv_errors", "receive errors", Severity.WARNING),
    ErrorRule("port_rcv_remote_physical_errors", "remote physical errors", Severity.WARNING),
    ErrorRule("local_link_integrity_errors", "link integrity errors", Severity.WARNING),
    ErrorRule("excessive_buffer_overrun_errors", "buffer overruns", Severity.WARNING),
    ErrorRule("port_xmit_discards", "transmit discards", Severity.WARNING),
    ErrorRule("netdev.rx_errors", "netdev receive errors", Severity.WARNING),
    ErrorRule("netdev.tx_errors", "netdev transmit errors", Severity.WARNING),
    ErrorRule("out_of_sequence", "out-of-sequence packets", Severity.WARNING, 1.0),
    ErrorRule("packet_seq_err", "packet sequence errors", Severity.WARNING, 1.0),
    ErrorRule("local_ack_timeout_err", "ack timeouts", Severity.WARNING),
    ErrorRule("roce_adp_retrans", "retransmits", Severity.WARNING, 1.0),
    ErrorRule("req_transport_retries_exceeded", "transport retries exceeded", Severity.CRITICAL),
    ErrorRule("rnr_nak_retry_err", "RNR retries exceeded", Severity.WARNING),
)
# Congestion: CNPs and ECN marks (RoCE), and transmit wait ticks (IB credits starved).
CONGESTION_RULES: tuple[CongestionRule, ...] = (
    CongestionRule("np_ecn_marked_roce_packets", "ECN-marked packets", 100.0, 10_000.0),
    CongestionRule("np_cnp_sent", "CNPs sent", 100.0, 10_000.0),
    CongestionRule("rp_cnp_handled", "CNPs handled", 100.0, 10_000.0),
    CongestionRule("port_xmit_wait", "transmit wait", 1e5, 1e7),
)


def pegged_counters(counters: tuple[tuple[str, int, int], ...]) -> tuple[tuple[str, int], ...]:
    """The PortCounters (counters/*, as (name, value, bits)) at their maximum, (name,
    value) each: they saturate there and never wrap, so each counts nothing more (a link
    going down again, errors climbing) until it is cleared (`perfquery -R`)."""
    return tuple(
        (name, value)
        for name, value, bits in counters
        if bits < SATURATES_BELOW and value == (1 << bits) - 1
    )


_WORDS: dict[str, str] = {r.counter: r.words for r in ERROR_RULES} | {
    r.counter: r.words for r in CONGESTION_RULES
}


def counter_words(name: str) -> str:
    """A counter in an operator's words ("link downed"), its file name where no rule has
    words for it."""
    return _WORDS.get(name, name)


# The counters whose per-interval delta the hub keeps.
_DELTAS = frozenset(r.counter for r in ERROR_RULES) | frozenset(r.counter for r in CONGESTION_RULES)


def port_problems(
    port: FabricPort, rate: RateLookup, delta: DeltaLookup | None = None
) -> tuple[PortProblem, ...]:
    """What is wrong with a port now, worst first; `rate` gives a counter's per-second rate
    and `delta` how far it moved over the last interval.

    Down compute and storage rails are critical, a down management port a warning; error
    counters that climbed over the last interval are problems of their rule's severity, said
    as the delta ("symbol errors +37 (18.5/s)"); so is congestion. Without `delta` the
    errors are judged and said by their rates alone.
    """
    found: list[PortProblem] = []
    if not port.active:
        severity = Severity.WARNING if port.role is PortRole.MANAGEMENT else Severity.CRITICAL
        found.append(PortProblem(severity, f"link {port.state.lower()} ({port.phys_state})"))
    elif port.downtrained:
        found.append(
            PortProblem(
                Severity.WARNING,
                f"downtrained: {port.rate_text} (expected {port.expected_rate_gbps:g})",
            )
        )
    stats = port.netdev_stats
    if stats is not None and stats.operstate not in ("UP", "UNKNOWN") and port.active:
        found.append(PortProblem(Severity.WARNING, f"netdev {stats.ifname} {stats.operstate}"))
    for counter, words, severity, floor in ERROR_RULES:
        if delta is None:
            per_s = rate(counter)
            if per_s is not None and per_s > floor:
                found.append(PortProblem(severity, f"{words} {per_s:.3g}/s", counter, per_s))
            continue
        moved = delta(counter)  # mostly none: its rate is read only of a counter that moved
        if not moved:
            continue
        per_s = rate(counter)
        if per_s is not None and per_s <= floor:
            continue
        said = f"{words} +{moved}" + (f" ({per_s:.3g}/s)" if per_s is not None else "")
        found.append(PortProblem(severity, said, counter, per_s, moved))
    for counter, words, warn, critical in CONGESTION_RULES:
        per_s = rate(counter)
        if per_s is None or per_s <= warn:
            continue
        severity = Severity.CRITICAL if per_s > critical else Severity.WARNING
        moved = delta(counter) if delta is not None else None
        found.append(
            PortProblem(severity, f"congestion: {words} {per_s:.3g}/s", counter, per_s, moved)
        )
    order = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
    found.sort(key=lambda p: order[p.severity])
    return tuple(found)
