"""The console while it starts: what a key does before there is anything to show."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, ClassVar

from gpuconsole.hub import Hub
from gpuconsole.readings.base import Key, RawCounter
from gpuconsole.sources.base import EmitEvent
from gpuconsole.tui.app import ConsoleApp


class _Nothing:
    def counters(self) -> Iterator[RawCounter]:
        return iter(())

    def series(self) -> Iterator[tuple[Key, float]]:
        return iter(())


class SlowStart:
    """A source that takes as long to start as a hung driver: until closed."""

    kind: ClassVar[str] = "nvml"

    def __init__(self) -> None:
        self.node = "dgx-001"
        self.interval_s = 1.0
        self.timeout_s = 1.0
        self.closed = asyncio.Event()

    async def start(self, emit: EmitEvent) -> None:
        await self.closed.wait()

    async def poll(self) -> _Nothing:
        return _Nothing()

    async def close(self) -> None:
        self.closed.set()


async def test_ctrl_c_ends_a_console_that_is_still_starting() -> None:
    """Nothing is drawn yet, so no key hint can be read: Ctrl+C ends the console (once it
    shows data, Ctrl+C says which key quits, as every Textual app does)."""
    hub = Hub()
    hub.add_node("dgx-001")
    source = SlowStart()
    hub.add_source(source)
    app = ConsoleApp(hub, theme_dirs=[], cursor_blink=False)
    async with asyncio.timeout(20):
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert app._exit  # asked to end, at once
    assert app.return_code == 0 and source.closed.is_set()


async def test_once_it_shows_data_ctrl_c_says_which_key_quits(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.snapshot is not None
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert not app._exit and app.is_running
        (said,) = [n.message for n in app._notifications]
        assert said.startswith("Press [b]") and said.endswith("to quit the app")
