"""One session's input must not hold the others: the ssh driver takes a few
events per turn of the shared loop, stops reading a channel whose input piles up, and drops
what it cannot read with a message instead of ending the session; a session draws at a
bounded size whatever its client claims. End to end: a session types 8 KB into its command
palette while another keeps getting frames."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.app import App

from gpuconsole.ssh.driver import BoundedOutput, SshDriver
from gpuconsole.ssh.server import MAX_COLUMNS, MAX_ROWS
from gpuconsole.tui.commands import MAX_QUERY_CHARS
from tests.test_ssh_console import (
    Keys,
    Terminal,
    console_server,
    login,
    open_terminal,
    session_of,
)
from tests.waiting import until


class Channel:
    """Where frames go: counted, never congested."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: bytes) -> None:
        self.bytes += len(data)

    def get_write_buffer_size(self) -> int:
        return 0


class Typed(App[None]):
    """An app that keeps every key and paste it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []
        self.pastes: list[str] = []
        self.sizes: list[tuple[int, int]] = []

    def on_key(self, event: events.Key) -> None:
        self.keys.append(event.character or event.key)

    def on_paste(self, event: events.Paste) -> None:
        self.pastes.append(event.text)

    def on_resize(self, event: events.Resize) -> None:
        self.sizes.append((event.size.width, event.size.height))


@contextlib.asynccontextmanager
async def typed_session(pauses: list[bool]) -> AsyncIterator[tuple[Typed, SshDriver]]:
    """A Typed app behind the driver a session binds; `pauses` gets each pause_input call."""
    app = Typed()
    ready: asyncio.Future[SshDriver] = asyncio.get_running_loop().create_future()
    output = BoundedOutput(Channel(), 1 << 20)  # type: ignore[arg-type]
    app.driver_class = SshDriver.bind(output, (80, 24), ready.set_result, pauses.append)
    task = asyncio.create_task(app.run_async())
    try:
        driver = await asyncio.wait_for(ready, 30)
        yield app, driver
    finally:
        app.exit()
        await asyncio.wait_for(task, 30)


async def test_a_burst_of_keys_reaches_the_app_a_few_per_turn_of_the_loop() -> None:
    typed = "".join(chr(ord("a") + i % 26) for i in range(3000))
    async with typed_session([]) as (app, driver):
        most = 0
        driver.feed(typed.encode())  # one packet, as a paste typed out arrives
        last = len(app.keys)
        while len(app.keys) < len(typed):
            await asyncio.sleep(0)  # one turn of the loop: what did the app take meanwhile?
            most = max(most, len(app.keys) - last)
            last = len(app.keys)
        assert "".join(app.keys) == typed  # all of it, in order
        # EVENTS_PER_TURN per turn, a few turns' worth at times when the app is busy
        # painting; far below the whole burst, which would hold every other session.
        assert most < len(typed) // 10, most


async def test_input_piling_up_pauses_the_channel_until_it_is_taken() -> None:
    pauses: list[bool] = []
    pasted = "é" * 40_000  # 80 KB: over the high mark, yet a paste within its bound
    async with typed_session(pauses) as (app, driver):
        driver.feed(f"\x1b[200~{pasted}\x1b[201~".encode())
        assert pauses == [True]  # above the high mark: stop reading the channel
        assert driver.input_backlog > 0
        await until(lambda: app.pastes == [pasted])
        assert pauses == [True, False]  # taken: read again
        assert driver.input_backlog == 0


async def test_input_the_parser_fails_on_is_dropped_with_a_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with typed_session([]) as (app, driver):
        feed = driver._parser.feed
        failing = [True]

        def fail_once(text: str) -> Any:
            if failing.pop() if failing else False:
                raise ValueError("a parser bug")
            return feed(text)

        monkeypatch.setattr(driver._parser, "feed", fail_once)
        driver.feed(b"\x1b[?garbage")
        await until(lambda: bool(app._notifications))
        [note] = app._notifications
        assert note.message == "Some input could not be read and was dropped."
        driver.feed(b"ok")  # a fresh parser takes the next input
        await until(lambda: app.keys == ["o", "k"])
        assert app.is_running


async def test_a_dragged_window_resizes_the_app_at_once_then_to_the_latest_size() -> None:
    async with typed_session([]) as (app, driver):
        await until(lambda: bool(app.sizes))
        await asyncio.sleep(0.3)
        started = len(app.sizes)  # the first size, as textual delivers it (twice)
        for width in range(81, 121):  # a drag: forty window-changes in a row
            driver.resize(width, 30)
        await until(lambda: app.sizes[-1:] == [(120, 30)])
        await asyncio.sleep(0.3)
        assert app.sizes[started:] == [(81, 30), (120, 30)]


class Frames:
    """When a terminal got data from the server, and how long the loop was held at worst."""

    def __init__(self, term: Terminal) -> None:
        self.at: list[float] = []
        self.worst_stall_s = 0.0
        received = term.data_received

        def data_received(data: bytes, datatype: Any) -> None:
            self.at.append(time.monotonic())
            received(data, datatype)

        term.data_received = data_received  # type: ignore[method-assign]

    async def watch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.02)
            self.worst_stall_s = max(self.worst_stall_s, loop.time() - before - 0.02)

    def after(self, start: float) -> list[float]:
        return [t for t in self.at if t >= start]


async def test_8kb_typed_into_a_palette_holds_no_other_session(tmp_path: Path) -> None:
    keys = Keys(tmp_path)
    typed = ("dgx-002 gpu 3 sm map " * 400)[:8192]  # never q: typed into the palette
    async with (
        console_server(tmp_path, keys) as server,
        login(server, keys.operator, "ops") as ops_conn,
        login(server, keys.viewer, "amy") as amy_conn,
    ):
        typist = await open_terminal(ops_conn, 120, 40)
        watcher = await open_terminal(amy_conn, 120, 40)
        await typist.wait_for("Fleet")
        await watcher.wait_for("Fleet", "dgx-002")
        typist.send(":")
        await typist.wait_for("Search for commands")
        frames = Frames(watcher)
        probe = asyncio.create_task(frames.watch_loop())
        try:
            start = time.monotonic()
            assert typist.chan is not None
            typist.chan.write(typed.encode())  # as typed: no bracketed paste
            await asyncio.sleep(4.0)  # the watcher's view refreshes once a second
        finally:
            probe.cancel()
        # Taken in one turn, 4 KB would hold the loop ~80 s (8 KB, minutes) and the
        # watcher would get nothing meanwhile. Bounds generous for a loaded machine.
        assert frames.worst_stall_s < 2.0, frames.worst_stall_s
        got = frames.after(start)
        gaps = [b - a for a, b in zip([start, *got], got, strict=False)]
        assert len(got) >= 2 and max(gaps) < 3.0, gaps
        # the typist's palette holds what fits and says the rest was dropped
        await typist.wait_for(f"at most {MAX_QUERY_CHARS} characters", timeout=60)
        assert typed[:MAX_QUERY_CHARS] in typist.text
        # the typist's session answers at once: Esc closes the palette, `e` opens events
        typist.send("\x1b")
        await asyncio.sleep(0.3)
        typist.send("e")
        await typist.wait_for("\u203a Events")
        typist.send("q")
        watcher.send("q")
        assert await typist.closed() == 0
        assert await watcher.closed() == 0


async def test_a_claimed_terminal_of_65535_squared_is_drawn_at_a_bounded_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(tmp_path)
    async with console_server(tmp_path, keys) as server, login(server, keys.viewer, "amy") as conn:
        term = await open_terminal(conn, 100, 30)
        await term.wait_for("Fleet")
        assert term.chan is not None
        term.chan.change_terminal_size(65535, 65535)  # before: a repaint of 4e9 cells
        app = session_of(server, "amy").app
        await until(lambda: app.size == (MAX_COLUMNS, MAX_ROWS))
        assert "terminal size 65535x65535 from user=amy" in caplog.text
        term.resize(100, 30)
        await until(lambda: app.size == (100, 30))
        term.send("e")
        await term.wait_for("\u203a Events")
        term.send("q")
        assert await term.closed() == 0
