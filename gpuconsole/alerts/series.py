"""The samples rules are evaluated over: the exporter's own series for a snapshot, built by
the one builder a scrape uses, so an alert and a Prometheus rule read the same numbers."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Iterable

from gpuconsole.alerts.condition import Sample
from gpuconsole.export.collector import TIMED, fleet_families, node_families
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot

_Pairs = tuple[tuple[str, str], ...]
ByName = dict[str, list[Sample]]


@functools.lru_cache(maxsize=1024)
def _pairing(names: tuple[str, ...]) -> Callable[[tuple[str, ...]], _Pairs]:
    """What makes a sample's (name, value) pairs, sorted by name, from its label values: a
    family's label names come in one order, so they are sorted once per order."""
    order = sorted(range(len(names)), key=names.__getitem__)
    ordered = tuple(names[i] for i in order)
    if order == list(range(len(names))):
        return lambda values: tuple(zip(ordered, values, strict=True))
    return lambda values: tuple(zip(ordered, [values[i] for i in order], strict=True))


# Per sample name and label order, each series' label values -> its last sample.
_Interned = dict[tuple[str, tuple[str, ...]], dict[tuple[str, ...], Sample]]
_NONE: dict[tuple[str, ...], Sample] = {}


def _by_name(
    families: Iterable[tuple[str, list[tuple[tuple[str, ...], tuple[str, ...], float]]]],
    interned: _Interned,
) -> ByName:
    """The samples by name; a series' sample of the same value as last time is that one
    again, and its pairs are made once: an evaluation of a large fleet would otherwise
    make millions of tuples, and Python's collector pass over them all, each time."""
    found: ByName = {}
    for name, samples in families:
        kept = found.setdefault(name, [])
        names_of: tuple[str, ...] | None = None  # the label names the two below are for
        make, known = _pairing(()), _NONE
        for labels, values, value in samples:
            if labels is not names_of:
                make, names_of = _pairing(labels), labels
                known = interned.setdefault((name, labels), {})
            last = known.get(values)
            if last is None:
                last = known[values] = Sample(name, make(values), value)
            elif last[2] is value and value == value:
                pass  # the very value of last time (most of a fleet's: the small ints of
                # counters that never moved): the checks below would say the same
            elif (
                last.value != value
                or type(last.value) is not type(value)
                or (value == 0 and math.copysign(1.0, last.value) != math.copysign(1.0, value))
            ):  # of another value: of its type (an int's 0 is no 0.0 in a template) and sign
                last = known[values] = Sample(name, last.labels, value)
            kept.append(last)
    return found


class Series:
    """The samples of the metrics in `wanted`, snapshot after snapshot, as
    samples_by_name builds them; a node whose snapshot is the very object of the last
    call (the hub hands an unchanged node on as it was) has its samples from then, unless
    a family read depends on the snapshot's time as well (collector.TIMED)."""

    def __init__(self, wanted: Collection[str]) -> None:
        self.wanted = frozenset(wanted)
        self._timed = bool(self.wanted & TIMED)
        self._nodes: dict[str, tuple[NodeSnapshot, float, ByName]] = {}
        self._interned: _Interned = {}

    def samples(self, snapshot: FleetSnapshot) -> ByName:
        now = snapshot.at
        out: ByName = {}

        def add(part: ByName) -> None:
            for name, found in part.items():
                kept = out.get(name)
                if kept is None:
                    out[name] = list(found)
                else:
                    kept.extend(found)

        add(_by_name(fleet_families(snapshot, self.wanted).by_family(), self._interned))
        kept: dict[str, tuple[NodeSnapshot, float, ByName]] = {}
        for node in snapshot.nodes:
            before = self._nodes.get(node.node)
            if before is not None and before[0] is node and (not self._timed or before[1] == now):
                part = before[2]
            else:
                part = _by_name(node_families(node, now, self.wanted).by_family(), self._interned)
            kept[node.node] = (node, now, part)
            add(part)
        self._nodes = kept
        held = sum(len(known) for known in self._interned.values())
        if held > 2 * sum(len(found) for found in out.values()) + 1000:
            self._interned = {}  # series gone since: made again as they come
        return out


def samples_by_name(snapshot: FleetSnapshot, wanted: Collection[str]) -> ByName:
    """The samples of the metrics in `wanted`, by sample name, as of the snapshot's time."""
    return Series(wanted).samples(snapshot)
