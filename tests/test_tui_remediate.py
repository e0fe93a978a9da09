"""Repair and power from the console: story 1 carried on (GPU 5 of dgx-003 fell off the bus;
its verdict says reset it, then verify; `r` runs that and it ends fit), the next action
offered when a fault stays, the power dialog (plan, type-to-confirm, audit), and viewers
told why an operator's key does nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from textual.widgets import OptionList

from gpuconsole.actions.plan import StepKind
from gpuconsole.actions.remediation import escalation, verdict_action
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.actions.store import AUDIT_FILE
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.hub import Hub
from gpuconsole.readings.base import normal_bus_id
from gpuconsole.readings.nvml import GpuReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sim.actions import live_world
from gpuconsole.sim.cluster import (
    SimNodeSpec,
    add_sim_bmc_sources,
    add_sim_sources,
    build_sim_nodes,
    demo_cluster,
    demo_hub,
)
from gpuconsole.sim.fabric import add_sim_fabric_sources
from gpuconsole.sim.node import Scenario
from gpuconsole.sim.tenancy import add_sim_tenancy_sources
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.assign import Stage
from gpuconsole.tui.screens.gpu import GpuScreen
from gpuconsole.tui.screens.node import NodeScreen
from gpuconsole.tui.screens.power import PowerScreen
from gpuconsole.tui.screens.remediate import RemediateScreen
from gpuconsole.tui.wallboard import WallboardApp
from tests.waiting import until

SIZE = (120, 40)
NODE = "dgx-003"
GPU5 = "0000:c3:00.0"
OPERATOR = Actor("ops", Role.OPERATOR, "SHA256:ops", "ssh")
VIEWER = Actor("val", Role.VIEWER, "SHA256:val", "ssh")


async def _hub(scenario: str) -> Hub:
    sims = build_sim_nodes([SimNodeSpec(NODE, "dgx-h100", (Scenario.parse(scenario),))])
    running = Hub()
    add_sim_sources(running, sims, interval_s=0.2, events=False)
    add_sim_fabric_sources(running, sims, interval_s=0.5)
    add_sim_tenancy_sources(running, sims, interval_s=0.2)
    add_sim_bmc_sources(running, sims, interval_s=0.5)
    await running.start()
    await until(lambda: (node := _node(running)) is not None and node.tenancy is not None)
    return running


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    """dgx-003 as story 1 finds it: GPU 5 fell off the bus (XID 79), its pod still on it."""
    running = await _hub("xid79:5")
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def stuck_hub() -> AsyncIterator[Hub]:
    """The same, with a fault that neither a reset nor a power cycle clears."""
    running = await _hub("xid79hard:5")
    try:
        yield running
    finally:
        await running.stop()


def _node(hub: Hub) -> NodeSnapshot | None:
    latest = hub.latest
    return latest.node(NODE) if latest is not None else None


def _verdict(hub: Hub) -> Action | None:
    node = _node(hub)
    return verdict_action(node, GPU5) if node is not None else None


def _gpu5_lost(hub: Hub) -> bool | None:
    node = _node(hub)
    found = next((g for g in node.gpus if g.index == 5), None) if node is not None else None
    return None if found is None else found.lost


def console(hub: Hub, actor: Actor) -> ConsoleApp:
    return ConsoleApp(hub, start_hub=False, actor=actor, theme_dirs=[], cursor_blink=False)


def screen_text(app: Any) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def notes(app: ConsoleApp) -> list[str]:
    return [n.message for n in app._notifications]


def audit(hub: Hub) -> list[dict[str, Any]]:
    world = live_world(hub, NODE)
    assert world is not None
    path = world.root / "actions" / AUDIT_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def node_view(app: ConsoleApp, pilot: Any, bus_id: str = GPU5) -> NodeScreen:
    await until(lambda: app.snapshot is not None and app.snapshot.node(NODE) is not None)
    app.jump("node", NODE)
    await until(lambda: isinstance(app.screen, NodeScreen) and app.screen.is_mounted)
    screen = app.screen
    assert isinstance(screen, NodeScreen)
    await until(lambda: bus_id in screen.table.row_keys)
    screen.table.move_cursor(bus_id)
    await pilot.pause()
    return screen


async def repaired(app: ConsoleApp, pilot: Any, confirm: str) -> RemediateScreen:
    """From a GPU's view: r, the plan its verdict asks for, the confirmation, Enter, until
    the plan has run."""
    await until(lambda: isinstance(app.screen, GpuScreen) and "r Repair" in screen_text(app))
    await pilot.press("r")
    await until(lambda: isinstance(app.screen, RemediateScreen))
    dialog = app.screen
    assert isinstance(dialog, RemediateScreen)
    await until(lambda: dialog.stage is Stage.PLAN)
    await pilot.press(*confirm, "enter")
    await until(lambda: dialog.stage is Stage.DONE, timeout=30)
    return dialog


async def test_story_1_the_lost_gpu_5_is_repaired_as_its_verdict_says_and_answers_again(
    hub: Hub,
) -> None:
    """Keys from the node view: Enter (GPU 5), r, 5, Enter: four."""
    assert _gpu5_lost(hub)
    node = _node(hub)
    assert node is not None
    asked = verdict_action(node, GPU5)
    app = console(hub, OPERATOR)
    async with app.run_test(size=SIZE) as pilot:
        await node_view(app, pilot)
        await pilot.press("enter")
        dialog = await repaired(app, pilot, "5")
        plan = dialog.plan
        assert plan is not None and plan.remedy == asked.value
        titles = [s.title for s in plan.steps]
        assert "evict pod team-nlp/train-llm-7b-0 from GPU " in "\n".join(titles)
        if asked is Action.RESET_GPU:
            assert f"reset GPU 5 ({GPU5}) (nvidia-smi -r -i {GPU5})" in titles
        else:
            assert f"power-cycle {NODE} through its BMC" in titles
        assert dialog.outcome is not None and dialog.outcome.ok, dialog.outcome
        assert [dialog.progress[k][0] for k in range(len(plan.steps))] == ["done"] * len(plan.steps)
        # the dialog says what the GPU is now, beside what it was
        assert f"GPU 5 ({GPU5}) now: free (was: pod team-nlp/train-llm-7b-0" in screen_text(app)
        # every console on the hub sees it answer again, and its verdict turn fit: the BMC's
        # record of the bus error (the SEL names GPU 5's bus) is the fault the reset repaired
        await until(lambda: _gpu5_lost(hub) is False, timeout=15)
        await until(lambda: _verdict(hub) is Action.FIT, timeout=15)
        await pilot.press("escape")  # back in GPU 5's view, which says so too
        await until(lambda: isinstance(app.screen, GpuScreen))
        await until(lambda: "fit for work" in screen_text(app), timeout=15)
    records = audit(hub)
    assert {r["outcome"] for r in records} >= {"started", "step done", "ok"}
    assert all(r["args"]["gpus"] == [GPU5] for r in records)


async def test_the_verdict_says_reset_the_gpu_then_verify_and_r_makes_it_fit() -> None:
    """A row remap pending on a GPU of dgx-004: its verdict asks for a reset, then a check.
    Keys from the GPU's view: r, the node's name, Enter."""
    (spec,) = [s for s in demo_cluster() if s.name == "dgx-004"]  # MIG on 7, ECC on 3
    sims = build_sim_nodes([spec])
    bus = normal_bus_id(sims[0].profile.gpus[3].bus_id)
    running = Hub()
    add_sim_sources(running, sims, interval_s=0.2, events=False)
    add_sim_tenancy_sources(running, sims, interval_s=0.2)
    await running.start()

    def verdict() -> Action | None:
        node = running.latest.node("dgx-004") if running.latest else None
        return verdict_action(node, bus) if node is not None and node.tenancy else None

    try:
        await until(lambda: verdict() is Action.RESET_GPU)
        app = console(running, OPERATOR)
        async with app.run_test(size=SIZE) as pilot:
            await until(lambda: app.snapshot is not None)
            app.jump("node", "dgx-004")
            app.open_gpu("dgx-004", bus_id=bus)
            dialog = await repaired(app, pilot, "dgx-004")
            assert dialog.plan is not None and dialog.plan.remedy == "reset_gpu"
            assert dialog.outcome is not None and dialog.outcome.ok, dialog.outcome
            assert "final check: a fresh reading finds it fit" in screen_text(app)
            await until(lambda: verdict() is Action.FIT, timeout=15)
    finally:
        await running.stop()


async def _shut_down_when_told(hub: Hub, dialog: RemediateScreen) -> None:
    """The tenant of dgx-003's guests shuts them down once the plan's step has told it."""
    plan = dialog.plan
    assert plan is not None
    seq = next(k for k, s in enumerate(plan.steps) if s.kind is StepKind.NOTIFY)
    await until(lambda: dialog.progress.get(seq, ("",))[0] == "done", timeout=30)
    world = live_world(hub, NODE)
    assert world is not None
    guests = tuple(dataclasses.replace(g, state=5) for g in world.plan.guests)
    world.plan = dataclasses.replace(world.plan, guests=guests)


async def test_a_fault_that_stays_offers_the_next_action_until_service(stuck_hub: Hub) -> None:
    """Neither a reset nor a power cycle brings the GPU back: each outcome offers the next
    action (n), down to returning it for service."""
    node = _node(stuck_hub)
    assert node is not None
    asked: Action | None = verdict_action(node, GPU5)
    app = console(stuck_hub, OPERATOR)
    async with app.run_test(size=SIZE) as pilot:
        await node_view(app, pilot)
        await pilot.press("r")
        await until(lambda: isinstance(app.screen, RemediateScreen))
        dialog = app.screen
        assert isinstance(dialog, RemediateScreen)
        seen = []
        tenant: list[asyncio.Task[None]] = []
        while asked is not None:
            await until(lambda: dialog.stage is Stage.PLAN and dialog.plan is not None)
            assert dialog.plan is not None and dialog.plan.remedy == asked.value
            seen.append(asked)
            if asked is Action.REBOOT_NODE:
                # the power cycle would stop guest tenant-b-vm8 (it holds no GPU): its
                # tenant is told, and shuts it down, before the node's power goes
                told = "tell tenant tenant-b of guest tenant-b-vm8"
                assert told in screen_text(app)
                tenant.append(asyncio.create_task(_shut_down_when_told(stuck_hub, dialog)))
            await pilot.press(*NODE, "enter")
            await until(lambda: dialog.stage is Stage.DONE, timeout=30)
            assert dialog.outcome is not None
            asked = escalation(asked)
            if asked is None:
                break
            assert not dialog.outcome.ok
            assert f"next: {asked.value}" in dialog.outcome.message
            assert f"n plans the next: {asked.value}" in screen_text(app)
            await pilot.press("n")
        assert seen[-2:] == [Action.REBOOT_NODE, Action.SERVICE]
        await asyncio.gather(*tenant)
        assert dialog.outcome.ok, dialog.outcome.message
        assert dialog.now == {GPU5: "unavailable (no driver bound)"}, screen_text(app)
    world = live_world(stuck_hub, NODE)
    assert world is not None and world.node.power_cycles == 1
    assert world.owners(5) == ["drained"]


async def test_viewers_are_told_why_an_operator_key_does_nothing(hub: Hub) -> None:
    app = console(hub, VIEWER)
    async with app.run_test(size=SIZE) as pilot:
        view = await node_view(app, pilot)
        await pilot.press("a", "r", "P", "p")
        await pilot.pause()
        assert app.screen is view
        said = notes(app)
        for what in ("assign", "remediate", "power", "propose"):
            assert any(f"viewers cannot {what}: val is a viewer" in n for n in said), said
        assert not any(w in screen_text(app) for w in ("Assign", "Repair", "Power", "Propose"))
        assert audit(hub) == []
        # forced past the UI: the power action refuses where it executes, and audits it
        app.push_screen(PowerScreen(NODE))
        await until(lambda: isinstance(app.screen, PowerScreen) and app.screen.is_mounted)
        await pilot.pause()
        choices = app.screen.query_one("#power-choices", OptionList)
        choices.highlighted = choices.get_option_index("off")
        await pilot.press("enter", *NODE, "enter")
        await until(lambda: "refused, nothing sent: role viewer may not act" in screen_text(app))
    (record,) = audit(hub)
    assert (record["action"], record["outcome"], record["user"]) == ("power off", "refused", "val")
    world = live_world(hub, NODE)
    assert world is not None and world.node.power_cycles == 0


async def test_the_wallboard_offers_no_power(hub: Hub) -> None:
    app = WallboardApp(hub, start_hub=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("P", "r", "a")
        await pilot.pause()
        assert not any(isinstance(s, PowerScreen | RemediateScreen) for s in app.screen_stack)
    assert audit(hub) == []


async def test_the_power_dialog_never_says_nothing_runs_when_it_cannot_tell() -> None:
    """dgx-003's libvirt never answers, so the console has no tenancy reading of it: the
    power cycle's plan says who runs there is not known, not that nothing runs."""
    sims = build_sim_nodes([SimNodeSpec(NODE, "dgx-h100")])
    running = Hub()
    add_sim_sources(running, sims, interval_s=0.2, events=False)
    add_sim_tenancy_sources(running, sims, interval_s=0.2)
    add_sim_bmc_sources(running, sims, interval_s=0.5)
    world = live_world(running, NODE)
    assert world is not None

    def refused() -> Any:
        raise ConnectionRefusedError("libvirt: connection refused")

    world.tree.libvirt = refused  # type: ignore[method-assign]
    await running.start()
    try:
        await until(lambda: (node := _node(running)) is not None and node.bmc is not None)
        await until(lambda: (node := _node(running)) is not None and bool(node.statuses))
        app = console(running, OPERATOR)
        async with app.run_test(size=SIZE) as pilot:
            await until(lambda: app.snapshot is not None)
            app.push_screen(PowerScreen(NODE))
            await until(lambda: isinstance(app.screen, PowerScreen) and app.screen.is_mounted)
            choices = app.screen.query_one("#power-choices", OptionList)
            choices.highlighted = choices.get_option_index("cycle")
            await pilot.press("enter")
            await until(lambda: f"power cycle {NODE}" in screen_text(app))
            text = screen_text(app)
            assert "nothing runs on its GPUs" not in text
            assert "who runs there is not known" in text
    finally:
        await running.stop()


async def test_an_operator_power_cycles_a_node_after_reading_the_plan_and_typing_its_name(
    hub: Hub,
) -> None:
    app = console(hub, OPERATOR)
    async with app.run_test(size=SIZE) as pilot:
        await node_view(app, pilot)
        assert "P Power" in screen_text(app)
        await pilot.press("P")
        await until(lambda: isinstance(app.screen, PowerScreen))
        dialog = app.screen
        assert isinstance(dialog, PowerScreen)
        choices = dialog.query_one("#power-choices", OptionList)
        choices.highlighted = choices.get_option_index("cycle")
        await pilot.press("enter")
        await until(lambda: f"power cycle {NODE}" in screen_text(app))
        text = screen_text(app)
        assert "through its BMC" in text and "power now: on" in text
        assert "it stops what runs there: pod team-vision/resnet-ft-1" in text
        assert "vm tenant-b-vm8" in text  # a guest waiting for a GPU: it stops too
        assert f"type {NODE} to confirm" in text
        await pilot.press(*"dgx-004", "enter")
        await until(lambda: "refused, nothing sent" in screen_text(app))
        assert "does not match the node name" in screen_text(app)
        await pilot.press(*NODE, "enter")
        await until(lambda: "requested: power cycle sent" in screen_text(app))
    records = audit(hub)
    assert [r["outcome"] for r in records] == ["refused", "started", "ok"]
    assert all(r["action"] == "power cycle" and r["user"] == "ops" for r in records)
    assert records[-1]["args"]["via"] == "ssh"
    world = live_world(hub, NODE)
    assert world is not None and world.node.power_cycles == 1


async def test_story_8_xid_48_is_drained_reset_and_read_again_and_the_node_never_reboots() -> None:
    """XID 48 (a double-bit ECC error) on dgx-021's GPU 2, which pod train-dgx-021 holds:
    the verdict asks for a reset with the XID, the DBE count and NVIDIA's bucket as evidence;
    `r` cordons the GPU, evicts its pod, waits for it to be idle, resets it and reads it
    again. The verdict turns fit, the node never rebooted, the audit log has every step."""
    node_name = "dgx-021"
    spec = SimNodeSpec(node_name, "dgx-h100", (Scenario.parse("xid48:2"),))
    running = demo_hub(specs=[spec], interval_s=0.2, fabric_interval_s=0.5, tenancy_interval_s=0.2)
    await running.start()

    def gpu2() -> tuple[NodeSnapshot, GpuReading] | None:
        node = running.latest.node(node_name) if running.latest else None
        if node is None or node.tenancy is None or node.nvml is None:
            return None
        return node, node.nvml.gpus[2]

    def action() -> Action | None:
        found = gpu2()
        return gpu_verdict(found[0], found[1]).action if found is not None else None

    try:
        await until(lambda: (found := gpu2()) is not None and bool(found[1].xids))
        found = gpu2()
        assert found is not None
        node, gpu = found
        bus = normal_bus_id(gpu.pci_bus_id)
        verdict = gpu_verdict(node, gpu)
        assert verdict.action is Action.RESET_GPU
        words = "\n".join(f.text for f in verdict.findings)
        assert "XID 48 double-bit ECC error" in words and "reset the GPU" in words
        assert "1 uncorrectable" in words  # the double-bit error count
        app = console(running, OPERATOR)
        async with app.run_test(size=SIZE) as pilot:
            await until(lambda: app.snapshot is not None)
            app.open_gpu(node_name, bus_id=bus)
            dialog = await repaired(app, pilot, node_name)
            plan = dialog.plan
            assert plan is not None and dialog.outcome is not None
            assert dialog.outcome.ok, dialog.outcome.message
            assert [s.kind.value for s in plan.steps] == [
                "cordon", "evict", "wait_idle", "gpu_reset", "verify"
            ]  # fmt: skip
            assert plan.steps[1].pod == "team-nlp/train-dgx-021"
        await until(lambda: (found := gpu2()) is not None and not found[1].ecc.remap_pending)
        world = live_world(running, node_name)
        assert world is not None
        assert world.node.resets == {2: 1} and world.node.power_cycles == 0
        path = world.root / "actions" / AUDIT_FILE
        records = [json.loads(line) for line in path.read_text().splitlines()]
        done = [r["detail"] for r in records if r["outcome"] == "step done"]
        assert len(done) == len(plan.steps)
        assert all(r["args"]["gpus"] == [bus] for r in records)
        assert all(r["args"]["uuids"] == [gpu.uuid] for r in records)
        # the XID it repaired is no reason to reset it again
        await until(lambda: action() is Action.FIT, timeout=15)
    finally:
        await running.stop()


async def test_a_node_rebooted_under_the_repair_ends_it_interrupted_and_offers_no_next_action(
    hub: Hub,
) -> None:
    """The power cycle plan has told the guest's tenant and waits for the guest; meanwhile
    the node loses power and boots again. The plan does not power-cycle it a second time:
    the dialog says it was interrupted by the reboot, and offers no escalation, since no
    repair of it failed."""
    world = live_world(hub, NODE)
    assert world is not None
    app = console(hub, OPERATOR)
    async with app.run_test(size=SIZE) as pilot:
        await node_view(app, pilot)
        dialog = RemediateScreen(NODE, GPU5, Action.REBOOT_NODE)
        await app.push_screen(dialog)
        await until(lambda: dialog.stage is Stage.PLAN and dialog.plan is not None)

        async def rebooted_then_shut_down() -> None:
            plan = dialog.plan
            assert plan is not None
            seq = next(k for k, s in enumerate(plan.steps) if s.kind is StepKind.NOTIFY)
            await until(lambda: dialog.progress.get(seq, ("",))[0] == "done", timeout=30)
            world.node.power_cycle()  # the mains, not the plan
            world.save()
            await _shut_down_when_told(hub, dialog)

        tenant = asyncio.create_task(rebooted_then_shut_down())
        await pilot.press(*NODE, "enter")
        await until(lambda: dialog.stage is Stage.DONE, timeout=30)
        await tenant
        assert dialog.outcome is not None
        assert dialog.outcome.state == "interrupted", dialog.outcome.message
        assert "dgx-003 rebooted (boot id" in dialog.outcome.message
        await pilot.pause()
        text = screen_text(app)
        assert "interrupted: dgx-003 rebooted" in text, text
        assert "n plans the next" not in text
        assert not dialog.check_action("next", ())
    assert world.node.power_cycles == 1  # the reboot's, not a second one from the plan
