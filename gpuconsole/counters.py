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
    """Per-second rates from successive raw counter samples."""

    def __init__(self) -> None:
        self._last: dict[Key, tuple[int, float]] = {}
        self.resets = 0

    def update(self, samples: Iterable[CounterSample], at: float) -> dict[Key, float]:
        rates: dict[Key, float] = {}
        last = self._last
        seen: dict[Key, tuple[int, float]] = {}
        for sample in samples:
            prev = last.get(sample.key)
            seen[sample.key] = (sample.value, at)
            if prev is None:
                continue
            dt = at - prev[1]
            if dt <= 0:
                continue
            delta = counter_delta(prev[0], sample.value, sample.bits)
            if delta is None:
                self.resets += 1
                continue
            rates[sample.key] = delta / dt
        # Counters that vanished (a GPU lost, a port gone) are forgotten.
        self._last = seen
        return rates
