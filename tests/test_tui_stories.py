"""STORIES.md's journeys 1-4 driven end to end on the simulated cluster, each with the keys
it takes counted: a journey that needs more keys than its name says fails here."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.hub import Hub
from gpuconsole.sim.actions import live_world
from gpuconsole.sim.cluster import demo_hub
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.assign import AssignScreen, ProposeScreen, Stage
from gpuconsole.tui.screens.gpu import GpuScreen
from gpuconsole.tui.screens.node import NodeScreen
from gpuconsole.tui.wallboard import PAGES, WallboardApp
from gpuconsole.tui.widgets.panel import Panel
from tests.conftest_tui import frozen_fleet
from tests.waiting import until

OPS = Actor("ops", Role.OPERATOR, "SHA256:ops", "ssh")
VIEWER = Actor("val", Role.VIEWER, "SHA256:val", "ssh")
LOST = "0000:c3:00.0"  # dgx-003's GPU 5, lost a minute into the demo


def screen_text(app: ConsoleApp | WallboardApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


class Keys:
    """Presses keys and counts them."""

    def __init__(self, pilot: Any) -> None:
        self.pilot = pilot
        self.count = 0

    async def __call__(self, *keys: str) -> None:
        self.count += len(keys)
        await self.pilot.press(*keys)


@pytest.fixture
async def cluster() -> AsyncIterator[Hub]:
    """The demo cluster's first four nodes, running, two minutes into the demo (so dgx-003's
    GPU 5 has fallen off the bus), each source polled often."""
    from gpuconsole.sim.cluster import demo_cluster

    hub = demo_hub(specs=demo_cluster()[:4], interval_s=0.2, events=False,
                   start=time.time() - 120, fabric_interval_s=0.5, tenancy_interval_s=0.2)  # fmt: skip
    await hub.start()
    await until(
        lambda: (
            (s := hub.latest) is not None
            and all(n.tenancy is not None for n in s.nodes)
            and len(s.nodes) == 4
        ),
        timeout=15,
    )
    try:
        yield hub
    finally:
        await hub.stop()


def console(hub: Hub, actor: Actor) -> ConsoleApp:
    return ConsoleApp(hub, start_hub=False, actor=actor, theme_dirs=[], cursor_blink=False)


async def test_story_1_the_3am_page_in_7_keys(cluster: Hub) -> None:
    """Fleet → dgx-003 (red) → GPU 5 lost, its owner → drain it, type 5: 7 keys (was 16)."""
    app = console(cluster, OPS)
    async with app.run_test(size=(120, 40)) as pilot:
        keys = Keys(pilot)
        await until(lambda: "dgx-003" in screen_text(app))
        row = next(line for line in screen_text(app).splitlines() if "dgx-003" in line)
        assert row.split()[0] == "✖"  # marked critical on the fleet
        await keys("down", "down", "enter")
        assert isinstance(app.screen, NodeScreen) and app.screen.node_name == "dgx-003"
        await pilot.pause()
        node = app.screen
        assert node.table.cursor_key == LOST  # it opens on the GPU that needs a look
        shown = screen_text(app)
        assert "✖ 5" in shown and "LOST since" in shown
        # the verdict: the least disruptive repair first, naming the GPU
        assert "critical: reset GPU 5, then verify" in shown
        owners = node.query_one("#panel-owners", Panel).text.plain
        assert "pod team-nlp/train-llm-7b-0 holds GPU 5 (0000:c3:00.0)" in owners
        # the BMC's side of it, as the story promises: a PCIe bus error on GPU 5's bus
        await until(
            lambda: "Bus Fatal Error (bus c3" in node.query_one("#panel-bmc", Panel).text.plain
        )
        await keys("a")
        await until(
            lambda: isinstance(app.screen, AssignScreen) and app.screen.stage is Stage.CHOOSE
        )
        dialog = app.screen
        assert isinstance(dialog, AssignScreen)
        await keys("d")  # the drained target, planned at once
        await until(lambda: dialog.stage is Stage.PLAN)
        assert dialog.plan is not None and dialog.plan.gpus == (LOST,)
        assert "type dgx-003, 5 or c3:00.0 to confirm" in screen_text(app)
        await keys("5", "enter")
        await until(lambda: dialog.stage is Stage.DONE, timeout=15)
        assert dialog.outcome is not None and dialog.outcome.ok, dialog.outcome
        assert keys.count == 7
    world = live_world(cluster, "dgx-003")
    assert world is not None
    audit = AuditLog(world.root / "actions" / "audit.jsonl").records()
    drained = [r for r in audit if r["action"] == "assign drained" and r["outcome"] == "ok"]
    assert [(r["user"], r["args"]["gpus"]) for r in drained] == [("ops", [LOST])]


async def test_story_2_why_is_this_job_slow_in_3_keys(console_app: Any) -> None:
    """dgx-002 → its hot GPU 3 (SM clock held to 1410 MHz by a thermal slowdown, FAN 3 on the
    BMC) → its HBM temperature: 3 keys."""
    app = console_app(frozen_fleet())
    async with app.run_test(size=(120, 40)) as pilot:
        keys = Keys(pilot)
        await pilot.pause()
        await keys("down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.node_name == "dgx-002"
        rows = {line.split()[1]: line for line in screen_text(app).splitlines()
                if line[1:2] in "●▲✖" and line.split()[1].isdigit()}  # fmt: skip
        assert "1410" in rows["3"] and "HW thermal slowdown" in rows["3"]
        assert all("1980" in rows[k] for k in rows if k != "3")
        assert "FAN 3: Lower critical" in screen_text(app) and "fans 11/12 ok" in screen_text(app)
        await keys("enter")  # the cursor is on GPU 3 already
        await pilot.pause()
        assert isinstance(app.screen, GpuScreen) and app.screen.gpu_index == 3
        assert "HBM" in screen_text(app)
        assert keys.count == 3


async def test_story_3_a_tenant_gets_a_passthrough_gpu_in_11_keys(cluster: Hub) -> None:
    """p, Tab H→ (H100), Tab v→ (vm:tenant-b-vm8, the guest waiting for a GPU), Enter to
    propose, Enter to plan, 3 Enter to run: 11 keys (was 26). A viewer beside sees the new
    owner and cannot do the same."""
    app = console(cluster, OPS)
    async with app.run_test(size=(120, 40)) as pilot:
        keys = Keys(pilot)
        await until(lambda: app.snapshot is not None and len(app.snapshot.nodes) == 4)
        await keys("p")
        await until(lambda: isinstance(app.screen, ProposeScreen))
        await keys("tab", "H", "right", "tab", "v", "right", "enter")
        await until(lambda: "NVLinks disabled" in screen_text(app))
        assert "dgx-003: GPU 3" in screen_text(app)
        await keys("enter")
        await until(lambda: isinstance(app.screen, AssignScreen) and app.screen.stage is Stage.PLAN)
        dialog = app.screen
        assert isinstance(dialog, AssignScreen) and dialog.plan is not None
        assert str(dialog.plan.target) == "vm:tenant-b-vm8"
        await keys("3", "enter")
        await until(lambda: dialog.stage is Stage.DONE, timeout=15)
        assert dialog.outcome is not None and dialog.outcome.ok, dialog.outcome
        assert keys.count == 11
    beside = console(cluster, VIEWER)
    async with beside.run_test(size=(120, 40)) as pilot:
        await until(lambda: beside.snapshot is not None)
        beside.jump("node", "dgx-003")
        await until(lambda: "vm tenant-b-vm8" in screen_text(beside))
        assert "val viewer" in screen_text(beside).splitlines()[0]
        assert "Assign" not in screen_text(beside)


async def test_story_4_the_noc_wall_in_0_keys() -> None:
    """The wallboard cycles heat grid, hottest GPUs, alerts, fabric and owners by itself, fills
    the screen and offers no action: 0 keys."""
    app = WallboardApp(None, snapshot=frozen_fleet(), page_s=0.1, theme_dirs=[], start_hub=False)
    async with app.run_test(size=(160, 48)):
        titles: set[str] = set()

        def every_page_shown() -> bool:
            if app.current is not None:
                titles.add(app.current.title)
            return len(titles) == len(PAGES)

        await until(every_page_shown, timeout=5)
        assert {"Fabric errors", "Who owns the GPUs", "Alerts and stale sources"} <= titles
        keys = {b.key for b in app.BINDINGS}  # type: ignore[union-attr]
        assert keys == {"p,space", "q"}  # pause and quit, nothing that acts
