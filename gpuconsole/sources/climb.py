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
    driver reloaded, a reset, `perfquery -R`) starts the window of its thing again: a climb
    is only counted between two readings of the same run. A counter not read in a poll (a
    netdev's statistics missing once) counts nothing against a sample without it, and
    costs its thing's other counters nothing."""

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
        # below an older sample (reset while it was not read): nothing climbed, until that
        # sample has left the window
        climbed = tuple(
            0 if a is None or b is None or b < a else b - a
            for a, b in zip(first[1], sample[1], strict=True)
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
    return any(a is not None and b is not None and b < a for a, b in zip(before, now, strict=True))
