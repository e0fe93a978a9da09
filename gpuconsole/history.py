"""Bounded history rings for sparklines, and frozen views of them for snapshots."""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from gpuconsole.readings.base import Key


class HistoryStore:
    """One node's rings, keyed by series: a fixed-capacity ring of floats per series, and
    the count of every value ever written to it. Written by the hub only.

    Each value is kept as a 32-bit float: a head keeps some forty series of 300 points for
    each of a thousand nodes, and a gauge's sparkline needs no more than its 7 digits (an
    integer reads back exactly, and so do the halves and quarters of one).

    A head records a thousand nodes' forty series a second and views each node it
    publishes: the counts sit in one dict beside the rings, so that a view copies that dict
    whole and a record writes a point with no call per series.
    """

    __slots__ = ("_rings", "_written", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._rings: dict[Key, array[float]] = {}
        self._written: dict[Key, int] = {}

    def record(self, samples: Iterable[tuple[Key, float]]) -> None:
        rings, written, capacity = self._rings, self._written, self.capacity
        count = written.get
        for key, value in samples:
            n = count(key)
            if n is None:
                n = 0
                rings[key] = array("f", bytes(4 * capacity))
            rings[key][n % capacity] = value
            written[key] = n + 1

    @property
    def nbytes(self) -> int:
        """The bytes its rings' points take."""
        return sum(ring.itemsize * len(ring) for ring in self._rings.values())

    def values(self, key: Key, upto: int | None = None) -> tuple[float, ...]:
        """The values of `key` written before its `upto`th (default: all) that its ring
        still holds."""
        ring, written = self._rings.get(key), self._written.get(key, 0)
        if ring is None:
            return ()
        end = written if upto is None else min(upto, written)
        capacity = self.capacity
        start = max(0, end - capacity, written - capacity)
        return tuple(ring[i % capacity] for i in range(start, end))

    def view(self) -> HistoryView:
        return HistoryView(self, self._written.copy())


class HistoryView:
    """History as of one snapshot: later writes are not visible through it."""

    __slots__ = ("_marks", "_store")

    def __init__(self, store: HistoryStore, marks: dict[Key, int]) -> None:
        self._store = store
        self._marks = marks

    def series(self, *key: str) -> tuple[float, ...]:
        mark = self._marks.get(key)
        if mark is None:
            return ()
        return self._store.values(key, mark)

    def keys(self) -> list[Key]:
        return list(self._marks)
