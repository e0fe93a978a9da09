"""How fast gpuconsole starts: the demo's and the console's first frame (the one-shot beside
nvitop -1 is benchmarks.bench_one_shot).

- demo and console: `gpuconsole demo`, and `gpuconsole console` on the fake libnvidia-ml.so
  of a DGX H100 (every other source at its defaults, reading this machine), in a
  pseudo-terminal of 120x40; seconds from the exec to the fleet view's header (the layout)
  and to a node's row with its GPUs' utilisation (the first reading drawn), and the CPU
  the process took until then. Target: <= 1 s.
  Bytecode cached, as an installed package has it; one untimed start first.

Medians; the machine may be shared (its load is printed), so compare figures from one run.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import statistics
import struct
import sys
import tempfile
import termios
import time
from pathlib import Path

from benchmarks.timing import record
from gpuconsole.sim.fakenvml import (
    build_library,
    driver_of,
    environment,
)
from gpuconsole.sim.profiles import DGX_H100

ROOT = Path(__file__).resolve().parent.parent
RUNS = 5
SIZE = (120, 40)
FIRST_FRAME_TARGET_S = 1.0
_ESCAPES = re.compile(
    rb"\x1b\[[0-9;?<>=$]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]|\x1b[=>]"
)
LAYOUT = re.compile(rb"GBFT")  # the fleet table's header
# A node's row with its model and its GPUs' utilisation: NVML has read it (dgx-001's GPUs
# are its guests', and its model comes from sysfs)
DATA = re.compile(rb"dgx-\d{3}\s+H100\s+\d+ \d+")
FAKE_NODE = "dgx-h100-fake"
FAKE_DATA = re.compile(rb"dgx-h100-fake\s+H100\s+\d+ \d+")
# The console on the fake library: NVML from it, every other source at its defaults.
CONSOLE_CONFIG = f"""\
[host]
name = "{FAKE_NODE}"
"""


def first_frame(
    argv: list[str], env: dict[str, str], timeout_s: float = 30.0, data: re.Pattern[bytes] = DATA
) -> dict[str, float]:
    """Seconds from exec to the layout and to the first reading drawn, in a 120x40 pty."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the console
        os.execvpe(argv[0], argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
    began = time.perf_counter()
    seen, marks = b"", {}
    try:
        while "data" not in marks and time.perf_counter() - began < timeout_s:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
            text = _ESCAPES.sub(b"", seen)
            for name, pattern in (("layout", LAYOUT), ("data", data)):
                if name not in marks and pattern.search(text):
                    marks[name] = time.perf_counter() - began
                    marks[f"{name}_cpu"] = _cpu_s(pid)
    finally:
        _quit(pid, fd)
    return marks


def _cpu_s(pid: int) -> float:
    """The CPU time `pid` has taken so far, every thread's: the share of a start that does not
    depend on how busy the machine is."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _quit(pid: int, fd: int) -> None:
    """Quit as a user does (q), so that the demo removes its simulated trees; else the next
    start would sweep them up and be timed doing it."""
    os.write(fd, b"q")
    deadline = time.perf_counter() + 10.0
    while time.perf_counter() < deadline:
        if select.select([fd], [], [], 0.05)[0]:
            try:
                os.read(fd, 65536)
            except OSError:
                pass
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done:
            os.close(fd)
            return
    os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)
    os.close(fd)


def child_env(**more: str) -> dict[str, str]:
    """The environment of a timed gpuconsole: this one, with bytecode written and read as an
    installed package has it (a session that turns it off would time the compiler)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **more}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def _starts(
    label: str, name: str, argv: list[str], env: dict[str, str], data: re.Pattern[bytes]
) -> None:
    first_frame(argv, env, data=data)  # untimed: bytecode written, files in the page cache
    runs = [first_frame(argv, env, data=data) for _ in range(RUNS)]
    layout, drawn, cpu = (
        statistics.median(r.get(mark, float("inf")) for r in runs)
        for mark in ("layout", "data", "data_cpu")
    )
    print(f"start: `{name}` at {SIZE[0]}x{SIZE[1]}, median of {RUNS} (load {_load()})")
    print(f"  layout drawn {layout:.2f} s; first reading drawn {drawn:.2f} s "
          f"({cpu:.2f} s of CPU)   target <= {FIRST_FRAME_TARGET_S:g} s: "
          f"{_verdict(drawn <= FIRST_FRAME_TARGET_S)}")  # fmt: skip
    record(f"{label}: first frame with data", drawn, "s", at_most=FIRST_FRAME_TARGET_S)


def _demo(tmp: Path) -> None:
    env = child_env(TERM="xterm-256color", XDG_STATE_HOME=str(tmp / "state"),
                    XDG_CONFIG_HOME=str(tmp / "config"))  # fmt: skip
    _starts("demo", "gpuconsole demo", [sys.executable, "-m", "gpuconsole", "demo"], env, DATA)


def _console(tmp: Path) -> None:
    library = build_library(tmp / "lib", driver_of(DGX_H100))
    from gpuconsole.sim.fakenvml import write_profile

    profile = write_profile(DGX_H100, tmp / "dgx-h100.profile")
    config = tmp / "console.toml"
    config.write_text(CONSOLE_CONFIG)
    env = child_env(**environment(library.parent, profile), TERM="xterm-256color",
                    XDG_STATE_HOME=str(tmp / "state"), XDG_CONFIG_HOME=str(tmp / "config"))  # fmt: skip
    argv = [sys.executable, "-m", "gpuconsole", "console", "-c", str(config)]
    _starts("console", "gpuconsole console (fake NVML)", argv, env, FAKE_DATA)


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gpuconsole-bench-start-") as folder:
        tmp = Path(folder)
        _demo(tmp)
        _console(tmp)


if __name__ == "__main__":
    main()
