"""Bounded history rings for sparklines, and frozen views of them for snapshots."""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from gpuconsole.readings.base import Key


class Ring:
    """A fixed-capacity ring of floats that counts every value ever written.

    Each value is kept as a 32-bit float: a head keeps some forty series of 300 points for
    each of a thousand nodes, and a gauge's sparkline needs no more than its 7 digits (an
    integer reads back exactly, and so do the halves and quarters of one).
    """

    __slots__ = ("_data", "capacity", "written")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data = array("f", bytes(4 * capacity))
        self.written = 0

    def append(self, value: float) -> None:
        self._data[self.written % self.capacity] = value
        self.written += 1

    def values(self, upto: int | None = None) -> tuple[float, ...]:
        """The values written before `upto` (default: all) that the ring still holds."""
        end = self.written if upto is None else min(upto, self.written)
        start = max(0, end - self.capacity, self.written - self.capacity)
        cap, data = self.capacity, self._data
        return tuple(data[i % cap] for i in range(start, end))


class HistoryStore:
    """One node's rings, keyed by series. Written by the hub only."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._rings: dict[Key, Ring] = {}

    def record(self, samples: Iterable[tuple[Key, float]]) -> None:
        rings = self._rings
        for key, value in samples:
            ring = rings.get(key)
            if ring is None:
                ring = rings[key] = Ring(self.capacity)
            ring.append(value)

    @property
    def nbytes(self) -> int:
        """The bytes its rings' points take."""
        return sum(ring._data.itemsize * ring.capacity for ring in self._rings.values())

    def view(self) -> HistoryView:
        return HistoryView(self, {key: ring.written for key, ring in self._rings.items()})


class HistoryView:
    """History as of one snapshot: later writes are not visible through it."""

    __slots__ = ("_marks", "_store")

    def __init__(self, store: HistoryStore, marks: dict[Key, int]) -> None:
        self._store = store
        self._marks = marks

    def series(self, *key: str) -> tuple[float, ...]:
        mark = self._marks.get(key)
        ring = self._store._rings.get(key)
        if mark is None or ring is None:
            return ()
        return ring.values(mark)

    def keys(self) -> list[Key]:
        return list(self._marks)
