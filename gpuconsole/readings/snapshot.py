"""A node's merged readings and the whole fleet's, as consumers receive them.

The hub merges the sources' partial readings (one per source kind) into a NodeSnapshot per
node and a FleetSnapshot for the whole process. Whether a node is healthy is a fact derived
from all of them: `facts.verdict` (on a head, from the verdict the node's agent sends).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import msgspec

from gpuconsole.readings.actions import JournalReading
from gpuconsole.readings.alerts import ActiveAlert
from gpuconsole.readings.base import Event, Key, SourceStatus
from gpuconsole.readings.bmc import BmcReading
from gpuconsole.readings.fabric import FabricReading
from gpuconsole.readings.nvml import GpuReading, NvmlReading
from gpuconsole.readings.tenancy import TenancyReading
from gpuconsole.readings.verdict import CarriedVerdict

if TYPE_CHECKING:
    from gpuconsole.history import HistoryView

# --- Node and fleet ---------------------------------------------------------------

_EMPTY_RATES: Mapping[Key, float] = MappingProxyType({})
_EMPTY_DELTAS: Mapping[Key, int] = MappingProxyType({})
_EMPTY_XIDS: Mapping[str, int] = MappingProxyType({})


# weakly referenced where facts are remembered per snapshot: the snapshot a hub replaces is
# freed as it replaces it, not later by whoever asks about the next one
class NodeSnapshot(msgspec.Struct, frozen=True, weakref=True):
    """The latest readings of one node, merged from its sources, with derived rates."""

    node: str
    simulated: bool = False
    profile: str | None = None
    nvml: NvmlReading | None = None
    bmc: BmcReading | None = None
    fabric: FabricReading | None = None
    tenancy: TenancyReading | None = None
    statuses: tuple[SourceStatus, ...] = ()
    rates: Mapping[Key, float] = msgspec.field(default_factory=lambda: _EMPTY_RATES)
    # how far each counter read with `delta` moved over its source's last interval; only
    # the counters that moved are here
    deltas: Mapping[Key, int] = msgspec.field(default_factory=lambda: _EMPTY_DELTAS)
    # each GPU's latest XID the hub saw, by UUID and by bus id (a drained GPU has no UUID
    # NVML reads, and keeps its XID)
    last_xid: Mapping[str, int] = msgspec.field(default_factory=lambda: _EMPTY_XIDS)
    # the node's verdict as its agent judged it, where it read everything; None where this
    # process judges the node (its own, or one whose agent sends none)
    verdict: CarriedVerdict | None = None
    # the node's action journal, read on the node (its verdict carries what it says)
    actions: JournalReading | None = None
    history: HistoryView | None = None

    def status(self, source: str) -> SourceStatus | None:
        for status in self.statuses:
            if status.source == source:
                return status
        return None

    def rate(self, *key: str) -> float | None:
        """Per-second rate of a counter, e.g. rate("gpu", uuid, "energy_mj")."""
        return self.rates.get(key)

    def delta(self, *key: str) -> int | None:
        """How far a counter read with `delta` moved over its source's last interval: 0 when
        it did not move, None when that is unknown (its first reading, or a reset)."""
        moved = self.deltas.get(key)
        if moved is not None:
            return moved
        return 0 if key in self.rates else None

    def pcie_rates(self, gpu: GpuReading) -> tuple[float | None, float | None]:
        """PCIe tx and rx bytes per second: from the byte counters, else the driver's rate."""
        tx = self.rate("gpu", gpu.uuid, "pcie_tx_bytes")
        rx = self.rate("gpu", gpu.uuid, "pcie_rx_bytes")
        return (
            tx if tx is not None else gpu.pcie.tx_bytes_per_s,
            rx if rx is not None else gpu.pcie.rx_bytes_per_s,
        )

    @property
    def gpus(self) -> tuple[GpuReading, ...]:
        return self.nvml.gpus if self.nvml is not None else ()


class Rebuilt(msgspec.Struct, frozen=True, eq=False):
    """Which nodes of a hub's snapshot the hub built anew since the snapshot it published
    just before: every other position holds the very node that one held there. Made by the
    hub alone (never read from JSON); a consumer that took the snapshot before (`after`)
    need look at no other node.

    Of the nodes built anew, those `steady` moved in their readings alone: each of its
    sources answered as it did for the one before (none failed since, none answered after
    failing, none was added), and the verdict its agent sent is the very object that one
    carried (an agent source keeps it so while its agent sends it again, its own sources
    as fresh). What a judge took as its agent's verdict then stands, unlooked at."""

    after: object  # the snapshot before's `mark`; None: its nodes were laid out otherwise
    mark: object  # this snapshot's, unique to it: what the next one is `after`
    nodes: tuple[NodeSnapshot, ...]  # this snapshot's nodes: what these positions are of
    positions: tuple[int, ...]  # built anew, other than `steady`
    # a byte per position, 1 where the node there was built anew steady (b"": none): read
    # in C, as a thousand-bit number, where a thousand positions would each be an object
    steady: bytes = b""

    def __repr__(self) -> str:  # not its nodes again: the snapshot shows them
        shown = [at for at, one in enumerate(self.steady) if one]
        return f"Rebuilt(positions={self.positions!r}, steady={shown!r})"


# weakly referenced where verdicts are found by a node's position in the snapshot judged;
# a __dict__ for what is worked out of it once, on first asking (`_positions`)
class FleetSnapshot(msgspec.Struct, frozen=True, weakref=True, dict=True):
    """Every node this process knows, as of one moment; what consumers receive."""

    seq: int
    at: float
    nodes: tuple[NodeSnapshot, ...]
    events: tuple[Event, ...] = ()  # the most recent events, oldest first
    # every event since the process started, counted by (node, kind, severity)
    event_counts: tuple[tuple[str, str, str, int], ...] = ()
    alerts: tuple[ActiveAlert, ...] = ()  # what this process's alert rules hold, worst first
    # what its hub rebuilt since its snapshot before: None where no hub says
    rebuilt: Rebuilt | None = None

    def node(self, name: str) -> NodeSnapshot | None:
        """The node of that name (the first, were two so named)."""
        at = self._positions.get(name)
        return self.nodes[at] if at is not None else None

    @functools.cached_property
    def _positions(self) -> dict[str, int]:
        # built once per snapshot: views ask for nodes by name in loops over a fleet of
        # thousands, where a scan per asking costs the square of the fleet
        positions: dict[str, int] = {}
        for at, node in enumerate(self.nodes):
            positions.setdefault(node.node, at)
        return positions

    @property
    def simulated(self) -> bool:
        return any(node.simulated for node in self.nodes)
