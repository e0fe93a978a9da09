"""Raw counters to deltas and rates: 32-bit wrap and resets are decided here, once."""

from __future__ import annotations

from collections.abc import Iterable

from gpuconsole.readings.base import Key, RawCounter


def counter_delta(previous: int, current: int, bits: int) -> int | None:
    """How far a counter moved, across one wrap; None when it was reset."""
    if current >= previous:
        return current - previous
    if bits < 64:
        wrapped = current + (1 << bits) - previous
        if wrapped < (1 << (bits - 1)):
            return wrapped
    return None


class RateTracker:
    """Per-second rates, and per-interval deltas where asked, from successive raw counter
    samples of one source."""

    def __init__(self) -> None:
        self._last: dict[Key, int] = {}
        self._last_at: float | None = None
        self.resets = 0
        # Of the last update: how far each counter sampled with `delta` moved, only those
        # that moved (errors are rare, so this stays small), and the interval it covers.
        self.deltas: dict[Key, int] = {}
        self.interval_s: float | None = None
        # Of the last update: the rates of the counters sampled with `history`.
        self.history: list[tuple[Key, float]] = []

    def update(self, samples: Iterable[RawCounter], at: float) -> dict[Key, float]:
        """Rates since the previous update; counters seen for the first time have none."""
        rates: dict[Key, float] = {}
        deltas: dict[Key, int] = {}
        history: list[tuple[Key, float]] = []
        seen: dict[Key, int] = {}
        dt = at - self._last_at if self._last_at is not None else 0.0
        last = self._last if dt > 0 else {}  # no interval to divide by: only record
        previous = last.get
        # One pass, no helper calls but for a counter that went back: a DGX yields
        # hundreds of counters a poll and this loop is most of the hub's work.
        for key, value, bits, keep_history, keep_delta in samples:
            seen[key] = value
            prev = previous(key)
            if prev is None:
                continue
            moved = value - prev
            if moved < 0:
                wrapped = counter_delta(prev, value, bits)
                if wrapped is None:
                    self.resets += 1
                    continue
                moved = wrapped
            rate = rates[key] = moved / dt
            if keep_history:
                history.append((key, rate))
            if keep_delta and moved:
                deltas[key] = moved
        # Counters that vanished (a GPU lost, a port gone) are forgotten.
        self._last = seen
        self._last_at = at
        self.deltas = deltas
        self.history = history
        self.interval_s = dt if dt > 0 else None
        return rates
