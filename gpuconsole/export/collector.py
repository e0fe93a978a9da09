"""Prometheus metrics rendered from the latest snapshot; a scrape never touches hardware.

The exposition text is rendered once per snapshot and reused by every scrape until the
hub publishes the next one, so scrape cost does not grow with scrape rate; for a steady
scraper it is rendered just before the scrape comes, so the scrape does not wait for it. Each kind of
reading has its room: gpu.py (dcgm-exporter's names), bmc.py (ipmi_exporter's),
fabric.py (node_exporter's node_infiniband_*), ownership.py (who holds each GPU); this
module assembles them per node.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from gpuconsole.export import names
from gpuconsole.export.bmc import bmc_metrics
from gpuconsole.export.fabric import fabric_metrics
from gpuconsole.export.families import Families
from gpuconsole.export.gpu import gpu_metrics, topology_metrics
from gpuconsole.export.ownership import PodLabels, ownership_metrics, pod_labels
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.facts.ownership import Ownership, node_ownership
from gpuconsole.facts.verdict import gpu_verdict, node_verdict, standing_xids
from gpuconsole.facts.xids import xid_entry
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot


def _source_metrics(out: Families, node: NodeSnapshot, now: float) -> None:
    out.gauge(names.NODE_SIMULATED, ("node",), (node.node,), float(node.simulated))
    running = node.nvml.fabric_manager_running if node.nvml is not None else None
    if running is not None:
        out.gauge(names.FABRIC_MANAGER, ("node",), (node.node,), float(running))
    for status in node.statuses:
        lv = (node.node, status.source)
        out.gauge(names.SOURCE_UP, ("node", "source"), lv, float(status.ok))
        stale = now - status.stale_since if status.stale_since is not None else 0.0
        out.gauge(names.SOURCE_STALE, ("node", "source"), lv, max(0.0, stale))
        if status.last_ok_at is not None:
            out.gauge(names.SOURCE_LAST_OK, ("node", "source"), lv, status.last_ok_at)
        if status.last_poll_s is not None:
            out.gauge(names.SOURCE_POLL, ("node", "source"), lv, status.last_poll_s)


def guest_metrics(
    out: Families, node: NodeSnapshot, ownership: Ownership | None, now: float
) -> None:
    """Passthrough GPUs as their guests' agents read them: the same series as the host's,
    labelled with the guest and its tenant; a guest that stopped answering exports its
    silence (gpuconsole_guest_up 0), not its last values as if they were current."""
    if node.tenancy is None:
        return
    up: dict[tuple[str, str], bool] = {}
    for guest in node.tenancy.guest_gpus:
        key = (guest.guest, guest.tenant or "")
        up[key] = up.get(key, True) and guest.error is None
        if guest.reading is None or guest.error is not None:
            continue
        labels = (("guest", "tenant"), key)
        # the host's NVML does not number it: named as the console names it ("52:00.0"),
        # never by the guest's own number, which a host GPU's series may carry
        pods = PodLabels(gpus={guest.reading.uuid: labels})
        gpu_metrics(out, node, guest.reading, pods, ownership, guest_bus=guest.bus_id)
        if guest.seen_at is not None:
            out.gauge(
                names.GUEST_READING_AGE,
                ("node", "guest", "pci_bus_id"),
                (node.node, guest.guest, guest.bus_id),
                max(0.0, now - guest.seen_at),
            )
    for (guest_name, tenant), answered in sorted(up.items()):
        out.gauge(
            names.GUEST_UP,
            ("node", "guest", "tenant"),
            (node.node, guest_name, tenant),
            float(answered),
        )


def verdict_metrics(out: Families, node: NodeSnapshot) -> None:
    """The verdict of the node and of each of its GPUs (NVML's and those only sysfs sees),
    and each GPU's XIDs counted over the health window (a guest's GPU's as its guest's
    agent read them): what alert rules fire on."""
    verdict = node_verdict(node)
    out.gauge(names.NODE_VERDICT, ("node", "action"), (node.node, verdict.action.value),
              float(verdict.action.rank))  # fmt: skip
    for row in node_gpus(node):
        judged = gpu_verdict(node, row)
        uuid = row.uuid or ""
        out.gauge(names.GPU_VERDICT, names.VERDICT_LABELS,
                  (node.node, row.bus_id, uuid, judged.action.value),
                  float(judged.action.rank))  # fmt: skip
        reading = row.seen
        if reading is None:
            continue
        # as the verdict counts them: a journaled repair's XIDs resolve with it
        for xid in standing_xids(node, reading, row.bus_id)[0]:
            entry = xid_entry(xid.code)
            out.gauge(names.GPU_XID_WINDOW, names.XID_WINDOW_LABELS,
                      (node.node, row.bus_id, uuid, str(xid.code),
                       entry.mnemonic if entry is not None else ""),
                      float(xid.count))  # fmt: skip


def node_metrics(out: Families, node: NodeSnapshot, now: float) -> None:
    """Every series of one node."""
    _source_metrics(out, node, now)
    ownership = node_ownership(node)
    pods = pod_labels(ownership)
    flagged = sum(gpu_metrics(out, node, gpu, pods, ownership) for gpu in node.gpus)
    # always written, 0 included: a node without it is read from an agent that lacks it
    out.gauge(names.NODE_GPUS_FLAGGED, ("node",), (node.node,), float(flagged))
    guest_metrics(out, node, ownership, now)
    topology_metrics(out, node)
    verdict_metrics(out, node)
    bmc_metrics(out, node)
    fabric_metrics(out, node)
    if ownership is not None:
        ownership_metrics(out, node, ownership)


# The families node_metrics writes from `now` as well as from the node: the others are the
# same for the same node object whenever they are built.
TIMED = frozenset({names.SOURCE_STALE[0], names.GUEST_READING_AGE[0]})


def snapshot_metrics(out: Families, snapshot: FleetSnapshot) -> None:
    """The series of the snapshot itself (its time), written before every node's."""
    out.gauge(names.SNAPSHOT_AGE, (), (), snapshot.at)


def event_metrics(out: Families, snapshot: FleetSnapshot) -> None:
    """The events counted per node, kind and severity, written after every node's."""
    for node_name, kind, severity, count in snapshot.event_counts:
        out.counter(
            names.EVENTS, ("node", "kind", "severity"), (node_name, kind, severity), float(count)
        )


def node_families(node: NodeSnapshot, now: float, only: frozenset[str] | None = None) -> Families:
    """One node's families, as build() writes them for it."""
    out = Families(only)
    node_metrics(out, node, now)
    return out


def fleet_families(snapshot: FleetSnapshot, only: frozenset[str] | None = None) -> Families:
    """The families build() writes of the snapshot itself, no node's: its time, its
    events counted."""
    out = Families(only)
    snapshot_metrics(out, snapshot)
    event_metrics(out, snapshot)
    return out


def build(
    snapshot: FleetSnapshot, now: float | None = None, only: frozenset[str] | None = None
) -> Families:
    """Every metric family for one snapshot (`only`: the families of these names alone)."""
    out = Families(only)
    at = time.time() if now is None else now
    snapshot_metrics(out, snapshot)
    for node in snapshot.nodes:
        node_metrics(out, node, at)
    event_metrics(out, snapshot)
    return out


def families(snapshot: FleetSnapshot, now: float | None = None) -> Iterator[Metric]:
    """Every metric family for one snapshot, as prometheus_client metrics."""
    return iter(build(snapshot, now))


class MetricsCache:
    """The exposition text, rendered once per snapshot, and ahead of a scrape that is due.

    A Prometheus scraping every 15 s finds a new snapshot every time, and rendering one is
    the whole cost of a scrape. Scrapers keep a steady period, so once a peer has scraped
    at the same spacing a few times, `ahead_at()` says when to render the newest snapshot
    just before its next scrape. That scrape then gets this body even if the hub published
    again in those last instants (it is at most `lead_s` older); the next one is current.
    Renders stay one per scrape; a scrape that comes unannounced renders as it arrives.
    """

    MIN_PERIOD_S = 0.8  # scraping faster than the hub publishes: bodies are mostly reused
    PEERS = 16  # scrapers followed at once (Prometheus pairs, a few curls)

    def __init__(
        self,
        latest: Callable[[], FleetSnapshot | None],
        clock: Callable[[], float] = time.monotonic,
        lead_s: float = 0.2,
    ) -> None:
        self._latest = latest
        self.clock = clock
        self.lead_s = lead_s
        self._seq: int | None = None
        self._body = b""
        self._ahead_since: float | None = None  # when the body was rendered ahead, unserved
        self._scrapes: dict[str, deque[float]] = {}
        self.renders = 0

    def render(self, peer: str = "") -> bytes:
        """The body for a scrape from `peer` (its address; empty: not followed)."""
        now = self.clock()
        if peer:
            self._note(peer, now)
        ahead, self._ahead_since = self._ahead_since, None
        snapshot = self._latest()
        if snapshot is None:
            return b""
        if snapshot.seq == self._seq and self._body:
            return self._body
        if ahead is not None and now - ahead <= 2 * self.lead_s:
            return self._body  # rendered for this scrape; the next one gets the newer
        self._render(snapshot)
        return self._body

    def render_ahead(self) -> None:
        """Render the newest snapshot now (if not done yet), for a scrape due within
        `lead_s`: that scrape gets this body even if the hub publishes meanwhile."""
        snapshot = self._latest()
        if snapshot is None:
            return
        if snapshot.seq != self._seq or not self._body:
            self._render(snapshot)
        self._ahead_since = self.clock()

    def ahead_at(self, peer: str) -> float | None:
        """When to render ahead of `peer`'s next scrape (clock time), if it scrapes at a
        steady period; None if it does not, or scrapes too often to need it."""
        times = self._scrapes.get(peer)
        if times is None or len(times) < 3:
            return None
        gaps = [b - a for a, b in itertools.pairwise(times)]
        period = gaps[-1]
        if period < self.MIN_PERIOD_S or any(abs(gap - period) > 0.1 * period for gap in gaps):
            return None
        return times[-1] + period - self.lead_s

    def _note(self, peer: str, now: float) -> None:
        times = self._scrapes.pop(peer, None) or deque(maxlen=4)
        times.append(now)
        self._scrapes[peer] = times  # the most recent peers last
        while len(self._scrapes) > self.PEERS:
            del self._scrapes[next(iter(self._scrapes))]

    def _render(self, snapshot: FleetSnapshot) -> None:
        self._body = build(snapshot).text()
        self._seq = snapshot.seq
        self.renders += 1
