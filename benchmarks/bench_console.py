"""CPU cost of the console: one FleetSnapshot applied to the fleet view (8, 64, 1,000 nodes),
and an 8-GPU node view refreshed at 1 Hz. Prints medians of several runs.

Targets: under 50 ms per snapshot at 1,000 nodes; under 5% of a core for the node view.
Every node changes in every snapshot (the worst case: a busy fleet at 1 Hz).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time

from gpuconsole.model import FleetSnapshot, NodeSnapshot
from gpuconsole.sim.cluster import demo_hub

FIXED = 1_796_000_000.0
RUNS = 7


async def _base() -> FleetSnapshot:
    hub = demo_hub(clock=lambda: FIXED, start=FIXED - 120, events=False)
    return await hub.poll_once()


def _fleet(base: FleetSnapshot, nodes: int, step: int) -> FleetSnapshot:
    """`nodes` nodes cloned from the demo cluster, every GPU's utilization moved by `step`."""
    out: list[NodeSnapshot] = []
    for i in range(nodes):
        node = base.nodes[i % len(base.nodes)]
        nvml = node.nvml
        if nvml is not None:
            gpus = tuple(
                dataclasses.replace(g, util_gpu_pct=float((i + g.index * 7 + step * 13) % 101))
                if g.util_gpu_pct is not None else g
                for g in nvml.gpus
            )  # fmt: skip
            nvml = dataclasses.replace(nvml, gpus=gpus)
        out.append(dataclasses.replace(node, node=f"node-{i:04d}", nvml=nvml))
    return FleetSnapshot(seq=step + 1, at=FIXED, nodes=tuple(out), events=base.events)


async def _measure(base: FleetSnapshot, nodes: int, *, node_view: bool) -> float:
    """Median CPU milliseconds to apply one snapshot and repaint."""
    from gpuconsole.tui.app import ConsoleApp

    snapshots = [_fleet(base, nodes, step) for step in range(RUNS + 1)]
    app = ConsoleApp(None, start_hub=False, snapshot=snapshots[0], clock=lambda: FIXED,
                     theme_dirs=[], cursor_blink=False)  # fmt: skip
    costs = []
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        if node_view:
            app.open_node(snapshots[0].nodes[0].node)
            await pilot.pause()
        for snapshot in snapshots[1:]:
            began = time.process_time()
            app.show_snapshot(snapshot)
            await pilot.pause()
            costs.append(time.process_time() - began)
    return 1000 * statistics.median(costs)


def main() -> None:
    base = asyncio.run(_base())
    print("console: CPU per snapshot (median of", RUNS, "runs, every node changed)")
    for nodes in (8, 64, 1000):
        ms = asyncio.run(_measure(base, nodes, node_view=False))
        print(f"  fleet view, {nodes:>5} nodes: {ms:7.2f} ms per snapshot"
              + ("   (target < 50 ms)" if nodes == 1000 else ""))  # fmt: skip
    ms = asyncio.run(_measure(base, 8, node_view=True))
    print(
        f"  node view, 8 GPUs at 1 Hz: {ms:7.2f} ms per snapshot = {ms / 10:.2f}% of a core"
        "   (target < 5%)"
    )


if __name__ == "__main__":
    main()
