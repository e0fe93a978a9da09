"""The processes the comparison starts: one-shot runs, servers, TUIs in tmux; their CPU and
memory read from the kernel; and stopping every one of them, by its own id."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ToolFailed(RuntimeError):
    """A compared tool exited with an error or never became ready."""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds that `pid` (all its threads) has used so far."""
    # fields after "(comm)": state is [0], utime [11], stime [12] (stat(5) numbers 3, 14, 15)
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise ToolFailed(f"/proc/{pid}/status has no {key}")


def rss_bytes(pid: int) -> int:
    """Resident memory of `pid` now."""
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """The largest resident memory `pid` has had."""
    return _status_kib(pid, "VmHWM") * 1024


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@dataclass(frozen=True)
class Run:
    """One finished run of a one-shot command, as the kernel accounted it."""

    wall_s: float
    cpu_s: float


def run_once(argv: Sequence[str], env: Mapping[str, str], out: Path, timeout_s: float) -> Run:
    """Run `argv` to completion, stdout to `out`; its own wall and CPU time.

    wait4 gives the child's rusage alone (the same accounting as RUSAGE_CHILDREN deltas). Its
    ru_maxrss is left out: subprocess starts the child with vfork, and the kernel carries the
    parent's peak memory over the exec into it.
    """
    err = out.with_suffix(".stderr")
    with out.open("wb") as sink, err.open("wb") as errors:
        began = time.perf_counter()
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=sink, stderr=errors)
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
        wall = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise ToolFailed(
            f"{shlex.join(argv)} exited {proc.returncode}: {err.read_text()[-2000:].strip()}"
        )
    return Run(wall, usage.ru_utime + usage.ru_stime)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """Interrupt `proc` as a user would (Ctrl-C), then terminate, then kill."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            proc.send_signal(sig)
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def stop_pid(pid: int, grace_s: float = 5.0) -> None:
    """The same for a process this one did not fork directly (a tmux pane's)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if not alive(pid):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


class Tmux:
    """A tmux server of our own (its own socket), for full-screen tools in a real terminal."""

    def __init__(self, socket: Path, env: Mapping[str, str]) -> None:
        self.socket = socket
        self.env = dict(env)
        self.pids: list[int] = []

    def _tmux(self, *args: str) -> str:
        proc = subprocess.run(
            ["tmux", "-S", str(self.socket), "-f", "/dev/null", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode != 0:
            raise ToolFailed(f"tmux {' '.join(args[:2])}: {proc.stderr.strip()}")
        return proc.stdout

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], size: tuple[int, int]
    ) -> int:
        """Run `argv` in a new detached session of `size` (columns, lines); its pid."""
        env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        cols, lines = size
        self._tmux(
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            str(cols),
            "-y",
            str(lines),
            *env_args,
            "exec " + shlex.join(argv),
        )
        # keep a crashed tool's last screen, so the error can be shown
        self._tmux("set-option", "-w", "-t", name, "remain-on-exit", "on")
        pid = int(self._tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())
        self.pids.append(pid)
        return pid

    def screen(self, name: str) -> str:
        """The text on the session's screen now."""
        return self._tmux("capture-pane", "-p", "-t", name)

    def keys(self, name: str, *keys: str) -> None:
        self._tmux("send-keys", "-t", name, *keys)

    def wait_for(self, name: str, pattern: str, pid: int, timeout_s: float) -> None:
        """Wait until the screen shows `pattern` (a regex); fail with the screen if never."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.screen(name)
            if re.search(pattern, text):
                return
            if not alive(pid):
                break
            time.sleep(0.2)
        raise ToolFailed(f"{name} never showed {pattern!r}; its screen:\n{self.screen(name)}")

    def close(self) -> None:
        """Stop the tools, then this server (only ours: it has its own socket)."""
        for pid in self.pids:
            stop_pid(pid, grace_s=3.0)
        if self.socket.exists():
            subprocess.run(
                ["tmux", "-S", str(self.socket), "kill-server"],
                capture_output=True,
                timeout=30,
                check=False,
            )
