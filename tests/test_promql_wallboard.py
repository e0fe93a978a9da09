"""A Prometheus overview watched by a wallboard, or by nobody: the wallboard's rows have
their GPUs read each round, its hottest GPUs and totals are the whole fleet's (Prometheus
aggregates them), and a head with no viewer reads every node's health each round, its GPU
gauges only on the pass over every node."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.widgets import Digits

from benchmarks.promfleet import (
    BackfilledPrometheus,
    Member,
    members,
    targets_file,
    write_openmetrics,
)
from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.alerts.rules import DEFAULT_RULES
from gpuconsole.export import names
from gpuconsole.export.collector import node_metrics
from gpuconsole.export.families import Families
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.promql import FleetFigures, PromQLSource, drawn_gauges
from gpuconsole.tui.wallboard import WallboardApp
from tests.export_fixtures import frozen_fleet
from tests.peers import require_program
from tests.test_promql_fleet import Fleet, _matched, fresh, head, record_queries
from tests.test_promql_health import MOVERS, HealthFleet, _with_gpu, health_fleet
from tests.waiting import until

__all__ = ["health_fleet"]  # the fixture, shared with the health tests

NODES = 600
HOT = "gpu-00600"
POWER = names.DCGM_POWER_USAGE[0]  # the last node: far below any screen's rows


@pytest.fixture
def board_fleet(tmp_path: Path) -> Iterator[Fleet]:
    """600 copies of the demo's GPU nodes; the last one's GPU 3 the hottest and the most
    power-hungry of the fleet."""
    require_program("promtool", "apt-get install prometheus")
    require_program("prometheus", "apt-get install prometheus")
    templates = [n for n in frozen_fleet().nodes if n.gpus]
    fleet = list(members(templates, NODES))
    last = fleet[-1]
    assert last.name == HOT
    hot = _with_gpu(last.node, 3, temp_gpu_c=97.0, power_w=731.0)
    fleet[-1] = Member(last.name, last.instance, hot)
    source = tmp_path / "fleet.om"
    write_openmetrics(source, fleet, time.time() - 30)
    targets = tmp_path / "targets.json"
    targets_file(targets, fleet)
    with BackfilledPrometheus(source) as prometheus:
        yield Fleet(prometheus.url, targets, fleet)


def _exported_watts(node: NodeSnapshot) -> float:
    """The power of every GPU the node's agent exports: a guest's GPU its host reads
    through the guest's agent too."""
    out = Families(frozenset({POWER}))
    node_metrics(out, node, time.time())
    return sum(
        x
        for n, k, v, x in out.samples()
        if n == POWER and not dict(zip(k, v, strict=True)).get("GPU_I_ID")
    )


def _text(renderable: Any) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


async def test_a_wallboard_has_its_rows_gpus_read_and_shows_the_fleets_hottest_gpu_and_kw(
    board_fleet: Fleet,
) -> None:
    fleet = board_fleet
    hub = head(fleet)
    sources = [s for s in hub.sources if isinstance(s, PromQLSource)]
    reader = sources[0].reader
    reader.out_of_view_s = 3600.0  # no pass over every node's gauges while measured
    sent = record_queries(reader)
    by_name = {m.name: m for m in fleet.members}
    await hub.start()
    try:
        await until(lambda: all(fresh(hub, m.name) for m in fleet.members), timeout=90)
        board = WallboardApp(hub, start_hub=False, theme_dirs=[])
        async with board.run_test(size=(120, 40)) as pilot:
            # the heat page: its rows (as many as fit) seen, the fleet's busy GPUs aggregated
            await until(lambda: any(s.in_view for s in sources), timeout=30)
            await until(lambda: board.fleet is not None and board.fleet.busy is not None, 30)
            board.render_page()
            assert board.current is not None
            heat = _text(board.current.body)
            rows = {n for n in by_name if re.search(rf"\b{n}\b", heat)}
            assert 20 <= len(rows) < 60 and f"of {NODES}" in heat
            assert {s.node for s in sources if s.in_view} == rows
            # the hottest page: the fleet's hottest GPUs and power, from Prometheus
            board.next_page()
            await until(lambda: board.fleet is not None and board.fleet.hottest is not None, 30)
            await until(lambda: HOT in {s.node for s in sources if s.in_view}, timeout=30)
            shown = {s.node for s in sources if s.in_view}
            assert rows < shown and len(shown) < NODES // 5
            began = reader.rounds + 1
            await until(lambda: reader.rounds >= began + 2, timeout=30)
            instances = {by_name[n].instance for n in shown}
            for r in (began, began + 1):
                for gauge in drawn_gauges():
                    asked = [q for q in sent[r] if f"({gauge}{{" in q and q.startswith("max by")]
                    assert len(asked) == 1 and _matched(asked[0]) == instances, gauge
                # the hottest page's aggregations, not the heat page's
                assert not [q for q in sent[r] if q.startswith("count")]
            board.render_page()
            await pilot.pause()
            page = board.current
            assert page is not None and page.title.startswith("Hottest")
            figures = dict(page.figures)
            watts = sum(_exported_watts(m.node) for m in fleet.members)
            assert figures["hottest °C"] == "97" and figures["top W"] == "731"
            assert figures["GPU kW"] == f"{watts / 1000:.1f}"
            assert f"{HOT} #3" in _text(page.body).splitlines()[1]
            assert "97" in [d.value for d in board.query(Digits)]
        # the wallboard gone: no viewer, no node seen, no aggregation asked
        assert not any(s.in_view for s in sources) and reader.figures is None
    finally:
        await hub.stop()


async def test_with_no_viewer_a_health_rule_fires_within_a_round_without_gpu_gauges(
    health_fleet: HealthFleet,
) -> None:
    """A head that only alerts: every round asks each node's health, and a GPU lost fires
    GpuLost by the next round, while no round between the passes over every node asks a
    GPU's gauges."""
    fleet = health_fleet
    hub = head(fleet)
    sources = [s for s in hub.sources if isinstance(s, PromQLSource)]
    reader = sources[0].reader
    reader.out_of_view_s = 3600.0
    step = 0
    reader.evaluate_at = lambda: fleet.steps[step] + 0.001
    sent = record_queries(reader)
    engine = AlertEngine([r for r in DEFAULT_RULES if r.name == "GpuLost"])
    movers = {fleet.members[i].name for i in MOVERS}

    def lost_nodes() -> set[str]:
        assert hub.latest is not None
        engine.evaluate(hub.latest)
        return {a.labels.get("node", "") for a in engine.alerts.values() if a.state == "firing"}

    await hub.start()
    try:
        await until(lambda: all(fresh(hub, m.name) for m in fleet.members), timeout=60)
        assert not any(s.in_view for s in sources)
        assert not movers & lost_nodes()
        step = 1
        began = reader.rounds
        await until(lambda: movers <= lost_nodes(), timeout=30)
        assert reader.rounds <= began + 2
        for r in range(1, reader.rounds):
            for gauge in drawn_gauges():
                assert not [q for q in sent.get(r, []) if f"({gauge}{{" in q], (r, gauge)
    finally:
        await hub.stop()


def test_two_prometheus_servers_figures_are_one_fleets() -> None:
    """A head reading two Prometheus servers: the hottest GPUs of both, highest first,
    their power added up; a figure one of them has not aggregated yet is not shown."""
    one = FleetFigures(1.0, hottest=(("a", 0, 90.0), ("a", 1, 70.0)), watts=1000.0, busy=3)
    two = FleetFigures(2.0, hottest=(("b", 4, 80.0),), watts=500.0, busy=None)
    both = FleetFigures.merged([one, two], top=2)
    assert both is not None
    assert both.hottest == (("a", 0, 90.0), ("b", 4, 80.0))
    assert both.watts == 1500.0 and both.busy is None and both.at == 1.0
