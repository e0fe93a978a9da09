"""Prometheus metrics rendered from the latest snapshot; a scrape never touches hardware.

The exposition text is rendered once per snapshot and reused by every scrape until the
hub publishes the next one, so scrape cost does not grow with scrape rate. Each kind of
reading has its room: gpu.py (dcgm-exporter's names), bmc.py (ipmi_exporter's),
fabric.py (node_exporter's node_infiniband_*), ownership.py (who holds each GPU); this
module assembles them per node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuconsole.export import names as n
from gpuconsole.export.bmc import bmc_metrics
from gpuconsole.export.fabric import fabric_metrics
from gpuconsole.export.families import Families
from gpuconsole.export.gpu import gpu_metrics, topology_metrics
from gpuconsole.export.ownership import ownership_metrics, pod_labels
from gpuconsole.model import FleetSnapshot, NodeSnapshot
from gpuconsole.ownership import node_ownership


def _source_metrics(out: Families, node: NodeSnapshot, now: float) -> None:
    out.gauge(n.NODE_SIMULATED, ("node",), (node.node,), float(node.simulated))
    for status in node.statuses:
        lv = (node.node, status.source)
        out.gauge(n.SOURCE_UP, ("node", "source"), lv, float(status.ok))
        stale = now - status.stale_since if status.stale_since is not None else 0.0
        out.gauge(n.SOURCE_STALE, ("node", "source"), lv, max(0.0, stale))
        if status.last_ok_at is not None:
            out.gauge(n.SOURCE_LAST_OK, ("node", "source"), lv, status.last_ok_at)
        if status.last_poll_s is not None:
            out.gauge(n.SOURCE_POLL, ("node", "source"), lv, status.last_poll_s)


def node_metrics(out: Families, node: NodeSnapshot, now: float) -> None:
    """Every series of one node."""
    _source_metrics(out, node, now)
    ownership = node_ownership(node)
    pods = pod_labels(ownership)
    for gpu in node.gpus:
        gpu_metrics(out, node, gpu, pods)
    topology_metrics(out, node)
    bmc_metrics(out, node)
    fabric_metrics(out, node)
    if ownership is not None:
        ownership_metrics(out, node, ownership)


def build(snapshot: FleetSnapshot, now: float | None = None) -> Families:
    """Every metric family for one snapshot."""
    out = Families()
    at = time.time() if now is None else now
    out.gauge(n.SNAPSHOT_AGE, (), (), snapshot.at)
    for node in snapshot.nodes:
        node_metrics(out, node, at)
    for node_name, kind, severity, count in snapshot.event_counts:
        out.counter(
            n.EVENTS, ("node", "kind", "severity"), (node_name, kind, severity), float(count)
        )
    return out


def families(snapshot: FleetSnapshot, now: float | None = None) -> Iterator[Metric]:
    """Every metric family for one snapshot, as prometheus_client metrics."""
    return iter(build(snapshot, now))


@dataclass
class SnapshotCollector(Collector):
    """A prometheus_client collector over whatever snapshot `latest()` returns."""

    latest: Callable[[], FleetSnapshot | None]

    def collect(self) -> Iterator[Metric]:
        snapshot = self.latest()
        if snapshot is None:
            return iter(())
        return families(snapshot)


class MetricsCache:
    """The exposition text, rendered once per snapshot."""

    def __init__(self, latest: Callable[[], FleetSnapshot | None]) -> None:
        self._latest = latest
        self._seq: int | None = None
        self._body = b""

    def render(self) -> bytes:
        snapshot = self._latest()
        if snapshot is None:
            return b""
        if snapshot.seq != self._seq or not self._body:
            self._body = build(snapshot).text()
            self._seq = snapshot.seq
        return self._body
