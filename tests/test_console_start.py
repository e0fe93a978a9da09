"""A console starts fast: its layout is drawn before the first reading, its hub's sources start
side by side beside that first frame, and one slow to start holds up no other reading."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from gpuconsole.sim.bmc import sim_link
from gpuconsole.sim.cluster import build_sim_nodes, demo_cluster, demo_hub
from gpuconsole.sources.base import EmitEvent
from gpuconsole.sources.bmc import BmcSource
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.messages import SnapshotArrived
from gpuconsole.tui.screens.fleet import FleetScreen
from gpuconsole.tui.screens.node import NodeScreen
from gpuconsole.tui.widgets.row_table import RowTable
from tests.conftest_tui import frozen_fleet
from tests.waiting import until

SIZE = (120, 40)
# Generous: a shared two-core machine; a console whose first frame waits for its hub's start
# fails here rather than hangs.
SANITY_S = 60.0


class SlowBmc(BmcSource):
    """The simulated BMC of a node whose session takes its time to open, until released."""

    def __init__(self, node: str) -> None:
        (sim,) = build_sim_nodes([s for s in demo_cluster(2) if s.name == node])
        super().__init__(node, sim_link(sim), simulated=True)
        self.release = asyncio.Event()
        self.closed = False

    async def start(self, emit: EmitEvent) -> None:
        await self.release.wait()
        await super().start(emit)

    async def close(self) -> None:
        self.closed = True
        await super().close()


def _gpu_cell(app: ConsoleApp, node: str) -> str:
    table = app.screen.query_one("#fleet-table", RowTable)
    cell: Any = table.get_cell(node, "gpus")
    return str(getattr(cell, "plain", cell))


async def test_the_layout_and_the_first_readings_show_while_a_source_still_starts(
    utc: None,
) -> None:
    hub = demo_hub(nodes=2, events=False, bmc=False, fabric=False, tenancy=False)
    slow = SlowBmc("dgx-002")
    hub.add_source(slow)
    app = ConsoleApp(hub, theme_dirs=[], cursor_blink=False)
    try:
        async with asyncio.timeout(SANITY_S), app.run_test(size=SIZE) as pilot:
            # the fleet view is up at once, before any reading
            assert isinstance(app.screen, FleetScreen)
            table = app.screen.query_one("#fleet-table", RowTable)
            # both nodes' GPUs drawn from NVML while dgx-002's BMC still starts
            await until(lambda: table.row_count == 2 and "8" in _gpu_cell(app, "dgx-002"))
            assert not slow.release.is_set() and hub.latest is not None
            node = hub.latest.node("dgx-002")
            assert node is not None and node.bmc is None
            slow.release.set()
            await until(lambda: (n := hub.latest and hub.latest.node("dgx-002")) is not None
                        and n.bmc is not None)  # fmt: skip
            await pilot.pause()
    finally:
        slow.release.set()
    assert hub._running is False


async def test_a_console_that_ends_while_its_hub_still_starts_stops_the_hub(utc: None) -> None:
    hub = demo_hub(nodes=2, events=False, bmc=False, fabric=False, tenancy=False)
    slow = SlowBmc("dgx-002")
    hub.add_source(slow)
    app = ConsoleApp(hub, theme_dirs=[], cursor_blink=False)
    async with asyncio.timeout(SANITY_S), app.run_test(size=SIZE) as pilot:
        await until(lambda: hub.latest is not None and any(n.gpus for n in hub.latest.nodes))
        await pilot.press("q")  # the BMC still starting
    assert hub._running is False
    assert all(t.done() for t in asyncio.all_tasks() if t.get_name().startswith("poll "))
    assert slow.closed


async def test_a_node_just_opened_draws_each_reading_as_it_lands_not_at_the_tick(
    utc: None,
) -> None:
    hub = demo_hub(nodes=2, events=False, bmc=False, fabric=False, tenancy=False)
    app = ConsoleApp(hub, start_hub=False, theme_dirs=[], cursor_blink=False)
    fleet = frozen_fleet()
    async with asyncio.timeout(SANITY_S), app.run_test(size=SIZE) as pilot:
        app.on_snapshot_arrived(SnapshotArrived(fleet))
        await pilot.pause()
        app.open_node("dgx-002")
        await until(lambda: isinstance(app.screen, NodeScreen))
        await pilot.pause()
        # the node's next reading (a fleet's: its agent's every detail) within the second
        fuller = msgspec.structs.replace(fleet, seq=fleet.seq + 1)
        app.on_snapshot_arrived(SnapshotArrived(fuller))
        assert app._snapshot_shown is fuller  # drawn now, not at the next tick
