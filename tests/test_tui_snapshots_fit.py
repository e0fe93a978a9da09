"""SVG snapshots, at 80x24 and 200x50, of the views where something could be cut off: the
node view's table and panels, events, the assign dialog and its plan, the NVSwitch matrix,
help, and the wallboard's heat grid. Files live in snapshots/test_tui_snapshots_fit/."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytest_textual_snapshot")

from gpuconsole.tui.screens.assign import AssignScreen, Stage
from gpuconsole.tui.wallboard import WallboardApp
from tests.conftest_tui import FIXED, frozen_fleet
from tests.test_tui_assign import OPERATOR, FrozenAccess, show_plan
from tests.waiting import until

SIZES = {"80x24": (80, 24), "200x50": (200, 50)}
# views test_tui_snapshots.py has at 80x24 already (its "small"): only the large size here
LARGE = {"200x50": (200, 50)}


def goto(view: str, node: str | None = None) -> Callable[[Any], Any]:
    async def run_before(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.jump(view, node)
        await pilot.pause()
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", SIZES)
def test_node_with_more_owners_than_fit(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(
        console_app(), terminal_size=SIZES[size], run_before=goto("node", "dgx-003")
    )


@pytest.mark.parametrize("size", LARGE)
def test_node_with_a_guests_gpu(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(
        console_app(), terminal_size=LARGE[size], run_before=goto("node", "dgx-004")
    )


@pytest.mark.parametrize("size", LARGE)
def test_events_cut_with_an_ellipsis(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(console_app(), terminal_size=LARGE[size], run_before=goto("events"))


@pytest.mark.parametrize("size", SIZES)
def test_nvswitch_matrix(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(console_app(), terminal_size=SIZES[size],
                        run_before=goto("topology", "dgx-003"))  # fmt: skip


@pytest.mark.parametrize("size", LARGE)
def test_help_with_the_fleets_legend(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(console_app(), terminal_size=LARGE[size], press=["question_mark"])


@pytest.mark.parametrize("size", SIZES)
def test_assign_choosing_with_a_guests_gpu(
    snap_compare: Any, console_app: Any, tmp_path: Path, size: str
) -> None:
    async def run_before(pilot: Any) -> None:
        app = pilot.app
        app.jump("node", "dgx-004")
        await pilot.pause()
        await pilot.press("a")
        await until(
            lambda: isinstance(app.screen, AssignScreen) and app.screen.stage is Stage.CHOOSE
        )
        await pilot.pause()

    app = console_app(actor=OPERATOR, actions=FrozenAccess(tmp_path))
    assert snap_compare(app, terminal_size=SIZES[size], run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_plan_wrapped_under_its_words(
    snap_compare: Any, console_app: Any, tmp_path: Path, size: str
) -> None:
    app = console_app(actor=OPERATOR, actions=FrozenAccess(tmp_path))
    run_before = show_plan("dgx-003", ["0000:61:00.0"], "vm:tenant-b-vm8")
    assert snap_compare(app, terminal_size=SIZES[size], run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_wallboard_heat_fills_the_screen(snap_compare: Any, utc: None, size: str) -> None:
    app = WallboardApp(None, snapshot=frozen_fleet(), page_s=3600, theme_dirs=[],
                       start_hub=False, clock=lambda: FIXED)  # fmt: skip
    assert snap_compare(app, terminal_size=SIZES[size])
