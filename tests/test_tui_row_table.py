"""The keyed row table under the fleet view: a fixed header, columns as wide as their widest
cell, sideways scrolling, and a row drawn again only when its own cells change."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult

from gpuconsole.tui.widgets.row_table import Cell, RowTable

COLUMNS = (("name", "name"), ("wide", "wide"))


class TableApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.selected: list[str] = []

    def compose(self) -> ComposeResult:
        yield RowTable(COLUMNS, id="table")

    def on_row_table_row_selected(self, event: RowTable.RowSelected) -> None:
        self.selected.append(event.key)


def lines(app: App[None]) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


async def test_the_header_stays_while_rows_scroll_and_enter_selects_the_cursors_row() -> None:
    app = TableApp()
    async with app.run_test(size=(40, 6)) as pilot:
        table = app.query_one(RowTable)
        table.set_rows((f"row-{i:02d}", (f"row-{i:02d}", "x")) for i in range(20))
        await pilot.pause()
        await pilot.press("pagedown", "pagedown")
        await pilot.pause()
        shown = lines(app)
        assert shown[0].split() == ["name", "wide"]  # still on top
        assert table.cursor_key == "row-10"  # two pages of five rows (six lines, less header)
        assert shown[-1].split()[0] == "row-10"  # the cursor's row, at the bottom of the view
        await pilot.press("enter")
        await pilot.pause()
        assert app.selected == ["row-10"]


async def test_a_wider_cell_widens_its_column_and_end_scrolls_header_and_rows() -> None:
    app = TableApp()
    async with app.run_test(size=(20, 5)) as pilot:
        table = app.query_one(RowTable)
        table.set_rows([("a", ("a", "short")), ("b", ("b", ""))])
        await pilot.pause()
        table.update_row("b", ("b", Text("0123456789abcdefghij")))
        await pilot.pause()
        assert table.virtual_size.width == 6 + 22  # "name" and the new cell, one space a side
        await pilot.press("end")  # DataTable's End: as far right as the table goes
        await pilot.pause()
        assert table.scroll_x == 28 - 20
        shown = lines(app)
        # header and rows cut at the same place: " name   wide" less its first 8 cells
        assert shown[0].startswith("ide ")
        assert shown[2].startswith("123456789abcdefghij ")
        assert table.cursor_key == "a"  # End scrolls; it does not move the cursor


async def test_only_the_row_whose_cells_changed_is_drawn_again() -> None:
    app = TableApp()
    async with app.run_test(size=(40, 8)) as pilot:
        table = app.query_one(RowTable)
        table.set_rows((key, (key, "1")) for key in "abc")
        await pilot.pause()
        drawn: list[str] = []
        original = table._render_cells

        def render(cells: Any) -> Any:
            drawn.append(cells[0])
            return original(cells)

        table._render_cells = render  # type: ignore[method-assign]
        assert not table.update_row("a", ("a", "1"))  # the same cells: nothing to do
        assert table.update_row("b", ("b", "2"))
        await pilot.pause()
        assert drawn == ["b"]
        assert lines(app)[2].split() == ["b", "2"]


async def test_a_cell_that_only_changes_colour_is_drawn_again() -> None:
    app = TableApp()
    async with app.run_test(size=(40, 8)) as pilot:
        table = app.query_one(RowTable)
        table.set_rows([("a", ("a", Text("▅▆", style="green")))])
        await pilot.pause()
        # Rich's Text == leaves the Text's own style out: a sparkline turning red is a change
        assert not table.update_row("a", ("a", Text("▅▆", style="green")))
        assert table.update_row("a", ("a", Text("▅▆", style="red")))
        await pilot.pause()
        assert table.get_cell("a", "wide").style == "red"


async def test_a_one_style_cell_is_drawn_the_way_any_cell_is() -> None:
    """Cells of one style (numbers, sparklines: nearly all a new reading brings) take a
    short way to their segments; they come out as the general way makes them."""
    app = TableApp()
    async with app.run_test(size=(40, 8)):
        table = app.query_one(RowTable)
        column = table._columns[1]
        column.width = 8
        cells: list[Cell] = ["", "12%", "12345678", Text("42°C"), Text("▅▆", style="green"),
                             Text("", style="red"), Text("x", style="none"), Text("no", style="")]  # fmt: skip
        for compact in (False, True):
            table._compact = compact
            short = [table._render_cell(column, cell) for cell in cells]
            table._one_style_cell = lambda *_: None  # type: ignore[method-assign]
            general = [table._render_cell(column, cell) for cell in cells]
            del table._one_style_cell
            assert short == general
