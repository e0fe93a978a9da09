"""`gpuconsole demo --nodes 1000`: how long until the fleet view shows every node and every
GPU, what the console costs while it stays live at 1 Hz, and how long a node that is opened
takes to show its full detail.

Each run is a fresh process (imports included, as a user's `gpuconsole demo` pays them)
running the console headless (Textual's run_test, 120x40) on the hub `demo --nodes 1000`
builds: a thousand AgentSources reading simulated agents' summaries, decoded and merged by the
head's own code. The first full frame is when the fleet table holds every node and the
snapshot it draws holds every GPU, counted from the process's start. CPU is the process's
(the console, the hub and the simulation together, the opened node's own process aside),
over WINDOW_S of the steady state. Full detail is when the node view has drawn a snapshot
with the node's every BMC sensor (what the summary leaves out). Medians of RUNS runs.
Then `--nodes 10000`, first rows only: when the view first draws a node with its GPUs (the
fleet comes up in batches, drawn as they arrive), and whether it says its slower refresh.

Targets: first full frame within 3 s, under one core, full detail within 1 s of opening;
at 10,000 nodes, first rows within 3 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.bench_start import child_env
from benchmarks.timing import record

NODES = 1000
RUNS = 3
WINDOW_S = 10.0
LIMIT_S = 120.0
FRAME_TARGET_S = 3.0
CPU_TARGET_CORES = 1.0
DETAIL_TARGET_S = 1.0
LARGE_NODES = 10_000  # only its first rows: a fleet that refreshes slower than 1 Hz
ROWS_TARGET_S = 3.0


async def _child(nodes: int, began: float, rows_only: bool = False) -> dict[str, float]:
    from gpuconsole.config import Config
    from gpuconsole.tui.app import ConsoleApp
    from gpuconsole.tui.screens.node import NodeScreen
    from gpuconsole.tui.widgets.row_table import RowTable
    from gpuconsole.wiring import sim_hub

    hub = sim_hub(Config(), nodes, None)
    app = ConsoleApp(hub, freeze_heap=True)
    figures: dict[str, float] = {}
    async with app.run_test(size=(120, 40)) as pilot:

        def gpus() -> int:
            shot = hub.latest
            return sum(len(n.nvml.gpus) for n in shot.nodes if n.nvml) if shot else 0

        while time.time() - began < LIMIT_S:
            table = app.screen.query_one("#fleet-table", RowTable)
            shown = app._snapshot_shown  # what the fleet view has drawn
            if "rows_s" not in figures and shown is not None and any(n.gpus for n in shown.nodes):
                figures["rows_s"] = time.time() - began
                # the slower refresh of a large fleet, said where the console lists events
                said = [e.message for e in shown.events if e.kind == "refresh"]
                figures["says_refresh"] = float(any("refreshes every" in m for m in said))
                if rows_only:
                    return figures
            if table.row_count == nodes and gpus() == 8 * nodes:
                break
            await asyncio.sleep(0.05)
        figures["frame_s"] = time.time() - began
        figures["frame_cpu_s"] = time.process_time()  # this process's, from its start
        await asyncio.sleep(2.0)  # every node answered once more, from its own moment
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.sleep(WINDOW_S)
        figures["cores"] = (time.process_time() - cpu) / (time.perf_counter() - wall)
        opened = time.perf_counter()  # from the key: the press returns once it is handled
        await pilot.press("down", "enter")
        while time.perf_counter() - opened < LIMIT_S:
            if isinstance(app.screen, NodeScreen):
                shot = app._snapshot_shown  # what the view has drawn
                node = shot.node(app.screen.node_name) if shot is not None else None
                # every sensor, nominal ones too: what the summary leaves out
                if (
                    node is not None
                    and node.bmc
                    and any(s.health.value == "ok" for s in node.bmc.sensors)
                ):
                    break
            await asyncio.sleep(0.02)
        figures["detail_s"] = time.perf_counter() - opened
    return figures


def _run(nodes: int, rows_only: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as state:
        env = child_env(XDG_STATE_HOME=state, XDG_CONFIG_HOME=state)
        command = [sys.executable, "-m", "benchmarks.bench_demo_scale", "--child"]
        command += ["--nodes", str(nodes), "--began", repr(time.time())]
        command += ["--rows-only"] if rows_only else []
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
        return figures


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def main(nodes: int = NODES, runs: int = RUNS, large: int = LARGE_NODES) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"gpuconsole demo --nodes {nodes:,} (console headless, {runs} fresh processes; "
        f"{os.cpu_count()} CPUs, load {load})"
    )
    results = [_run(nodes) for _ in range(runs)]
    rows = statistics.median(r["rows_s"] for r in results)
    frame = statistics.median(r["frame_s"] for r in results)
    frame_cpu = statistics.median(r["frame_cpu_s"] for r in results)
    cores = statistics.median(r["cores"] for r in results)
    detail = statistics.median(r["detail_s"] for r in results)
    print(
        f"  first full frame ({nodes:,} nodes, {8 * nodes:,} GPUs) {frame:.2f} s from start "
        f"({frame_cpu:.2f} s of CPU), under {FRAME_TARGET_S:g} s: "
        f"{_verdict(frame < FRAME_TARGET_S)}"
    )
    print(f"  first rows drawn {rows:.2f} s from start")
    print(
        f"  live at 1 Hz: {cores:.2f} cores, under {CPU_TARGET_CORES:g}: "
        f"{_verdict(cores < CPU_TARGET_CORES)}"
    )
    print(
        f"  a node opened: full detail in {detail:.2f} s, under {DETAIL_TARGET_S:g} s: "
        f"{_verdict(detail < DETAIL_TARGET_S)}"
    )
    record(f"demo --nodes {nodes:,}: first full frame", frame, "s", at_most=FRAME_TARGET_S)
    record(f"demo --nodes {nodes:,}: CPU at 1 Hz", cores, "cores", at_most=CPU_TARGET_CORES)
    record(f"demo --nodes {nodes:,}: a node opened", detail, "s", at_most=DETAIL_TARGET_S)
    if large:
        _large(large, runs)


def _large(nodes: int, runs: int) -> None:
    """A fleet past one head's 1 Hz: its first rows, drawn as its agents' first answers
    arrive (not after all of them), and whether it says its slower refresh."""
    results = [_run(nodes, rows_only=True) for _ in range(runs)]
    rows = statistics.median(r["rows_s"] for r in results)
    says = all(r["says_refresh"] for r in results)
    print(
        f"gpuconsole demo --nodes {nodes:,}: first rows {rows:.2f} s from start, under "
        f"{ROWS_TARGET_S:g} s: {_verdict(rows < ROWS_TARGET_S)}; says its slower refresh: "
        f"{'yes' if says else 'NO'}"
    )
    record(f"demo --nodes {nodes:,}: first rows", rows, "s", at_most=ROWS_TARGET_S)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--child", action="store_true", help="one run (the child)")
    parser.add_argument("--began", type=float, help="when the parent started the child")
    parser.add_argument("--rows-only", action="store_true", help="the child: first rows only")
    parser.add_argument(
        "--large", type=int, default=LARGE_NODES, help="nodes of the first-rows run (0: none)"
    )
    args = parser.parse_args()
    if args.child:
        began = args.began or time.time()
        print(json.dumps(asyncio.run(_child(args.nodes, began, args.rows_only))))
    else:
        main(args.nodes, args.runs, args.large)
