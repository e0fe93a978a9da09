"""How far each NVLink's error counters climbed over a window: a counter that keeps climbing
is a link to watch, then to drain and reseat; one that moved once, long ago, is history."""

from __future__ import annotations

from collections import deque

from gpuconsole.readings.nvml import NVLINK_ERROR_WINDOW_S, NvLinkErrors

# (when, replays, recoveries, CRC errors)
_Sample = tuple[float, int, int, int]


class LinkErrorWindow:
    """One GPU's links, each sampled every `window_s / 10` seconds: a few samples per link,
    however often the GPU is polled."""

    def __init__(self, window_s: float = NVLINK_ERROR_WINDOW_S) -> None:
        self.window_s = window_s
        self._step_s = window_s / 10.0
        self._samples: dict[int, deque[_Sample]] = {}

    def add(
        self, now: float, link: int, replay: int | None, recovery: int | None, crc: int | None
    ) -> NvLinkErrors | None:
        """This poll's counters of `link`; how far they climbed since the oldest sample in
        the window, None when none did."""
        sample = (now, replay or 0, recovery or 0, crc or 0)
        kept = self._samples.get(link)
        if kept is None or any(b < a for a, b in zip(kept[-1][1:], sample[1:], strict=True)):
            # first seen, or a counter went back (the driver reloaded, the GPU was reset)
            self._samples[link] = deque((sample,))
            return None
        start = now - self.window_s
        while len(kept) > 1 and kept[1][0] <= start:
            kept.popleft()
        if now - kept[-1][0] >= self._step_s:
            kept.append(sample)
        first = kept[0]
        climbed = (sample[1] - first[1], sample[2] - first[2], sample[3] - first[3])
        if not any(climbed):
            return None
        return NvLinkErrors(link, *climbed, window_s=self.window_s)

    def forget(self, links: set[int]) -> None:
        """Drop the links not read this poll (down now): their climb starts again when they
        come back."""
        for link in set(self._samples) - links:
            del self._samples[link]
