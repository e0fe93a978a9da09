"""Lines of Rich Text that change every second (the node view's freshness line): a line
that stays the same is not drawn again when another one changes."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult

from gpuconsole.tui.widgets.rich_lines import RichLines


class LinesApp(App[None]):
    def compose(self) -> ComposeResult:
        yield RichLines(id="lines")


def shown(app: App[None]) -> list[str]:
    return [strip.text.rstrip() for strip in app.screen._compositor.render_strips()][:2]


async def test_only_the_line_that_changed_is_drawn_again() -> None:
    app = LinesApp()
    async with app.run_test(size=(40, 4)) as pilot:
        lines = app.query_one(RichLines)
        lines.update(Text("H100 · 8 H100 · driver 550\nnvml: ok, 0 s ago"))
        await pilot.pause()
        drawn: list[int] = []
        original = lines.render_line

        def render_line(y: int) -> object:
            drawn.append(y)
            return original(y)

        lines.render_line = render_line  # type: ignore[assignment, method-assign]
        lines.update(Text("H100 · 8 H100 · driver 550\nnvml: ok, 1 s ago"))
        await pilot.pause()
        assert drawn == [1]
        assert shown(app) == ["H100 · 8 H100 · driver 550", "nvml: ok, 1 s ago"]
        lines.update("one line now")  # fewer lines: laid out again, and all of it drawn
        await pilot.pause()
        assert shown(app) == ["one line now", ""]
