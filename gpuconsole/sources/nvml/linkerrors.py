"""How far each NVLink's error counters climbed over a window: a counter that keeps climbing
is a link to watch, then to drain and reseat; one that moved once, long ago, is history."""

from __future__ import annotations

from gpuconsole.readings.nvml import NVLINK_ERROR_WINDOW_S, NvLinkErrors
from gpuconsole.sources.climb import ClimbWindow


class LinkErrorWindow:
    """One GPU's links, each sampled every `window_s / 10` seconds: a few samples per link,
    however often the GPU is polled."""

    def __init__(self, window_s: float = NVLINK_ERROR_WINDOW_S) -> None:
        self.window_s = window_s
        self._window: ClimbWindow[int] = ClimbWindow(window_s)

    def add(
        self, now: float, link: int, replay: int | None, recovery: int | None, crc: int | None
    ) -> NvLinkErrors | None:
        """This poll's counters of `link`; how far they climbed since the oldest sample in
        the window, None when none did."""
        # a counter not read counts as 0, as the driver's own count before it moved
        moved = self._window.add(now, link, (replay or 0, recovery or 0, crc or 0))
        if moved is None:
            return None
        replays, recoveries, crcs = moved[0]
        return NvLinkErrors(link, replays, recoveries, crcs, window_s=self.window_s)

    def forget(self, links: set[int]) -> None:
        """Drop the links not read this poll (down now): their climb starts again when they
        come back."""
        self._window.forget(links)
