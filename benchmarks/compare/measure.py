"""The measurements: one-shot readings, then the exporters and the TUIs at 1 Hz side by side.

One-shot: each command runs `runs` times, the tools taking turns so that a burst of load from
elsewhere falls on all of them; medians. The first round (page cache, call counts) is not timed.

Steady state: gpuconsole agent, nvitop-exporter, gpuconsole console and nvitop's TUI run at
once, all at a 1 s interval, for the same window, so that background load on a shared machine
falls on all four alike. Both exporters are scraped at 1 Hz by the same client (this process),
as a Prometheus with a 1 s scrape interval would, so their CPU includes rendering /metrics.
Nothing scrapes faster until the window ends; then each exporter, alone, gets a sequential
burst of scrapes for latency and throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from benchmarks.compare.calls import LiveCounts, delta, per_refresh, total
from benchmarks.compare.fakenode import INTERVAL_S, NODE, Setup, free_port
from benchmarks.compare.procs import (
    Run,
    Tmux,
    ToolFailed,
    alive,
    cpu_s,
    peak_rss_bytes,
    rss_bytes,
    run_once,
    stop,
)
from gpuconsole.sim.fakenvml import COUNTS_ENV, read_counts_file

TUI_SIZE = (200, 50)
GPU_TABLE = r"GPU\s+util"  # the header of the console's node view
SLICE_S = 10.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The `q` quantile (0..1) by nearest rank, as the other benchmarks take p99."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(len(ordered) * q + 0.5) - 1))]


# --- one-shot ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OneShot:
    """Medians over the timed runs of one one-shot command."""

    tool: str
    runs: int
    wall_s: float
    cpu_s: float
    calls_per_gpu: float


def one_shot_commands(setup: Setup) -> dict[str, list[str]]:
    return {
        "gpuconsole snapshot --json": [
            *setup.gpuconsole,
            "snapshot",
            "--json",
            "-c",
            str(setup.config),
        ],
        "gpustat --json": [setup.tool("gpustat"), "--json"],
        "nvitop -1": [setup.tool("nvitop"), "-1"],
    }


def one_shot(setup: Setup, runs: int) -> dict[str, OneShot]:
    commands = one_shot_commands(setup)
    names = list(commands)
    timed: dict[str, list[Run]] = {name: [] for name in names}
    calls: dict[str, float] = {}
    counts_file = setup.tmp / "one-shot.counts"
    for round_ in range(runs + 1):
        log(f"one-shot: round {round_}/{runs}" + ("" if round_ else " (untimed: NVML calls)"))
        k = round_ % len(names)
        for name in names[k:] + names[:k]:
            env = setup.env
            if round_ == 0:
                counts_file.unlink(missing_ok=True)
                env = {**env, COUNTS_ENV: str(counts_file)}
            run = run_once(commands[name], env, setup.tmp / "one-shot.out", timeout_s=120)
            if round_ == 0:
                calls[name] = total(read_counts_file(counts_file)) / setup.gpus
            else:
                timed[name].append(run)
    return {
        name: OneShot(
            tool=name,
            runs=len(timed[name]),
            wall_s=statistics.median(r.wall_s for r in timed[name]),
            cpu_s=statistics.median(r.cpu_s for r in timed[name]),
            calls_per_gpu=calls[name],
        )
        for name in names
    }


# --- steady state ------------------------------------------------------------------------


@dataclass(frozen=True)
class Steady:
    """One long-running tool over the measured window."""

    tool: str
    window_s: float
    cpu_pct: float  # of one core, over the whole window
    cpu_pct_slice_median: float  # median over 10 s slices: the same, less any one burst
    rss_bytes: float  # median of one sample a second
    peak_rss_bytes: int
    calls_per_gpu_per_refresh: float
    refreshes_per_s: float
    calls_by_function: dict[str, int]


@dataclass
class _Watch:
    """CPU, memory and NVML calls of one process across the window."""

    tool: str
    pid: int
    counts: LiveCounts
    t0: float = 0.0
    cpu0: float = 0.0
    calls0: dict[str, int] = field(default_factory=dict)
    cpu_samples: list[tuple[float, float]] = field(default_factory=list)
    rss_samples: list[int] = field(default_factory=list)

    def begin(self) -> None:
        self.t0, self.cpu0 = time.monotonic(), cpu_s(self.pid)
        self.calls0 = self.counts.read(self.pid)
        self.cpu_samples = [(self.t0, self.cpu0)]

    def sample(self) -> None:
        if not alive(self.pid):
            raise ToolFailed(f"{self.tool} (pid {self.pid}) exited during the measurement")
        self.cpu_samples.append((time.monotonic(), cpu_s(self.pid)))
        self.rss_samples.append(rss_bytes(self.pid))

    def end(self, gpus: int) -> Steady:
        calls = delta(self.counts.read(self.pid), self.calls0)
        t1, cpu1 = time.monotonic(), cpu_s(self.pid)
        window = t1 - self.t0
        per_gpu, refreshes = per_refresh(calls, gpus)
        slices = []
        start_t, start_cpu = self.cpu_samples[0]
        for t, c in [*self.cpu_samples[1:], (t1, cpu1)]:
            if t - start_t >= SLICE_S - 0.5:
                slices.append((c - start_cpu) / (t - start_t) * 100)
                start_t, start_cpu = t, c
        return Steady(
            tool=self.tool,
            window_s=window,
            cpu_pct=(cpu1 - self.cpu0) / window * 100,
            cpu_pct_slice_median=statistics.median(slices) if slices else float("nan"),
            rss_bytes=statistics.median(self.rss_samples),
            peak_rss_bytes=peak_rss_bytes(self.pid),
            calls_per_gpu_per_refresh=per_gpu,
            refreshes_per_s=refreshes / window,
            calls_by_function=calls,
        )


@dataclass(frozen=True)
class Scrapes:
    """An exporter's /metrics under a sequential burst of scrapes (and at 1 Hz before it)."""

    tool: str
    count: int
    p50_ms: float
    p99_ms: float
    per_s: float
    body_bytes: int
    at_1hz_p50_ms: float


@dataclass(frozen=True)
class SteadyResults:
    tools: dict[str, Steady]
    scrapes: dict[str, Scrapes]


AGENT = "gpuconsole agent"
EXPORTER = "nvitop-exporter"
CONSOLE = "gpuconsole console"
NVITOP_TUI = "nvitop (TUI)"
# a series each body carries once the first reading is in
READY = {AGENT: b"DCGM_FI_DEV_GPU_UTIL{", EXPORTER: b"gpu_utilization_Percentage{"}


async def scrape(http: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    began = time.perf_counter()
    async with http.get(url) as response:
        body = await response.read()
        response.raise_for_status()
    return time.perf_counter() - began, len(body)


async def wait_ready(
    http: aiohttp.ClientSession, tool: str, url: str, proc: subprocess.Popen[bytes], log_file: Path
) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ToolFailed(f"{tool} exited {proc.returncode}: {log_file.read_text()[-2000:]}")
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(url) as response:
                if READY[tool] in await response.read():
                    return
        await asyncio.sleep(0.2)
    raise ToolFailed(f"{tool} never served {READY[tool]!r} at {url}")


def start_logged(setup: Setup, argv: list[str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
    log_file = setup.tmp / f"{name}.log"
    with log_file.open("wb") as sink:
        proc = subprocess.Popen(argv, env=setup.env, stdout=sink, stderr=subprocess.STDOUT)
    return proc, log_file


def start_tuis(setup: Setup, tmux: Tmux) -> tuple[int, int]:
    """gpuconsole console and nvitop's TUI, each in a tmux session of TUI_SIZE; their pids."""
    console_argv = [*setup.gpuconsole, "console", "-c", str(setup.config)]
    console = tmux.start("console", console_argv, setup.fake_env, TUI_SIZE)
    nvitop_argv = [setup.tool("nvitop"), "--interval", f"{INTERVAL_S:g}"]
    return console, tmux.start("nvitop", nvitop_argv, setup.fake_env, TUI_SIZE)


def tuis_ready(tmux: Tmux, console: int, nvitop: int) -> None:
    """Wait for both TUIs to draw their data. The console opens on the fleet; Enter on the
    node opens its GPU table, the view nvitop shows."""
    tmux.wait_for("console", re.escape(NODE), console, 60)
    tmux.keys("console", "Enter")
    tmux.wait_for("console", GPU_TABLE, console, 30)
    tmux.wait_for("nvitop", r"NVITOP", nvitop, 60)


def tuis_alone(setup: Setup, duration_s: float, warmup_s: float) -> dict[str, Steady]:
    """The TUI row by itself (`--tui`): the console and nvitop as `steady` runs them, without
    the exporters beside them; a minute and a half, for a change to the console."""
    counts = LiveCounts(setup.library)
    tmux = Tmux(setup.tmp / "tmux.sock", setup.env)
    try:
        console, nvitop = start_tuis(setup, tmux)
        log("tui: starting the console and nvitop in tmux")
        tuis_ready(tmux, console, nvitop)
        time.sleep(warmup_s)
        watches = [_Watch(CONSOLE, console, counts), _Watch(NVITOP_TUI, nvitop, counts)]
        for w in watches:
            w.begin()
        log(f"tui: measuring for {duration_s:g} s")
        for tick in range(int(duration_s)):
            for w in watches:
                w.sample()
            time.sleep(max(0.0, watches[0].t0 + (tick + 1) * INTERVAL_S - time.monotonic()))
        results = {w.tool: w.end(setup.gpus) for w in watches}
        if not re.search(GPU_TABLE, tmux.screen("console")):
            raise ToolFailed("the console left its GPU table during the window")
        return results
    finally:
        tmux.close()


async def steady(setup: Setup, duration_s: float, warmup_s: float, burst: int) -> SteadyResults:
    """Run the four long-running tools together; measure the window; then burst-scrape."""
    counts = LiveCounts(setup.library)
    ports = {AGENT: free_port(), EXPORTER: free_port()}
    urls = {tool: f"http://127.0.0.1:{port}/metrics" for tool, port in ports.items()}
    with contextlib.ExitStack() as cleanup:
        agent, agent_log = start_logged(
            setup,
            [
                *setup.gpuconsole,
                "agent",
                "-c",
                str(setup.config),
                "--listen",
                f"127.0.0.1:{ports[AGENT]}",
            ],
            "agent",
        )
        cleanup.callback(stop, agent)
        exporter, exporter_log = start_logged(
            setup,
            [
                setup.tool("nvitop-exporter"),
                "--bind-address",
                "127.0.0.1",
                "--port",
                str(ports[EXPORTER]),
                "--interval",
                f"{INTERVAL_S:g}",
                "--hostname",
                NODE,
            ],
            "exporter",
        )
        cleanup.callback(stop, exporter)
        tmux = Tmux(setup.tmp / "tmux.sock", setup.env)
        cleanup.callback(tmux.close)
        console, nvitop = start_tuis(setup, tmux)

        async with aiohttp.ClientSession() as http:
            log("steady: starting the agent, nvitop-exporter, the console and nvitop in tmux")
            await wait_ready(http, AGENT, urls[AGENT], agent, agent_log)
            await wait_ready(http, EXPORTER, urls[EXPORTER], exporter, exporter_log)
            tuis_ready(tmux, console, nvitop)
            await asyncio.sleep(warmup_s)

            watches = [
                _Watch(AGENT, agent.pid, counts),
                _Watch(EXPORTER, exporter.pid, counts),
                _Watch(CONSOLE, console, counts),
                _Watch(NVITOP_TUI, nvitop, counts),
            ]
            for w in watches:
                w.begin()
            t0 = watches[0].t0
            at_1hz: dict[str, list[float]] = {AGENT: [], EXPORTER: []}
            log(f"steady: measuring for {duration_s:g} s")
            for tick in range(int(duration_s)):
                for tool, (seconds, _size) in zip(
                    urls,
                    await asyncio.gather(*(scrape(http, u) for u in urls.values())),
                    strict=True,
                ):
                    at_1hz[tool].append(seconds)
                for w in watches:
                    w.sample()
                await asyncio.sleep(max(0.0, t0 + (tick + 1) * INTERVAL_S - time.monotonic()))
            results = {w.tool: w.end(setup.gpus) for w in watches}
            if not re.search(GPU_TABLE, tmux.screen("console")):
                raise ToolFailed("the console left its GPU table during the window")

            scrapes = {}
            for tool, url in urls.items():
                log(f"steady: {burst} sequential scrapes of {tool}")
                latencies, size = [], 0
                began = time.perf_counter()
                for _ in range(burst):
                    seconds, size = await scrape(http, url)
                    latencies.append(seconds)
                wall = time.perf_counter() - began
                scrapes[tool] = Scrapes(
                    tool=tool,
                    count=burst,
                    p50_ms=statistics.median(latencies) * 1000,
                    p99_ms=percentile(latencies, 0.99) * 1000,
                    per_s=burst / wall,
                    body_bytes=size,
                    at_1hz_p50_ms=statistics.median(at_1hz[tool]) * 1000,
                )
    return SteadyResults(results, scrapes)
