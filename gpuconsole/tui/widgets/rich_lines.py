"""Rich Text drawn straight to terminal lines, for text that changes every second.

A Static takes a Rich Text through Textual's Content on every update, which costs as much as
drawing a table's changed rows; these lines go from the Text to segments and nothing else.
Lines never wrap: one longer than the widget ends in an ellipsis.
"""

from __future__ import annotations

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from gpuconsole.tui.widgets.cells import looks_same


def text_strip(line: Text, width: int, console: Console, base: Style) -> Strip:
    """One line of Text as a strip `width` cells wide: cut with an ellipsis, or padded, and
    drawn over the widget's own style (`base`)."""
    if line.cell_len > width:
        line = line.copy()
        line.truncate(width, overflow="ellipsis")
    if line.spans or line.style:
        segments = list(line.render(console))
    else:  # Text.render leaves a Text without spans unstyled
        segments = [Segment(line.plain)] if line.plain else []
    strip = Strip(Segment.apply_style(segments, base), line.cell_len)
    return strip.adjust_cell_length(width, base)


class RichLines(Widget):
    """Lines of Rich Text, one per line of the widget, never wrapped."""

    DEFAULT_CSS = """
    RichLines { height: auto; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._text: Text | str = ""
        self._lines: list[Text] = [Text()]

    def update(self, text: Text | str) -> None:
        """Show `text`; nothing to do if it shows that already, a layout only if its count of
        lines changes, and otherwise only the lines that changed are drawn again."""
        if looks_same(self._text, text):
            return
        lines = list((text if isinstance(text, Text) else Text(text)).split("\n", allow_blank=True))
        shown, self._text, self._lines = self._lines, text, lines
        if len(lines) != len(shown):
            self.refresh(layout=True)
            return
        gutter, width = self.styles.gutter, self.content_size.width
        if not self.is_mounted or not width:  # not laid out yet: its first paint draws all
            self.refresh()
            return
        changed = [
            Region(gutter.left, gutter.top + y, width, 1)
            for y, (old, new) in enumerate(zip(shown, lines, strict=True))
            if not looks_same(old, new)
        ]
        if changed:
            self.refresh(*changed)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        style = self.visual_style.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, style)
        return text_strip(self._lines[y], width, self.app.console, style)
