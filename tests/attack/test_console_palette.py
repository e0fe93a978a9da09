"""The `:` palette as a viewer would try it: only the console's own commands, by role.

Textual's palette offers its own commands too: "Screenshot" wrote an SVG into the home of
the user the console (or the ssh server) runs as, for each press, and told the viewer the
path; "Theme" listed Textual's themes, which have no heat scale, and picking one ended the
console (over ssh, the session).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from textual.app import InvalidThemeError
from textual.command import CommandList, CommandPalette

from gpuconsole.actions.roles import Actor, Role
from gpuconsole.config import ActionsConfig, Config, HostConfig
from gpuconsole.tui.actions import MachineAccess
from gpuconsole.tui.app import ConsoleApp
from tests.test_ssh_console import Keys, console_server, login, open_terminal, session_of
from tests.waiting import until

SIZE = (120, 40)
VIEWER = Actor("amy", Role.VIEWER)
OPERATOR = Actor("ops", Role.OPERATOR)
TEXTUAL_COMMANDS = {"Keys", "Maximize", "Minimize", "Quit", "Screenshot", "Theme"}


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The console's user's home, where Textual saves screenshots (its Downloads folder)."""
    folder = tmp_path / "home"
    (folder / "Downloads").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.delenv("XDG_DOWNLOAD_DIR", raising=False)
    monkeypatch.chdir(folder)
    return folder


async def open_palette(app: ConsoleApp, pilot: Any) -> CommandPalette:
    await pilot.press("colon")
    await until(lambda: isinstance(app.screen, CommandPalette) and app.screen.is_mounted)
    for _ in range(3):
        await pilot.pause(0.1)
    assert isinstance(app.screen, CommandPalette)
    return app.screen


def offered(palette: CommandPalette) -> list[str]:
    return [option.hit.text or "" for option in palette.query_one(CommandList).options]


async def search(app: ConsoleApp, pilot: Any, text: str) -> list[str]:
    """What the palette offers for `text`, typed."""
    palette = await open_palette(app, pilot)
    await pilot.press(*text)
    await pilot.pause(0.5)
    return offered(palette)


def console(console_app: Any, actor: Actor, tmp_path: Path) -> ConsoleApp:
    """A console that can act on this machine, for `actor`: only the role tells them apart."""
    cfg = Config(host=HostConfig(name="head"), actions=ActionsConfig(state_dir=str(tmp_path)))
    app: ConsoleApp = console_app(actor=actor, actions=MachineAccess(cfg, lambda _event: None))
    return app


@pytest.mark.parametrize("actor", [VIEWER, OPERATOR], ids=lambda a: a.role.value)
async def test_the_palette_offers_the_consoles_own_commands_for_the_role(
    console_app: Any, actor: Actor, tmp_path: Path
) -> None:
    app = console(console_app, actor, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        palette = await open_palette(app, pilot)
        listed = offered(palette)
        assert not TEXTUAL_COMMANDS & set(listed), listed
        themes = [name for name in listed if name.startswith("theme ")]
        assert themes == [f"theme {name}" for name in app.theme_names]
        assert {"fleet", "events", "help", "quit"} <= set(listed)
        assert ("propose" in listed) is actor.role.may_act


async def test_the_palette_takes_no_screenshot(
    console_app: Any, home: Path, tmp_path: Path
) -> None:
    app = console(console_app, VIEWER, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert "Screenshot" not in await search(app, pilot, "screenshot")
        await pilot.press("enter")
        await pilot.pause(0.5)
        assert app.is_running and app._exception is None
    assert list(home.rglob("*.svg")) == []
    assert not any(".svg" in str(n.message) for n in app._notifications)


async def test_every_theme_the_palette_offers_draws_the_console(
    console_app: Any, tmp_path: Path
) -> None:
    app = console(console_app, VIEWER, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        # exactly the console's themes exist: none that lacks its heat scale can be set
        assert set(app.available_themes) == set(app.theme_names)
        with pytest.raises(InvalidThemeError):
            app.theme = "nord"
        for name in app.theme_names:
            hits = await search(app, pilot, f"theme {name}")
            assert hits[0] == f"theme {name}"
            await pilot.press("enter")
            await until(lambda: not isinstance(app.screen, CommandPalette))
            await pilot.pause(0.2)
            assert app.is_running and app._exception is None
            assert app.theme == name


async def test_a_viewer_over_ssh_can_neither_screenshot_nor_end_the_session_with_a_theme(
    tmp_path: Path, home: Path
) -> None:
    keys = Keys(tmp_path)
    async with (
        console_server(tmp_path, keys) as server,
        login(server, keys.viewer, "amy") as conn,
    ):
        term = await open_terminal(conn, 120, 40)
        await term.wait_for("Fleet", "read-only")
        app = session_of(server, "amy").app
        for typed in ("screenshot", "theme"):
            term.send(":")
            await until(lambda: isinstance(app.screen, CommandPalette) and app.screen.is_mounted)
            term.send(typed)
            await asyncio.sleep(0.5)
            listed = offered(app.screen)
            assert not TEXTUAL_COMMANDS & set(listed), listed
            term.send("\r" if listed else "\x1b")
            await until(lambda: not isinstance(app.screen, CommandPalette))
        # had "theme" opened Textual's list of themes, this would pick Nord: the end of the
        # session; here it is keys on the fleet view
        term.send("nord\r")
        await asyncio.sleep(1.0)
        assert app.is_running and app._exception is None
        assert app.theme in app.theme_names
        term.send("q")
        assert await term.closed() == 0
    assert list(home.rglob("*.svg")) == []
    assert "svg" not in term.raw.decode("utf-8", "replace")
