"""The console as an operator lives in it: nothing cut off without a hint, keys that do
what they show, help that explains the console's own marks, and who is at the console."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
from rich.color import Color
from textual import events
from textual.widgets import Input, OptionList, SelectionList, Static

from gpuconsole.readings.base import Health
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.assign import AssignScreen, ProposeScreen, Stage
from gpuconsole.tui.screens.help import HelpScreen
from gpuconsole.tui.wallboard import WallboardApp
from gpuconsole.tui.widgets.filter_bar import FilterBar
from gpuconsole.tui.widgets.panel import Panel
from gpuconsole.tui.widgets.row_table import RowTable
from tests.conftest_tui import FIXED, frozen_fleet
from tests.test_tui_assign import OPERATOR, FrozenAccess
from tests.waiting import until

SMALL, LARGE = (80, 24), (200, 50)


def screen_text(app: ConsoleApp | WallboardApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def burst(app: ConsoleApp, *keys: str) -> None:
    """Keys as they come in one packet over ssh: all queued before the first is handled."""
    for key in keys:
        character = {"slash": "/", "escape": None, "enter": "\r"}.get(key, key)
        app.post_message(events.Key(key, character))


def without_fabric(node_name: str) -> FleetSnapshot:
    """The frozen fleet with one node's fabric source not configured."""
    fleet = frozen_fleet()
    nodes = tuple(
        msgspec.structs.replace(n, fabric=None,
                            statuses=tuple(s for s in n.statuses if s.source != "fabric"))
        if n.node == node_name else n
        for n in fleet.nodes
    )  # fmt: skip
    return msgspec.structs.replace(fleet, nodes=nodes)


# --- nothing cut off without a hint ------------------------------------------------------


async def test_the_owners_panel_says_how_many_owners_it_could_not_show(console_app: Any) -> None:
    for size, hidden in ((SMALL, True), (LARGE, False)):
        app = console_app()
        async with app.run_test(size=size) as pilot:
            app.jump("node", "dgx-003")
            await pilot.pause()
            owners = app.screen.query_one("#panel-owners", Panel)
            lines = [line.plain for line in owners.shown_lines()]
            text = owners.text.plain
            every = text.count("\n") + 1  # a problem line, free, and three owners
            assert every == 5
            if hidden:
                left = int(lines[-1].removeprefix("… +").removesuffix(" more"))
                shown = sum(1 for line in lines if not line.startswith(("  ", "… +")))
                assert shown + left == every, lines
            else:
                assert "pod team-nlp/notebook-alice: GPU 2" in screen_text(app)
                assert not any(line.startswith("… +") for line in lines)


async def test_at_80x24_the_node_table_shows_ecc_and_owner_and_every_footer_keeps_quit(
    console_app: Any,
) -> None:
    app = console_app()
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        assert screen_text(app).splitlines()[-1].rstrip().endswith("q Quit")
        for view, node, gpu in (("node", "dgx-004", None), ("gpu", "dgx-004", 2),
                                ("topology", "dgx-003", None), ("events", None, None)):  # fmt: skip
            app.jump(view, node, gpu)
            await pilot.pause()
            assert screen_text(app).splitlines()[-1].rstrip().endswith("q Quit"), view
            if view == "node":
                shown = screen_text(app)
                header = next(line for line in shown.splitlines() if "util" in line)
                assert "ECC" in header and "owner" in header
                assert "0/16 pend" in shown and "vm tenant-b-vm7" in shown
                # a cell cut to fit ends in an ellipsis
                assert "pod team-vision/…" in shown or "pod team-vision/infer-0 +1" in shown


async def test_an_operators_longer_footer_keeps_its_actions_help_and_quit_at_80_columns(
    console_app: Any, tmp_path: Path
) -> None:
    app = console_app(actor=OPERATOR, actions=FrozenAccess(tmp_path))
    async with app.run_test(size=SMALL) as pilot:
        app.jump("node", "dgx-004")
        await pilot.pause()
        await pilot.pause()
        footer = screen_text(app).splitlines()[-1]
        assert footer.rstrip().endswith("q Quit")
        assert "a Assign" in footer and "p Propose" in footer and "? Help" in footer
        await pilot.press("question_mark")  # what the footer left out, help lists
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert {"t", "e", ":"} <= dict(app.screen._keys).keys()


async def test_event_messages_cut_at_the_edge_end_in_an_ellipsis(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SMALL) as pilot:
        app.jump("events")
        await pilot.pause()
        await pilot.pause()
        rows = [line for line in screen_text(app).splitlines() if "dgx-003" in line]
        lost = next(line for line in rows if "gpu_lost" in line)
        assert lost.rstrip().endswith("…")


async def test_the_assign_dialog_names_a_guests_gpu_once(console_app: Any, tmp_path: Path) -> None:
    app = console_app(actor=OPERATOR, actions=FrozenAccess(tmp_path))
    async with app.run_test(size=(120, 30)) as pilot:
        app.jump("node", "dgx-004")
        await pilot.pause()
        await pilot.press("a")
        await until(
            lambda: isinstance(app.screen, AssignScreen) and app.screen.stage is Stage.CHOOSE
        )
        await pilot.pause()
        shown = screen_text(app)
        assert "52:00.0 52:00.0" not in shown
        row = next(line for line in shown.splitlines() if "tenant-b-vm7" in line and "52" in line)
        assert "◆ vfio   52:00.0   vm tenant-b-vm7" in row


async def test_plan_text_wraps_under_its_own_words(console_app: Any, tmp_path: Path) -> None:
    from tests.test_tui_assign import show_plan

    app = console_app(actor=OPERATOR, actions=FrozenAccess(tmp_path))
    async with app.run_test(size=(80, 40)) as pilot:
        await show_plan("dgx-003", ["0000:61:00.0"], "vm:tenant-b-vm8")(pilot)
        # the plan's lines, inside the dialog's box (x 3 on): what is left of the box's edge
        lines = [line[3:].split("│")[0] for line in screen_text(app).splitlines()]
        start = next(k for k, line in enumerate(lines) if "✓ NVSwitch partition" in line)
        # the line it wraps onto starts under the words after the tick, not at column 0
        assert lines[start + 1].startswith("     ") and lines[start + 1].strip()


async def test_a_source_that_is_off_says_its_config_section(console_app: Any) -> None:
    app = console_app(without_fabric("dgx-002"))
    async with app.run_test(size=LARGE) as pilot:
        app.jump("node", "dgx-002")
        await pilot.pause()
        assert "fabric source off: [fabric] enabled = true" in screen_text(app)


async def test_words_keep_their_spaces_where_styles_meet(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.jump("node", "dgx-004")
        await pilot.pause()
        assert "▲ warning: reset GPU 2, then verify  DGX H100" in screen_text(app)
        app.jump("topology", "dgx-003")
        await pilot.pause()
        shown = screen_text(app)
        assert "8/8 up at 400 Gb/sec" in shown and "mlx5_10 PIX" in shown


async def test_the_nvswitch_matrix_names_its_columns_as_gpus(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SMALL) as pilot:
        app.jump("topology", "dgx-003")
        await pilot.pause()
        header = next(line for line in screen_text(app).splitlines() if "NVSwitch  " in line)
        assert header.split()[1:10] == ["NVSwitch", *(f"GPU{k}" for k in range(8))]


async def test_the_wallboard_shows_every_gpu_and_fills_a_big_screen() -> None:
    fleet = frozen_fleet()
    app = WallboardApp(None, snapshot=fleet, page_s=600, theme_dirs=[], start_hub=False,
                       clock=lambda: FIXED)  # fmt: skip
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        lines = screen_text(app).splitlines()
        dgx004 = next(line for line in lines if "dgx-004" in line)
        assert len(dgx004.split()[2:-1]) == 8  # every GPU, the one in a guest too
        assert app.current is not None and app.current.figures[0] == ("GPUs", "80")
        rows = [k for k, line in enumerate(lines) if any(n.node in line for n in fleet.nodes)]
        assert rows[-1] - rows[0] + 1 >= 0.6 * len(lines)  # 10 nodes over most of 48 lines


# --- the keyboard does what it shows -------------------------------------------------------


async def test_the_assign_dialog_starts_on_a_visible_cursor_and_enter_never_marks_a_gpu(
    console_app: Any, tmp_path: Path
) -> None:
    app = console_app(actor=OPERATOR, actions=FrozenAccess(tmp_path))
    async with app.run_test(size=(120, 30)) as pilot:
        app.jump("node", "dgx-003")
        await pilot.pause()
        await pilot.press("a")
        await until(
            lambda: isinstance(app.screen, AssignScreen) and app.screen.stage is Stage.CHOOSE
        )
        await pilot.pause()
        targets = app.screen.query_one("#assign-targets", OptionList)
        assert app.focused is targets and targets.highlighted == 0
        gpus = app.screen.query_one("#assign-gpus", SelectionList)
        marked = list(gpus.selected)
        await pilot.press("tab", "down", "enter")
        assert list(gpus.selected) == marked  # Enter marked nothing
        assert app.focused is targets  # it went on to the targets


async def test_the_same_proposal_asked_again_goes_back_to_its_list(console_app: Any) -> None:
    from gpuconsole.sim.cluster import demo_hub
    from gpuconsole.tui.actions import DemoAccess

    hub = demo_hub(events=False)
    app = console_app(actor=OPERATOR, actions=DemoAccess(hub))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("p")
        await until(lambda: isinstance(app.screen, ProposeScreen))
        dialog = app.screen
        assert isinstance(dialog, ProposeScreen)
        await pilot.press("enter")
        await until(lambda: dialog.placement is not None)
        listed = dialog.query_one("#propose-list", OptionList)
        await until(lambda: app.focused is listed)
        first = dialog.placement
        news = str(dialog.query_one("#propose-news", Static).render())
        assert "proposals for 1 GPU: Enter on one plans it" in news
        await pilot.press("tab", "enter")
        await pilot.pause()
        assert dialog.placement is first and app.focused is listed


async def test_a_filter_typed_in_one_burst_keeps_every_key_and_esc_leaves_it(
    console_app: Any,
) -> None:
    app = console_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        bar = app.screen.query_one(FilterBar)
        burst(app, "slash", "H", "1", "0", "0")
        await until(lambda: bar.input.value == "H100", timeout=2)
        burst(app, "escape")
        await pilot.pause()
        assert not isinstance(app.focused, Input)
        # the next / opens the filter again (rather than being typed into it), and a / in
        # the filter is typed into it
        burst(app, "slash", "a", "1", "slash", "x")
        await until(lambda: bar.input.value == "a1/x", timeout=2)


async def test_help_explains_the_consoles_marks_and_leaves_out_textuals_keys(
    console_app: Any,
) -> None:
    app = console_app()
    async with app.run_test(size=LARGE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        shown = screen_text(app)
        for mark in ("GBFT", "◆", "▲", "◌", "·", "hot", "seen", "MIG mode"):
            assert mark in shown, mark
        for generic in ("Focus Next", "Focus Previous", "Copy selected text", "Cursor up", "^q"):
            assert generic not in shown, generic


async def test_the_selected_row_keeps_its_health_colour(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.jump("node", "dgx-003")
        await pilot.pause()
        table = app.screen.query_one("#gpu-table", RowTable)
        table.move_cursor("0000:c3:00.0")  # GPU 5, lost
        await pilot.pause()
        line = table.render_line(table.cursor_row + 1)
        lost = next(s for s in line if "✖" in s.text)
        critical = app.palette.health[Health.CRITICAL].color
        assert lost.style is not None and lost.style.color == critical


async def test_the_fleet_summary_counts_what_the_filter_lists(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("slash", *"a100", "enter")
        await pilot.pause()
        summary = str(app.screen.query_one("#fleet-summary", Static).render())
        assert summary.startswith("3 of 10 nodes · 24 GPUs")


def _contrast(a: Color, b: Color) -> float:
    """WCAG 2 contrast ratio of two colours."""

    def luminance(color: Color) -> float:
        def channel(c: int) -> float:
            v = c / 255
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

        r, g, b_ = color.get_truecolor()
        return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b_)

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


async def test_light_theme_sparklines_reach_wcag_aa_on_its_surface(console_app: Any) -> None:
    theme = tomllib.loads(
        resources.files("gpuconsole.themes").joinpath("light.toml").read_text("utf-8")
    )
    grounds = [Color.parse(theme["colors"][k]) for k in ("surface", "background")]
    app = console_app(theme="gpuconsole-light")
    async with app.run_test(size=(120, 40)):
        for step in range(11):
            ink = app.palette.heat_fg(step / 10).color
            assert ink is not None
            for ground in grounds:
                assert _contrast(ink, ground) >= 4.5, (step, ink, ground)


# --- roles in view ---------------------------------------------------------------------------


async def test_the_header_says_who_is_at_the_console_and_their_role(console_app: Any) -> None:
    for actor, said in ((None, "alice viewer"), (OPERATOR, "ops operator")):
        app = console_app(**({"actor": actor} if actor else {}))
        async with app.run_test(size=SMALL) as pilot:
            app.jump("node", "dgx-004")
            await pilot.pause()
            assert said in screen_text(app).splitlines()[0]
