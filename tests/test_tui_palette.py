"""The command palette under keys and clicks faster than it opens and closes.

Each burst goes in as a terminal sends it: all its events queued before the app handles
the first, as when they arrive in one ssh packet. Handled as if each came alone, such a
burst pops the last screen (ScreenStackError), dismisses a palette before it has mounted
(IndexError) or pops the view under the palette; each test says none of that happens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.command import CommandList, CommandPalette
from textual.message import Message

from gpuconsole.actions.roles import Actor, Role
from gpuconsole.config import ActionsConfig, Config, HostConfig
from gpuconsole.tui.actions import MachineAccess
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.commands import MAX_QUERY_CHARS, ConsolePalette, JumpInput
from gpuconsole.tui.screens.assign import ProposeScreen
from gpuconsole.tui.screens.events import EventsScreen
from gpuconsole.tui.screens.fleet import FleetScreen
from gpuconsole.tui.screens.gpu import GpuScreen
from gpuconsole.tui.screens.node import NodeScreen
from tests.waiting import until

SIZE = (120, 40)
BESIDE = (5, 1)  # above the palette's input: a click there closes it
CHARS = {"colon": ":", "question_mark": "?", "e": "e"}


def key(name: str) -> events.Key:
    return events.Key(name, CHARS.get(name, name if len(name) == 1 else None))


def click(x: int, y: int) -> list[Message]:
    """A click as a terminal reports it: the button down, then up."""
    return [
        kind(None, x, y, 0, 0, 1, False, False, False, screen_x=x, screen_y=y)
        for kind in (events.MouseDown, events.MouseUp)
    ]


def burst(app: ConsoleApp, *items: str | list[Message]) -> None:
    """Queue keys (by name) and clicks (lists of events) all at once, as one packet."""
    assert app._driver is not None
    for item in items:
        for event in [key(item)] if isinstance(item, str) else item:
            event.set_sender(app)
            app._driver.send_message(event)


async def settle(pilot: Any) -> None:
    for _ in range(3):
        await pilot.pause(0.1)


def views(app: ConsoleApp) -> list[str]:
    return [type(screen).__name__ for screen in app.screen_stack]


async def open_view(app: ConsoleApp, pilot: Any, view: str) -> None:
    """Go to `view` the way an operator does and wait until it shows."""
    if view == "node":
        app.open_node("dgx-002")
    elif view == "gpu":
        app.open_node("dgx-002")
        app.open_gpu("dgx-002", 0)
    elif view == "events":
        await pilot.press("e")
    await settle(pilot)


async def open_palette(app: ConsoleApp, pilot: Any) -> None:
    await pilot.press("colon")
    await until(lambda: isinstance(app.screen, CommandPalette) and app.screen.is_mounted)
    await settle(pilot)


VIEWS = {"fleet": FleetScreen, "node": NodeScreen, "gpu": GpuScreen, "events": EventsScreen}


@pytest.mark.parametrize("view", list(VIEWS))
async def test_a_double_click_beside_the_palette_closes_the_palette_only(
    console_app: Any, view: str
) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_view(app, pilot, view)
        under = views(app)
        await open_palette(app, pilot)
        burst(app, click(*BESIDE), click(*BESIDE))
        await settle(pilot)
        assert app.is_running and app._exception is None
        assert views(app) == under  # not the view under the palette too
        assert isinstance(app.screen, VIEWS[view])


@pytest.mark.parametrize(
    "keys",
    [
        ["colon", "escape"],  # closed before it mounted
        ["colon", "escape", "escape"],
        ["colon", "escape", "colon"],
        ["colon", "colon", "escape", "colon", "escape"],
        ["colon", "question_mark", "escape", "colon"],
        ["colon", "enter", "escape", "colon", "enter"],
    ],
)
@pytest.mark.parametrize("view", ["fleet", "node"])
async def test_palette_and_back_keys_in_one_burst_leave_the_console_running(
    console_app: Any, view: str, keys: list[str]
) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_view(app, pilot, view)
        burst(app, *keys)
        await settle(pilot)
        assert app.is_running and app._exception is None
        palettes = [s for s in app.screen_stack if isinstance(s, CommandPalette)]
        assert len(palettes) <= 1
        assert views(app)[0] == "FleetScreen"
        # and it still answers: Esc back to the fleet, then a palette opens and closes
        for _ in range(4):
            await pilot.press("escape")
        await settle(pilot)
        assert views(app) == ["FleetScreen"]
        await open_palette(app, pilot)
        await pilot.press("escape")
        await until(lambda: isinstance(app.screen, FleetScreen))


async def test_a_double_enter_on_a_hit_jumps_once(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_palette(app, pilot)
        await pilot.press(*"dgx-002 topology")
        await pilot.pause(0.5)
        burst(app, "enter", "enter")  # both reach the palette's input
        await settle(pilot)
        assert app._exception is None
        assert views(app) == ["FleetScreen", "NodeScreen", "TopologyScreen"]


async def test_a_palette_opened_while_the_last_one_is_being_removed_opens(
    console_app: Any,
) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_palette(app, pilot)
        closing = app.screen
        app.pop_screen()  # closing: off the stack, its removal still to come
        app.action_command_palette()  # before: DuplicateIds '--command-palette'
        await settle(pilot)
        assert app._exception is None
        assert views(app) == ["FleetScreen", "ConsolePalette"]
        assert app.screen is not closing and not closing.is_attached


async def test_a_palette_closed_before_it_mounted_stays_closed(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.action_command_palette()
        app.pop_screen()  # before: its mount read the screen under it: IndexError
        await settle(pilot)
        assert app._exception is None
        assert views(app) == ["FleetScreen"]


async def test_the_last_screen_is_never_popped(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await app.pop_screen()
        await pilot.pause()
        assert views(app) == ["FleetScreen"] and app._exception is None


async def test_the_palette_takes_a_bounded_query_and_says_so(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_palette(app, pilot)
        burst(app, *("x" * (MAX_QUERY_CHARS + 50)))
        field = app.screen.query_one(JumpInput)
        await until(lambda: len(field.value) == MAX_QUERY_CHARS)
        await settle(pilot)
        assert len(field.value) == MAX_QUERY_CHARS
        told = [n.message for n in app._notifications]
        assert told == [
            f"the jump list takes at most {MAX_QUERY_CHARS} characters; the rest was dropped"
        ]
        # a paste keeps what fits
        field.value = ""
        await pilot.pause()
        app.screen.query_one(JumpInput).post_message(events.Paste("dgx-002 topology" + "y" * 9000))
        await until(lambda: field.value.startswith("dgx-002 topology"))
        assert len(field.value) == MAX_QUERY_CHARS
        field.value = "dgx-002 topology"
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(lambda: views(app) == ["FleetScreen", "NodeScreen", "TopologyScreen"])


async def test_a_burst_of_typing_searches_once(console_app: Any, monkeypatch: Any) -> None:
    searched: list[str] = []
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_palette(app, pilot)
        palette = app.screen
        assert isinstance(palette, ConsolePalette)
        gather = palette._gather_commands

        def search(query: str) -> Any:
            searched.append(query)
            return gather(query)

        monkeypatch.setattr(palette, "_gather_commands", search)
        burst(app, *"dgx-002")
        await until(lambda: palette.query_one(JumpInput).value == "dgx-002")
        await settle(pilot)
        assert searched == ["dgx-002"]


def offered(app: ConsoleApp) -> list[str]:
    return [option.hit.text or "" for option in app.screen.query_one(CommandList).options]


@pytest.mark.parametrize("role", [Role.VIEWER, Role.OPERATOR, Role.ADMIN])
async def test_the_palette_offers_assign_over_a_node_view_to_those_who_may_act(
    console_app: Any, tmp_path: Path, role: Role
) -> None:
    cfg = Config(host=HostConfig(name="head"), actions=ActionsConfig(state_dir=str(tmp_path)))
    app = console_app(actor=Actor("x", role), actions=MachineAccess(cfg, lambda _event: None))
    async with app.run_test(size=SIZE) as pilot:
        await open_view(app, pilot, "node")
        await open_palette(app, pilot)
        await pilot.press(*"assign")
        await pilot.pause(0.5)
        if not role.may_act:
            assert offered(app) == []
            return
        assert offered(app)[0] == "assign"
        await pilot.press("enter")
        await until(lambda: views(app) == ["FleetScreen", "NodeScreen", "AssignScreen"])
        await pilot.press("escape")
        await until(lambda: views(app) == ["FleetScreen", "NodeScreen"])
        await open_palette(app, pilot)
        await pilot.press(*"propose")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(lambda: views(app) == ["FleetScreen", "NodeScreen", "ProposeScreen"])
        propose = app.screen
        assert isinstance(propose, ProposeScreen) and propose.node_name == "dgx-002"


async def test_a_theme_picked_in_the_palette_redraws_the_console(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        before = app.palette
        await open_palette(app, pilot)
        await pilot.press(*"theme gpuconsole-light")
        await pilot.pause(0.5)
        assert offered(app)[0] == "theme gpuconsole-light"
        await pilot.press("enter")
        await until(lambda: app.theme == "gpuconsole-light")
        await settle(pilot)
        assert app._exception is None and views(app) == ["FleetScreen"]
        assert app.palette != before  # the heat scale and health colours of the new theme
