"""The XIDs each GPU raised within the health window, counted per code, until its next reset.

Kept per GPU by its bus id (its UUID where NVML never told the bus id), never by NVML index.
What clears a GPU's history is a reset seen by NVML: the GPU was lost (or gone from NVML's list)
and answers again, in this NVML session or a new one. A GPU comes back from XID 79 only through
a reset or a reboot. A reset that NVML never showed as the GPU lost or gone (one between two
polls that both read it) goes unseen: its XIDs age out of the window instead. A reboot clears them too: the history lives
in this process, which a reboot ends. Counts are exact; the window's edge is kept to the minute.
"""

from __future__ import annotations

import threading
from collections import deque

import msgspec

from gpuconsole.readings.nvml import XID_WINDOW_S, XidCount

# XIDs of one code that fall in the same minute share a bucket: a storm of thousands a second
# costs a bucket per minute of the window, not an entry per event.
BUCKET_S = 60.0


class _Bucket(msgspec.Struct):
    minute: int
    count: int
    first_at: float
    last_at: float


class _Code(msgspec.Struct):
    buckets: deque[_Bucket] = msgspec.field(default_factory=deque)


class XidHistory:
    """XIDs per GPU and code, within `window_s` of now (thread-safe: events arrive in the
    event watcher's thread, readings are made in the poller's)."""

    def __init__(self, window_s: float = XID_WINDOW_S) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._gpus: dict[str, dict[int, _Code]] = {}
        self._resets: dict[str, float] = {}  # by GPU: when NVML last saw it come back

    def add(self, gpu: str, code: int, at: float) -> None:
        """One XID `code` that GPU `gpu` (bus id or UUID) raised at `at`."""
        minute = int(at // BUCKET_S)
        with self._lock:
            buckets = self._gpus.setdefault(gpu, {}).setdefault(code, _Code()).buckets
            last = buckets[-1] if buckets else None
            if last is not None and last.minute == minute:
                last.count += 1
                last.first_at = min(last.first_at, at)
                last.last_at = max(last.last_at, at)
            else:
                buckets.append(_Bucket(minute, 1, at, at))

    def counts(self, gpu: str, now: float) -> tuple[XidCount, ...]:
        """Each code this GPU raised within the window before `now`, lowest code first."""
        since = now - self.window_s
        found: list[XidCount] = []
        with self._lock:
            codes = self._gpus.get(gpu)
            if not codes:
                return ()
            for code in sorted(codes):
                buckets = codes[code].buckets
                while buckets and buckets[0].last_at < since:
                    buckets.popleft()
                if not buckets:
                    del codes[code]
                    continue
                found.append(
                    XidCount(
                        code=code,
                        count=sum(b.count for b in buckets),
                        first_at=buckets[0].first_at,
                        last_at=buckets[-1].last_at,
                    )
                )
        return tuple(found)

    def clear(self, gpu: str, at: float) -> None:
        """Forget a GPU's XIDs: it was reset (NVML saw it come back at `at`)."""
        with self._lock:
            self._gpus.pop(gpu, None)
            self._resets[gpu] = at

    def reset_at(self, gpu: str, now: float) -> float | None:
        """When NVML last saw this GPU come back from a reset, within the window before
        `now`; None if not since this process began, or longer ago."""
        with self._lock:
            at = self._resets.get(gpu)
            if at is not None and at < now - self.window_s:
                del self._resets[gpu]
                return None
            return at
