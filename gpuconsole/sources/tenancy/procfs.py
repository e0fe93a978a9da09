"""Small readers of /proc (under a configurable root) shared by the QEMU and cgroup scans."""

from __future__ import annotations

import os
from collections.abc import Iterator

__all__ = ["Clock", "comm", "command_line", "pids", "real_uid", "users"]


def pids(proc_root: str) -> Iterator[int]:
    """Every process id under proc_root, in no particular order."""
    try:
        names = os.listdir(proc_root)
    except OSError:
        return
    for name in names:
        if name.isascii() and name.isdigit():
            yield int(name)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def read_text(proc_root: str, pid: int, name: str) -> str | None:
    data = _read(os.path.join(proc_root, str(pid), name))
    return data.decode("utf-8", "replace") if data is not None else None


def command_line(proc_root: str, pid: int) -> tuple[str, ...]:
    """A process's argv (empty for kernel threads and vanished processes)."""
    data = _read(os.path.join(proc_root, str(pid), "cmdline"))
    if not data:
        return ()
    return tuple(part.decode("utf-8", "replace") for part in data.rstrip(b"\0").split(b"\0"))


def comm(proc_root: str, pid: int) -> str:
    text = read_text(proc_root, pid, "comm")
    return text.strip() if text else ""


def real_uid(proc_root: str, pid: int) -> int | None:
    """The real user id from /proc/PID/status."""
    text = read_text(proc_root, pid, "status")
    for line in (text or "").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) > 1 and fields[1].isascii() and fields[1].isdigit():
                return int(fields[1])
    return None


def environ(proc_root: str, pid: int) -> dict[str, str]:
    """A process's initial environment (root may read any; others only their own)."""
    data = _read(os.path.join(proc_root, str(pid), "environ")) or b""
    out = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


class Clock:
    """Turns /proc/PID/stat start times (clock ticks since boot) into epoch seconds."""

    def __init__(self, proc_root: str) -> None:
        self.proc_root = proc_root
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.boot: float | None = None
        text = (_read(os.path.join(proc_root, "stat")) or b"").decode("ascii", "replace")
        for line in text.splitlines():
            if line.startswith("btime "):
                self.boot = float(line.split()[1])

    def started_at(self, pid: int) -> float | None:
        if self.boot is None:
            return None
        text = read_text(self.proc_root, pid, "stat")
        if not text:
            return None
        # comm (field 2) may hold spaces and parentheses: split after the last ')'
        rest = text[text.rfind(")") + 1 :].split()
        try:
            return self.boot + int(rest[19]) / self.ticks  # field 22: starttime
        except (IndexError, ValueError):
            return None


def users(passwd_file: str) -> dict[int, str]:
    """uid -> user name from a passwd file (the host's, or a test's)."""
    out: dict[int, str] = {}
    data = _read(passwd_file)
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isascii() and fields[2].isdigit():
            out.setdefault(int(fields[2]), fields[0])
    return out
