"""Raw counters to deltas and rates: 32-bit wrap and resets are decided here, once."""

from __future__ import annotations

from collections.abc import Iterable

from gpuconsole.model import CounterSample, Key


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

    def update(self, samples: Iterable[CounterSample], at: float) -> dict[Key, float]:
        """Rates since the previous update; counters seen for the first time have none."""
        rates: dict[Key, float] = {}
        deltas: dict[Key, int] = {}
        last = self._last
        seen: dict[Key, int] = {}
        dt = at - self._last_at if self._last_at is not None else 0.0
        for key, value, bits, _history, keep_delta in samples:
            seen[key] = value
            prev = last.get(key)
            if prev is None or dt <= 0:
                continue
            if value >= prev:
                moved = value - prev
            else:
                wrapped = counter_delta(prev, value, bits)
                if wrapped is None:
                    self.resets += 1
                    continue
                moved = wrapped
            rates[key] = moved / dt
            if keep_delta and moved:
                deltas[key] = moved
        # Counters that vanished (a GPU lost, a port gone) are forgotten.
        self._last = seen
        self._last_at = at
        self.deltas = deltas
        self.interval_s = dt if dt > 0 else None
        return rates
