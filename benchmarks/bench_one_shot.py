"""One-shot `gpuconsole snapshot --json` beside `nvitop -1`, on the fake libnvidia-ml.so of an
8-GPU DGX H100: NVML calls per GPU (counted by the library), wall and CPU of the child.

The tools take turns, run after run, so that load from elsewhere on a shared machine falls on
both; medians, and their ratio from this one run. Both run from compiled bytecode, as installed. nvitop is looked for beside this Python, then
in the `make bench-compare` venv; without it only gpuconsole's figures are printed.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.compare.fakenode import BYTECODE_OFF, CONFIG
from benchmarks.compare.procs import Run, ToolFailed, run_once
from benchmarks.timing import record
from gpuconsole.sim.fakenvml import (
    COUNTS_ENV,
    build_library,
    driver_of,
    environment,
    read_counts_file,
    write_profile,
)
from gpuconsole.sim.profiles import DGX_H100

RUNS = 15  # two seconds in all; a shared machine's bursts need the median of more than a few
CALLS_TARGET = 30  # NVML calls per GPU
COMPARE_VENV = Path(__file__).resolve().parent.parent / ".venv-compare"


def nvitop() -> str | None:
    """nvitop's command, where one is installed."""
    for folder in (Path(sys.executable).parent, COMPARE_VENV / "bin"):
        if (folder / "nvitop").exists():
            return str(folder / "nvitop")
    return shutil.which("nvitop")


def measure(folder: Path, runs: int = RUNS) -> dict[str, tuple[float, float, float]]:
    """(calls per GPU, median wall s, median CPU s) of each tool."""
    library = build_library(folder / "lib", driver_of(DGX_H100))
    profile = write_profile(DGX_H100, folder / "dgx-h100.profile")
    config = folder / "gpuconsole.toml"
    config.write_text(CONFIG)
    # An installed gpuconsole runs from bytecode pip compiled, as nvitop does: a shell that
    # says PYTHONDONTWRITEBYTECODE would have every run compile gpuconsole from source
    # (a tenth of a second and more of CPU). The untimed round writes it.
    env = {
        **{k: v for k, v in os.environ.items() if k != BYTECODE_OFF},
        **environment(library.parent, profile),
        "XDG_STATE_HOME": str(folder / "state"),
        "XDG_CONFIG_HOME": str(folder / "config"),
        "XDG_CACHE_HOME": str(folder / "cache"),
    }
    commands = {
        "gpuconsole snapshot --json": [
            sys.executable,
            "-m",
            "gpuconsole",
            "snapshot",
            "--json",
            "-c",
            str(config),
        ]
    }
    other = nvitop()
    if other is not None:
        commands["nvitop -1"] = [other, "-1"]
    gpus = len(DGX_H100.gpus)
    calls: dict[str, float] = {}
    timed: dict[str, list[Run]] = {name: [] for name in commands}
    counts = folder / "calls.counts"
    names = list(commands)
    for round_ in range(runs + 1):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            if round_ == 0:  # untimed: the page cache warms, the library counts the calls
                counts.unlink(missing_ok=True)
                run_once(commands[name], {**env, COUNTS_ENV: str(counts)}, folder / "out", 120)
                calls[name] = sum(read_counts_file(counts).values()) / gpus
            else:
                timed[name].append(run_once(commands[name], env, folder / "out", 120))
    return {
        name: (
            calls[name],
            statistics.median(r.wall_s for r in timed[name]),
            statistics.median(r.cpu_s for r in timed[name]),
        )
        for name in names
    }


def main() -> None:
    print(f"One-shot reading of an 8-GPU DGX H100 on the fake NVML (medians of {RUNS} runs)")
    if shutil.which("gcc") is None:
        print("  skipped: gcc is needed to build the fake libnvidia-ml.so.1")
        return
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            figures = measure(Path(tmp))
        except ToolFailed as exc:
            print(f"  failed: {exc}")
            return
    after = os.getloadavg()
    print(f"  load average (1 min) {before[0]:.2f} before, {after[0]:.2f} after")
    print(f"  {'tool':28} {'calls/GPU':>9} {'wall':>9} {'CPU':>9}")
    for name, (calls, wall, cpu) in figures.items():
        print(f"  {name:28} {calls:9.2f} {wall * 1000:7.0f}ms {cpu * 1000:7.0f}ms")
    ours = figures["gpuconsole snapshot --json"]
    met = "met" if ours[0] <= CALLS_TARGET else "MISSED"
    print(f"  target: <= {CALLS_TARGET} NVML calls per GPU: {ours[0]:.2f}, {met}")
    theirs = figures.get("nvitop -1")
    peer = "" if theirs is None else "nvitop -1"
    for what, k in (("wall", 1), ("CPU", 2)):
        record(f"one-shot: {what}", ours[k] * 1000, "ms", peer=peer,
               peer_value=None if theirs is None else theirs[k] * 1000, ratio_at_most=1.0)  # fmt: skip
    record("one-shot: NVML calls per GPU", ours[0], "calls", at_most=CALLS_TARGET, peer=peer,
           peer_value=None if theirs is None else theirs[0])  # fmt: skip
    if theirs is None:
        print("  nvitop not installed here: no ratio (benchmarks/RESULTS.md has the last one)")
        return
    for what, k in (("wall", 1), ("CPU", 2)):
        ratio = ours[k] / theirs[k]
        print(
            f"  target: {what} <= nvitop -1's: {ratio:.2f}x, {'met' if ratio <= 1.0 else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
