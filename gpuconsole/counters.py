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
    """Per-second rates from successive raw counter samples of one source."""

    def __init__(self) -> None:
        self._last: dict[Key, int] = {}
        self._last_at: float | None = None
        self.resets = 0

    def update(self, samples: Iterable[CounterSample], at: float) -> dict[Key, float]:
        """Rates since the previous update; counters seen for the first time have none."""
        rates: dict[Key, float] = {}
        last = self._last
        seen: dict[Key, int] = {}
        dt = at - self._last_at if self._last_at is not None else 0.0
        for key, value, bits, _history in samples:
            seen[key] = value
            prev = last.get(key)
            if prev is None or dt <= 0:
                continue
            if value >= prev:
                rates[key] = (value - prev) / dt
                continue
            delta = counter_delta(prev, value, bits)
            if delta is None:
                self.resets += 1
            else:
                rates[key] = delta / dt
        # Counters that vanished (a GPU lost, a port gone) are forgotten.
        self._last = seen
        self._last_at = at
        return rates
