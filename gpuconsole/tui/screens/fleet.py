"""Fleet: every node as a row, a heat cell per GPU, health lights, filter and sort.

A row has a cell for every GPU of the node, those a guest holds through vfio-pci included
(NVML cannot read them, so they carry the passthrough mark instead of a heat colour).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static
from textual.widgets.data_table import ColumnKey

from gpuconsole import format as fmt
from gpuconsole.model import FleetSnapshot, Health, NodeSnapshot
from gpuconsole.tui import summaries as S
from gpuconsole.tui.hardware import short_model
from gpuconsole.tui.screens.base import BaseView
from gpuconsole.tui.themes import Palette
from gpuconsole.tui.widgets.cells import facet_lights, health_light, heat_cells
from gpuconsole.tui.widgets.filter_bar import FilterBar

COLUMNS: tuple[tuple[str, str], ...] = (
    ("node", "  node"),
    ("model", "model"),
    ("gpus", "GPUs"),
    ("lights", "GBFT"),
    ("free", "free"),
    ("power", "power"),
    ("hot", "hot"),
    ("seen", "seen"),
)
_HEALTH_RANK = {Health.CRITICAL: 0, Health.WARNING: 1, Health.STALE: 2, Health.UNKNOWN: 3,
                Health.OK: 4}  # fmt: skip


class Sort(enum.StrEnum):
    """Orders the fleet table can take; `s` cycles them."""

    NAME = "name"
    HEALTH = "health"
    UTIL = "util"
    TEMP = "temp"
    POWER = "power"
    FREE = "free"

    def next(self) -> Sort:
        members = list(Sort)
        return members[(members.index(self) + 1) % len(members)]


def sort_key(sort: Sort) -> Callable[[NodeSnapshot], tuple[float | str, str]]:
    """Worst or busiest first, then by name."""
    if sort is Sort.NAME:
        return lambda n: ("", n.node)
    if sort is Sort.HEALTH:
        return lambda n: (_HEALTH_RANK[n.health], n.node)
    if sort is Sort.UTIL:
        return lambda n: (-(S.mean(g.util_gpu_pct for g in n.gpus) or -1.0), n.node)
    if sort is Sort.TEMP:
        return lambda n: (-(S.node_hottest_c(n) or -1.0), n.node)
    if sort is Sort.POWER:
        return lambda n: (-(S.node_power_w(n) or -1.0), n.node)
    return lambda n: (-S.free_count(n), n.node)


def row_cells(
    node: NodeSnapshot, metric: S.Metric, palette: Palette, now: float
) -> tuple[Text | str, ...]:
    """The cells of one node's row, in COLUMNS order."""
    health = node.health
    seen = S.oldest_ok(node)
    stale = S.stale_sources(node)
    seen_text = Text(fmt.age(seen, now) if seen is not None else fmt.NA)
    if stale:
        seen_text.stylize(palette.health[Health.STALE])
    rows = S.gpu_rows(node)
    counts = S.gpu_counts(node)
    name = health_light(health, palette)
    name.append(" ")
    name.append(node.node, style=palette.health[health] if health is not Health.OK else "")
    return (
        name,
        short_model(S.node_model(node)),
        heat_cells(rows, metric, palette),
        facet_lights(S.facets(node), palette),
        f"{counts.free}/{counts.total}",
        fmt.kilowatts(S.node_power_w(node)),
        fmt.celsius(S.node_hottest_c(node)),
        seen_text,
    )


def placeholder_cells(node: NodeSnapshot) -> tuple[Text | str, ...]:
    """A row that has not been on screen yet: its name (for sorting) and nothing else."""
    return (Text(f"· {node.node}"), *("" for _ in COLUMNS[1:]))


class FleetTable(DataTable[Text | str]):
    """The fleet table: rows keyed by node name, updated cell by cell.

    Only rows in view are filled in: a row scrolled into view is brought up to date then,
    so a 1,000-node fleet costs what its visible rows cost.
    """

    def __init__(self, on_view_change: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._on_view_change = on_view_change

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self._on_view_change()

    def on_resize(self) -> None:
        self._on_view_change()

    def visible_rows(self) -> range:
        """Indexes of the rows in view, with a few spare below."""
        first = max(0, int(self.scroll_y))
        return range(first, min(self.row_count, first + self.size.height + 2))


class FleetScreen(BaseView):
    """Every node at a glance."""

    BINDINGS = [
        Binding("enter", "open", "Node"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("m", "metric", "Colour by"),
        Binding("s", "sort", "Sort"),
        Binding("o", "topology", "Topology"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]
    HELP_EXTRA = (("↑ ↓ PgUp PgDn", "move between nodes"), ("click", "select a node"))

    def __init__(self) -> None:
        super().__init__()
        self.metric = S.Metric.UTIL
        self.sort = Sort.NAME
        self.query_text = ""
        self._row_order: list[str] = []
        self._latest: dict[str, NodeSnapshot] = {}  # newest reading of every row
        self._shown: dict[str, NodeSnapshot] = {}  # the reading each row's cells show
        self._row_cells: dict[str, tuple[Text | str, ...]] = {}

    def crumbs(self) -> list[str]:
        return ["Fleet"]

    def compose_body(self) -> ComposeResult:
        yield Static(id="fleet-summary", classes="summary")
        table = FleetTable(self._fill_visible, id="fleet-table", cursor_type="row")
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        yield table
        yield FilterBar(placeholder="filter: name, model, owner or state (Enter keeps, Esc clears)")

    @property
    def table(self) -> FleetTable:
        return self.query_one(FleetTable)

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        nodes = snapshot.nodes
        if self.query_text:
            nodes = tuple(n for n in nodes if S.matches(n, self.query_text))
        ordered = sorted(nodes, key=sort_key(self.sort)) if self.sort is not Sort.NAME else nodes
        keys = [n.node for n in ordered]
        table = self.table
        self._latest = {n.node: n for n in ordered}
        with self.app.batch_update():
            if force or set(keys) != set(self._row_order):
                self._rebuild(table, ordered)
            elif keys != self._row_order:
                rank = {name: i for i, name in enumerate(keys)}
                table.sort("node", key=lambda cell: rank[_plain(cell).split(" ", 1)[-1]])
                self._row_order = keys
            self._fill_visible()
        self._show_summary(snapshot)

    def _rebuild(
        self, table: FleetTable, ordered: list[NodeSnapshot] | tuple[NodeSnapshot, ...]
    ) -> None:
        selected = self._selected_name()
        table.clear()
        self._shown.clear()
        self._row_cells.clear()
        for node in ordered:
            cells = placeholder_cells(node)
            table.add_row(*cells, key=node.node)
            self._row_cells[node.node] = cells
        self._row_order = [n.node for n in ordered]
        table.columns[ColumnKey("gpus")].label = Text(f"GPUs: {S.metric_unit(self.metric)}")
        if selected in self._latest:
            table.move_cursor(row=table.get_row_index(selected), animate=False)

    def _fill_visible(self) -> None:
        """Bring the rows in view up to date with the newest readings, changed cells only."""
        if not self._latest:
            return
        table = self.table
        palette, now, metric = self.palette, self.console.clock(), self.metric
        order = self._row_order
        for index in table.visible_rows():
            if index >= len(order):
                break
            name = order[index]
            node = self._latest.get(name)
            if node is None or self._shown.get(name) is node:
                continue
            self._update_row(table, node, row_cells(node, metric, palette, now))

    def _update_row(
        self, table: FleetTable, node: NodeSnapshot, cells: tuple[Text | str, ...]
    ) -> None:
        old = self._row_cells.get(node.node, ())
        for (key, _label), new, before in zip(COLUMNS, cells, old, strict=False):
            if new != before:
                table.update_cell(node.node, key, new)
        self._row_cells[node.node] = cells
        self._shown[node.node] = node

    def _show_summary(self, snapshot: FleetSnapshot) -> None:
        nodes = snapshot.nodes
        # every node, not only the rows in view: counts, not rows, keep 1,000 nodes cheap
        counts = sum((S.gpu_counts(n) for n in nodes), S.GpuCounts())
        lost, guests = counts.lost, counts.passthrough
        bad = sum(1 for n in nodes if n.health in (Health.CRITICAL, Health.WARNING, Health.STALE))
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{len(nodes)} nodes · {counts.total} GPUs · {counts.in_use} in use · "
                    f"{counts.free} free")  # fmt: skip
        if guests:
            text.append(f" · {guests} ")
            text.append(S.PASSTHROUGH_GLYPH, style=self.palette.passthrough_fg)
            text.append(" vfio")
        if lost:
            text.append(f" · {lost} lost", style=self.palette.health[Health.CRITICAL])
        if bad:
            text.append(f" · {bad} need a look", style=self.palette.health[Health.WARNING])
        text.append(f" · cells: {S.metric_unit(self.metric)} · sort: {self.sort.value}")
        if self.query_text:
            text.append(f" · filter: {self.query_text}", style="bold")
        self.query_one("#fleet-summary", Static).update(text)

    def _selected_name(self) -> str | None:
        table = self.table
        if table.row_count == 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        except Exception:
            return None
        return str(key.value) if key.value is not None else None

    # --- actions -------------------------------------------------------------------

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.console.open_node(str(event.row_key.value))

    def action_open(self) -> None:
        name = self._selected_name()
        if name is not None:
            self.console.open_node(name)

    def action_topology(self) -> None:
        name = self._selected_name()
        if name is not None:
            self.console.open_topology(name)

    def action_metric(self) -> None:
        self.metric = self.metric.next()
        self.render_latest(force=True)

    def action_sort(self) -> None:
        self.sort = self.sort.next()
        self.render_latest(force=True)

    def action_filter(self) -> None:
        self.query_one(FilterBar).open(self.query_text)

    def action_clear_filter(self) -> None:
        if self.query_text:
            self.query_one(FilterBar).close(clear=True)

    def on_filter_bar_changed(self, event: FilterBar.Changed) -> None:
        self.query_text = event.value.strip()
        self.render_latest(force=True)

    def on_filter_bar_closed(self, event: FilterBar.Closed) -> None:
        self.table.focus()


def _plain(cell: Text | str) -> str:
    return cell.plain if isinstance(cell, Text) else cell
