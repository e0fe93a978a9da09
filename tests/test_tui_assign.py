"""Moving a GPU from the console (story 3): mark it on the node view, choose the guest, read
the plan, confirm by typing its index, watch the steps tick, and see the new owner in every
view on the hub; viewers are never offered it and are refused where it executes; a wrong
confirmation changes nothing; placement help leads to the same plan. Plus snapshots of the
plan on frozen data."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import OptionList, SelectionList

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.drivers import Drivers
from gpuconsole.actions.drivers.vfio import VfioDriver
from gpuconsole.actions.executor import Executor
from gpuconsole.actions.journal import Journal
from gpuconsole.actions.plan import Step, StepKind, Target
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.config import ActionsConfig, Config, HostConfig
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.hub import Hub
from gpuconsole.readings.nvml import GpuReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sim.actions import live_world
from gpuconsole.sim.cluster import SimNodeSpec, add_sim_sources, build_sim_nodes, demo_cluster
from gpuconsole.sim.fabric import add_sim_fabric_sources
from gpuconsole.sim.node import Scenario
from gpuconsole.sim.tenancy import add_sim_tenancy_sources
from gpuconsole.ssh.feed import PacedFeed
from gpuconsole.tui.actions import ActionAccess, DemoAccess, MachineAccess, OnNote, OnStep
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.assign import AssignScreen, ProposeScreen, Stage
from gpuconsole.tui.screens.node import NodeScreen
from tests.assign_fixtures import tree_picture
from tests.conftest_tui import frozen_fleet
from tests.waiting import until

SIZE = (120, 40)
NODE = "dgx-003"
GPU3 = "0000:61:00.0"  # dgx-003's only free GPU; guest tenant-b-vm8 holds none yet
GUEST = "vm:tenant-b-vm8"
OPERATOR = Actor("ops", Role.OPERATOR, "SHA256:ops", "ssh")
VIEWER = Actor("val", Role.VIEWER, "SHA256:val", "ssh")


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    """The demo cluster's dgx-003, running: NVML, fabric and tenancy polled often, so a
    change lands on screen within a fraction of a second."""
    sims = build_sim_nodes([s for s in demo_cluster() if s.name == NODE])
    running = Hub()
    add_sim_sources(running, sims, interval_s=0.2, events=False)
    add_sim_fabric_sources(running, sims, interval_s=0.5)
    add_sim_tenancy_sources(running, sims, interval_s=0.2)
    await running.start()
    await until(lambda: (node := _node(running)) is not None and node.tenancy is not None)
    try:
        yield running
    finally:
        await running.stop()


def _node(hub: Hub) -> NodeSnapshot | None:
    latest = hub.latest
    return latest.node(NODE) if latest is not None else None


def owner_of(node: NodeSnapshot | None, bus_id: str) -> str | None:
    rows = {row.bus_id: row for row in node_gpus(node)} if node is not None else {}
    return rows[bus_id].label if bus_id in rows else None


def console(hub: Hub, actor: Actor) -> ConsoleApp:
    """A console on the running hub, as an ssh session gets one (it never starts the hub)."""
    return ConsoleApp(hub, start_hub=False, actor=actor, theme_dirs=[], cursor_blink=False)


def screen_text(app: ConsoleApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def open_node(app: ConsoleApp, pilot: Any, bus_id: str) -> NodeScreen:
    """The node view with the cursor on one GPU's row."""
    await until(lambda: app.snapshot is not None and app.snapshot.node(NODE) is not None)
    app.jump("node", NODE)
    await until(lambda: isinstance(app.screen, NodeScreen) and app.screen.is_mounted)
    screen = app.screen
    assert isinstance(screen, NodeScreen)
    await until(lambda: bus_id in screen.table.row_keys)
    screen.table.move_cursor(bus_id)
    await pilot.pause()
    return screen


async def plan_shown(app: ConsoleApp, pilot: Any, target: str) -> AssignScreen:
    """In the dialog: Enter on `target` among the targets, until the plan is shown."""
    screen = app.screen
    assert isinstance(screen, AssignScreen)
    await until(lambda: screen.stage is Stage.CHOOSE)
    targets = screen.query_one("#assign-targets", OptionList)
    targets.focus()
    targets.highlighted = targets.get_option_index(target)
    await pilot.press("enter")
    await until(lambda: screen.stage is Stage.PLAN)
    return screen


async def type_and_enter(pilot: Any, word: str) -> None:
    await pilot.press(*word, "enter")


async def test_an_operator_gives_a_guest_a_free_gpu_and_every_console_sees_it(hub: Hub) -> None:
    app = console(hub, OPERATOR)
    async with app.run_test(size=SIZE) as pilot:
        node_view = await open_node(app, pilot, GPU3)
        assert "a Assign" in screen_text(app) and "p Propose" in screen_text(app)
        await pilot.press("a")
        await until(lambda: isinstance(app.screen, AssignScreen))
        dialog = await plan_shown(app, pilot, GUEST)
        assert dialog.query_one("#assign-gpus", SelectionList).selected == [GPU3]
        plan = dialog.plan
        assert (
            plan is not None and not plan.blocked and plan.confirmations() == (NODE, "3", "61:00.0")
        )
        # the NVSwitch rule for a single H100 is there before anything runs
        assert any("NVLinks disabled" in note for note in plan.notes)
        assert "type dgx-003, 3 or 61:00.0 to confirm" in screen_text(app)
        await type_and_enter(pilot, "3")
        await until(lambda: dialog.stage is Stage.DONE)
        assert dialog.outcome is not None and dialog.outcome.ok
        # every step ticked, in order, as the executor reported it
        assert [dialog.progress[k][0] for k in range(len(plan.steps))] == ["done"] * len(plan.steps)
        assert f"done: GPU 3 ({GPU3}) now {GUEST}" in screen_text(app)
        # and the plan's own line says the new owner, not the one it was planned from
        assert f"GPU 3 ({GPU3}) now: vm tenant-b-vm8 (was: free)" in screen_text(app)
        await pilot.press("escape")
        assert app.screen is node_view
        await until(lambda: node_view.table.get_cell(GPU3, "owner") == "vm tenant-b-vm8")
        # the actions and their steps are in the Events view, with who asked
        await pilot.press("e")
        await until(lambda: f"assign {GUEST} by ops" in screen_text(app))
        text = screen_text(app)
        assert f"ops (operator, ssh key SHA256:ops) started assign {GUEST}" in text
        assert "step 8/8 done: final check" in text

    # a viewer on the same hub (story 3's neighbour) sees the new owner and cannot act
    beside = console(hub, VIEWER)
    async with beside.run_test(size=SIZE) as pilot:
        node_view = await open_node(beside, pilot, GPU3)
        assert node_view.table.get_cell(GPU3, "owner") == "vm tenant-b-vm8"
        assert "Assign" not in screen_text(beside) and "Propose" not in screen_text(beside)


async def test_a_viewer_is_offered_nothing_and_is_refused_where_the_plan_runs(hub: Hub) -> None:
    world = live_world(hub, NODE)
    assert world is not None
    before = tree_picture(world.tree.sysfs_root)
    app = console(hub, VIEWER)
    async with app.run_test(size=SIZE) as pilot:
        node_view = await open_node(app, pilot, GPU3)
        # the keys only say why they do nothing: none is offered in the footer
        offered = {k: b.binding for k, b in node_view.active_bindings.items()}
        assert offered["a"].action == "refuse('assign')" and not offered["a"].show
        assert offered["p"].action == "refuse('propose')" and not offered["p"].show
        await pilot.press("a", "p")
        await pilot.pause()
        assert app.screen is node_view
        said = [n.message for n in app._notifications]
        assert any(m.startswith("viewers cannot assign") for m in said)
        await pilot.press("question_mark")
        await until(lambda: "move between GPUs" in screen_text(app))
        assert "Assign" not in screen_text(app) and "Propose" not in screen_text(app)
        await pilot.press("escape")
        # forced past the UI: the executor refuses, says why, and changes nothing
        app.push_screen(AssignScreen(NODE, [GPU3]))
        dialog = await plan_shown(app, pilot, GUEST)
        await type_and_enter(pilot, "3")
        await until(lambda: dialog.stage is Stage.REFUSED)
        assert "role viewer may not act" in screen_text(app)
        await until(lambda: any("val (viewer" in e.message for e in hub.events()))
    assert tree_picture(world.tree.sysfs_root) == before
    assert owner_of(_node(hub), GPU3) == "free"


async def test_a_wrong_confirmation_is_refused_and_leaves_everything_as_it_was(hub: Hub) -> None:
    world = live_world(hub, NODE)
    assert world is not None
    before = tree_picture(world.tree.sysfs_root)
    app = console(hub, OPERATOR)
    async with app.run_test(size=SIZE) as pilot:
        await open_node(app, pilot, GPU3)
        await pilot.press("a")
        await until(lambda: isinstance(app.screen, AssignScreen))
        dialog = await plan_shown(app, pilot, GUEST)
        await type_and_enter(pilot, "dgx-004")
        await until(lambda: "does not match" in screen_text(app))
        # nothing ran, and the confirmation may be typed again
        assert dialog.stage is Stage.PLAN and dialog.progress == {} and dialog.outcome is None
        await pilot.press("escape")
        assert dialog.stage is Stage.CHOOSE
    assert tree_picture(world.tree.sysfs_root) == before
    assert world.cordoned == set() and owner_of(_node(hub), GPU3) == "free"
    audit = AuditLog(world.root / "actions" / "audit.jsonl").records()
    assert [(r["user"], r["outcome"]) for r in audit] == [("ops", "refused")]


async def test_placement_help_proposes_the_free_gpu_with_its_rail_and_plans_it(hub: Hub) -> None:
    app = console(hub, OPERATOR)
    async with app.run_test(size=SIZE) as pilot:
        await until(lambda: app.snapshot is not None and app.snapshot.node(NODE) is not None)
        await pilot.press("p")
        await until(lambda: isinstance(app.screen, ProposeScreen))
        await pilot.press("tab", *"H100", "tab", *GUEST, "enter")
        await until(lambda: "rail mlx5_5 (PIX)" in screen_text(app))
        assert "dgx-003: GPU 3" in screen_text(app) and "NVLinks disabled" in screen_text(app)
        await pilot.press("enter")  # accept: the plan for it
        await until(lambda: isinstance(app.screen, AssignScreen))
        dialog = app.screen
        assert isinstance(dialog, AssignScreen)
        await until(lambda: dialog.stage is Stage.PLAN)
        assert dialog.plan is not None and dialog.plan.gpus == (GPU3,)
        assert str(dialog.plan.target) == GUEST


@pytest.fixture
async def lost_hub() -> AsyncIterator[Hub]:
    """dgx-003 as the demo has it, but its GPU 5 falls off the bus a second in."""
    spec = SimNodeSpec(NODE, "dgx-h100", (Scenario("xid79", 5, 1.0),))
    sims = build_sim_nodes([spec])
    running = Hub()
    add_sim_sources(running, sims, interval_s=0.2, events=False)
    add_sim_tenancy_sources(running, sims, interval_s=0.2)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def _shown_as(hub: Hub, bus_id: str) -> str | None:
    """How the console names a GPU now."""
    node = _node(hub)
    return next((r.name for r in node_gpus(node) if r.bus_id == bus_id), None) if node else None


def _reading(hub: Hub, bus_id: str) -> GpuReading | None:
    node = _node(hub)
    return next((g for g in node.gpus if g.pci_bus_id == bus_id), None) if node else None


async def test_after_nvml_renumbers_the_operator_drains_the_gpu_on_screen_and_no_other(
    lost_hub: Hub,
) -> None:
    hub, lost_bus, beside = lost_hub, "0000:c3:00.0", "0000:d1:00.0"
    await until(lambda: (g := _reading(hub, lost_bus)) is not None and g.lost, timeout=10)
    first = _reading(hub, lost_bus)
    assert first is not None and first.index == 5
    # GPU 3 goes to the waiting guest: NVML restarts and numbers the rest again
    world = live_world(hub, NODE)
    assert world is not None
    executor = DemoAccess(hub).executor(NODE, lambda _update: None)
    try:
        plan = await executor.plan([GPU3], Target.parse(GUEST))
        assert (await executor.execute(plan, OPERATOR, NODE)).ok
    finally:
        await executor.close()
    await until(lambda: _shown_as(hub, lost_bus) == "GPU 4", timeout=10)
    app = console(hub, OPERATOR)
    async with app.run_test(size=SIZE) as pilot:
        await open_node(app, pilot, lost_bus)
        await pilot.press("a")
        await until(lambda: isinstance(app.screen, AssignScreen))
        dialog = await plan_shown(app, pilot, "drained")
        shown = screen_text(app)
        plan = dialog.plan
        assert plan is not None and plan.gpus == (lost_bus,)
        assert f"dgx-003: GPU 4 ({lost_bus}) → drained" in shown
        assert "GPU 5" not in shown  # the GPU shown as 5 is d1:00.0, a training GPU
        assert "type dgx-003, 4 or c3:00.0 to confirm" in shown
        assert "healthy: lost" not in shown
        await type_and_enter(pilot, "4")
        await until(lambda: dialog.stage is Stage.DONE)
        assert dialog.outcome is not None and dialog.outcome.ok, dialog.outcome
        cordon = next(k for k, s in enumerate(plan.steps) if s.kind is StepKind.CORDON)
        assert dialog.progress[cordon][1] == f"cordoned {first.uuid}"
    assert world.owners(5) == ["drained"] and world.owners(6) != ["drained"]
    assert VfioDriver(world.tree.sysfs_root).driver(beside) == "nvidia"
    # still the GPU lost at the first poll that saw it, one event, its UUID kept; NVML lists
    # it until its first poll after the unbind (drained: no driver holds it), which may
    # already have come
    again = _reading(hub, lost_bus)
    if again is not None:
        assert again.lost_since == first.lost_since and again.uuid == first.uuid
    lost_events = [e for e in hub.events() if e.kind == "gpu_lost"]
    assert [e.gpu_uuid for e in lost_events] == [first.uuid]
    audit = AuditLog(world.root / "actions" / "audit.jsonl").records()
    drained = [r for r in audit if r["action"] == "assign drained"]
    assert {(r["args"]["gpus"][0], r["args"]["uuids"][0]) for r in drained} == {
        (lost_bus, first.uuid)
    }


async def test_placement_help_says_the_node_it_proposes_has_a_lost_gpu(lost_hub: Hub) -> None:
    hub = lost_hub
    await until(lambda: (g := _reading(hub, "0000:c3:00.0")) is not None and g.lost, timeout=10)
    await until(lambda: (node := _node(hub)) is not None and node.tenancy is not None)
    app = console(hub, OPERATOR)
    async with app.run_test(size=SIZE) as pilot:
        await until(lambda: app.snapshot is not None and app.snapshot.node(NODE) is not None)
        await pilot.press("p")
        await until(lambda: isinstance(app.screen, ProposeScreen))
        await pilot.press("enter")  # one GPU, any model, anywhere
        await until(lambda: "dgx-003: GPU 3" in screen_text(app))
        text = screen_text(app)
        assert "critical on the node" in text  # in the list of proposals
        assert "! dgx-003: GPU 5 (c3:00.0): fell off the bus (XID 79)" in text


# --- snapshots of the plan, on frozen data ------------------------------------------------


class _Inert:
    """A driver that is never asked: the snapshot only shows the plan."""

    async def run(self, step: Step) -> str:
        raise AssertionError(f"{step.title} should not run in a snapshot")

    async def undo(self, step: Step) -> str:
        raise AssertionError(f"{step.title} should not be undone in a snapshot")


class FrozenAccess(ActionAccess):
    """Plans from the frozen fleet; journal and audit log in a test's folder."""

    def __init__(self, state: Path) -> None:
        self.state = state

    def executor(self, node: str, on_step: OnStep, on_note: OnNote | None = None) -> Executor:
        found = frozen_fleet().node(node)
        assert found is not None

        async def read() -> NodeSnapshot:
            return found

        return Executor(
            node,
            Drivers(pci=_Inert()),
            Journal(self.state / "actions.db"),
            AuditLog(self.state / "audit.jsonl"),
            reader=read,
            on_step=on_step,
        )


def show_plan(node: str, gpus: Sequence[str], target: str) -> Callable[[Any], Any]:
    async def run_before(pilot: Any) -> None:
        app = pilot.app
        app.jump("node", node)
        await pilot.pause()
        app.push_screen(AssignScreen(node, gpus, Target.parse(target)))
        await until(lambda: isinstance(app.screen, AssignScreen) and app.screen.stage is Stage.PLAN)
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["wide", "small"])
def test_plan_snapshot(
    snap_compare: Any, console_app: Any, tmp_path: Path, size: tuple[int, int]
) -> None:
    pytest.importorskip("pytest_textual_snapshot")
    app = console_app(actor=OPERATOR, actions=FrozenAccess(tmp_path))
    assert snap_compare(app, terminal_size=size, run_before=show_plan(NODE, [GPU3], GUEST))


def test_blocked_plan_snapshot(snap_compare: Any, console_app: Any, tmp_path: Path) -> None:
    # dgx-004's guest holds one H100 already: two is no partition an HGX board allows
    pytest.importorskip("pytest_textual_snapshot")
    app = console_app(actor=OPERATOR, actions=FrozenAccess(tmp_path))
    run_before = show_plan("dgx-004", ["0000:1b:00.0"], "vm:tenant-b-vm7")
    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


async def test_a_console_moves_only_its_own_machines_gpus_and_says_where_to_go(
    console_app: Any, tmp_path: Path
) -> None:
    cfg = Config(host=HostConfig(name="head"), actions=ActionsConfig(state_dir=str(tmp_path)))
    app = console_app(actor=OPERATOR, actions=MachineAccess(cfg, lambda _event: None))
    async with app.run_test(size=SIZE) as pilot:
        dialog = AssignScreen(NODE, [GPU3])
        app.push_screen(dialog)
        await until(lambda: dialog.stage is Stage.CLOSED)
        assert "dgx-003 is not this machine (head)" in screen_text(app)
        assert "ssh dgx-003 gpuconsole assign" in screen_text(app)
        await pilot.press("escape")
        await until(lambda: app.screen is not dialog)


def test_demo_access_comes_from_a_hub_with_simulated_tenants_only() -> None:
    sims = build_sim_nodes([s for s in demo_cluster() if s.name == NODE])
    bare = Hub()
    add_sim_sources(bare, sims)
    assert ConsoleApp(bare, start_hub=False, actor=OPERATOR).actions is None
    add_sim_tenancy_sources(bare, sims)
    app = ConsoleApp(bare, start_hub=False, actor=VIEWER)
    assert isinstance(app.actions, DemoAccess) and not app.may_act
    assert ConsoleApp(bare, start_hub=False, actor=OPERATOR, read_only=True).may_act is False
    assert ConsoleApp(bare, start_hub=False, actor=OPERATOR).may_act
    # an ssh session reads the server's hub through its paced feed: the same simulator
    session = ConsoleApp(bare, feed=PacedFeed(bare, 1.0), start_hub=False, actor=OPERATOR)
    assert isinstance(session.actions, DemoAccess) and session.actions.hub is bare


def test_the_ssh_server_gives_its_operators_this_machines_actions_and_viewers_none(
    tmp_path: Path,
) -> None:
    from gpuconsole.ssh.server import SessionInfo, console_factory
    from gpuconsole.tui.actions import MachineAccess

    cfg = Config(
        host=HostConfig(name="gpu-node"),
        actions=ActionsConfig(state_dir=str(tmp_path / "state")),
    )
    hub = Hub()
    factory = console_factory(
        hub,
        theme=None,
        wallboard_theme=None,
        page_s=15,
        actions=MachineAccess(cfg, hub.post_event, hub),
    )

    def session(role: Role) -> Any:
        actor = Actor("ops", role, "SHA256:x", "ssh")
        return factory(SessionInfo("ops", actor, "SHA256:x", "127.0.0.1", False, "xterm"))

    operator, viewer = session(Role.OPERATOR), session(Role.VIEWER)
    assert isinstance(operator.actions, MachineAccess) and operator.may_act
    assert not viewer.may_act  # read-only: no assign or propose keys at all


def test_after_a_plan_runs_this_machines_nvml_enumerates_its_gpus_again() -> None:
    from gpuconsole.sim.node import SimNode
    from gpuconsole.sim.nvml import SimNvml
    from gpuconsole.sim.profiles import DGX_H100
    from gpuconsole.sources.nvml.source import NvmlSource
    from gpuconsole.tui.actions import MachineAccess

    hub = Hub()
    here = NvmlSource("gpu-node", lib=SimNvml(SimNode("gpu-node", DGX_H100)), events=False)
    there = NvmlSource("other", lib=SimNvml(SimNode("other", DGX_H100)), events=False)
    hub.add_source(here)
    hub.add_source(there)
    access = MachineAccess(Config(host=HostConfig(name="gpu-node")), hub.post_event, hub)
    access.executed("gpu-node")
    assert here._rediscover.is_set() and not there._rediscover.is_set()
