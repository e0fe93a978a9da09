"""The audit log: one JSON line per action asked for, whatever came of it.

In the machine's shared folder each Unix user appends to a file of their own beside the
log's name (`audit.alice.jsonl` beside `audit.jsonl`), mode 0640: the operators' group
reads every record and can change none but its own. Linux gives no append-only permission
that a user can set (`chattr +a` needs CAP_LINUX_IMMUTABLE, so root), and a file the group
may append to it may as well truncate; so a record is the word of the uid that owns its
file, and the folder's sticky bit keeps one user from deleting another's file. A log in a
user's own folder is one file, 0600.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuconsole import paths
from gpuconsole.actions.roles import login_name, user_name

SHARED_MODE = 0o640  # the writer appends; the operators' group reads
PRIVATE_MODE = 0o600
_OPEN = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK  # no link, no FIFO wait
_NOT_OURS = (errno.EACCES, errno.EPERM, errno.ELOOP, errno.ENXIO)


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
    """Appends records to a JSON-lines file: each record whole or not at all, so that a
    full disk never leaves a fragment that makes the log unreadable. `shared`: the
    machine's folder, where this process writes only to its own user's file."""

    def __init__(self, path: Path, *, shared: bool = False) -> None:
        self.path = path
        self.shared = shared
        self._lock = threading.Lock()
        self._own: Path | None = None  # this user's file in a shared folder, once found

    def append(self, record: AuditRecord) -> None:
        """Write `record`; raises OSError, naming the log, with nothing of it written."""
        body = asdict(record)
        body["args"] = dict(record.args)
        body["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(record.at))
        line = (json.dumps(body, sort_keys=True) + "\n").encode()
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = self._open()
            try:
                # other processes append to the same file: none may write between our
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
                    raise OSError(exc.errno, exc.strerror, str(self.file)) from None
            finally:
                os.close(fd)

    @property
    def file(self) -> Path:
        """The file this process appends to (in a shared folder, once it has)."""
        return self._own or self.path

    def cannot_write(self, exc: OSError) -> str:
        """What to tell a person when an append raised `exc`."""
        return f"the audit log {self.file} cannot be written ({exc.strerror or exc})"

    def _open(self) -> int:
        if not self.shared:
            paths.create_file(self.path, PRIVATE_MODE)
            return os.open(self.path, os.O_WRONLY | os.O_APPEND)
        if self._own is None:
            _seal(self.path)
        user = login_name()
        mine = self.path.with_name(f"{self.path.stem}.{user}{self.path.suffix}")
        # a file of that name someone else made first leaves this user another, made anew
        pattern = glob.escape(f"{mine.stem}+") + "*" + glob.escape(self.path.suffix)
        for path in (self._own, mine, *sorted(self.path.parent.glob(pattern))):
            fd = None if path is None else _open_own(path)
            if fd is not None:
                self._own = path
                return fd
        for path in (mine, mine.with_name(f"{mine.stem}+{secrets.token_hex(4)}{mine.suffix}")):
            try:
                fd = os.open(path, _OPEN | os.O_CREAT | os.O_EXCL, SHARED_MODE)
            except FileExistsError:  # made since: by this user's other process, or another's
                taken = _open_own(path)
                if taken is None:
                    continue
                fd = taken
            else:
                os.fchmod(fd, SHARED_MODE)  # whatever the umask
            self._own = path
            return fd
        raise FileExistsError(errno.EEXIST, "taken by another user", str(mine))

    def records(self) -> list[dict[str, Any]]:
        """Every record so far, oldest first. A record from a writer's own file carries
        `writer`: the Unix user that owns the file, and so wrote it, whatever it says."""
        found = [_read(self.path)]
        pattern = glob.escape(f"{self.path.stem}.") + "*" + glob.escape(self.path.suffix)
        for path in sorted(self.path.parent.glob(pattern)):
            found.append(_read(path, writer=True))
        if sum(1 for part in found if part) <= 1:
            return [r for part in found for r in part]  # in the order they were written
        return sorted((r for part in found for r in part), key=lambda r: float(r.get("at", 0)))


def _open_own(path: Path) -> int | None:
    """`path` open to append, if it is a file this process's uid owns; else None."""
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in _NOT_OURS:  # another's (or root's), a link, a FIFO
            return None
        raise
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    if info.st_mode & 0o022:  # made writable for others since: no longer only ours
        os.fchmod(fd, SHARED_MODE)
    return fd


def _seal(path: Path) -> None:
    """The log every user once wrote: no longer written, so read-only for the group where
    this user owns it (only its owner may change its mode)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if info.st_uid == os.getuid() and stat.S_ISREG(info.st_mode) and info.st_mode & 0o022:
        path.chmod(stat.S_IMODE(info.st_mode) & ~0o022)


def _read(path: Path, *, writer: bool = False) -> list[dict[str, Any]]:
    """The records in `path`; with `writer`, each marked with the user owning the file. A
    link or anything but a file in the folder is no one's records."""
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_NOFOLLOW | os.O_NONBLOCK if writer else 0))
    except FileNotFoundError:
        return []
    except OSError as exc:
        if writer and exc.errno in _NOT_OURS:
            return []
        raise
    with open(fd, encoding="utf-8") as f:
        info = os.fstat(fd)
        if writer and not stat.S_ISREG(info.st_mode):
            return []
        text = f.read()
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    if writer:
        owner = user_name(info.st_uid)
        for record in records:
            record["writer"] = owner
    return records
