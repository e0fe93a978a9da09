"""A panel of wrapped lines that says how many it could not show, instead of cutting them."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text
from textual.containers import Horizontal
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from gpuconsole.tui.widgets.cells import looks_same
from gpuconsole.tui.widgets.rich_lines import text_strip


def hang(line: Text, width: int, console: Console) -> list[Text]:
    """`line` wrapped to `width`, each continuation indented past the line's own indent
    (two more cells), so a wrapped line never runs back to column 0."""
    width = max(1, width)
    first, *rest = line.wrap(console, width) or [Text()]
    if not rest:
        return [first]
    plain = line.plain
    indent = min(len(plain) - len(plain.lstrip(" ")) + 2, width // 2)
    tail = line[len(first.plain) :]
    tail = tail[len(tail.plain) - len(tail.plain.lstrip(" ")) :]
    pad = Text(" " * indent)
    return [first, *(pad + part for part in tail.wrap(console, max(1, width - indent)))]


def fold(text: Text, width: int, height: int, console: Console) -> list[Text]:
    """`text`'s lines wrapped to `width` (see `hang`), as many whole lines as fit in `height`;
    when some do not, the last line says how many more there are."""
    wrapped = [hang(line, width, console) for line in text.split("\n", allow_blank=False)]
    if sum(len(parts) for parts in wrapped) <= height:
        return [part for parts in wrapped for part in parts]
    shown: list[Text] = []
    for k, parts in enumerate(wrapped):
        if len(shown) + len(parts) > height - 1:
            shown.append(Text(f"… +{len(wrapped) - k} more", style="italic"))
            break
        shown.extend(parts)
    return shown


class Panel(Widget):
    """Wrapped lines in a box; when they do not all fit, the last line says how many more."""

    DEFAULT_CSS = """
    Panel { height: auto; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._text = Text()
        self._lines: list[Text] = []
        self._laid_out: tuple[int, int] | None = None

    @property
    def text(self) -> Text:
        return self._text

    def update(self, content: Text | str) -> None:
        # a str is words, never markup: "[fabric] enabled = true" keeps its brackets
        text = content if isinstance(content, Text) else Text(content)
        if looks_same(self._text, text):
            return
        lines_before = self._text.plain.count("\n")
        shown, laid_out = self._lines, self._laid_out
        self._text, self._laid_out = text, None
        if text.plain.count("\n") != lines_before or laid_out is None or not self.is_mounted:
            self.refresh(layout=True)
            return
        # only the lines that changed: a panel repainted whole each second (a power reading)
        # costs an ssh session its blank lines too
        fresh = self.shown_lines()
        if len(fresh) != len(shown):
            self.refresh()
            return
        gutter, width = self.styles.gutter, self.content_size.width
        changed = [
            Region(gutter.left, gutter.top + y, width, 1)
            for y, (old, new) in enumerate(zip(shown, fresh, strict=True))
            if not looks_same(old, new)
        ]
        if changed:
            self.refresh(*changed)

    def shown_lines(self) -> list[Text]:
        """The lines drawn at the panel's size now."""
        width, height = self.content_size
        if self._laid_out != (width, height):
            self._lines = fold(self._text, width, max(1, height), self.app.console)
            self._laid_out = (width, height)
        return self._lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(fold(self._text, width, 10_000, self.app.console))

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        style = self.visual_style.rich_style
        lines = self.shown_lines()
        if y >= len(lines):
            return Strip.blank(width, style)
        return text_strip(lines[y], width, self.app.console, style)


class Backdrop(Horizontal):
    """Panels side by side that cover the row they share. Textual draws every line of a
    widget that a changed line of the screen crosses, its children aside: blank, this row's
    lines cost one line of background, not a pass of each through its styles a second."""

    BLANK = True
