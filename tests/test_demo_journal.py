"""The demo's consoles read what its plans did: a GPU whose reset failed in a running demo
is one whose node must be power-cycled, on every console of that demo hub (the fleet, the
node and GPU views and the wallboard all read the hub's verdict; `snapshot --json` of the
demo prints verdicts_json of the same snapshot)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpuconsole.actions.roles import Actor, Role
from gpuconsole.cli.table import render_table
from gpuconsole.facts.verdict import Action, gpu_verdict, verdicts_json
from gpuconsole.hub import Hub
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sim.cluster import SimNodeSpec, demo_hub
from gpuconsole.sim.node import Scenario
from gpuconsole.tui.wallboard import WallboardApp, alerts_page
from gpuconsole.wiring import live_demo_executor
from tests.waiting import until

NODE = "dgx-003"
GPU5 = "0000:c3:00.0"
OPERATOR = Actor("ops", Role.OPERATOR, "SHA256:ops", "ssh")


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    """A demo hub as `gpuconsole demo` builds it, over dgx-003 whose GPU 5 fell off the bus
    for good (neither a reset nor a power cycle brings it back)."""
    spec = SimNodeSpec(NODE, "dgx-h100", (Scenario.parse("xid79hard:5"),))
    running = demo_hub(specs=[spec], interval_s=0.2, fabric_interval_s=0.5, tenancy_interval_s=0.2)
    await running.start()
    try:
        await until(lambda: (node := _node(running)) is not None and node.tenancy is not None)
        yield running
    finally:
        await running.stop()


def _node(hub: Hub) -> NodeSnapshot | None:
    return hub.latest.node(NODE) if hub.latest is not None else None


def _action(hub: Hub) -> Action | None:
    node = _node(hub)
    return gpu_verdict(node, GPU5).action if node is not None else None


async def test_a_failed_reset_in_the_demo_asks_every_console_for_the_power_cycle(
    hub: Hub,
) -> None:
    assert _action(hub) is Action.RESET_GPU
    executor = live_demo_executor(hub, NODE)
    try:
        plan = await executor.plan_remedy(GPU5)
        assert plan.remedy == Action.RESET_GPU.value
        outcome = await executor.execute(plan, OPERATOR, NODE)
    finally:
        await executor.close()
    assert not outcome.ok  # the fault stays: the reset did not bring GPU 5 back
    await until(lambda: _action(hub) is Action.REBOOT_NODE, timeout=10)
    node = _node(hub)
    assert node is not None
    words = gpu_verdict(node, GPU5).findings[0].text
    assert "reboot the node: the reset of GPU 5" in words and "failed" in words
    snapshot = hub.latest
    assert snapshot is not None
    assert verdicts_json(snapshot)[NODE]["gpus"][GPU5]["action"] == "reboot_node"  # type: ignore[index]
    board = alerts_page(snapshot, WallboardApp(None, theme_dirs=[]).palette, snapshot.at).body
    assert "reboot the node: the reset of GPU 5" in board.plain  # type: ignore[union-attr]
    assert "reboot the node: the reset of GPU 5" in render_table(snapshot)
