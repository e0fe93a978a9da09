"""The table of figures with ratios (ours / theirs), the targets, and benchmarks/RESULTS.md."""

from __future__ import annotations

import datetime
import math
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks.compare.fakenode import BYTECODE_OFF, INTERVAL_S, Setup
from benchmarks.compare.measure import (
    AGENT,
    CONSOLE,
    EXPORTER,
    NVITOP_TUI,
    TUI_SIZE,
    OneShot,
    Steady,
    SteadyResults,
)

MIB = 2**20
OURS_ONE_SHOT = "gpuconsole snapshot --json"
STEADY_TARGET = 0.5  # our CPU at most half the anchor's
ONE_SHOT_TARGET = 1.0  # wall and CPU no more than nvitop -1's (and gpustat's wall)
ONE_SHOT_CALLS_PER_GPU = 30.0  # every NVML call is an ioctl on a real driver


@dataclass(frozen=True)
class Row:
    """One figure of ours beside the same figure of another tool."""

    section: str
    measure: str
    ours: float
    anchor: str
    theirs: float
    decimals: int = 1
    target: float | None = None  # the highest ours/theirs that meets it (lower is better)
    higher_is_better: bool = False
    ceiling: float | None = None  # the highest figure of ours that meets it, whatever theirs is

    @property
    def ratio(self) -> float:
        return self.ours / self.theirs if self.theirs else math.inf

    @property
    def met(self) -> bool | None:
        if self.ceiling is not None:
            return self.ours <= self.ceiling
        return None if self.target is None else self.ratio <= self.target

    def goal(self) -> str:
        """The target in words: a ratio to the anchor, or a ceiling on our own figure."""
        if self.ceiling is not None:
            return f"ours ≤ {self.ceiling:g}"
        return f"≤ {self.target:.2f}"

    def cells(self) -> list[str]:
        target = ""
        if self.met is not None:
            target = f"{self.goal()}: " + ("met" if self.met else "**NOT met**")
        elif self.higher_is_better:
            target = "(higher is better)"
        return [
            self.section,
            self.measure,
            f"{self.ours:.{self.decimals}f}",
            self.anchor,
            f"{self.theirs:.{self.decimals}f}",
            f"{self.ratio:.2f}",
            target,
        ]


TUI_SECTION = f"TUI, {INTERVAL_S:g} s refresh, in tmux"


def tool_rows(section: str, a: Steady, b: Steady) -> list[Row]:
    """CPU, memory, NVML calls and refreshes of a long-running tool `a` beside `b`."""
    anchor = b.tool
    return [
        Row(section, "CPU, % of a core", a.cpu_pct, anchor, b.cpu_pct, 2, STEADY_TARGET),
        Row(section, "RSS, MiB (median)", a.rss_bytes / MIB, anchor, b.rss_bytes / MIB),
        Row(
            section,
            "NVML calls per GPU per refresh",
            a.calls_per_gpu_per_refresh,
            anchor,
            b.calls_per_gpu_per_refresh,
        ),
        Row(section, "refreshes per s", a.refreshes_per_s, anchor, b.refreshes_per_s, 2),
    ]


def rows(one: dict[str, OneShot], steady: SteadyResults) -> list[Row]:
    return one_shot_rows(one) + steady_rows(steady)


def one_shot_rows(one: dict[str, OneShot]) -> list[Row]:
    ours = one[OURS_ONE_SHOT]
    out: list[Row] = []
    section = "one-shot reading"
    for anchor in (a for a in one if a != OURS_ONE_SHOT):
        theirs = one[anchor]
        out += [
            Row(
                section,
                "wall, ms",
                ours.wall_s * 1000,
                anchor,
                theirs.wall_s * 1000,
                0,
                ONE_SHOT_TARGET,
            ),
            Row(
                section,
                "CPU, ms",
                ours.cpu_s * 1000,
                anchor,
                theirs.cpu_s * 1000,
                0,
                ONE_SHOT_TARGET if anchor.startswith("nvitop") else None,
            ),
            Row(
                section,
                "NVML calls per GPU",
                ours.calls_per_gpu,
                anchor,
                theirs.calls_per_gpu,
                ceiling=ONE_SHOT_CALLS_PER_GPU if anchor.startswith("nvitop") else None,
            ),
        ]
    return out


def steady_rows(steady: SteadyResults) -> list[Row]:
    out: list[Row] = []
    t, s = steady.tools, steady.scrapes
    for section, mine, anchor in (
        (f"exporter, {INTERVAL_S:g} s, scraped at 1 Hz", AGENT, EXPORTER),
        (TUI_SECTION, CONSOLE, NVITOP_TUI),
    ):
        out += tool_rows(section, t[mine], t[anchor])
        if mine == AGENT:
            sa, sb = s[AGENT], s[EXPORTER]
            burst = f"scrapes ({sa.count} back to back)"
            out += [
                Row(section, f"{burst}: p50, ms", sa.p50_ms, anchor, sb.p50_ms, 2),
                Row(section, f"{burst}: p99, ms", sa.p99_ms, anchor, sb.p99_ms, 2),
                Row(
                    section, f"{burst}: per s", sa.per_s, anchor, sb.per_s, 0, higher_is_better=True
                ),
                Row(
                    section,
                    "scrape at 1 Hz: p50, ms",
                    sa.at_1hz_p50_ms,
                    anchor,
                    sb.at_1hz_p50_ms,
                    2,
                ),
                Row(
                    section,
                    "/metrics body, KiB",
                    sa.body_bytes / 1024,
                    anchor,
                    sb.body_bytes / 1024,
                    0,
                ),
            ]
    return out


HEADER = ["", "measure", "gpuconsole", "anchor", "anchor's", "ours / theirs", "target"]


def table(all_rows: list[Row]) -> str:
    """A Markdown table that also reads as plain text."""
    body = [HEADER, *(r.cells() for r in all_rows)]
    widths = [max(len(line[i]) for line in body) for i in range(len(HEADER))]
    right = {2, 4, 5}

    def line(cells: list[str]) -> str:
        padded = []
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
            padded.append(cell.rjust(width) if i in right else cell.ljust(width))
        return "| " + " | ".join(padded) + " |"

    rules = ["-" * (w + 1) + ":" if i in right else "-" * (w + 2) for i, w in enumerate(widths)]
    rule = "|" + "|".join(rules) + "|"
    return "\n".join([line(body[0]), rule, *(line(c) for c in body[1:])])


def verdicts(all_rows: list[Row]) -> list[str]:
    """One line per target: which row, the ratio, met or not."""
    out = []
    for r in all_rows:
        if r.met is not None:
            state = "met" if r.met else "NOT met"
            figure = (
                f"gpuconsole {r.ours:.{r.decimals}f}"
                if r.ceiling is not None
                else f"gpuconsole / {r.anchor} = {r.ratio:.2f}"
            )
            out.append(f"- {r.section}, {r.measure}: {figure} (target {r.goal()}): {state}")
    return out


def machine(load_at_start: tuple[float, float, float]) -> list[str]:
    """Where and when it ran."""
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.partition(":")[2].strip()
            break
    usable = len(os.sched_getaffinity(0))
    start, end = (" ".join(f"{x:.2f}" for x in load) for load in (load_at_start, os.getloadavg()))
    return [
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        f"- platform: {platform.platform()}, Python {platform.python_version()}",
        f"- CPU: {model}, {os.cpu_count()} cores ({usable} usable by this process)",
        f"- load average (1, 5, 15 min) at the start: {start}; at the end: {end}",
    ]


def versions(setup: Setup) -> str:
    """The compared tools' versions, as installed in their venv."""
    code = (
        "import importlib.metadata as m; print(', '.join(f'{n} {m.version(n)}' for n in "
        "('gpustat', 'nvitop', 'nvitop-exporter', 'nvidia-ml-py', 'prometheus-client')))"
    )
    listed = subprocess.run(
        [setup.tool("python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(
        ["git", "-C", str(root), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"gpuconsole at {head or 'an unknown commit'}; {listed}"


def details(steady: SteadyResults, gpus: int) -> list[str]:
    """The steady-state figures the table leaves out, and which NVML calls each tool makes."""
    out = []
    for s in steady.tools.values():
        out.append(
            f"- {s.tool}: {s.window_s:.0f} s window, CPU {s.cpu_pct:.2f}% of a core "
            f"(median of 10 s slices {s.cpu_pct_slice_median:.2f}%), "
            f"peak RSS {s.peak_rss_bytes / MIB:.1f} MiB"
        )
        refreshes = s.refreshes_per_s * s.window_s
        per = sorted(s.calls_by_function.items(), key=lambda kv: -kv[1])
        listed = ", ".join(f"{name} {n / gpus / refreshes:.2g}" for name, n in per)
        out.append(f"  - calls per GPU per refresh: {listed}")
    return out


def results_md(
    setup: Setup,
    all_rows: list[Row],
    steady: SteadyResults,
    *,
    duration_s: float,
    runs: int,
    load_at_start: tuple[float, float, float],
) -> str:
    """The whole of benchmarks/RESULTS.md."""
    return "\n".join(
        [
            "# gpuconsole beside gpustat, nvitop and nvitop-exporter",
            "",
            "Written by `make bench-compare` (`python -m benchmarks.compare`); rerun it to "
            "refresh these figures.",
            "",
            "## Where it ran",
            "",
            *machine(load_at_start),
            f"- {versions(setup)}",
            "- This machine's cores are shared with other developers' builds and test runs, "
            "so wall times are noisy: one-shot figures are medians of "
            f"{runs} runs taken in turns, and steady-state figures are CPU time (not wall) "
            "over one window that all four long-running tools shared.",
            "- Every tool ran from compiled bytecode, as an installed copy does: "
            f"`{BYTECODE_OFF}`{' (set in this shell)' if BYTECODE_OFF in os.environ else ''} "
            "was cleared for the tools' processes, so "
            "gpuconsole's bytecode was written once, by the untimed one-shot round, and not "
            "compiled again at each start (0.15-0.3 s of CPU that nvitop and gpustat, compiled "
            "by pip at install, never pay).",
            "",
            "## What ran",
            "",
            "Every tool loaded the same fake `libnvidia-ml.so.1` (gpuconsole/sim/fakenvml) "
            "through `LD_LIBRARY_PATH`, with the 8-GPU DGX H100 profile (8x H100 SXM5, "
            "seed 0). gpuconsole read NVML only (`[fabric]` and `[tenancy]` off: this node has "
            "no RDMA port, BMC or tenant), every `[nvml]` key at its default (1 s, the XID/ECC "
            "event thread on).",
            "",
            f"- one-shot: `gpuconsole snapshot --json`, `gpustat --json`, `nvitop -1`, each "
            f"{runs} times after an untimed round; wall and CPU (user + system, from wait4) of "
            "the child process.",
            f"- steady state: `gpuconsole agent` and `nvitop-exporter --interval 1`, both "
            f"scraped once a second by the same aiohttp client (as Prometheus with a 1 s "
            f"scrape interval), and `gpuconsole console` (node view) and `nvitop --interval 1` "
            f"in tmux ({TUI_SIZE[0]}x{TUI_SIZE[1]}), all four at once for "
            f"{duration_s:g} s after a warm-up; CPU from /proc/PID/stat, RSS sampled each "
            "second. Then each exporter alone took a burst of back-to-back scrapes.",
            "- NVML calls: counted by the fake library. One-shot: the whole run, divided by "
            "the GPUs. Steady state: read from the running process at both ends of the window; "
            "refreshes are the `nvmlDeviceGetUtilizationRates` calls per GPU (every tool "
            "makes one per GPU per refresh), so the figure has no timing in it.",
            "",
            "## Figures",
            "",
            table(all_rows),
            "",
            "Reading them: gpustat sleeps 0.1 s per GPU that has processes (to sample their CPU "
            "%), so about 0.8 s of its one-shot wall here is sleep, not work. gpuconsole's "
            "XID/ECC event thread asks NVML to wait 100 ms at a time (a closing source waits "
            "for it no longer than that): ten wake-ups a second, on a GPU node as here (the "
            "`nvmlEventSetWait_v2` calls below), about 1 ms of CPU a second of the console's "
            "and the agent's. Where gpuconsole loses, "
            "`make bench-compare BENCH_COMPARE_ARGS='--profile DIR'` records py-spy profiles of "
            "its side.",
            "",
            "## Targets",
            "",
            *verdicts(all_rows),
            "",
            "## Steady state in detail",
            "",
            *details(steady, setup.gpus),
            "",
        ]
    )
