"""A fleet's overview from a real Prometheus that holds it: every agent's series backfilled
with promtool (benchmarks.promfleet), read by the console's PromQL source; drilling into a
node still reads its own agent."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.promfleet import (
    BackfilledPrometheus,
    Member,
    identities,
    members,
    targets_file,
    write_openmetrics,
)
from gpuconsole.config import FleetConfig
from gpuconsole.export import names
from gpuconsole.export.agent import Agent, select
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.facts.verdict import reading_verdict
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.base import Health
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.promql import (
    OUT_OF_VIEW_S,
    FleetSeries,
    NodeBuilder,
    PrometheusReader,
    PromQLSource,
    drawn_asks,
    drawn_gauges,
    figure_queries,
    flag_asks,
    gpu_verdict_asks,
    parse_overview,
    round_plan,
    verdict_ask,
)
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.fleet import FleetScreen, Sort
from gpuconsole.tui.wallboard import TOP, WallboardApp
from gpuconsole.wiring import AgentSettings, fleet_hub
from tests.export_fixtures import HeldHub, frozen_fleet
from tests.peers import require_program
from tests.test_promql import node_view
from tests.waiting import until

NODES = 200
OPENED = "dgx-002"  # the member a user drills into: its agent runs here
UNSCRAPED = "gpu-00150"  # a target Prometheus could not scrape


@dataclass
class Fleet:
    url: str
    targets: Path
    members: list[Member]


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    served = Agent(HeldHub(select(frozen_fleet(), OPENED, summary=False)), AgentSettings(port=0))
    await served.start()
    try:
        yield served
    finally:
        await served.stop()


@pytest.fixture
def fleet(agent: Agent, tmp_path: Path) -> Iterator[Fleet]:
    """200 nodes: the demo's GPU nodes under their own names (the first at its agent's
    address), then copies of them named gpu-00007 on, one of which Prometheus never scraped."""
    require_program("promtool", "apt-get install prometheus")
    require_program("prometheus", "apt-get install prometheus")
    templates = [n for n in frozen_fleet().nodes if n.gpus]
    assert templates[0].node == OPENED
    own = [Member(n.node, f"127.0.0.1:{19000 + i}", n) for i, n in enumerate(templates)]
    own[0] = Member(OPENED, f"127.0.0.1:{agent.port}", templates[0])
    copies = [
        m if m.name != UNSCRAPED else Member(m.name, m.instance, m.node, up=False)
        for m in members(templates, NODES, first_port=20000)
    ][len(own) :]
    fleet = own + copies
    source = tmp_path / "fleet.om"
    write_openmetrics(source, fleet, time.time() - 30)
    targets = tmp_path / "targets.json"
    targets_file(targets, fleet)
    with BackfilledPrometheus(source) as prometheus:
        yield Fleet(prometheus.url, targets, fleet)


def head(fleet: Fleet) -> Hub:
    cfg = FleetConfig(
        targets_file=str(fleet.targets), prometheus=fleet.url, interval_s=1.0, timeout_s=10.0
    )
    return fleet_hub(cfg, HubSettings(publish_gap_s=0.1, max_backoff_s=2.0))


def record_queries(reader: Any) -> dict[int, list[str]]:
    """What `reader` sends from now on, by its round; each query still sent."""
    sent: dict[int, list[str]] = {}
    query = reader.query

    async def recorded(promql: str) -> list[Any]:
        sent.setdefault(reader.rounds, []).append(promql)
        return await query(promql)

    reader.query = recorded
    return sent


def fresh(hub: Hub, node: str) -> bool:
    found = hub.latest.node(node) if hub.latest is not None else None
    status = found.status("remote") if found is not None else None
    return status is not None and status.ok


async def test_a_user_sees_every_node_of_a_backfilled_fleet_its_gpus_and_its_faults(
    fleet: Fleet,
) -> None:
    hub = head(fleet)
    assert len(hub.sources) == NODES
    scraped = [m for m in fleet.members if m.up]
    await hub.start()
    try:
        await until(lambda: all(fresh(hub, m.name) for m in scraped), timeout=60)
        # the first round read every series; later ones read part of them each: once
        # every part came round, the user sees what the whole round showed
        reader = hub.sources[0].reader  # type: ignore[attr-defined]
        assert isinstance(reader, PrometheusReader)
        whole = hub.latest
        assert whole is not None
        await until(lambda: reader.rounds >= len(reader.parts) + 2, timeout=60)
        await until(lambda: hub.latest is not None and hub.latest.seq > whole.seq + 1)
        shot = hub.latest
        assert shot is not None and len(shot.nodes) == NODES
        for member in scraped:
            now, then = shot.node(member.name), whole.node(member.name)
            assert now is not None and then is not None
            assert node_view(now) == node_view(then), member.name
            node = shot.node(member.name)
            assert node is not None
            template = member.node
            # every GPU, under the node's own identities, where the agent's node has it
            own = set(identities(member.name, len(node_gpus(template))))
            assert len({g.uuid for g in node.gpus} & own) == len(template.gpus), member.name
            # (a GPU NVML lost before reading it: where sysfs has it, as the agent exports)
            assert [r.bus_id for r in node_gpus(node) if r.reading] == [
                r.bus_id for r in node_gpus(template) if r.reading
            ]
            assert [g.util_gpu_pct for g in node.gpus] == [g.util_gpu_pct for g in template.gpus]
            assert [(g.mem_used_bytes, g.mem_total_bytes) for g in node.gpus] == [
                (g.mem_used_bytes, g.mem_total_bytes) for g in template.gpus
            ], member.name
            assert [reading_verdict(g).health for g in node.gpus] == [
                reading_verdict(g).health for g in template.gpus
            ]
        # the demo's fault: dgx-003's GPU 5 fell off the bus, and so on every copy of it
        lost = [m.name for m in scraped if m.node.node == "dgx-003"]
        templates = len({m.node.node for m in fleet.members})
        assert len(lost) >= NODES // templates - 1
        for name in lost:
            node = shot.node(name)
            assert node is not None
            critical = [g.index for g in node.gpus if reading_verdict(g).health is Health.CRITICAL]
            assert critical == [5], name
        # the target Prometheus could not scrape says so, and nothing else is stale
        gone = shot.node(UNSCRAPED)
        status = gone.status("remote") if gone is not None else None
        assert status is not None and not status.ok
        assert "cannot scrape the agent at" in (status.error or "")
        # drilling in reads the node's own agent: NVLink readings the overview leaves out
        overview = shot.node(OPENED)
        assert overview is not None and all(g.nvlinks == () for g in overview.gpus)
        assert [g.uuid for g in overview.gpus] == [g.uuid for g in fleet.members[0].node.gpus]
        hub.focus(OPENED)
        await until(lambda: bool(hub.latest.node(OPENED).gpus[0].nvlinks), timeout=15)  # type: ignore[union-attr]
        opened = hub.latest.node(OPENED)  # type: ignore[union-attr]
        assert opened is not None
        assert [g.nvlinks for g in opened.gpus] == [g.nvlinks for g in fleet.members[0].node.gpus]
    finally:
        await hub.stop()


def _sample(name: str, value: float, **labels: str) -> dict[str, Any]:
    metric = {"__name__": name, "instance": "n1:9400", "node": "n1", **labels}
    return {"metric": metric, "value": [1796000000.5, str(value)]}


def test_a_round_replaces_what_it_asked_for_and_a_flag_no_longer_raised_reads_zero() -> None:
    plan = round_plan()
    util, lost, dbe = "DCGM_FI_DEV_GPU_UTIL", "gpuconsole_gpu_lost", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
    asked_util = next(a for a in plan.every if a.named == util)
    flags = flag_asks()  # each asked for only where raised
    assert {lost, dbe} <= {m for a in flags for m in a.raised}
    sm = "DCGM_FI_DEV_SM_CLOCK"
    part = next(a for p in plan.parts for a in p if sm in a.metrics)
    series = FleetSeries()
    series.take_values(
        [_sample("up", 1), _sample(util, 40, gpu="0"), _sample(lost, 1, gpu="0"),
         _sample(dbe, 0, gpu="0"), _sample(sm, 1980, gpu="0")]
    )  # fmt: skip
    # the next round: the GPU came back, its utilization moved, the SM clock was not asked;
    # a metric asked alone comes without its name
    unnamed = _sample(util, 55, gpu="0")
    del unnamed["metric"]["__name__"]
    series.take_values([unnamed], asked_util.metrics, named=util)
    for flag in flags:
        series.take_values([], flag.metrics, flag.raised, flag.named)
    gpu = series.overview().nodes["n1:9400"]["n1"].gpus[0]
    assert gpu == {util: 55.0, lost: 0.0, dbe: 0.0, sm: 1980.0}
    # the part that holds the SM clock comes round without it: the series is gone
    series.take_values([], part.metrics, named=part.named)
    assert sm not in series.overview().nodes["n1:9400"]["n1"].gpus[0]


def test_memory_in_use_moves_every_round_over_a_total_read_beside_it_in_its_part() -> None:
    """Free memory is asked only in its part, as total memory does not move: the share a
    user sees is used over the total taken when free was read beside used, not over a
    free that is rounds old."""
    plan = round_plan()
    used, free = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
    assert [a.named for a in plan.every if a.named in (used, free)] == [used]
    part = next(p for p in plan.parts if any(a.named == free for a in p))
    info = [{"metric": {"__name__": "gpuconsole_gpu_info", "instance": "n1:9400", "node": "n1",
                        "gpu": "0", "uuid": "GPU-0", "pci_bus_id": "0000:01:00.0"},
             "value": [1796000000.5, "1"]}]  # fmt: skip
    series = FleetSeries()
    series.take_values(
        [_sample("up", 1), _sample(used, 1000, gpu="0"), _sample(free, 7000, gpu="0")]
    )
    series.take_info(info)
    builder = NodeBuilder("n1")

    def memory() -> tuple[float | None, float | None]:
        gpu = builder.build(series.overview().nodes["n1:9400"]["n1"], series.at).gpus[0]
        return gpu.mem_used_pct, gpu.mem_total_bytes

    gib8 = 8000 * 1024 * 1024
    assert memory() == (12.5, gib8)

    def unnamed(name: str, value: float) -> dict[str, Any]:
        sample = _sample(name, value, gpu="0")
        del sample["metric"]["__name__"]
        return sample

    # a job took 3000 MiB more: used moved, free was not asked
    series.take_values([unnamed(used, 4000)], frozenset({used}), named=used)
    assert memory() == (50.0, gib8)
    # free's part comes round, read beside used: the same total
    series.take_values([unnamed(used, 6000)], frozenset({used}), named=used)
    for ask in part:
        sample = [unnamed(free, 2000)] if ask.named == free else []
        series.take_values(sample, ask.metrics, named=ask.named)
    series.settle_totals()
    assert memory() == (75.0, gib8)


def test_a_gpu_labelled_by_its_bus_id_leaves_the_round_to_the_others() -> None:
    """A host exports a GPU it reads from its guest under its bus id (the host's NVML does
    not number it): the overview skips that GPU, and every other series still lands."""
    util = "DCGM_FI_DEV_GPU_UTIL"
    overview = parse_overview(
        [_sample("up", 1), _sample(util, 30, gpu="0"), _sample(util, 70, gpu="0000:52:00.0"),
         _sample(util, 10, gpu="²")],
        [{"metric": {"__name__": "gpuconsole_gpu_info", "instance": "n1:9400", "node": "n1",
                     "gpu": "0000:52:00.0", "uuid": "GPU-guest"}, "value": [1796000000.5, "1"]}],
    )  # fmt: skip
    assert overview.nodes["n1:9400"]["n1"].gpus == {0: {util: 30.0}}
    assert overview.nodes["n1:9400"]["n1"].gpu_info == {}


def test_a_node_is_built_again_as_far_as_its_series_changed() -> None:
    """Between rounds the overview shows every value that moved: a gauge (its GPU redrawn
    from what the rest made), a flag raised, a series read in its part; unchanged, it is
    the node the last round built."""
    util, lost, sm = "DCGM_FI_DEV_GPU_UTIL", "gpuconsole_gpu_lost", "DCGM_FI_DEV_SM_CLOCK"
    info = [
        {"metric": {"__name__": "gpuconsole_gpu_info", "instance": "n1:9400", "node": "n1",
                    "gpu": str(i), "uuid": f"GPU-{i}", "pci_bus_id": f"0000:{i + 1:02x}:00.0"},
         "value": [1796000000.5, "1"]}
        for i in range(2)
    ]  # fmt: skip
    series = FleetSeries()
    series.take_values(
        [_sample("up", 1), _sample(util, 10, gpu="0"), _sample(util, 20, gpu="1"),
         _sample(lost, 0, gpu="0"), _sample(lost, 0, gpu="1"), _sample(sm, 1500, gpu="1")]
    )  # fmt: skip
    series.take_info(info)
    builder = NodeBuilder("n1")

    def build() -> NodeSnapshot:
        return builder.build(series.overview().nodes["n1:9400"]["n1"], series.at)

    first = build()
    assert [(g.util_gpu_pct, g.lost, g.sm_clock_mhz) for g in first.gpus] == [
        (10.0, False, None),
        (20.0, False, 1500),
    ]
    assert build() is first  # nothing moved

    def unnamed(name: str, value: float, gpu: str) -> dict[str, Any]:
        sample = _sample(name, value, gpu=gpu)
        del sample["metric"]["__name__"]
        return sample

    series.take_values(
        [unnamed(util, 10, "0"), unnamed(util, 55, "1")], frozenset({util}), named=util
    )
    moved = build()
    assert [(g.util_gpu_pct, g.sm_clock_mhz, g.pci_bus_id) for g in moved.gpus] == [
        (10.0, None, "0000:01:00.0"),
        (55.0, 1500, "0000:02:00.0"),
    ]
    flags = frozenset({lost})
    series.take_values([unnamed(lost, 1, "0")], flags, flags, named=lost)
    assert [g.lost for g in build().gpus] == [True, False]
    series.take_values([unnamed(sm, 1980, "1")], frozenset({sm}), named=sm)
    series.take_values([], flags, flags, named=lost)  # the GPU came back
    assert [(g.lost, g.sm_clock_mhz, g.util_gpu_pct) for g in build().gpus] == [
        (False, None, 10.0),
        (False, 1980, 55.0),
    ]


def test_the_readme_says_which_queries_the_console_sends() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    scale = readme[readme.index("## Scale") : readme.index("## How it is built")]
    plan = round_plan()
    by = "instance, Hostname, node, exported_node, gpu, source, device, port, netdev"
    assert f"`(…)` below is `{by}`" in scale
    some = frozenset({"10.0.0.1:9400", "10.0.0.2:9400"})
    seen = drawn_asks(within=some)
    assert {a.named for a in seen} == set(drawn_gauges())
    assert {a.named for a in plan.every} == {"up", *drawn_gauges(), names.NODE_GPUS_FLAGGED[0]}
    flags = (*flag_asks(within=some), *flag_asks())
    verdicts = (verdict_ask(), *gpu_verdict_asks(within=some), gpu_verdict_asks()[0])
    assert all(a.raised == a.metrics for a in (*flags, *verdicts))
    for ask in (*plan.every, *seen, *flags, *verdicts):
        # each as the README writes it, with the labels it aggregates by shortened to (…)
        # and the targets a console sees to "…"
        shown = re.sub(r'instance=~"[^"]*"', 'instance=~"…"', ask.query.replace(by, "…"))
        if ask.named != "up" and ask.named in ask.query:  # else a value it makes
            assert f"`{ask.named}`" in scale
            shown = shown.replace(ask.named, "METRIC")
        assert f"`{shown}`" in scale
    info = next(a for part in plan.parts for a in part if a.info)
    assert f"`{info.query}`" in scale
    assert (
        f'of every node, `max by (…) (METRIC{{GPU_I_ID=""}})`, once every {OUT_OF_VIEW_S:g} s'
        in " ".join(scale.split())
    )
    rounds = {8: "eight", 9: "nine", 10: "ten"}[len(plan.parts)]
    assert f"fresh within {rounds} rounds" in scale
    # the fleet's figures a wallboard shows, as Prometheus aggregates them
    for promql in figure_queries(TOP).values():
        assert f"`{promql}`" in scale, promql


def test_a_series_gone_from_an_answer_is_gone_though_as_many_others_came() -> None:
    util, lost = "DCGM_FI_DEV_GPU_UTIL", "gpuconsole_gpu_lost"
    series = FleetSeries()
    series.take_values(
        [_sample("up", 1), _sample(util, 1, gpu="0"), _sample(util, 2, gpu="1"),
         _sample(lost, 1, gpu="0"), _sample(lost, 0, gpu="1")]
    )  # fmt: skip

    def unnamed(name: str, value: float, gpu: str) -> dict[str, Any]:
        sample = _sample(name, value, gpu=gpu)
        del sample["metric"]["__name__"]
        return sample

    # as many values as before, one of them a GPU new to the rounds
    series.take_values(
        [unnamed(util, 3, "0"), unnamed(util, 4, "2")], frozenset({util}), named=util
    )
    # GPU 0 came back as GPU 1 fell off: one flag raised, as before
    flags = frozenset({lost})
    series.take_values([unnamed(lost, 1, "1")], flags, flags, named=lost)
    gpus = series.overview().nodes["n1:9400"]["n1"].gpus
    assert {g: v.get(util) for g, v in gpus.items()} == {0: 3.0, 1: None, 2: 4.0}
    assert {g: v.get(lost) for g, v in gpus.items()} == {0: 0.0, 1: 1.0, 2: None}


@dataclass
class MovingFleet(Fleet):
    steps: list[float]  # the times whose samples hold the gauges moved 1 more each


@pytest.fixture
def moving_fleet(tmp_path: Path) -> Iterator[MovingFleet]:
    """200 copies of the demo's GPU nodes whose drawn gauges, lost flags and counts of
    flagged GPUs move 1 at each step: at the first step after the backfill every GPU of
    every node is lost."""
    require_program("promtool", "apt-get install prometheus")
    require_program("prometheus", "apt-get install prometheus")
    templates = [n for n in frozen_fleet().nodes if n.gpus]
    fleet = list(members(templates, NODES))
    at = time.time() - 60
    steps = [at + 5.0 * k for k in range(3)]
    source = tmp_path / "fleet.om"
    moving = (*drawn_gauges(), names.GPU_LOST[0], names.NODE_GPUS_FLAGGED[0])
    write_openmetrics(source, fleet, at, moving=moving, steps=steps[1:])
    targets = tmp_path / "targets.json"
    targets_file(targets, fleet)
    with BackfilledPrometheus(source) as prometheus:
        yield MovingFleet(prometheus.url, targets, fleet, steps)


def _rows_in_view(app: ConsoleApp) -> set[str]:
    screen = app.screen
    assert isinstance(screen, FleetScreen)
    keys = screen.table.row_keys
    return {keys[i] for i in screen.table.visible_rows()}


async def test_the_rows_on_screen_have_their_gpus_read_each_round_the_rest_their_health(
    moving_fleet: MovingFleet,
) -> None:
    """Two consoles on one head (two ssh sessions): Prometheus is asked each round for the
    GPU gauges of the rows either shows, and for every node's health; a row scrolled into
    view has its GPUs read by the next round, and every row sorts by its figures."""
    fleet = moving_fleet
    hub = head(fleet)
    sources = [s for s in hub.sources if isinstance(s, PromQLSource)]
    reader = sources[0].reader
    step = 0
    reader.evaluate_at = lambda: fleet.steps[step] + 0.001
    reader.out_of_view_s = 3600.0  # rows out of view: their gauges as the first round read
    sent: list[str] = []
    query = reader.query

    async def recorded(promql: str) -> list[Any]:
        sent.append(promql)
        return await query(promql)

    reader.query = recorded  # type: ignore[method-assign]  # what it sends, still sent
    by_name = {m.name: m for m in fleet.members}

    def utils(name: str) -> list[float | None]:
        node = hub.latest.node(name) if hub.latest is not None else None
        assert node is not None
        return [g.util_gpu_pct for g in node.gpus]

    def moved(name: str, by: int) -> list[float | None]:
        return [
            None if u is None else u + by for u in (g.util_gpu_pct for g in by_name[name].node.gpus)
        ]

    def all_lost(name: str) -> bool:
        node = hub.latest.node(name) if hub.latest is not None else None
        return node is not None and all(g.lost for g in node.gpus)

    one = ConsoleApp(hub, start_hub=False, theme_dirs=[])
    two = ConsoleApp(hub, start_hub=False, theme_dirs=[])
    await hub.start()
    try:
        await until(lambda: all(fresh(hub, m.name) for m in fleet.members), timeout=60)
        # the event log says how often what is read, as a large demo says its refresh
        said = [e.message for e in hub.events() if e.kind == "refresh"]
        assert len(said) == 1 and "every node's GPUs every 3600 s" in said[0]
        async with one.run_test(size=(120, 30)) as first, two.run_test(size=(120, 30)) as second:
            await second.press("pagedown", "pagedown", "pagedown")
            await first.pause()
            await second.pause()
            shown = _rows_in_view(one) | _rows_in_view(two)
            assert {s.node for s in sources if s.in_view} == shown
            assert 20 < len(shown) < NODES // 2
            hidden = [m.name for m in fleet.members if m.name not in shown]
            # the gauges move: the rows in view show it within a round; the rest, whose
            # health is asked each round, show every GPU lost, their gauges as read before
            sent.clear()
            step, began = 1, reader.rounds
            await until(lambda: all(utils(n) == moved(n, 1) for n in shown), timeout=30)
            await until(lambda: all(all_lost(n) for n in hidden), timeout=30)
            assert reader.rounds <= began + 3
            assert all(utils(n) == moved(n, 0) for n in hidden)
            instances = {by_name[n].instance for n in shown}
            for gauge in drawn_gauges():
                asked = [q for q in sent if f"({gauge}{{" in q]
                assert asked and all(_matched(q) == instances for q in asked), gauge
            flag = [q for q in sent if f"({names.GPU_LOST[0]}{{" in q]
            assert flag and all("instance" not in q.split("(", 2)[2] for q in flag)
            # scrolled into view: the next round asks its GPUs, and the user sees them
            await second.press("ctrl+end")
            await second.pause()
            bottom = fleet.members[-1].name
            assert bottom in hidden and bottom in _rows_in_view(two)
            sent.clear()
            began = reader.rounds
            await until(lambda: utils(bottom) == moved(bottom, 1), timeout=30)
            assert reader.rounds <= began + 3
            first_drawn = next(q for q in sent if f"({drawn_gauges()[0]}{{" in q)
            assert by_name[bottom].instance in _matched(first_drawn)
            # every row's gauges at the slower rate: sorted by utilization, each row in
            # its place though most were never in view
            reader.out_of_view_s = 0.0
            began = reader.rounds
            await until(lambda: all(utils(n) == moved(n, 1) for n in hidden), timeout=30)
            assert reader.rounds <= began + 3
            screen = one.screen
            assert isinstance(screen, FleetScreen)
            while screen.sort is not Sort.UTIL:
                await first.press("s")
            await first.pause(1.2)
            mean = {m.name: _mean(moved(m.name, 1)) for m in fleet.members}
            expected = sorted(mean, key=lambda n: (-mean[n], n))
            assert list(screen.table.row_keys) == expected
            # a wallboard joins: the rows its heat grid has room for are seen too, not
            # every node (its hottest GPUs and totals Prometheus aggregates)
            consoles = _rows_in_view(one) | _rows_in_view(two)
            board = WallboardApp(hub, start_hub=False, theme_dirs=[])
            async with board.run_test(size=(120, 40)):
                await until(lambda: {s.node for s in sources if s.in_view} > consoles, 30)
                assert not all(s.in_view for s in sources)
            assert {s.node for s in sources if s.in_view} == consoles
        # both consoles gone: no node is seen (health each round, gauges on the pass over
        # every node), as with no console
        assert not any(s.in_view for s in sources)
    finally:
        await hub.stop()


def _matched(promql: str) -> set[str]:
    """The instances a query's `instance=~"…"` matcher names."""
    found = re.search(r'instance=~"([^"]*)"', promql)
    assert found is not None, promql
    return {part.replace("\\\\", "") for part in found.group(1).split("|")}


def _mean(values: list[float | None]) -> float:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else -1.0


async def test_a_round_asks_a_part_as_heavy_as_the_others_and_rows_out_of_view_add_no_point(
    moving_fleet: MovingFleet,
) -> None:
    """A console shows a few rows: each round asks their gauges, every node's health and
    one part of the rest, the parts about as large as each other; the round that asks every
    node's gauges asks no part; a row whose series did not change records no history point
    (its sparkline holds what was read), while a row in view whose gauges moved does."""
    fleet = moving_fleet
    hub = head(fleet)
    sources = [s for s in hub.sources if isinstance(s, PromQLSource)]
    reader = sources[0].reader
    step = 2
    reader.evaluate_at = lambda: fleet.steps[step] + 0.001
    reader.out_of_view_s = 3600.0
    sent: dict[int, list[tuple[str, int]]] = {}  # round -> (query, samples answered)
    query = reader.query

    async def recorded(promql: str) -> list[Any]:
        at = reader.rounds
        answer = await query(promql)
        sent.setdefault(at, []).append((promql, len(answer)))
        return answer

    reader.query = recorded  # type: ignore[method-assign]  # what it sends, still sent
    shown = [m.name for m in fleet.members[:10]]

    def points(name: str) -> int:
        node = hub.latest.node(name) if hub.latest is not None else None
        assert node is not None and node.history is not None
        history = node.history
        return max(len(history.series("gpu", g.uuid, "temp_gpu_c")) for g in node.gpus)

    await hub.start()
    try:
        await until(lambda: all(fresh(hub, m.name) for m in fleet.members), timeout=60)
        hub.show(shown, viewer=hub)
        began = reader.rounds + 1  # the next round asks as the view says
        await until(lambda: reader.rounds >= began + len(reader.parts) + 1, timeout=60)
        # nothing moved since: no node, in view or not, has a point more
        before = {m.name: points(m.name) for m in fleet.members}
        at = reader.rounds
        await until(lambda: reader.rounds >= at + 3, timeout=30)
        assert {m.name: points(m.name) for m in fleet.members} == before
        # the gauges moved: the rows in view show it in a point more
        step = 1
        await until(lambda: all(points(n) > before[n] for n in shown), timeout=30)
        # every part came round, one a round: about as many samples each
        parts = {ask.query: i for i, part in enumerate(reader.parts) for ask in part}
        size: dict[int, int] = {}
        for r in range(began, began + len(reader.parts)):
            asked = {parts[q] for q, _ in sent[r] if q in parts}
            assert len(asked) == 1, r
            size[asked.pop()] = sum(n for q, n in sent[r] if q in parts)
        assert len(size) == len(reader.parts)
        assert max(size.values()) <= 2 * min(size.values()), size
        # the pass over every node's gauges: no part beside it, and the next round asks one
        reader.out_of_view_s = 0.0
        at = reader.rounds + 1
        await until(lambda: reader.rounds >= at + 2, timeout=30)
        gauge = drawn_gauges()[0]
        whole = [r for r in (at, at + 1) if any(f"({gauge}{{G" in q for q, _ in sent[r])]
        assert whole
        for r in (at, at + 1):
            with_part = any(q in parts for q, _ in sent[r])
            assert with_part == (r not in whole) or len(whole) == 2, r
        assert any(any(q in parts for q, _ in sent[r]) for r in (at, at + 1))
    finally:
        await hub.stop()
