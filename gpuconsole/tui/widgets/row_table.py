"""A table of keyed rows drawn line by line, each row from segments rendered once per change.

DataTable clears its whole render cache on any cell update, so every cell in view is
rendered through Rich again each snapshot. Here a row keeps its rendered segments until its
own cells change; drawing a line lays the cursor's or hover's style over them and crops.
It looks and behaves like a row-cursor DataTable: header, keys, click, hover, scrolling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gpuconsole.tui.widgets.cells import looks_same

Cell = Text | str
_DRAWN_CELLS = 4096  # cells kept drawn, all columns together; then they start again
_PAD = Segment(" ")  # a cell's padding, each side, as DataTable's cell_padding=1


def _width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


@dataclass
class Column:
    """A column: its key, its header label, and the widest cell it has held."""

    key: str
    label: Text
    width: int
    mark: Style  # meta naming the column: two cells of one style stay two runs
    least: int | None = None  # it may give way to the view down to this width; None: never
    room: int | None = None  # the width it has while the view is too narrow for it
    hidden: bool = False

    @property
    def shown_width(self) -> int:
        return self.width if self.room is None else min(self.width, self.room)


class RowTable(ScrollView, can_focus=True):
    """Rows keyed by name under a fixed header, with a row cursor; Enter or a click on the
    cursor's row posts RowSelected. `on_view_change` runs when other rows come into view."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "row-table--header",
        "row-table--cursor",
        "row-table--hover",
    }
    # DataTable's look, but for the cursor: a tint under the row, not a block of colour, so
    # that its cells' own colours (health lights, heat) still read on the selected row.
    DEFAULT_CSS = """
    RowTable {
        background: $surface;
        color: $foreground;
        &:focus {
            background-tint: $foreground 5%;
            & > .row-table--cursor {
                background: $primary 18%;
                color: $foreground;
                text-style: bold;
            }
            & > .row-table--header {
                background-tint: $foreground 5%;
            }
        }
        & > .row-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        &:ansi > .row-table--header {
            background: ansi_bright_blue;
            color: ansi_default;
        }
        & > .row-table--cursor {
            background: $primary 12%;
            color: $foreground;
        }
        &:ansi > .row-table--cursor {
            background: ansi_default;
            text-style: reverse;
        }
        & > .row-table--hover {
            background: $block-hover-background;
        }
    }
    """
    # DataTable's keys and words for a row cursor: left, right, Home and End scroll sideways
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Select", show=False),
        Binding("up", "cursor_up", "Cursor up", show=False),
        Binding("down", "cursor_down", "Cursor down", show=False),
        Binding("right", "scroll_right", "Cursor right", show=False),
        Binding("left", "scroll_left", "Cursor left", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("ctrl+home", "cursor_first", "Top", show=False),
        Binding("ctrl+end", "cursor_last", "Bottom", show=False),
        Binding("home", "scroll_home", "Home", show=False),
        Binding("end", "scroll_end", "End", show=False),
    ]

    class RowSelected(Message):
        """Enter on a row, or a click on the cursor's row."""

        def __init__(self, table: RowTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> RowTable:
            return self.table

    def __init__(
        self,
        columns: Sequence[tuple[str, Cell]],
        *,
        on_view_change: Callable[[], None] | None = None,
        give_way: dict[str, int] | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """`give_way`: columns that narrow (down to the width given, in that order) when the
        view cannot show the whole table; their cut cells end in an ellipsis."""
        super().__init__(id=id, classes=classes)
        give_way = give_way or {}
        self._columns = [
            Column(key, Text(label) if isinstance(label, str) else label, 0,
                   Style.from_meta({"column": i}), give_way.get(key))
            for i, (key, label) in enumerate(columns)
        ]  # fmt: skip
        self._give_way = [k for k in give_way if k in {c.key for c in self._columns}]
        self._compact = False  # one space between cells instead of two
        self._column_index = {c.key: i for i, c in enumerate(self._columns)}
        self._on_view_change = on_view_change
        self._keys: list[str] = []
        self._index: dict[str, int] = {}
        self._cells: dict[str, tuple[Cell, ...]] = {}
        self._segments: dict[str, list[Segment]] = {}  # each row's cells, rendered
        # each cell drawn lately, by column and look: a row that changed reuses the rest
        self._drawn_cells: dict[tuple[object, ...], list[Segment]] = {}
        # a segment's style with the row's laid over it, by (row style, post style)
        self._style_sums: dict[tuple[Style, Style | None], dict[Style | None, Style | None]] = {}
        self._header: list[Segment] | None = None
        self._table_width = 0
        self._base_style = Style()  # the widget's own style, taken once per repaint
        self.cursor_row = 0
        self._hover_row: int | None = None  # shown only while the mouse moves over rows
        self._fit_columns()

    # --- rows ----------------------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self._keys)

    @property
    def row_keys(self) -> tuple[str, ...]:
        return tuple(self._keys)

    @property
    def cursor_key(self) -> str | None:
        return self._keys[self.cursor_row] if self._keys else None

    def get_row_at(self, index: int) -> tuple[Cell, ...]:
        return self._cells[self._keys[index]]

    def get_cell(self, key: str, column: str) -> Cell:
        return self._cells[key][self._column_index[column]]

    def label(self, column: str) -> Text:
        return self._columns[self._column_index[column]].label

    def set_label(self, column: str, label: Cell) -> None:
        self._columns[self._column_index[column]].label = (
            Text(label) if isinstance(label, str) else label
        )
        self._header = None
        self._fit_columns()
        self.refresh()

    def set_rows(self, rows: Iterable[tuple[str, tuple[Cell, ...]]]) -> None:
        """Replace every row; the cursor stays on its row if that row is still here, else it
        goes to the top."""
        keep = self.cursor_key
        self._cells = dict(rows)
        self._keys = list(self._cells)
        self._index = {key: i for i, key in enumerate(self._keys)}
        self._hover_row = None
        self._fit_columns()  # never narrower: columns hold still as a filter narrows the rows
        self._place_cursor(self._index.get(keep, 0) if keep is not None else 0)
        self.refresh()

    def reorder(self, keys: Sequence[str]) -> None:
        """Show the same rows in a new order. The cursor follows its row, and the view
        follows the cursor only if it was in view: a scrolled-away reader stays put."""
        keep, follow = self.cursor_key, self._cursor_in_view()
        self._keys = list(keys)
        self._index = {key: i for i, key in enumerate(self._keys)}
        if keep is not None:
            self._place_cursor(self._index[keep], scroll=follow)
        self.refresh()

    def update_row(self, key: str, cells: tuple[Cell, ...]) -> bool:
        """Give a row new cells; only that row is rendered again. False if nothing changed."""
        return bool(self.update_rows([(key, cells)]))

    def update_rows(self, rows: Iterable[tuple[str, tuple[Cell, ...]]]) -> list[str]:
        """Give rows new cells; only the rows whose cells changed are rendered again, in one
        refresh. The keys of those that changed."""
        changed: list[str] = []
        grew = False
        for key, cells in rows:
            old = self._cells.get(key)
            if old is None or len(old) != len(cells):
                fresh: Iterable[int] = range(len(cells))
            else:
                pairs = enumerate(zip(old, cells, strict=True))
                fresh = [i for i, (a, b) in pairs if not looks_same(a, b)]
                if not fresh:
                    continue
            self._cells[key] = cells
            self._segments.pop(key, None)
            grew = self._widen((i, cells[i]) for i in fresh) or grew
            changed.append(key)
        if changed and not grew:
            top, (width, height) = int(self.scroll_y), self.size
            lines = (self._index[key] + 1 - top for key in changed)  # the header is line 0
            regions = [Region(0, y, width, 1) for y in lines if 0 < y < height]
            if regions:  # none would mean all of it
                self.refresh(*regions)
        return changed

    def move_cursor(self, key: str) -> None:
        """Put the cursor on the row keyed `key`, and that row in view."""
        self._show_hover(None)
        self._place_cursor(self._index[key])

    def visible_rows(self) -> range:
        """Indexes of the rows in view, with a few spare below."""
        first = max(0, int(self.scroll_y))
        return range(first, min(self.row_count, first + self.size.height + 2))

    # --- widths --------------------------------------------------------------------

    def _fit_columns(self) -> None:
        """Each column as wide as its label and every row it holds; sets the virtual size."""
        for i, column in enumerate(self._columns):
            widest = max((_width(cells[i]) for cells in self._cells.values() if i < len(cells)),
                         default=0)  # fmt: skip
            column.width = max(column.width, column.label.cell_len, widest)
        self._header = None
        self._segments.clear()
        self._drawn_cells.clear()
        self._sized()

    def _widen(self, cells: Iterable[tuple[int, Cell]]) -> bool:
        """Make room for cells, each with its column's index; True (and every row drawn
        again) if a column grew."""
        grew = False
        columns = self._columns
        for i, cell in cells:
            width = _width(cell)
            if i < len(columns) and width > columns[i].width:
                columns[i].width = width
                grew = True
        if grew:
            self._header = None
            self._segments.clear()
            self._drawn_cells.clear()
            self._sized()
            self.refresh()
        return grew

    def _sized(self) -> None:
        self._give_room()
        self._table_width = self._width_of(self._columns)
        self.virtual_size = Size(self._table_width, len(self._keys) + 1)

    def _width_of(self, columns: Iterable[Column]) -> int:
        pad = 1 if self._compact else 2
        return sum(c.shown_width + pad for c in columns if not c.hidden)

    def _give_room(self) -> None:
        """Narrow the columns that give way, in order, until the table fits the view."""
        for column in self._columns:
            column.room = None
        view = self.scrollable_content_region.width if self.is_mounted else 0
        if not view or not self._give_way:
            return
        over = self._width_of(self._columns) - view
        for key in self._give_way:
            if over <= 0:
                break
            column = self._columns[self._column_index[key]]
            least = column.least if column.least is not None else column.width
            cut = min(over, max(0, column.width - least))
            column.room = column.width - cut
            over -= cut

    def show_columns(self, *, hide: Iterable[str] = (), compact: bool = False) -> None:
        """Leave columns out, or put them back, and set the space between cells."""
        hidden = set(hide)
        if compact == self._compact and hidden == {c.key for c in self._columns if c.hidden}:
            return
        for column in self._columns:
            column.hidden = column.key in hidden
        self._compact = compact
        self._header = None
        self._segments.clear()
        self._drawn_cells.clear()
        self._sized()
        self.refresh()

    # --- drawing -------------------------------------------------------------------

    def _render_cells(self, cells: Sequence[Cell]) -> list[Segment]:
        """A row's cells as segments, each padded to its column: no cursor, no background.
        A cell drawn before in its column (most of a changed row's) is not drawn again."""
        memo = self._drawn_cells
        out: list[Segment] = []
        for i, (column, cell) in enumerate(zip(self._columns, cells, strict=False)):
            if column.hidden:
                continue
            key = (
                (i, cell.plain, cell.style, tuple(cell.spans))
                if isinstance(cell, Text)
                else (i, cell)
            )
            drawn = memo.get(key)
            if drawn is None:
                if len(memo) >= _DRAWN_CELLS:
                    memo.clear()
                drawn = memo[key] = self._render_cell(column, cell)
            out += drawn
        return out

    def _render_cell(self, column: Column, cell: Cell) -> list[Segment]:
        console = self.app.console
        width = column.shown_width
        room = width - _width(cell)
        simple = self._one_style_cell(column, cell, room, console) if room >= 0 else None
        if simple is not None:
            return simple
        if _width(cell) > width:  # a cut cell says so
            cell = cell.copy() if isinstance(cell, Text) else Text(cell)
            cell.truncate(width, overflow="ellipsis")
        if not isinstance(cell, Text):
            line = [Segment(cell)] if cell else []
        elif cell.spans:
            line = list(cell.render(console))
        else:  # Text.render leaves a Text without spans unstyled
            line = [Segment(cell.plain, console.get_style(cell.style) if cell.style else None)]
        # padded unstyled, as Rich pads a cell: the row's style shows there, not the cell's
        body = Segment.adjust_line_length(line, width)
        padded = [_PAD, *body] if self._compact else [_PAD, *body, _PAD]
        # one run per style within a cell, and cells kept apart by their column's mark, as
        # DataTable draws them: a screenshot of the view comes out the same
        return list(Segment.apply_style(Segment.simplify(padded), post_style=column.mark))

    def _one_style_cell(
        self, column: Column, cell: Cell, room: int, console: Console
    ) -> list[Segment] | None:
        """A cell of one style (or none) that fits its column, as nearly every cell a new
        reading brings is (a number, a sparkline): the very segments the general way makes
        of it (padding, one run per style, the column's mark), without Rich's passes over
        them. None for another cell."""
        mark = column.mark
        tail = " " * room if self._compact else " " * (room + 1)
        if isinstance(cell, str):
            return [Segment(f" {cell}{tail}", mark)]
        if cell.spans:
            return None
        style = console.get_style(cell.style) if cell.style else None
        if style is None:
            return [Segment(f" {cell.plain}{tail}", mark)]
        if not cell.plain:
            return None  # Rich keeps an empty run of the style: the general way does too
        body = Segment(cell.plain, style + mark if style else mark)
        return (
            [Segment(" ", mark), body, Segment(tail, mark)] if tail else [Segment(" ", mark), body]
        )

    def render_lines(self, crop: Region) -> list[Strip]:
        self._base_style = self.rich_style  # it walks the DOM: once, not once a line
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        scroll_x, scroll_y = self.scroll_offset
        base = self._base_style
        if y == 0:
            if self._header is None:
                self._header = self._render_cells([c.label for c in self._columns])
            return self._line(self._header, self.get_component_rich_style("row-table--header"),
                              None, scroll_x, width, base)  # fmt: skip
        index = y - 1 + scroll_y
        if index >= len(self._keys):
            return Strip.blank(width, base)
        key = self._keys[index]
        segments = self._segments.get(key)
        if segments is None:
            segments = self._segments[key] = self._render_cells(self._cells[key])
        if index == self.cursor_row:
            over = self.get_component_rich_style("row-table--cursor")
        elif index == self._hover_row:
            over = self.get_component_rich_style("row-table--hover")
        else:
            return self._line(segments, base, None, scroll_x, width, base)
        # a cell's own colour (a health light, a heat cell) shows on the cursor's row too:
        # the cursor's foreground only where the cell has none
        return self._line(segments, base + over, None, scroll_x, width, base)

    def _line(
        self,
        segments: list[Segment],
        style: Style,
        post: Style | None,
        scroll_x: int,
        width: int,
        base: Style,
    ) -> Strip:
        styled = self._apply(segments, style, post)
        table_width = self._table_width
        if width > table_width:
            styled.append(Segment(" " * (width - table_width), style))
        strip = Strip(styled, max(width, table_width))
        if scroll_x or table_width > width:
            strip = strip.crop(scroll_x, scroll_x + width).adjust_cell_length(width, base)
        return strip

    def _apply(self, segments: list[Segment], style: Style, post: Style | None) -> list[Segment]:
        """Segment.apply_style(segments, style, post), each style worked out once. Rich keeps
        1,024 sums of styles for the whole app; Textual's own fill that every frame, and
        working one out again (a column's mark merged in) costs more than the rest of a line."""
        sums = self._style_sums.get((style, post))
        if sums is None:
            if len(self._style_sums) >= 64:  # themes, focus and cursor: a handful in use
                self._style_sums.clear()
            sums = self._style_sums[(style, post)] = {}
        out: list[Segment] = []
        for segment in segments:
            if segment.control:
                out.append(segment)
                continue
            if segment.style in sums:
                summed = sums[segment.style]
            else:
                (one,) = Segment.apply_style([segment], style, post)
                summed = sums[segment.style] = one.style
            out.append(Segment(segment.text, summed))
        return out

    # --- cursor, keys, mouse -----------------------------------------------------------

    @property
    def _rows_in_view(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)  # less the header

    def _cursor_in_view(self) -> bool:
        top = int(self.scroll_y)
        return top <= self.cursor_row < top + self._rows_in_view

    def _place_cursor(self, index: int, *, scroll: bool = True) -> None:
        """Move the cursor (clamped to the rows), redraw the two rows, bring it into view."""
        index = max(0, min(index, len(self._keys) - 1))
        old, self.cursor_row = self.cursor_row, index
        if old != index:
            self.refresh_line(old + 1)
            self.refresh_line(index + 1)
        if not scroll:
            return
        top, rows = int(self.scroll_y), self._rows_in_view
        if index < top:
            self.scroll_to(y=index, animate=False, force=True)
        elif index >= top + rows:
            self.scroll_to(y=index - rows + 1, animate=False, force=True)

    def refresh_line(self, y: int) -> None:
        if y > 0:  # a row's line scrolls; the header's (0) does not
            super().refresh_line(y)

    def _show_hover(self, index: int | None) -> None:
        if index != self._hover_row:
            for old_or_new in (self._hover_row, index):
                if old_or_new is not None:
                    self.refresh_line(old_or_new + 1)
            self._hover_row = index

    def _row_at(self, y: int) -> int | None:
        """The index of the row on line `y` of the widget; None on the header or below."""
        if y < 1:
            return None
        index = y - 1 + int(self.scroll_y)
        return index if index < len(self._keys) else None

    def action_cursor_up(self) -> None:
        self._show_hover(None)
        self._place_cursor(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self._show_hover(None)
        self._place_cursor(self.cursor_row + 1)

    def action_page_up(self) -> None:
        self._show_hover(None)
        self._place_cursor(self.cursor_row - self._rows_in_view)

    def action_page_down(self) -> None:
        self._show_hover(None)
        self._place_cursor(self.cursor_row + self._rows_in_view)

    def action_cursor_first(self) -> None:
        self._show_hover(None)
        self._place_cursor(0)

    def action_cursor_last(self) -> None:
        self._show_hover(None)
        self._place_cursor(len(self._keys) - 1)

    def action_scroll_home(self) -> None:
        self.scroll_to(x=0, animate=False)

    def action_scroll_end(self) -> None:
        self.scroll_to(x=self.max_scroll_x, animate=False)

    def action_select_cursor(self) -> None:
        key = self.cursor_key
        if key is not None:
            self.post_message(self.RowSelected(self, key))

    def on_click(self, event: events.Click) -> None:
        index = self._row_at(event.y)
        if index is None:
            return
        event.stop()
        if index == self.cursor_row:
            self.post_message(self.RowSelected(self, self._keys[index]))
        else:
            self._place_cursor(index)

    def on_mouse_move(self, event: events.MouseMove) -> None:
        self._show_hover(self._row_at(event.y))

    def on_leave(self, _event: events.Leave) -> None:
        self._show_hover(None)

    # --- view ----------------------------------------------------------------------

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value) and self._on_view_change is not None:
            self._on_view_change()

    def on_resize(self) -> None:
        if self._give_way:
            self._header = None
            self._segments.clear()
            self._drawn_cells.clear()
            self._sized()
            self.refresh()
        if self._on_view_change is not None:
            self._on_view_change()
