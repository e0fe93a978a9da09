"""A console open all day keeps what it shows, not what it showed (the soak run's growth)."""

from __future__ import annotations

import gc
from typing import Any

from textual.widgets._footer import FooterKey

from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.events import EventsScreen


def footer_keys() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, FooterKey))


async def test_walking_between_views_leaves_no_old_footer_keys(console_app: Any) -> None:
    app: ConsoleApp = console_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        shown = footer_keys()
        for _ in range(8):
            await pilot.press("e")
            await pilot.pause()
            assert isinstance(app.screen, EventsScreen)
            await pilot.press("escape")
            await pilot.pause()
        # Textual's footer data-binds each key it composes and kept every one (20 a visit)
        assert footer_keys() <= shown + 15
