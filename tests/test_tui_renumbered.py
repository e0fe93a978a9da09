"""After a GPU leaves the nvidia driver, NVML numbers the others again: the console's views
of a GPU, and its events, stay with the GPU (its bus id), not with the number it had.

dgx-003 as the demo has it, its GPU 5 (c3:00.0) lost a second in; then GPU 3 (61:00.0) goes
to a guest, so c3:00.0 is shown as GPU 4 and d1:00.0, a healthy training GPU, as GPU 5."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from textual.widgets import DataTable

from gpuconsole.actions.plan import Target
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.hub import Hub
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sim.cluster import SimNodeSpec, add_sim_sources, build_sim_nodes
from gpuconsole.sim.node import Scenario
from gpuconsole.sim.tenancy import add_sim_tenancy_sources
from gpuconsole.tui.actions import DemoAccess
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.events import EventsScreen
from gpuconsole.tui.screens.gpu import GpuScreen
from gpuconsole.tui.screens.node import NodeScreen
from gpuconsole.tui.screens.smmap import SmMapScreen
from tests.waiting import until

SIZE = (120, 40)
NODE = "dgx-003"
LOST = "0000:c3:00.0"  # GPU 5, lost; GPU 4 once NVML numbers the GPUs again
BESIDE = "0000:d1:00.0"  # GPU 6, training; GPU 5 once NVML numbers the GPUs again
TO_GUEST = "0000:61:00.0"  # GPU 3, free: the one that leaves for a guest
OPERATOR = Actor("ops", Role.OPERATOR, "SHA256:ops", "ssh")


@pytest.fixture(params=[1.0, 0.0], ids=["lost-after-read", "lost-before-read"])
async def hub(request: pytest.FixtureRequest) -> AsyncIterator[Hub]:
    """Lost a second in, or before NVML could read it (its bus id and UUID unknown to NVML:
    the tenancy source's sysfs knows them)."""
    spec = SimNodeSpec(NODE, "dgx-h100", (Scenario("xid79", 5, request.param),))
    sims = build_sim_nodes([spec])
    running = Hub()
    add_sim_sources(running, sims, interval_s=0.2, events=False)
    add_sim_tenancy_sources(running, sims, interval_s=0.2)
    await running.start()
    try:
        await until(lambda: any(e.kind == "gpu_lost" for e in running.events()), timeout=10)
        yield running
    finally:
        await running.stop()


def _node(hub: Hub) -> NodeSnapshot | None:
    latest = hub.latest
    return latest.node(NODE) if latest is not None else None


def _index(hub: Hub, bus_id: str) -> int | None:
    node = _node(hub)
    return next((r.index for r in node_gpus(node) if r.bus_id == bus_id), None) if node else None


async def renumber(hub: Hub) -> None:
    """GPU 3 goes to the waiting guest: NVML restarts and numbers the rest again."""
    executor = DemoAccess(hub).executor(NODE, lambda _update: None)
    try:
        plan = await executor.plan([TO_GUEST], Target.parse("vm:tenant-b-vm8"))
        assert (await executor.execute(plan, OPERATOR, NODE)).ok
    finally:
        await executor.close()
    await until(lambda: _index(hub, LOST) == 4 and _index(hub, BESIDE) == 5, timeout=10)


def _shown(app: ConsoleApp, bus_id: str) -> int | None:
    """The number the console shows a GPU by, in its latest snapshot."""
    node = app.snapshot.node(NODE) if app.snapshot is not None else None
    return next((r.index for r in node_gpus(node) if r.bus_id == bus_id), None) if node else None


def console(hub: Hub) -> ConsoleApp:
    return ConsoleApp(hub, start_hub=False, actor=OPERATOR, theme_dirs=[], cursor_blink=False)


def rows(app: ConsoleApp) -> list[list[str]]:
    table = app.screen.query_one("#events-table", DataTable)
    return [[str(cell) for cell in table.get_row_at(k)] for k in range(table.row_count)]


async def filter_events(app: ConsoleApp, pilot: Any, text: str) -> list[list[str]]:
    screen = app.screen
    assert isinstance(screen, EventsScreen)
    await pilot.press("slash", *text, "enter")  # the line opens empty: the whole filter
    await pilot.pause()
    return rows(app)


async def test_an_event_from_before_nvml_renumbers_opens_and_filters_by_the_gpu_it_was_about(
    hub: Hub,
) -> None:
    await renumber(hub)
    (lost,) = [e for e in hub.events() if e.kind == "gpu_lost"]
    assert lost.gpu_index == 5  # the number it had then
    app = console(hub)
    async with app.run_test(size=SIZE) as pilot:
        await until(lambda: app.snapshot is not None and app.snapshot.node(NODE) is not None)
        app.jump("events")
        await until(lambda: isinstance(app.screen, EventsScreen) and app.screen.is_mounted)
        # the number is the one the console shows the GPU by now
        shown = await filter_events(app, pilot, f"node:{NODE} gpu:4")
        assert [(r[3], r[4]) for r in shown] == [("c3:00.0", "gpu_lost")]
        assert "GPU 4 (c3:00.0)" in str(app.screen.query_one("#events-summary").content)
        assert await filter_events(app, pilot, f"node:{NODE} gpu:5") == []
        assert len(await filter_events(app, pilot, "gpu:c3:00.0")) == 1
        assert len(await filter_events(app, pilot, f"gpu:{LOST}")) == 1
        # the GPU that left: its plan's steps and its driver change, by its bus id
        kinds = {r[4] for r in await filter_events(app, pilot, "gpu:61:00.0")}
        assert {"action", "action_step", "ownership"} <= kinds, kinds
        assert app.snapshot is not None
        uuid = next(r.uuid for r in node_gpus(app.snapshot.node(NODE)) if r.bus_id == LOST)
        assert len(await filter_events(app, pilot, f"gpu:{uuid}")) == 1
        # Enter opens the GPU the event was about, now GPU 4, not the GPU shown as 5
        await filter_events(app, pilot, f"node:{NODE} gpu_lost")
        app.screen.query_one("#events-table", DataTable).focus()
        await pilot.press("enter")
        await until(lambda: isinstance(app.screen, GpuScreen) and app.screen.gpu_index is not None)
        assert isinstance(app.screen, GpuScreen)
        assert (app.screen.bus_id, app.screen.gpu_index) == (LOST, 4)
        # and the events of this GPU are that GPU's
        await pilot.press("e")
        await until(lambda: isinstance(app.screen, EventsScreen) and app.screen.is_mounted)
        await pilot.pause()
        assert [(r[3], r[4]) for r in rows(app)] == [("c3:00.0", "gpu_lost")]


@pytest.mark.parametrize("hub", [1.0], indirect=True)
async def test_an_sm_map_open_while_nvml_renumbers_stays_on_its_gpu(hub: Hub) -> None:
    app = console(hub)
    async with app.run_test(size=SIZE) as pilot:
        await until(lambda: app.snapshot is not None and app.snapshot.node(NODE) is not None)
        app.jump("node", NODE)
        await until(lambda: isinstance(app.screen, NodeScreen) and app.screen.is_mounted)
        node_view = app.screen
        assert isinstance(node_view, NodeScreen)
        await until(lambda: BESIDE in node_view.table.row_keys)
        node_view.table.move_cursor(BESIDE)
        await pilot.press("m")
        await until(lambda: isinstance(app.screen, SmMapScreen) and app.screen.is_mounted)
        sm_map = app.screen
        assert isinstance(sm_map, SmMapScreen) and sm_map.crumbs()[2] == "GPU 6"
        await renumber(hub)
        await until(lambda: _shown(app, BESIDE) == 5 and sm_map._applied is app.snapshot)
        await pilot.pause()
        assert sm_map.crumbs()[2] == "GPU 5"  # as the console shows d1:00.0 now
        title = str(sm_map.query_one("#sm-title").content)
        assert title.startswith("GPU 5 · NVIDIA H100")
        assert sm_map.bus_id == BESIDE


@pytest.mark.parametrize("hub", [1.0], indirect=True)
async def test_a_gpus_history_stays_its_own_when_nvml_renumbers(hub: Hub) -> None:
    """History is keyed by UUID, which NVML reads before anything else of a GPU (one it
    cannot name has no readings to keep): the GPU shown as 6, then 5, has one history."""

    def history(bus_id: str) -> tuple[float, ...]:
        node = _node(hub)
        assert node is not None and node.history is not None
        row = next(r for r in node_gpus(node) if r.bus_id == bus_id)
        assert row.uuid is not None
        return node.history.series("gpu", row.uuid, "power_w")

    await until(lambda: len(history(BESIDE)) >= 3)
    before = history(BESIDE)
    await renumber(hub)
    await until(lambda: len(history(BESIDE)) > len(before) + 2)
    after = history(BESIDE)
    assert after[: len(before)] == before  # the points from when it was GPU 6


@pytest.mark.parametrize("hub", [1.0], indirect=True)
async def test_every_gpus_owner_stays_with_its_bus_id_when_nvml_renumbers(hub: Hub) -> None:
    def owners() -> dict[str, str]:
        node = _node(hub)
        assert node is not None and node.tenancy is not None
        return {r.bus_id: r.label for r in node_gpus(node)}

    await until(lambda: (n := _node(hub)) is not None and n.tenancy is not None)
    before = owners()
    await renumber(hub)
    await until(lambda: owners()[TO_GUEST] == "vm tenant-b-vm8")
    after = owners()
    assert {b: o for b, o in after.items() if b != TO_GUEST} == {
        b: o for b, o in before.items() if b != TO_GUEST
    }
    assert after[LOST] == before[LOST] == "pod team-nlp/train-llm-7b-0"
