"""The samples rules are evaluated over: the exporter's own series for a snapshot, built by
the one builder a scrape uses, so an alert and a Prometheus rule read the same numbers."""

from __future__ import annotations

from collections.abc import Collection

from gpuconsole.alerts.condition import Sample
from gpuconsole.export.collector import build
from gpuconsole.readings.snapshot import FleetSnapshot


def samples_by_name(snapshot: FleetSnapshot, wanted: Collection[str]) -> dict[str, list[Sample]]:
    """The samples of the metrics in `wanted`, by sample name, as of the snapshot's time."""
    out: dict[str, list[Sample]] = {}
    for name, labels, values, value in build(snapshot, snapshot.at, frozenset(wanted)).samples():
        pairs = tuple(sorted(zip(labels, values, strict=True)))
        out.setdefault(name, []).append(Sample(name, pairs, value))
    return out
