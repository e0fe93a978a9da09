"""How far some counters climbed over a window of time: what a health check counts ("link
downed twice in the last 10 min"), where the hub's per-interval deltas show one poll only and
a fault that came once would be gone from the verdict at the next poll."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
# (when, the counters' values; None where one was not read)
_Sample = tuple[float, tuple[int | None, ...]]


class ClimbWindow(Generic[K]):
    """Counters of many things (links, ports), each thing's sampled every `window_s / 10`
    seconds: a few samples each, however often it is polled. A counter that went back (the
    driver reloaded, a reset, `perfquery -R`) or one that came or went starts the window of
    its thing again: a climb is only ever counted between two readings of the same run."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._step_s = window_s / 10.0
        self._samples: dict[K, deque[_Sample]] = {}

    def add(
        self, now: float, key: K, values: Sequence[int | None]
    ) -> tuple[tuple[int, ...], float] | None:
        """This poll's counters of `key`; how far each climbed since the oldest sample in the
        window, and over how many seconds; None when none did."""
        sample = (now, tuple(values))
        kept = self._samples.get(key)
        if kept is None or _went_back(kept[-1][1], sample[1]):
            self._samples[key] = deque((sample,))
            return None
        start = now - self.window_s
        while len(kept) > 1 and kept[1][0] <= start:
            kept.popleft()
        if now - kept[-1][0] >= self._step_s:
            kept.append(sample)
        first = kept[0]
        climbed = tuple(
            0 if a is None or b is None else b - a for a, b in zip(first[1], sample[1], strict=True)
        )
        if not any(climbed):
            return None
        return climbed, now - first[0]

    def forget(self, keys: Iterable[K]) -> None:
        """Keep only `keys` (those read this poll): a thing not read starts again when it is."""
        keep = set(keys)
        for key in [k for k in self._samples if k not in keep]:
            del self._samples[key]


def _went_back(before: tuple[int | None, ...], now: tuple[int | None, ...]) -> bool:
    if len(before) != len(now):
        return True
    for a, b in zip(before, now, strict=True):
        if (a is None) != (b is None) or (a is not None and b is not None and b < a):
            return True
    return False
