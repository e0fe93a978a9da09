"""The wallboard: read-only pages that rotate on a timer, large headline digits, the
high-contrast theme, and no keys but pause and quit."""

from __future__ import annotations

import io

import msgspec
import pytest
from rich.console import Console
from textual.widgets import Digits, Static

from gpuconsole.facts.summaries import gpu_count, gpu_rows
from gpuconsole.facts.verdict import gpu_verdict
from gpuconsole.readings.base import Health
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.themes import load_themes
from gpuconsole.tui.wallboard import (
    PAGES,
    WALLBOARD_THEME,
    WallboardApp,
    alerts_page,
    fabric_page,
    heat_page,
    hottest_page,
    owners_page,
)
from tests.waiting import until


def board(snapshot: FleetSnapshot, page_s: float = 60.0) -> WallboardApp:
    return WallboardApp(None, snapshot=snapshot, page_s=page_s, theme_dirs=[], start_hub=False)


def body_text(app: WallboardApp) -> str:
    """The page body as plain text, rendered at the screen's width."""
    assert app.current is not None
    console = Console(width=app.size.width, record=True, file=io.StringIO())
    console.print(app.current.body)
    return console.export_text()


async def test_it_opens_on_the_heat_grid_in_high_contrast_with_big_digits(
    fleet_snapshot: FleetSnapshot,
) -> None:
    app = board(fleet_snapshot)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.theme == WALLBOARD_THEME
        title = str(app.query_one("#wallboard-title", Static).render())
        assert "Fleet heat" in title and "page 1/5" in title and "SIMULATED" in title
        gpus = sum(gpu_count(n) for n in fleet_snapshot.nodes)  # a guest's GPUs too
        assert str(gpus) in [d.value for d in app.query(Digits)]
        for node in fleet_snapshot.nodes:
            assert node.node in body_text(app)


async def test_pages_rotate_on_the_timer_and_pause_holds_them(
    fleet_snapshot: FleetSnapshot,
) -> None:
    app = board(fleet_snapshot, page_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(lambda: app.page_index != 0)
        await pilot.press("p")
        held = app.page_index
        assert "PAUSED" in str(app.query_one("#wallboard-title", Static).render())
        await pilot.pause(0.6)  # three page times: a running rotation would have moved
        assert app.page_index == held
        await pilot.press("space")
        await until(lambda: app.page_index != held)


async def test_there_are_no_actions_and_no_palette(fleet_snapshot: FleetSnapshot) -> None:
    app = board(fleet_snapshot)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("colon", "ctrl+p", "enter", "e", "t")
        await pilot.pause()
        assert len(app.screen_stack) == 1  # nothing opened
        keys = {b.key for b in app.BINDINGS}  # type: ignore[union-attr]
        assert keys == {"p,space", "q"}
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


def test_every_page_has_a_title_figures_and_a_body(fleet_snapshot: FleetSnapshot) -> None:
    from gpuconsole.tui.themes import Palette

    theme = load_themes([])[WALLBOARD_THEME]
    app = WallboardApp(None, theme_dirs=[])
    colours: Palette = app.palette
    assert theme.name == WALLBOARD_THEME
    for build in PAGES:
        page = build(fleet_snapshot, colours, fleet_snapshot.at)
        assert page.title and 1 <= len(page.figures) <= 3
    hottest = hottest_page(fleet_snapshot, colours, fleet_snapshot.at)
    temps = [g.temp_gpu_c for n in fleet_snapshot.nodes for g in n.gpus if g.temp_gpu_c]
    assert hottest.figures[0] == ("hottest °C", f"{max(temps):.0f}")
    heat = heat_page(fleet_snapshot, colours, fleet_snapshot.at)
    assert heat.figures[0][1] == str(sum(gpu_count(n) for n in fleet_snapshot.nodes))
    # every GPU whose verdict is critical, of the nodes drawn and the rest alike
    critical = [(n.node, r.bus_id) for n in fleet_snapshot.nodes for r in gpu_rows(n)
                if gpu_verdict(n, r).health is Health.CRITICAL]  # fmt: skip
    assert critical and heat.figures[2] == ("critical", str(len(critical)))
    one_row = heat_page(fleet_snapshot, colours, fleet_snapshot.at, rows=1, first=3)
    assert one_row.figures == heat.figures
    alerts = alerts_page(fleet_snapshot, colours, fleet_snapshot.at)
    assert "fell off the bus (XID 79)" in str(alerts.body) or alerts.figures[0][1] == "0"
    owners = owners_page(fleet_snapshot, colours, fleet_snapshot.at)
    assert int(owners.figures[0][1]) + int(owners.figures[1][1]) > 0


@pytest.mark.parametrize("page", range(len(PAGES)))
async def test_each_page_renders_at_the_smallest_size(
    fleet_snapshot: FleetSnapshot, page: int
) -> None:
    app = board(fleet_snapshot)
    async with app.run_test(size=(80, 24)) as pilot:
        app.page_index = page
        app.render_page()
        await pilot.pause()
        assert body_text(app).strip()


def test_fabric_errors_say_how_far_each_counter_climbed_in_the_last_interval(
    fleet_snapshot: FleetSnapshot,
) -> None:
    node = fleet_snapshot.node("dgx-004")
    assert node is not None
    # the demo's RoCE rails on dgx-004 see out-of-sequence packets under load
    climbed = node.delta("fabric", "mlx5_7", "1", "out_of_sequence")
    assert climbed is not None and climbed > 0
    app = WallboardApp(None, theme_dirs=[])
    page = fabric_page(fleet_snapshot, app.palette, fleet_snapshot.at)
    lines = str(page.body).splitlines()
    said = f"▲ dgx-004 mlx5_7/1: out-of-sequence packets +{climbed} ("  # then its rate
    assert any(line.startswith(said) for line in lines), lines
    assert lines[-1] == "+N: how far the counter climbed in the last interval"


async def test_the_heat_grid_builds_the_rows_that_fit_and_pages_through_a_large_fleet(
    fleet_snapshot: FleetSnapshot,
) -> None:
    """300 nodes on a 40-line screen: the heat grid holds the rows it has room for, says
    which of the fleet they are, and shows the next ones when the page comes round again;
    its headline figures stay the whole fleet's."""
    copies = tuple(
        msgspec.structs.replace(node, node=f"n{i:03d}-{node.node}")
        for i in range(300 // len(fleet_snapshot.nodes) + 1)
        for node in fleet_snapshot.nodes
    )[:300]
    big = msgspec.structs.replace(fleet_snapshot, nodes=copies)
    app = board(big)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        first = body_text(app)
        shown = [n.node for n in copies if n.node in first]
        assert 20 <= len(shown) < 40 and shown == [n.node for n in copies[: len(shown)]]
        assert f"nodes 1-{len(shown)} of 300" in first
        gpus = sum(gpu_count(n) for n in copies)
        assert str(gpus) in [d.value for d in app.query(Digits)]
        for _ in PAGES:
            app.next_page()
        await pilot.pause()
        after = body_text(app)
        again = [n.node for n in copies if n.node in after]
        assert again == [n.node for n in copies[len(shown) : 2 * len(shown)]]
        assert f"nodes {len(shown) + 1}-{2 * len(shown)} of 300" in after
