"""The wallboard's pages and the console's fleet view over a 10,000-node fleet of 8 GPUs.

Each wallboard page is built (tui.wallboard's page builders, what a redraw costs before
Textual paints it) from a FleetSnapshot of NODES nodes cloned from the demo cluster, with
the heat grid given the rows of a 40-line screen. Two figures per page: "fresh", the first
build from a snapshot whose every node is new (a busy fleet at 1 Hz: each node's verdict
is judged afresh there), and "again", the same snapshot built once more (a page rotation,
or a second redraw before the next snapshot). Then the console's fleet view applying one
such snapshot (bench_console's "apply"), and `FleetSnapshot.node()` asked for every node
in turn (what a view looping over the fleet by name pays). Medians of CPU time; the
machine may be shared, so compare figures from one run.

Targets: each page again under 50 ms at 10,000 nodes; a node() look-up under 5 µs.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

from benchmarks.bench_console import FIXED, SIZE, _base, _fleet
from benchmarks.timing import record
from gpuconsole.readings.snapshot import FleetSnapshot

NODES = 10_000
RUNS = 3
ROWS = 38  # the heat grid's room on a 120x40 screen
AGAIN_TARGET_MS = 50.0
LOOKUP_TARGET_US = 5.0


def _pages(base: FleetSnapshot) -> dict[str, tuple[float, float]]:
    """Median CPU ms per page: (fresh snapshot, same snapshot again)."""
    from gpuconsole.tui.themes import Palette, load_themes
    from gpuconsole.tui.wallboard import PAGES, WALLBOARD_THEME

    palette = Palette.from_variables(dict(load_themes([])[WALLBOARD_THEME].variables))
    costs: dict[str, tuple[list[float], list[float]]] = {}
    for step in range(RUNS):
        snapshot = _fleet(base, NODES, step)
        for page in PAGES:
            fresh, again = costs.setdefault(getattr(page, "__name__", repr(page)), ([], []))
            for into in (fresh, again):
                began = time.process_time()
                page(snapshot, palette, FIXED, rows=ROWS, first=0)
                into.append(1000 * (time.process_time() - began))
            snapshot = _fleet(base, NODES, step + RUNS)  # the next page: a fresh one too
    return {k: (statistics.median(f), statistics.median(a)) for k, (f, a) in costs.items()}


async def _fleet_view(base: FleetSnapshot) -> float:
    """Median CPU ms for the console's fleet view to apply one 10,000-node snapshot."""
    from gpuconsole.tui.app import ConsoleApp

    snapshots = [_fleet(base, NODES, step) for step in range(RUNS + 2)]
    app = ConsoleApp(None, start_hub=False, snapshot=snapshots[0], clock=lambda: FIXED,
                     theme_dirs=[], cursor_blink=False, freeze_heap=True)  # fmt: skip
    costs = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.show_snapshot(snapshots[1])
        await pilot.pause()
        for snapshot in snapshots[2:]:
            began = time.process_time()
            app.show_snapshot(snapshot)
            costs.append(1000 * (time.process_time() - began))
            await pilot.pause()
    return statistics.median(costs)


def _lookups(base: FleetSnapshot) -> float:
    """Median µs per `FleetSnapshot.node(name)` over every node of a fresh snapshot, the
    first asking included."""
    samples = []
    for step in range(RUNS):
        snapshot = _fleet(base, NODES, step)
        names = [n.node for n in snapshot.nodes]
        began = time.process_time()
        for name in names:
            snapshot.node(name)
        samples.append(1e6 * (time.process_time() - began) / len(names))
    return statistics.median(samples)


def main() -> None:
    base = asyncio.run(_base())
    load = os.getloadavg()[0]
    print(f"wallboard at {NODES:,} nodes of 8 GPUs: CPU ms per page build, median of {RUNS} "
          f"(load average {load:.2f})")  # fmt: skip
    for name, (fresh, again) in _pages(base).items():
        ok = "met" if again < AGAIN_TARGET_MS else "NOT met"
        print(f"  {name:<13} fresh snapshot {fresh:8.1f} ms   again {again:8.1f} ms   "
              f"target again < {AGAIN_TARGET_MS:g} ms: {ok}")  # fmt: skip
        record(f"wallboard {name}, {NODES:,} nodes, again", again, "ms", at_most=AGAIN_TARGET_MS)
        record(f"wallboard {name}, {NODES:,} nodes, fresh", fresh, "ms")
    lookup = _lookups(base)
    print(
        f"  FleetSnapshot.node() over every node: {lookup:.2f} µs per look-up   "
        f"target < {LOOKUP_TARGET_US:g} µs: {'met' if lookup < LOOKUP_TARGET_US else 'NOT met'}"
    )
    record(f"FleetSnapshot.node(), {NODES:,} nodes", lookup, "µs", at_most=LOOKUP_TARGET_US)
    view = asyncio.run(_fleet_view(base))
    print(f"  console fleet view, apply one snapshot: {view:.1f} ms")
    record(f"console fleet view apply, {NODES:,} nodes", view, "ms")


if __name__ == "__main__":
    main()
