"""CPU cost of one NVML poll of an 8-GPU DGX H100, and NVML calls per GPU per poll.

Three paths: the in-process simulator, pynvml over the fake libnvidia-ml.so (a child
process, since the library is found through LD_LIBRARY_PATH), and the hub's own work per
snapshot. Figures are medians; compare ratios from one run, the machine is shared.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.timing import cpu_us
from gpuconsole.hub import Hub
from gpuconsole.readings.nvml import NvmlReading
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.nvml import SimNvml
from gpuconsole.sim.profiles import DGX_H100
from gpuconsole.sources.nvml.source import NvmlSource

GPUS = len(DGX_H100.gpus)
POLLS = 120


def poll_costs(source: NvmlSource, count_calls: Callable[[], int]) -> dict[str, float]:
    """Median CPU per poll, per tier, NVML calls per GPU per poll, and the hub's own CPU per
    snapshot (rates, history, publish) over those very readings, measured in turn with them
    so that both figures meet the same machine load."""
    ticks = iter(range(1, 10**9))
    hub = Hub(monotonic=lambda: float(next(ticks)))  # one second between polls, as at 1 Hz
    hub.add_source(source)
    state = hub._nodes[source.node]
    source_state = state.sources[0]
    hub.subscribe(lambda snapshot: None)

    def snapshot(reading: NvmlReading) -> None:
        hub._accept(state, source_state, reading, 0.0)
        hub.publish()

    snapshot(source.collect())  # the first poll reads identity, inventory and everything else
    table_only, everything, hub_costs = [], [], []
    calls_before = count_calls()
    table_calls = 0
    table_polls = 0
    for _ in range(POLLS):
        upcoming = source._round + 1
        is_table = upcoming % source.detail_every and upcoming % source.inventory_every
        before = count_calls()
        began = time.process_time_ns()
        reading = source.collect()
        cost = (time.process_time_ns() - began) / 1000.0
        everything.append(cost)
        if is_table:
            table_only.append(cost)
            table_calls += count_calls() - before
            table_polls += 1
        hub_costs += cpu_us(functools.partial(snapshot, reading), 1)
    all_calls = count_calls() - calls_before
    return {
        "poll_us_median": statistics.median(everything),
        "table_poll_us_median": statistics.median(table_only) if table_only else float("nan"),
        "us_per_gpu": statistics.median(everything) / GPUS,
        "table_calls_per_gpu": table_calls / max(1, table_polls) / GPUS,
        "all_calls_per_gpu": all_calls / POLLS / GPUS,
        "hub_us_median": statistics.median(hub_costs),
    }


def sim_figures() -> dict[str, float]:
    node = SimNode("bench", DGX_H100, scenarios=["mig:7"])
    lib = SimNvml(node)
    source = NvmlSource("bench", lib=lib, events=False, simulated=True)
    return poll_costs(source, lambda: sum(lib.calls.values()))


def fake_child() -> None:
    """Runs in a child whose LD_LIBRARY_PATH points at the fake library."""
    from gpuconsole.sim.fakenvml import call_counts

    source = NvmlSource("bench", events=False)
    figures = poll_costs(source, lambda: sum(call_counts().values()))
    print(json.dumps(figures))


def fake_figures() -> dict[str, float] | str:
    try:
        from gpuconsole.sim.fakenvml import (
            build_library,
            driver_of,
            environment,
            write_profile,
        )
    except ImportError as exc:
        return f"fake library glue missing: {exc}"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        try:
            lib_dir = build_library(folder, driver_of(DGX_H100)).parent
        except Exception as exc:
            return f"fake library not built: {exc}"
        profile = write_profile(DGX_H100, folder / "profile.txt", scenarios=["mig:7"])
        env = {**os.environ, **environment(lib_dir, profile)}
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_nvml", "--fake-child"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    if result.returncode != 0:
        return f"child failed: {result.stderr.strip()[-400:]}"
    figures: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main() -> None:
    print(f"NVML poll of an 8-GPU DGX H100, GPU 7 in MIG mode (CPU time, medians of {POLLS} polls)")
    sim = sim_figures()
    fake = fake_figures()
    rows = [("in-process simulator", sim)]
    if isinstance(fake, dict):
        rows.append(("pynvml + fake libnvidia-ml.so", fake))
    print(
        f"  {'path':30} {'table poll':>11} {'any poll':>9} {'per GPU':>8} "
        f"{'calls/GPU table':>16} {'calls/GPU avg':>14}"
    )
    for name, f in rows:
        print(
            f"  {name:30} {f['table_poll_us_median'] / 1000:9.2f}ms "
            f"{f['poll_us_median'] / 1000:7.2f}ms {f['us_per_gpu']:6.0f}us "
            f"{f['table_calls_per_gpu']:16.2f} {f['all_calls_per_gpu']:14.2f}"
        )
    if not isinstance(fake, dict):
        print(f"  pynvml + fake libnvidia-ml.so: skipped ({fake})")
    reference = fake if isinstance(fake, dict) else sim
    poll_us = reference["poll_us_median"]
    share = reference["hub_us_median"] / poll_us
    print(f"  hub per snapshot of those readings: {reference['hub_us_median']:.0f} us")
    print("  table poll: every poll; any poll: the table, detail and inventory tiers in turn")
    print(
        f"  target: a poll through pynvml < 5 ms: {poll_us / 1000:.2f} ms, {verdict(poll_us < 5000)}"
    )
    budget = reference["hub_us_median"] / 5000
    print(
        f"  target: the hub < 10% of a poll's 5 ms: {budget:.1%}, {verdict(budget < 0.10)} "
        f"({share:.1%} of the poll as measured here)"
    )
    calls = reference["table_calls_per_gpu"]
    print(f"  target: <= 4 NVML calls/GPU for the table: {calls:.2f}, {verdict(calls <= 4)}")


if __name__ == "__main__":
    if "--fake-child" in sys.argv:
        fake_child()
    else:
        main()
