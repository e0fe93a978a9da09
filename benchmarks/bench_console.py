"""CPU and memory cost of the console: one FleetSnapshot applied to the fleet view at 8, 64
and 1,000 nodes of 8 GPUs, an 8-GPU node view refreshed at 1 Hz, and the console's resident
memory. Prints medians and whether each target is met.

Targets: under 50 ms of CPU per snapshot at 1,000 nodes; under 5% of a core for an
8-GPU node view at 1 Hz. Every node changes in every snapshot (a busy fleet at 1 Hz): each
GPU's utilization moves, its owners do not (as on a real fleet, where tenancy changes in
minutes). Each node has readings of its own, so nothing is shared that a real fleet would not
share. "apply" is the console's own work (every node's health and counts, the cells of the
rows in view, the summary); "repaint" is Textual drawing the rows that changed into terminal
lines. Medians of process CPU time; the machine may be shared, so compare figures from one
run.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.readings.tenancy import TenancyReading
from gpuconsole.sim.cluster import demo_hub

FIXED = 1_796_000_000.0
RUNS = 9
SIZE = (120, 40)
FLEET_TARGET_MS = 50.0
NODE_TARGET_PCT = 5.0
NODE_WINDOW_S = 6


async def _base() -> FleetSnapshot:
    hub = demo_hub(clock=lambda: FIXED, start=FIXED - 120, events=False)
    return await hub.poll_once()


def _eight_gpu_nodes(base: FleetSnapshot) -> list[NodeSnapshot]:
    """The demo's nodes where NVML reads all 8 GPUs (H100, A100, PCIe; one with a lost GPU)."""
    return [n for n in base.nodes if len(n.gpus) == 8]


def _fleet(base: FleetSnapshot, nodes: int, step: int) -> FleetSnapshot:
    """`nodes` nodes of 8 GPUs cloned from the demo cluster, every GPU's utilization moved by
    `step`; each clone has its own tenancy reading, as each real node has."""
    models = _eight_gpu_nodes(base)
    out: list[NodeSnapshot] = []
    for i in range(nodes):
        node = models[i % len(models)]
        nvml = node.nvml
        assert nvml is not None
        gpus = tuple(
            msgspec.structs.replace(g, util_gpu_pct=float((i + g.index * 7 + step * 13) % 101))
            if g.util_gpu_pct is not None else g
            for g in nvml.gpus
        )  # fmt: skip
        out.append(
            msgspec.structs.replace(
                node,
                node=f"node-{i:04d}",
                nvml=msgspec.structs.replace(nvml, gpus=gpus),
                tenancy=_tenancy_of(node, i),
            )
        )
    return FleetSnapshot(seq=step + 1, at=FIXED, nodes=tuple(out), events=base.events)


_TENANCY: dict[int, TenancyReading] = {}


def _tenancy_of(node: NodeSnapshot, i: int) -> TenancyReading | None:
    """One tenancy reading per clone, the same object in every step (it polls every 5 s)."""
    if node.tenancy is None:
        return None
    if i not in _TENANCY:
        _TENANCY[i] = msgspec.structs.replace(node.tenancy)
    return _TENANCY[i]


async def _fleet_costs(base: FleetSnapshot, nodes: int) -> tuple[float, float]:
    """Median CPU milliseconds to (apply, repaint) one snapshot in the fleet view."""
    from gpuconsole.tui.app import ConsoleApp

    snapshots = [_fleet(base, nodes, step) for step in range(RUNS + 2)]
    app = ConsoleApp(None, start_hub=False, snapshot=snapshots[0], clock=lambda: FIXED,
                     theme_dirs=[], cursor_blink=False, freeze_heap=True)  # fmt: skip
    apply, repaint = [], []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.show_snapshot(snapshots[1])  # warm: the first change of every row
        await pilot.pause()
        for snapshot in snapshots[2:]:
            began = time.process_time()
            app.show_snapshot(snapshot)
            applied = time.process_time()
            await pilot.pause()
            apply.append(applied - began)
            repaint.append(time.process_time() - applied)
    return 1000 * statistics.median(apply), 1000 * statistics.median(repaint)


async def _node_view(base: FleetSnapshot) -> tuple[float, float]:
    """(median CPU ms per snapshot, % of a core over NODE_WINDOW_S s) for an 8-GPU node view
    fed one snapshot a second, its 1 s status tick included."""
    from gpuconsole.tui.app import ConsoleApp

    snapshots = [_fleet(base, 1, step) for step in range(RUNS + NODE_WINDOW_S + 2)]
    node = snapshots[0].nodes[0]
    assert len(node.gpus) == 8
    app = ConsoleApp(None, start_hub=False, snapshot=snapshots[0], clock=lambda: FIXED,
                     theme_dirs=[], cursor_blink=False, freeze_heap=True)  # fmt: skip
    costs = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.open_node(node.node)
        await pilot.pause()
        feed = iter(snapshots[1:])
        for snapshot in [next(feed) for _ in range(RUNS + 1)][1:]:
            began = time.process_time()
            app.show_snapshot(snapshot)
            await pilot.pause()
            costs.append(time.process_time() - began)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for snapshot in feed:
            app.show_snapshot(snapshot)
            await asyncio.sleep(1.0)
        share = 100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    return 1000 * statistics.median(costs), share


# --- resident memory, in a process of its own ----------------------------------------


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def _resident(nodes: int) -> dict[str, int]:
    base = await _base()
    snapshots = [_fleet(base, nodes, step) for step in range(3)]
    before = _rss_bytes()  # Python, the simulated hub and the fleet's snapshots; no Textual
    from gpuconsole.tui.app import ConsoleApp

    app = ConsoleApp(None, start_hub=False, snapshot=snapshots[0], clock=lambda: FIXED,
                     theme_dirs=[], cursor_blink=False, freeze_heap=True)  # fmt: skip
    async with app.run_test(size=SIZE) as pilot:
        for snapshot in snapshots[1:]:
            app.show_snapshot(snapshot)
            await pilot.pause()
        app.open_node(snapshots[-1].nodes[0].node)
        await pilot.pause()
        return {"rss": _rss_bytes(), "before_console": before}


def resident_child(nodes: int) -> None:
    """Entry point of the child process: print its RSS as JSON with the console running."""
    print(json.dumps(asyncio.run(_resident(nodes))))


def _measure_resident(nodes: int) -> dict[str, int]:
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c",
         f"from benchmarks.bench_console import resident_child; resident_child({nodes})"],
        cwd=root, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    base = asyncio.run(_base())
    print(
        f"console: CPU per snapshot, median of {RUNS}, every node changed, at {SIZE[0]}x{SIZE[1]}"
    )
    for nodes in (8, 64, 1000):
        apply_ms, repaint_ms = asyncio.run(_fleet_costs(base, nodes))
        total = apply_ms + repaint_ms
        line = (f"  fleet view, {nodes:>5} nodes of 8 GPUs: {total:7.2f} ms "
                f"(apply {apply_ms:.2f} + repaint {repaint_ms:.2f})")  # fmt: skip
        if nodes == 1000:
            line += f"   target < {FLEET_TARGET_MS:g} ms: {_verdict(total < FLEET_TARGET_MS)}"
        print(line)
    per_snapshot, share = asyncio.run(_node_view(base))
    print(f"  node view, 8 GPUs: {per_snapshot:7.2f} ms per snapshot; at 1 Hz over "
          f"{NODE_WINDOW_S} s: {share:.2f}% of a core   target < {NODE_TARGET_PCT:g}%: "
          f"{_verdict(share < NODE_TARGET_PCT)}")  # fmt: skip
    print("console: resident memory (a process of its own, fleet then node view shown)")
    for nodes in (8, 1000):
        got = _measure_resident(nodes)
        print(f"  {nodes:>5} nodes of 8 GPUs: RSS {got['rss'] / 2**20:6.1f} MiB "
              f"(of which {got['before_console'] / 2**20:.1f} MiB before the console started: "
              "Python, the simulated hub, the fleet's snapshots)")  # fmt: skip


if __name__ == "__main__":
    main()
