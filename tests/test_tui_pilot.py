"""The console driven like an operator drives it: keys, mouse, filter, drill-down, back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from rich.style import Style
from rich.text import Text
from textual.widgets import DataTable, Static

from gpuconsole.readings.base import Event, Health, Severity
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sim.cluster import demo_hub
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.messages import SnapshotArrived
from gpuconsole.tui.screens.events import EventsScreen
from gpuconsole.tui.screens.fleet import FleetScreen
from gpuconsole.tui.screens.gpu import GpuScreen
from gpuconsole.tui.screens.help import HelpScreen, TooSmallScreen
from gpuconsole.tui.screens.node import NodeScreen
from gpuconsole.tui.screens.smmap import SmMapScreen
from gpuconsole.tui.screens.topology import TopologyScreen
from gpuconsole.tui.widgets.row_table import RowTable
from gpuconsole.tui.widgets.status_bar import StatusBar
from tests.conftest_tui import FIXED, fleet_with_rail_down, frozen_fleet
from tests.waiting import until

SIZE = (120, 40)


def spy(
    monkeypatch: pytest.MonkeyPatch, owner: object, name: str, note: Callable[..., Any]
) -> list[Any]:
    """Calls of `owner.name` as they happen: each noted by `note(*args, **kwargs)` in the
    list returned, then passed on."""
    noted: list[Any] = []
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        noted.append(note(*args, **kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return noted


def fleet_table(app: ConsoleApp) -> RowTable:
    return app.screen.query_one("#fleet-table", RowTable)


def row_names(app: ConsoleApp) -> list[str]:
    table = fleet_table(app)
    return [str(_plain(table.get_row_at(i)[0]).split(" ", 1)[1]) for i in range(table.row_count)]


def _plain(cell: Text | str) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def status_line(app: ConsoleApp) -> str:
    bar = app.screen.query_one(StatusBar)
    return str(bar.render())


def screen_text(app: ConsoleApp) -> str:
    """What the terminal shows now, line by line."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def static_text(app: ConsoleApp, selector: str) -> Text:
    content = app.screen.query_one(selector, Static).content
    assert isinstance(content, Text)
    return content


def styles_of(text: Text, words: str) -> set[Style]:
    """The styles laid over the span of `text` that holds `words`."""
    start = text.plain.index(words)
    end = start + len(words)
    return {
        Style.parse(s.style) if isinstance(s.style, str) else s.style
        for s in text.spans
        if s.start <= start and s.end >= end
    }


async def test_fleet_lists_every_node_and_says_simulated(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        assert row_names(app) == [n.node for n in frozen_fleet().nodes]
        assert "SIMULATED" in status_line(app)


async def test_enter_drills_down_and_escape_walks_back(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "down", "enter")
        assert isinstance(app.screen, NodeScreen) and app.screen.node_name == "dgx-003"
        await pilot.press("down", "enter")  # the view opened on the lost GPU 5: one below
        assert isinstance(app.screen, GpuScreen) and app.screen.gpu_index == 6
        await pilot.press("m")
        assert isinstance(app.screen, SmMapScreen)
        await pilot.press("escape", "escape")
        assert isinstance(app.screen, NodeScreen)
        await pilot.press("o")
        assert isinstance(app.screen, TopologyScreen) and app.screen.node_name == "dgx-003"
        await pilot.press("escape", "escape")
        assert isinstance(app.screen, FleetScreen)


async def test_mouse_click_opens_a_node(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        # Row 4 (dgx-004) sits on line 4 of the table: header, then rows 0..3 above it.
        await pilot.click("#fleet-table", offset=(4, 4))
        await pilot.click("#fleet-table", offset=(4, 4))
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.node_name == "dgx-004"


async def test_slash_filters_by_model_and_escape_clears(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash", *"a100", "enter")
        assert row_names(app) == ["dgxa-001", "dgxa-002", "apollo-01"]
        await pilot.press("slash", "backspace", "backspace", "backspace", "backspace",
                          *"critical", "enter")  # fmt: skip
        # a failed fan, a lost GPU, a double-bit ECC error, a GPU lost for good, a failed PSU
        assert row_names(app) == ["dgx-002", "dgx-003", "dgx-005", "dgx-006", "dgxa-001"]
        await pilot.press("escape")
        assert len(row_names(app)) == 10


async def test_sort_by_health_puts_the_worst_first(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        names = row_names(app)
        # critical: a GPU out of work (lost, or a double-bit ECC error) by name, then a
        # failed fan and a failed PSU (their GPUs work on) by name; then a remap and a page
        # retirement pending, no peermem
        assert names[:5] == ["dgx-003", "dgx-005", "dgx-006", "dgx-002", "dgxa-001"]
        assert set(names[5:8]) == {"dgx-004", "dgx1-001", "apollo-01"}


async def test_m_switches_what_the_cells_show(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        table = fleet_table(app)
        assert "util" in table.label("gpus").plain
        await pilot.press("m")
        assert "temp" in table.label("gpus").plain
        # dgx-002 GPU 3 runs hot (thermal scenario): its cell reads 89
        assert _plain(table.get_cell("dgx-002", "gpus")).split()[3] == "89"


async def test_a_new_snapshot_redraws_only_the_row_that_changed(
    console_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = fleet_table(app)
        updated = spy(monkeypatch, table, "update_row", lambda key, cells: key)
        drawn = spy(monkeypatch, table, "_render_cells", lambda c: _plain(c[0]).split(" ", 1)[1])
        rebuilt: list[bool] = []
        table.set_rows = lambda *a, **k: rebuilt.append(True)  # type: ignore[method-assign]
        old = frozen_fleet()  # dgx-002 (dgx-001's GPUs are all in a guest: no NVML readings)
        app.post_message(SnapshotArrived(with_util(old, "dgx-002", 12.0, seq=old.seq + 1)))
        await pilot.pause()
        assert not rebuilt
        assert updated == ["dgx-002"]  # the other nodes' readings are the same objects
        assert drawn == ["dgx-002"]  # and only its line was drawn again
        assert _plain(table.get_cell("dgx-002", "gpus")).split()[0] == "12"
        assert "  12 95 95" in screen_text(app).splitlines()[4]  # status, summary, header, 001


def with_util(old: FleetSnapshot, node_name: str, util: float, seq: int) -> FleetSnapshot:
    """`old` with GPU 0 of one node at `util` %: a new reading of that node only."""
    node = next(n for n in old.nodes if n.node == node_name)
    assert node.nvml is not None
    gpu0 = msgspec.structs.replace(node.gpus[0], util_gpu_pct=util)
    changed = msgspec.structs.replace(
        node, nvml=msgspec.structs.replace(node.nvml, gpus=(gpu0, *node.gpus[1:]))
    )
    nodes = tuple(changed if n.node == node_name else n for n in old.nodes)
    return msgspec.structs.replace(old, seq=seq, nodes=nodes)


async def test_a_new_reading_redraws_only_the_node_views_gpu_rows_that_changed(
    console_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        app.jump("node", "dgx-002")
        await pilot.pause()
        table = app.screen.query_one("#gpu-table", RowTable)
        drawn = spy(monkeypatch, table, "_render_cells", lambda cells: _plain(cells[0]))
        app.show_snapshot(with_util(frozen_fleet(), "dgx-002", 12.0, seq=2))
        await pilot.pause()
        assert drawn == ["● 0"]  # GPU 0's row; the other seven and the header stay as drawn
        assert _plain(table.get_row_at(0)[1]) == "12%"


async def test_snapshots_that_come_within_a_second_are_drawn_once_by_the_tick(
    console_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        applied = spy(monkeypatch, app.screen, "apply", lambda snapshot, **_: snapshot.seq)
        old = frozen_fleet()
        first, second = (with_util(old, "dgx-002", u, seq=old.seq + i)
                         for i, u in ((1, 12.0), (2, 34.0)))  # fmt: skip
        app._snapshot_shown_at = 0.0  # over a second since the last drawing
        app.on_snapshot_arrived(SnapshotArrived(first))  # drawn at once
        app.on_snapshot_arrived(SnapshotArrived(second))  # waits for the tick
        assert applied == [first.seq] and app.snapshot is second
        app._tick()
        assert applied == [first.seq, second.seq]
        app._tick()  # nothing new: only the status bar's age moves on
        assert applied == [first.seq, second.seq]
        await pilot.pause()
        assert _plain(fleet_table(app).get_cell("dgx-002", "gpus")).split()[0] == "34"


def big_fleet(nodes: int) -> FleetSnapshot:
    """`nodes` copies of the frozen fleet's nodes, named node-0000 on."""
    frozen = frozen_fleet()
    copies = tuple(
        msgspec.structs.replace(frozen.nodes[i % len(frozen.nodes)], node=f"node-{i:04d}")
        for i in range(nodes)
    )
    return msgspec.structs.replace(frozen, nodes=copies)


async def test_paging_through_a_big_fleet_fills_the_rows_it_reaches(console_app: Any) -> None:
    app = console_app(big_fleet(300))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = fleet_table(app)
        filled = lambda i: not _plain(table.get_row_at(i)[0]).startswith("·")  # noqa: E731
        assert filled(0) and not filled(299)  # only rows in view are worked out
        await pilot.press("pagedown", "pagedown")
        await pilot.pause()
        assert table.cursor_row == 2 * (table.scrollable_content_region.height - 1)
        assert table.cursor_row in table.visible_rows()
        assert all(filled(i) for i in table.visible_rows())
        assert f"node-{table.cursor_row:04d}" in screen_text(app)
        await pilot.press("ctrl+end")
        await pilot.pause()
        assert table.cursor_key == "node-0299" and filled(299)
        assert screen_text(app).splitlines()[-2].split()[1] == "node-0299"  # above the footer
        await pilot.press("up", "enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.node_name == "node-0298"


async def test_the_cursor_stays_on_its_node_when_the_order_changes(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*["down"] * 6)  # dgxa-001: its PSU failed
        assert fleet_table(app).cursor_key == "dgxa-001"
        await pilot.press("s")  # by health: dgxa-001 moves up to fifth, the cursor with it
        assert row_names(app)[4] == "dgxa-001"
        assert fleet_table(app).cursor_row == 4 and fleet_table(app).cursor_key == "dgxa-001"


async def test_new_readings_that_reorder_the_rows_keep_the_cursor_on_its_node(
    console_app: Any,
) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s", "s")  # busiest first
        assert "sort: util" in static_text(app, "#fleet-summary").plain
        await pilot.press("ctrl+end")
        table = fleet_table(app)
        last = table.cursor_key
        old = frozen_fleet()
        node = next(n for n in old.nodes if n.node == last)
        assert node.nvml is not None and node.gpus  # an idle node NVML reads
        busy = tuple(msgspec.structs.replace(g, util_gpu_pct=100.0) for g in node.gpus)
        moved = msgspec.structs.replace(node, nvml=msgspec.structs.replace(node.nvml, gpus=busy))
        nodes = tuple(moved if n.node == last else n for n in old.nodes)
        rebuilt: list[bool] = []
        table.set_rows = lambda *a, **k: rebuilt.append(True)  # type: ignore[method-assign]
        app.post_message(
            SnapshotArrived(msgspec.structs.replace(old, seq=old.seq + 1, nodes=nodes))
        )
        await pilot.pause()
        assert not rebuilt and row_names(app)[0] == last  # moved, not rebuilt
        assert (table.cursor_row, table.cursor_key) == (0, last)


async def test_each_nodes_health_and_counts_are_worked_out_once_per_reading(
    console_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuconsole.facts import summaries

    judged = spy(monkeypatch, summaries, "node_facts", lambda node: node.node)
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert sorted(judged) == sorted(n.node for n in frozen_fleet().nodes)
        judged.clear()
        old = frozen_fleet()
        changed = msgspec.structs.replace(old.nodes[2], profile="moved")
        new = msgspec.structs.replace(old, seq=old.seq + 1, nodes=(*old.nodes[:2], changed,
                                                                *old.nodes[3:]))  # fmt: skip
        app.post_message(SnapshotArrived(new))
        await pilot.pause()
        await pilot.press("s")  # a sort by health asks again, of the same readings
        assert judged == ["dgx-003"]


async def test_a_passed_through_gpu_shows_in_the_fleet_row_and_opens_by_bus_id(
    console_app: Any,
) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = fleet_table(app)
        assert _plain(table.get_cell("dgx-001", "gpus")) == " ◆ " * 8
        # dgx-004's guest runs the guest agent: its cell shows what NVML in the guest reads
        inside = frozen_fleet().node("dgx-004").tenancy.guest_gpus[0].reading  # type: ignore[union-attr]
        assert inside is not None and inside.util_gpu_pct is not None
        assert _plain(table.get_cell("dgx-004", "gpus")).split()[2] == f"{inside.util_gpu_pct:.0f}"
        assert table.get_cell("dgx-004", "free") == "6/8"
        app.jump("node", "dgx-004")
        await pilot.pause()
        node_table = app.screen.query_one("#gpu-table", RowTable)
        assert node_table.row_count == 8
        assert node_table.get_cell("0000:52:00.0", "owner") == "vm tenant-b-vm7"
        await pilot.press("ctrl+home", "down", "down", "enter")  # it opened on GPU 2's ECC
        await pilot.pause()
        assert isinstance(app.screen, GpuScreen)
        assert (app.screen.bus_id, app.screen.gpu_index) == ("0000:52:00.0", None)
        assert app.screen.query_one("#box-readings").border_title == "identity (sysfs)"
        assert "owner         vm tenant-b-vm7" in screen_text(app)
        await pilot.press("escape", "down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, GpuScreen) and app.screen.gpu_index == 2
        assert app.screen.bus_id == "0000:61:00.0"  # NVML's 2 is the fourth GPU


def test_a_newer_snapshot_replaces_a_queued_one() -> None:
    snap = frozen_fleet()
    older, newer = SnapshotArrived(snap), SnapshotArrived(snap)
    assert newer.can_replace(older)


async def test_stale_data_shows_its_age(console_app: Any) -> None:
    app = console_app()
    app.clock = lambda: FIXED + 42
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "STALE 42 s" in status_line(app)


async def test_help_lists_the_keys_of_the_view(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "enter")
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        keys = dict(app.screen._keys)
        assert keys["m"] == "SM map" and keys["o"] == "Topology" and keys["?"] == "Help"
        await pilot.press("escape")
        assert isinstance(app.screen, NodeScreen)


async def test_t_cycles_the_gpuconsole_themes(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        seen = {app.theme}
        for _ in app.theme_names:
            await pilot.press("t")
            seen.add(app.theme)
        assert (
            seen
            == set(app.theme_names)
            >= {
                "gpuconsole-dark",
                "gpuconsole-light",
                "gpuconsole-high-contrast",
                "gpuconsole-ansi",
            }
        )


async def test_colon_jumps_to_a_gpu_by_name(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("colon")
        # the MIG GPU is NVML's 6 on dgx-004: GPU 2 is passed through to a guest
        await pilot.press(*"dgx-004 gpu 6 sm map")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SmMapScreen)
        assert (app.screen.node_name, app.screen.gpu_index) == ("dgx-004", 6)
        await pilot.press("escape")
        assert isinstance(app.screen, GpuScreen)


async def test_events_filter_by_node_and_severity(console_app: Any) -> None:
    fleet = frozen_fleet()
    critical = [e for e in fleet.events if e.severity.value == "critical"]
    on_dgx_002 = [e for e in fleet.events if e.node == "dgx-002"]
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("e")
        assert isinstance(app.screen, EventsScreen)
        table = app.screen.query_one("#events-table", DataTable)
        assert table.row_count == len(fleet.events)
        await pilot.press("v", "v")  # info → warning → critical
        # two lost GPUs and their PCIe errors, FAN 3, PSU 2
        assert table.row_count == len(critical) == 6
        await pilot.press("v", "slash", *"node:dgx-002", "enter")
        assert table.row_count == len(on_dgx_002)
        await pilot.press("escape")
        assert table.row_count == len(fleet.events)
        await pilot.press("slash", *"node:dgx-003 gpu:4", "enter")
        assert table.row_count == 0


async def test_events_opened_from_a_node_show_that_node(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter", "e")
        assert isinstance(app.screen, EventsScreen) and app.screen.flt.node == "dgx-001"
        rows = app.screen.query_one("#events-table", DataTable).row_count
        assert rows == len([e for e in frozen_fleet().events if e.node == "dgx-001"]) > 0


async def test_a_small_terminal_gets_a_message(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, TooSmallScreen)
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)


async def test_the_app_starts_and_stops_a_live_hub(utc: None) -> None:
    hub = demo_hub(nodes=2, events=False)
    app = ConsoleApp(hub, theme_dirs=[], cursor_blink=False)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(50):
            await pilot.pause(0.05)
            if app.snapshot is not None and app.snapshot.nodes and app.snapshot.nodes[0].gpus:
                break
        assert isinstance(app.snapshot, FleetSnapshot)
        assert row_names(app) == ["dgx-001", "dgx-002"]
    assert hub._running is False


async def test_topology_flags_a_down_rail_in_red(console_app: Any) -> None:
    # story 6: on a new node, rail mlx5_9 is down and GPU 5 would fall back
    app = console_app(fleet_with_rail_down("dgx-002", "mlx5_9"))
    async with app.run_test(size=SIZE) as pilot:
        app.jump("topology", "dgx-002")
        await pilot.pause()
        text = static_text(app, "#topo-gpudirect")
        assert "compute rails: 7/8 up" in text.plain
        assert "GPU 5 → mlx5_9  PIX  job 4711" in text.plain
        words = "its rail is down: falls back to mlx5_6 (NODE)"
        assert app.palette.health[Health.CRITICAL] in styles_of(text, words)
        assert app.palette.health[Health.CRITICAL] in styles_of(text, "mlx5_9")
        assert "GPU 4 → mlx5_6  PIX  job 4711" in text.plain  # the others are fine


async def test_topology_lists_each_gpus_owner(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        app.jump("topology", "dgx-004")
        await pilot.pause()
        lines = static_text(app, "#topo-gpudirect").plain.splitlines()
        assert "GPU 52:00.0 → mlx5_4  PIX  vm tenant-b-vm7" in lines
        assert "GPU 6       → mlx5_11 PIX  pod team-vision/infer-0 +1" in lines


async def test_gpu_detail_shows_the_owner_tenant_since_and_source(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        app.jump("gpu", "dgx-003", 5)  # story 1: lost, and still its pod's
        await pilot.pause()
        owner = app.screen.query_one("#box-owner", Static)
        assert owner.region.height > 0  # beside the readings, on the first screen
        await pilot.pause()
        shown = screen_text(app)
        for expected in ("pod team-nlp/train-llm-7b-0", "tenant", "nlp", "container trainer",
                         "since", "kubelet", "which NVML reports lost"):  # fmt: skip
            assert expected in shown, expected


async def test_enter_on_a_gpu_opens_its_sm_map(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        app.jump("gpu", "dgx-004", 6)
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SmMapScreen) and app.screen.gpu_index == 6
        await pilot.press("question_mark")
        await pilot.press("escape", "escape")
        assert isinstance(app.screen, GpuScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen) and ("Enter", "SM map") in app.screen._keys


async def test_the_sm_map_names_each_mig_instances_own_owner(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=(80, 40)) as pilot:
        app.jump("smmap", "dgx-004", 6)
        await pilot.pause()
        lines = screen_text(app).splitlines()
        rows = [line for line in lines if "GI " in line and "pod" in line]
        assert any("GI 1 3g.40gb" in r and "pod team-vision/infer-0" in r for r in rows)
        assert any("GI 2 2g.20gb" in r and "pod team-nlp/embed-1" in r for r in rows)
        assert not any("…" in line for line in lines)  # nothing cut short, even at 80 columns


async def test_escape_and_other_keys_keep_the_too_small_message(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, TooSmallScreen)
        for key in ("escape", "e", "question_mark", "colon", "enter", "t"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, TooSmallScreen), key
        await pilot.resize_terminal(120, 40)
        await until(lambda: isinstance(app.screen, FleetScreen))


async def test_new_events_are_added_as_keyed_rows_not_a_rebuild(
    console_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = frozen_fleet()
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("e")
        assert isinstance(app.screen, EventsScreen)
        table = app.screen.query_one("#events-table", DataTable)
        before = table.row_count
        cleared: list[bool] = []
        table.clear = lambda *a, **k: cleared.append(True)  # type: ignore[method-assign,assignment,return-value]
        added = spy(monkeypatch, table, "add_row", lambda *cells, **_: _plain(cells[-1]))
        removed = spy(monkeypatch, table, "remove_row", lambda key: key)
        oldest, *rest = fleet.events
        news = Event(FIXED + 1, "dgx-002", "nvml", "xid", Severity.WARNING, "XID 94 on GPU 3", 3)
        newer = msgspec.structs.replace(fleet, seq=fleet.seq + 1, events=(*rest, news))
        app.post_message(SnapshotArrived(newer))
        await pilot.pause()
        assert not cleared
        assert added == ["XID 94 on GPU 3"] and len(removed) == 1  # the one that aged out
        assert table.row_count == before
        assert _plain(table.get_row_at(0)[-1]) == "XID 94 on GPU 3"  # newest first
        assert oldest.message not in [
            _plain(table.get_row_at(i)[-1]) for i in range(table.row_count)
        ]
        added.clear()
        app.post_message(SnapshotArrived(msgspec.structs.replace(newer, seq=newer.seq + 1)))
        await pilot.pause()
        assert added == [] and not cleared  # the same events: nothing to do


async def test_enter_on_an_event_opens_its_gpu(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("e", "slash", *"node:dgx-003 gpu:5", "enter")
        table = app.screen.query_one("#events-table", DataTable)
        assert table.row_count >= 1
        table.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, GpuScreen)
        assert (app.screen.node_name, app.screen.gpu_index) == ("dgx-003", 5)
        await pilot.press("escape")
        assert isinstance(app.screen, EventsScreen)


async def test_a_tick_or_resize_while_the_console_ends_draws_nothing(console_app: Any) -> None:
    # the 1 s tick and a queued size check can still fire while the app takes its screens
    # down, when asking for the top screen of the empty stack raises ScreenStackError
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
    assert not app.screen_stack
    app.show_snapshot(frozen_fleet())
    app._tick()
    app.check_size()


async def test_a_frame_draws_the_lines_that_changed_not_the_views_backdrop(
    console_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second's new readings change a few rows: the view itself and the row of panels,
    covered by what they hold, are not passed through their styles again each frame."""
    from textual._styles_cache import StylesCache
    from textual.geometry import Region

    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "down", "enter")
        assert isinstance(app.screen, NodeScreen)
        await pilot.pause()
        drawn = spy(monkeypatch, StylesCache, "render_widget", lambda _c, w, _r: w)
        table = app.screen.query_one("#gpu-table", RowTable)
        table.refresh(Region(0, 2, table.size.width, 1))  # a row of new readings
        await pilot.pause()
        assert table in drawn
        assert app.screen not in drawn
        assert app.screen.query_one("#node-panels") not in drawn
        assert "BMC" in screen_text(app)  # the panels still show
