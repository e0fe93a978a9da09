"""The audit log: one JSON line per action asked for, whatever came of it."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuconsole import paths


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """Who asked for what, when, and what came of it ("started", then "ok", "failed" or
    "stopped" (half-way, left to recovery); "refused"; or "recovered")."""

    at: float
    user: str
    role: str
    action: str
    target: str
    outcome: str
    detail: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)
    key_fingerprint: str | None = None  # the ssh key that asked; None for local users


class AuditLog:
    """Appends records to a JSON-lines file, created with `mode`: each record whole or not at
    all, so that a full disk never leaves a fragment that makes the log unreadable."""

    def __init__(self, path: Path, *, mode: int = 0o600) -> None:
        self.path = path
        self.mode = mode
        self._lock = threading.Lock()

    def append(self, record: AuditRecord) -> None:
        """Write `record`; raises OSError, naming the log, with nothing of it written."""
        body = asdict(record)
        body["args"] = dict(record.args)
        body["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(record.at))
        line = (json.dumps(body, sort_keys=True) + "\n").encode()
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            paths.create_file(self.path, self.mode)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                # other processes append to the same log: none may write between our
                # record's start and a truncation that takes back a part of it
                fcntl.flock(fd, fcntl.LOCK_EX)
                end = os.lseek(fd, 0, os.SEEK_END)
                written = 0
                try:
                    while written < len(line):  # a full disk takes a part, then says ENOSPC
                        taken = os.write(fd, line[written:])
                        if taken == 0:
                            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                        written += taken
                except OSError as exc:
                    if written:
                        os.ftruncate(fd, end)
                    raise OSError(exc.errno, exc.strerror, str(self.path)) from None
            finally:
                os.close(fd)

    def cannot_write(self, exc: OSError) -> str:
        """What to tell a person when an append raised `exc`."""
        return f"the audit log {self.path} cannot be written ({exc.strerror or exc})"

    def records(self) -> list[dict[str, Any]]:
        """Every record so far, oldest first."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]
