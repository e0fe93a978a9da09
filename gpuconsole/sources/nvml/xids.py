"""The XIDs each GPU raised within the health window, counted per code, until its next reset.

Kept per GPU by its bus id (its UUID where NVML never told the bus id), never by NVML index.
What clears a GPU's history is a reset seen by NVML: the GPU was lost (or gone from NVML's list)
and answers again, in this NVML session or a new one. It clears the XIDs whose recovery, as
NVIDIA's catalog names it, a reset or a reboot is (`facts.xids.reset_clears`); one that asks
for a person (support, the mechanicals) stays for its window. A GPU comes back from XID 79 only
through a reset or a reboot. A reset that NVML never showed as the GPU lost or gone (one
between two polls that both read it) goes unseen here: its XIDs age out of the window, unless
the action journal says a repair made the GPU fit (the verdict reads that). A reboot clears
them too: the history is kept in a state file with the kernel's boot id, so that a restart of
gpuconsole keeps it and a new boot id clears what a reboot recovers. Counts are exact; the
window's edge is kept to the minute.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import threading
from collections import deque
from pathlib import Path

import msgspec

from gpuconsole import paths
from gpuconsole.facts.xids import reset_clears
from gpuconsole.readings.base import safe_text
from gpuconsole.readings.nvml import XID_WINDOW_S, XidCount

log = logging.getLogger(__name__)

# XIDs of one code that fall in the same minute share a bucket: a storm of thousands a second
# costs a bucket per minute of the window, not an entry per event.
BUCKET_S = 60.0
# A state file larger than this is not one this process wrote (a day of minute buckets of
# every code on every GPU of a node is far smaller).
STATE_MAX_BYTES = 8 << 20


class _Bucket(msgspec.Struct):
    minute: int
    count: int
    first_at: float
    last_at: float


class _Code(msgspec.Struct):
    buckets: deque[_Bucket] = msgspec.field(default_factory=deque)


class _Saved(msgspec.Struct):
    """The state file: the boot it was written in, each GPU's buckets by code as (minute,
    count, first_at, last_at), when NVML last saw each GPU come back, and the GPUs lost."""

    boot_id: str
    gpus: dict[str, dict[int, list[tuple[int, int, float, float]]]] = {}
    resets: dict[str, float] = {}
    lost: list[str] = []


class XidHistory:
    """XIDs per GPU and code, within `window_s` of now (thread-safe: events arrive in the
    event watcher's thread, readings are made in the poller's). With a `path`, kept there
    across restarts of this process within one boot of the node (`boot`: its boot id; an
    unknown one keeps nothing, as a reboot could not be told from a restart)."""

    def __init__(
        self, window_s: float = XID_WINDOW_S, path: Path | None = None, boot: str = ""
    ) -> None:
        self.window_s = window_s
        self.path = path
        self._boot = boot
        self._lock = threading.Lock()
        self._gpus: dict[str, dict[int, _Code]] = {}
        self._resets: dict[str, float] = {}  # by GPU: when NVML last saw it come back
        self._lost: set[str] = set()  # GPUs off the bus, until NVML sees them come back
        self._loaded = path is None
        self._dirty = False

    def _load(self) -> None:
        """What this node's earlier process kept (under the lock, once): nothing from
        another boot, nothing from a file this process would not have written."""
        self._loaded = True
        if self.path is None or not self._boot:
            return
        try:
            # not a link followed, nor a FIFO waited on: the poller's thread reads it
            data = paths.read_own_file(self.path, STATE_MAX_BYTES)
            saved = msgspec.json.decode(data, type=_Saved)
        except FileNotFoundError:
            return
        except (OSError, paths.NotOwnFile, ValueError, msgspec.DecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            log.warning("%s: the XIDs of the last run cannot be read (%s); %s, starting "
                        "afresh", self.path, safe_text(str(why)), paths.put_aside(self.path))  # fmt: skip
            return
        rebooted = saved.boot_id != self._boot
        if rebooted:
            log.info("%s: the node rebooted since: what a reboot recovers is history", self.path)
        for gpu, codes in saved.gpus.items():
            for code, rows in codes.items():
                if rebooted and reset_clears(code):
                    continue
                kept = _Code()
                for minute, count, first_at, last_at in sorted(rows):
                    if count > 0 and math.isfinite(first_at) and math.isfinite(last_at):
                        kept.buckets.append(_Bucket(minute, count, first_at, last_at))
                if kept.buckets:
                    self._gpus.setdefault(gpu, {})[code] = kept
        if not rebooted:  # a reset in the boot before says nothing of this one
            self._resets = {g: at for g, at in saved.resets.items() if math.isfinite(at)}
            self._lost = set(saved.lost)

    def flush(self) -> None:
        """Write the history to its file where it changed since the last write (the poller
        calls it each round: a storm of XIDs costs one write a round, not one an event)."""
        if self.path is None or not self._boot:
            return
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            saved = _Saved(
                self._boot,
                {
                    gpu: {
                        code: [(b.minute, b.count, b.first_at, b.last_at) for b in c.buckets]
                        for code, c in codes.items()
                    }
                    for gpu, codes in self._gpus.items()
                },
                dict(self._resets),
                sorted(self._lost),
            )
        data = msgspec.json.encode(saved)
        folder = self.path.parent
        tmp = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".xids-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("%s: cannot keep the XID history: %s", self.path, exc)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def add(self, gpu: str, code: int, at: float) -> None:
        """One XID `code` that GPU `gpu` (bus id or UUID) raised at `at`."""
        minute = int(at // BUCKET_S)
        with self._lock:
            if not self._loaded:
                self._load()
            self._dirty = True
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
            if not self._loaded:
                self._load()
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
        """Forget the XIDs a reset recovers (NVML saw the GPU come back at `at`); those that
        ask for a person stay for their window."""
        with self._lock:
            if not self._loaded:
                self._load()
            codes = self._gpus.get(gpu, {})
            for code in [c for c in codes if reset_clears(c)]:
                del codes[code]
            self._lost.discard(gpu)
            self._resets[gpu] = at
            self._dirty = True

    def mark_lost(self, gpu: str) -> None:
        """GPU `gpu` fell off the bus: one this node's next process finds answering was reset
        in between (`was_lost`)."""
        with self._lock:
            if not self._loaded:
                self._load()
            if gpu not in self._lost:
                self._lost.add(gpu)
                self._dirty = True

    def was_lost(self, gpu: str) -> bool:
        """Whether GPU `gpu` was off the bus when last seen, in this boot of the node."""
        with self._lock:
            if not self._loaded:
                self._load()
            return gpu in self._lost

    def reset_at(self, gpu: str, now: float) -> float | None:
        """When NVML last saw this GPU come back from a reset, within the window before
        `now`; None if not in this boot of the node as far as known, or longer ago."""
        with self._lock:
            if not self._loaded:
                self._load()
            at = self._resets.get(gpu)
            if at is not None and at < now - self.window_s:
                del self._resets[gpu]
                return None
            return at
