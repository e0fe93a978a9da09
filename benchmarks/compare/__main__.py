"""`python -m benchmarks.compare`: measure, print the table, write benchmarks/RESULTS.md.

`make bench-compare` builds the tools' venv and runs this; `--profile DIR` instead records
py-spy profiles of gpuconsole's side of every row, and `--tui` measures the TUI row alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.compare.fakenode import prepare
from benchmarks.compare.measure import CONSOLE, NVITOP_TUI, log, one_shot, steady, tuis_alone
from benchmarks.compare.procs import ToolFailed
from benchmarks.compare.report import (
    TUI_SECTION,
    results_md,
    rows,
    table,
    tool_rows,
    verdicts,
)

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description="gpuconsole beside gpustat, nvitop and nvitop-exporter on one fake NVML.",
    )
    parser.add_argument(
        "--tools",
        type=Path,
        default=Path(".venv-compare"),
        metavar="VENV",
        help="venv holding gpustat, nvitop, nvitop-exporter and py-spy (default: .venv-compare)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=60.0,
        metavar="S",
        help="steady-state window in seconds (default: 60)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds the long-running tools run before the window (default: 5)",
    )
    parser.add_argument(
        "--runs", type=int, default=7, metavar="N", help="timed one-shot runs per tool (7)"
    )
    parser.add_argument(
        "--scrapes",
        type=int,
        default=300,
        metavar="N",
        help="back-to-back scrapes of each exporter for latency and throughput (300)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        metavar="FILE",
        help="where to write the results (default: benchmarks/RESULTS.md)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="instead: py-spy profiles of gpuconsole's one-shot, agent and console into DIR",
    )
    parser.add_argument(
        "--tui",
        action="store_true",
        help="only the TUI row (the console and nvitop in tmux, nothing beside them); "
        "prints it and writes nothing",
    )
    args = parser.parse_args(argv)
    if args.duration < 10 or args.runs < 1 or args.scrapes < 1:
        parser.error("--duration is at least 10 s; --runs and --scrapes at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpuconsole-compare-") as tmp:
        try:
            setup = prepare(Path(tmp), args.tools)
            if args.profile is not None:
                from benchmarks.compare.profiling import profile

                print(profile(setup, args.profile.resolve(), args.duration))
                return 0
            if args.tui:
                tuis = tuis_alone(setup, args.duration, args.warmup)
                tui_rows = tool_rows(TUI_SECTION, tuis[CONSOLE], tuis[NVITOP_TUI])
                print(table(tui_rows))
                print("\n".join(verdicts(tui_rows)))
                load = " ".join(f"{x:.2f}" for x in os.getloadavg())
                print(f"load average at the start: {' '.join(f'{x:.2f}' for x in load_at_start)};"
                      f" at the end: {load}")  # fmt: skip
                return 0
            one = one_shot(setup, args.runs)
            long_running = asyncio.run(steady(setup, args.duration, args.warmup, args.scrapes))
            all_rows = rows(one, long_running)
            text = results_md(
                setup,
                all_rows,
                long_running,
                duration_s=args.duration,
                runs=args.runs,
                load_at_start=load_at_start,
            )
        except ToolFailed as exc:
            print(f"bench-compare: {exc}", file=sys.stderr)
            return 1
    print(table(all_rows))
    print()
    print("\n".join(verdicts(all_rows)))
    if not args.no_write:
        args.results.write_text(text)
        log(f"\nwritten to {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
