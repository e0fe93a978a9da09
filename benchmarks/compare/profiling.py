"""py-spy profiles of gpuconsole's side of each comparison: where its CPU (and wall) goes.

A separate run from the measurement (`--profile DIR`): a sampling profiler stops the process
it samples, which would bias the figures. Writes py-spy's collapsed stacks (load them into
speedscope or flamegraph.pl) and a summary of the top functions by own and inclusive samples.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections import Counter
from pathlib import Path

import aiohttp

from benchmarks.compare.fakenode import NODE, Setup, free_port
from benchmarks.compare.measure import (
    AGENT,
    GPU_TABLE,
    TUI_SIZE,
    log,
    scrape,
    start_logged,
    wait_ready,
)
from benchmarks.compare.procs import Tmux, ToolFailed, stop

TOP = 25
_LINE = re.compile(r":\d+\)$")


def summarize(raw: Path, top: int = TOP) -> str:
    """The functions with the most samples, own and inclusive, from collapsed stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        count = int(n)
        samples += count
        frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    out = [f"{raw.name}: {samples} samples"]
    for title, counter in (("own", own), ("inclusive", inclusive)):
        out.append(f"  top {top} by {title} samples:")
        out += [f"    {n / samples * 100:5.1f}%  {frame}" for frame, n in counter.most_common(top)]
    return "\n".join(out)


def _py_spy(setup: Setup, out: Path, *args: str, rate: int, on_cpu: bool = True) -> list[str]:
    """py-spy's command line. On CPU: only samples that hold the GIL, since here its idle
    detection misses threads waiting in select, a queue or NVML's event wait."""
    return [
        setup.tool("py-spy"),
        "record",
        "--format",
        "raw",
        "--rate",
        str(rate),
        "--output",
        str(out),
        *(("--gil",) if on_cpu else ("--idle", "--threads")),
        *args,
    ]


def _record(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise ToolFailed(f"py-spy failed: {proc.stderr[-2000:]}")


async def _agent(setup: Setup, out: Path, duration_s: float) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [*setup.gpuconsole, "agent", "-c", str(setup.config), "--listen", f"127.0.0.1:{port}"]
    agent, agent_log = start_logged(setup, argv, "profile-agent")
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, AGENT, url, agent, agent_log)
            record = asyncio.create_task(
                asyncio.to_thread(
                    _record,
                    _py_spy(
                        setup,
                        out,
                        "--pid",
                        str(agent.pid),
                        "--duration",
                        f"{duration_s:g}",
                        rate=250,
                    ),
                    setup.env,
                )
            )
            while not record.done():  # scraped at 1 Hz, as in the measurement
                await scrape(http, url)
                await asyncio.wait({record}, timeout=1.0)
            await record
    finally:
        stop(agent)


def _console(setup: Setup, out: Path, duration_s: float) -> None:
    tmux = Tmux(setup.tmp / "profile-tmux.sock", setup.env)
    try:
        argv = [*setup.gpuconsole, "console", "-c", str(setup.config)]
        pid = tmux.start("console", argv, setup.fake_env, TUI_SIZE)
        tmux.wait_for("console", re.escape(NODE), pid, 60)
        tmux.keys("console", "Enter")
        tmux.wait_for("console", GPU_TABLE, pid, 30)
        _record(
            _py_spy(setup, out, "--pid", str(pid), "--duration", f"{duration_s:g}", rate=250),
            setup.env,
        )
    finally:
        tmux.close()


def profile(setup: Setup, folder: Path, duration_s: float) -> str:
    """Profile gpuconsole's one-shot, agent and console; the summaries, also in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    snapshot = [*setup.gpuconsole, "snapshot", "--json", "-c", str(setup.config)]
    log("profile: gpuconsole snapshot --json (CPU, then wall with idle threads)")
    _record(_py_spy(setup, folder / "one-shot-cpu.txt", "--", *snapshot, rate=1000), setup.env)
    _record(
        _py_spy(setup, folder / "one-shot-wall.txt", "--", *snapshot, rate=1000, on_cpu=False),
        setup.env,
    )
    log(f"profile: gpuconsole agent for {duration_s:g} s, scraped at 1 Hz")
    asyncio.run(_agent(setup, folder / "agent.txt", duration_s))
    log(f"profile: gpuconsole console (node view) for {duration_s:g} s")
    _console(setup, folder / "console.txt", duration_s)
    names = ("one-shot-cpu.txt", "one-shot-wall.txt", "agent.txt", "console.txt")
    text = "\n\n".join(summarize(folder / name) for name in names)
    (folder / "summary.txt").write_text(text + "\n")
    return text
