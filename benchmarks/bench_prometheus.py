"""The fleet overview of 10,000 nodes x 8 GPUs read from a real Prometheus with PromQL.

The demo cluster's GPU nodes, polled twice, are the templates; 10,000 members copy them
under their own names and GPU identities (benchmarks.promfleet): every FAULTY_EVERY-th one of
the templates with a GPU health flag raised (each demo node plays a fault), the rest the
healthy ones in turn, as a large fleet has a few nodes in trouble at a time. Their series, as the
exporter writes them, are backfilled with promtool into a TSDB that `prometheus` serves on
127.0.0.1; only the families the overview selects are written (the rest would only grow
Prometheus' index, not the answer). The server runs with a lookback delta of an hour, so
every series is found. The GPU gauges the fleet view draws (utilization, memory, temperature,
power) and free memory have STEPS samples more, each value moved, and each round asks about the next step in
turn (the queries' `time`): every gauge of every GPU moves every round, as on a busy fleet,
so the head builds every node's GPUs each round.

The head is this process: the hub `gpuconsole console` builds for `[fleet] prometheus` and
`targets_file`, a PromQLSource per node sharing one PrometheusReader, every node read each
INTERVAL_S seconds. The reader's first round asks for every series; later rounds for what
moves (see PrometheusReader). Figures: how long the first round took, how long a later
round (its instant queries, the answers parsed) takes (median), the CPU the head and
Prometheus spend per round as a share of the interval it must fit in, and their RSS; for
each of MODES in one run, on one hub: with no viewer (a head that only exports or alerts:
each node's health each round, every node's GPU gauges every OUT_OF_VIEW_S), a wallboard
(what it tells the hub: the rows its heat grid has room for and the nodes of the hottest
GPUs, whose gauges each round, and on its hottest page, the one that asks the most, the
fleet's hottest GPUs and total power Prometheus aggregates), then a
console with the rows of a 50-row terminal in view (their GPU gauges each round, every
node's every OUT_OF_VIEW_S). Drill-down still reads the node's agent, as
tests/test_promql_fleet.py shows.

Target: the overview of 10,000 nodes refreshes every 5 s at most one core of the head.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.promfleet import (
    BackfilledPrometheus,
    Member,
    members,
    overview_families,
    targets_file,
    write_openmetrics,
)
from benchmarks.timing import record
from gpuconsole.config import FleetConfig
from gpuconsole.export import names
from gpuconsole.export.collector import node_metrics
from gpuconsole.export.families import Families
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.promql import (
    OUT_OF_VIEW_S,
    FleetSeries,
    PrometheusReader,
    drawn_gauges,
)
from gpuconsole.tui.wallboard import PAGE_FIGURES, TOP, hottest_page
from gpuconsole.wiring import fleet_hub

NODES = 10_000
INTERVAL_S = 5.0
ROUNDS = 6
STEPS = 3  # the gauges' later samples, STEP_S apart
# free memory moves with used on a busy fleet, though the console asks it only in its part
MOVING = frozenset((*drawn_gauges(), names.DCGM_FB_FREE[0]))
TIMEOUT_S = 120.0  # a round that takes longer than the interval is measured, not cut off
CORES_TARGET = 1.0
ROWS_IN_VIEW = 50  # a 50-row terminal's fleet table, with the spare rows it fills below
BOARD_ROWS = 40  # a wallboard's heat grid on a NOC screen: a row a node (below the figures)
MODES = ("none", "wallboard", "console")
MODE_WORDS = {
    "none": f"no viewer: health each round, GPU gauges every {OUT_OF_VIEW_S:g} s",
    "wallboard": f"a wallboard on its hottest page: {BOARD_ROWS} heat rows and the hottest "
    "GPUs' nodes, the fleet's hottest GPUs and kW aggregated",
    "console": f"{ROWS_IN_VIEW} rows in view: their GPU gauges each round, every GPU's each "
    f"{OUT_OF_VIEW_S:g} s",
}
FAULTY_EVERY = 20  # one node in this many copies a node with a GPU health flag raised
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


async def _templates() -> list[NodeSnapshot]:
    from gpuconsole.sim.cluster import demo_hub

    hub = demo_hub(start=time.time() - 120, events=False)
    shot = await hub.poll_once(rounds=2, say_stale=False)
    return [n for n in shot.nodes if len(n.gpus) == 8]


def _faulty(node: NodeSnapshot) -> bool:
    """Whether a GPU of the node has a health flag raised, as its exporter counts them."""
    out = Families(frozenset({names.NODE_GPUS_FLAGGED[0]}))
    node_metrics(out, node, time.time())
    return any(value > 0 for *_, value in out.samples())


def fleet_of(templates: list[NodeSnapshot], nodes: int) -> list[Member]:
    """`nodes` members: every FAULTY_EVERY-th a copy of a faulty template, the others of
    the healthy ones, each in turn."""
    marked = [(n, _faulty(n)) for n in templates]
    faulty = [n for n, bad in marked if bad] or templates
    healthy = [n for n, bad in marked if not bad] or templates
    return [
        Member(
            m.name,
            m.instance,
            faulty[i // FAULTY_EVERY % len(faulty)]
            if i % FAULTY_EVERY == 0
            else healthy[i % len(healthy)],
        )
        for i, m in enumerate(members(templates, nodes))
    ]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 1e6


def _fresh(hub: Hub) -> int:
    shot = hub.latest
    if shot is None:
        return 0
    return sum(1 for n in shot.nodes if (s := n.status("remote")) is not None and s.ok)


async def _head(
    url: str,
    targets: Path,
    nodes: int,
    rounds: int,
    prom_pid: int,
    steps: list[float],
    modes: tuple[str, ...] = MODES,
) -> dict[str, Any]:
    cfg = FleetConfig(
        targets_file=str(targets), prometheus=url, interval_s=INTERVAL_S, timeout_s=TIMEOUT_S
    )
    hub = fleet_hub(cfg, HubSettings(publish_gap_s=0.5, max_backoff_s=INTERVAL_S))
    reader = hub.sources[0].reader  # type: ignore[attr-defined]  # the one every node shares
    # each round asks about the step after the last round's: every gauge has moved
    reader.evaluate_at = lambda: steps[reader.rounds % len(steps)] + 0.001
    took: list[float] = []
    read: Callable[[], Awaitable[Any]] = reader._read  # timed from outside: a benchmark's view

    async def timed() -> Any:
        began = time.perf_counter()
        try:
            return await read()
        finally:
            took.append(time.perf_counter() - began)

    reader._read = timed
    asked = _per_query(reader)
    began = time.perf_counter()
    await hub.start()
    try:
        while _fresh(hub) < nodes and time.perf_counter() - began < 3 * TIMEOUT_S:
            await asyncio.sleep(0.1)
        first = time.perf_counter() - began if _fresh(hub) == nodes else None
        whole = took[0] if took else float("nan")

        async def measured() -> dict[str, Any]:
            """Over whole rounds, however long each takes on this machine."""
            landed, took[:] = reader.rounds, []
            cpu, wall, prom = time.process_time(), time.perf_counter(), _cpu_s(prom_pid)
            while (
                reader.rounds < landed + rounds
                and time.perf_counter() - wall < 20 * INTERVAL_S * rounds
            ):
                await asyncio.sleep(0.1)
            spent, done = time.perf_counter() - wall, reader.rounds - landed
            used = time.process_time() - cpu
            return {
                "round_s": statistics.median(took) if took else float("nan"),
                "rounds": done,
                # the head's CPU for one round, as a share of the interval it must fit in
                "cores": used / max(1, done) / INTERVAL_S,
                "prom_cores": (_cpu_s(prom_pid) - prom) / max(1, done) / INTERVAL_S,
                "rss_mb": _rss_mb(),
                "prom_rss_mb": _rss_mb(prom_pid),
                "spent_s": spent,
                "load": os.getloadavg()[0],
            }

        found: dict[str, Any] = {}
        queries: dict[str, dict[str, list[tuple[float, float, int]]]] = {}
        board, console = object(), object()
        for mode in modes:
            hub.show(None, viewer=board)
            hub.show(None, viewer=console)
            reader.want_figures(board, None)
            if mode == "wallboard":
                # as the wallboard tells it: its heat grid's rows, then the hottest GPUs'
                # nodes once the first aggregation named them
                # on its hottest page, the one that wants the most aggregations
                reader.want_figures(board, TOP, PAGE_FIGURES[hottest_page])
                rows = {source.node for source in hub.sources[:BOARD_ROWS]}
                hub.show(rows, viewer=board)
                landed = reader.rounds
                while reader.rounds < landed + 1 or reader.figures is None:
                    await asyncio.sleep(0.1)
                hot = reader.figures
                rows |= {node for node, _, _ in (*hot.hottest[:TOP], *hot.power[:TOP])}
                hub.show(rows, viewer=board)
            elif mode == "console":  # at the top of its table
                hub.show([source.node for source in hub.sources[:ROWS_IN_VIEW]], viewer=console)
            asked.clear()
            found[mode] = await measured()
            queries[mode] = dict(asked)
        return {
            "first_s": first,
            "whole_s": whole,
            "fresh": _fresh(hub),
            "modes": found,
            "queries": queries,
        }
    finally:
        await hub.stop()


def _per_query(reader: PrometheusReader) -> dict[str, list[tuple[float, float, int]]]:
    """Each query's latency (Prometheus' time, and its wait for a core beside the others
    asked with it), the head's time taking its answer, and the samples in it, by query:
    timed from outside, around the reader's own calls."""
    asked: dict[str, list[tuple[float, float, int]]] = {}
    latencies: dict[int, float] = {}  # by the answer's id, until it is taken
    query = reader.query

    matched: set[int] = set()  # answers to a query that names the targets it asks

    async def timed(promql: str) -> list[Any]:
        began = time.perf_counter()
        answer = await query(promql)
        latencies[id(answer)] = time.perf_counter() - began
        if promql.startswith(("topk", "sum", "count")):  # a fleet figure: no answer taken
            metric = re.search(r"(\w+)\{", promql)
            fn = promql.split("(")[0]
            busy = " >= ..." if ">=" in promql else ""
            what = f"fleet figure: {fn} of {metric[1] if metric else '?'}{busy}"
            took(what, answer, time.process_time())
            return answer
        if "instance=~" in promql:
            matched.add(id(answer))
        return answer

    def took(what: str, answer: list[Any], began: float) -> None:
        taken = time.process_time() - began
        asked.setdefault(what, []).append((latencies.pop(id(answer), 0.0), taken, len(answer)))

    take_values, take_info = FleetSeries.take_values, FleetSeries.take_info

    def values(
        series: FleetSeries,
        answer: list[Any],
        metrics: frozenset[str] | None = None,
        raised: frozenset[str] = frozenset(),
        named: str = "",
        within: frozenset[str] | None = None,
    ) -> None:
        began = time.process_time()
        take_values(series, answer, metrics, raised, named, within)
        if named:
            where = ""
            if id(answer) in matched:
                matched.discard(id(answer))
                where = " (flagged nodes)" if raised else " (in view)"
            took(f"{named}{' > 0' if raised else ''}{where}", answer, began)

    def info(series: FleetSeries, answer: list[Any], *args: Any) -> None:
        began = time.process_time()
        take_info(series, answer, *args)
        took("info series", answer, began)

    reader.query = timed  # type: ignore[method-assign]
    FleetSeries.take_values = values  # type: ignore[method-assign]
    FleetSeries.take_info = info  # type: ignore[method-assign]
    return asked


def main(nodes: int = NODES, rounds: int = ROUNDS, modes: tuple[str, ...] = MODES) -> None:
    logging.getLogger("gpuconsole").setLevel(logging.ERROR)
    templates = asyncio.run(_templates())
    fleet = fleet_of(templates, nodes)
    keep = overview_families()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"Fleet overview of {nodes:,} nodes x 8 GPUs from a real Prometheus, every "
        f"{INTERVAL_S:g} s ({os.cpu_count()} CPUs, load {load}); one node in "
        f"{FAULTY_EVERY} with a GPU health flag raised"
    )
    with tempfile.TemporaryDirectory(prefix="gpuconsole-bench-prom-") as folder:
        source = Path(folder) / "fleet.om"
        began = time.perf_counter()
        at = time.time() - 60.0
        steps = [at + INTERVAL_S * k for k in range(1, STEPS + 1)]
        samples = write_openmetrics(source, fleet, at, keep, moving=MOVING, steps=steps)
        written = time.perf_counter() - began
        targets = Path(folder) / "targets.json"
        targets_file(targets, fleet)
        size = source.stat().st_size
        with BackfilledPrometheus(source) as prometheus:
            source.unlink()
            print(
                f"  backfill: {samples:,} samples ({samples / nodes:.0f} per node, "
                f"the drawn gauges' {STEPS + 1} each; "
                f"{size / 1e6:.0f} MB OpenMetrics written in {written:.1f} s), promtool "
                f"{prometheus.backfill_s:.1f} s, prometheus ready in {prometheus.start_s:.1f} s"
            )
            assert prometheus.pid is not None
            f = asyncio.run(
                _head(prometheus.url, targets, nodes, rounds, prometheus.pid, [at, *steps], modes)
            )
    first = f"{f['first_s']:.1f} s" if f["first_s"] is not None else "never within the limit"
    print(
        f"  every node fresh after {first} (the first round reads every series: "
        f"{f['whole_s']:.1f} s); {f['fresh']:,} of {nodes:,} fresh at the end"
    )
    found: dict[str, dict[str, Any]] = f["modes"]
    for mode, m in found.items():
        print(
            f"  {MODE_WORDS[mode]}: a round (up, counts of flagged GPUs, their flags, a part "
            f"of the rest, the GPU gauges asked, every one moved; parsed) {m['round_s']:.2f} s "
            f"median of {m['rounds']}; CPU per round over the {INTERVAL_S:g} s it must fit "
            f"in: head {m['cores']:.2f} cores (RSS {m['rss_mb']:.0f} MB), Prometheus "
            f"{m['prom_cores']:.2f} cores (RSS {m['prom_rss_mb']:.0f} MB); load {m['load']:.1f}"
        )
    for mode, asked in f["queries"].items():
        print(
            f"  {mode}: each query (asked side by side: its latency is Prometheus' time and "
            "its wait for a core) and the head's time taking its answer, median over the "
            "rounds that asked it:"
        )
        by_latency = sorted(asked.items(), key=lambda kv: -statistics.median(x[0] for x in kv[1]))
        for what, seen in by_latency:
            print(
                f"    {what:58} {len(seen):2d}x  latency "
                f"{statistics.median(x[0] for x in seen):5.2f} s"
                f"  taken {1000 * statistics.median(x[1] for x in seen):5.0f} ms"
                f"  {statistics.median(x[2] for x in seen):9,.0f} samples"
            )
    if "console" in found:
        c = found["console"]
        for mode in ("none", "wallboard"):
            if mode in found:
                m = found[mode]
                print(
                    f"  {mode} against a console: round {m['round_s'] / c['round_s']:.2f}x, "
                    f"head CPU {m['cores'] / c['cores']:.2f}x, Prometheus CPU "
                    f"{m['prom_cores'] / c['prom_cores']:.2f}x"
                )
    for mode, m in found.items():
        met = m["cores"] <= CORES_TARGET and m["round_s"] <= INTERVAL_S
        print(
            f"  {mode}: the overview refreshes every {INTERVAL_S:g} s at ≤ {CORES_TARGET:g} "
            f"core of the head: {'met' if met else 'MISSED'}"
        )
        what = {"none": "no viewer", "wallboard": "a wallboard"}.get(
            mode, f"{ROWS_IN_VIEW} rows in view"
        )
        record(
            f"Prometheus {nodes:,} nodes: overview round, {what}",
            m["round_s"],
            "s",
            at_most=INTERVAL_S,
        )
        record(
            f"Prometheus {nodes:,} nodes: head CPU, {what}",
            m["cores"],
            "cores",
            at_most=CORES_TARGET,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"the viewers measured, in turn, of {', '.join(MODES)} (default: all)",
    )
    args = parser.parse_args()
    chosen = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not chosen or set(chosen) - set(MODES):
        parser.error(f"--modes: each of {', '.join(MODES)}")
    main(args.nodes, args.rounds, chosen)
