"""Fleet: every node as a row, a heat cell per GPU, health lights, filter and sort.

A row has a cell for every GPU of the node, those a guest holds through vfio-pci included
(NVML cannot read them, so they carry the passthrough mark instead of a heat colour).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from gpuconsole import format as fmt
from gpuconsole.facts import summaries
from gpuconsole.hardware import short_model
from gpuconsole.readings.base import Health
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.tui.screens.base import BaseView
from gpuconsole.tui.themes import Palette
from gpuconsole.tui.widgets.cells import facet_lights, health_light, heat_cells
from gpuconsole.tui.widgets.filter_bar import FilterBar
from gpuconsole.tui.widgets.row_table import Cell, RowTable

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
_NEEDS_A_LOOK = frozenset((Health.CRITICAL, Health.WARNING, Health.STALE))


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


def sort_key(
    sort: Sort, facts: Mapping[str, summaries.NodeFacts]
) -> Callable[[NodeSnapshot], tuple[float | str, ...]]:
    """Worst or busiest first, then by name. Among critical nodes, the one with more GPUs
    out of work first (a lost GPU's job died; a failed fan's did not), then the stronger
    action."""
    if sort is Sort.NAME:
        return lambda n: ("", n.node)
    if sort is Sort.HEALTH:
        return lambda n: _health_order(facts[n.node], n.node)
    if sort is Sort.UTIL:
        return lambda n: (-(summaries.mean(g.util_gpu_pct for g in n.gpus) or -1.0), n.node)
    if sort is Sort.TEMP:
        return lambda n: (-(summaries.node_hottest_c(n) or -1.0), n.node)
    if sort is Sort.POWER:
        return lambda n: (-(summaries.node_power_w(n) or -1.0), n.node)
    return lambda n: (-facts[n.node].counts.free, n.node)


def _health_order(facts: summaries.NodeFacts, name: str) -> tuple[float | str, ...]:
    return _HEALTH_RANK[facts.health], -facts.unfit, -facts.action_rank, name


def row_cells(
    node: NodeSnapshot,
    facts: summaries.NodeFacts,
    metric: summaries.Metric,
    palette: Palette,
    now: float,
) -> tuple[Cell, ...]:
    """The cells of one node's row, in COLUMNS order."""
    health, counts = facts.health, facts.counts
    seen = summaries.oldest_ok(node)
    stale = summaries.stale_sources(node)
    seen_text = Text(fmt.age(seen, now) if seen is not None else fmt.NA)
    if stale:
        seen_text.stylize(palette.health[Health.STALE])
    name = health_light(health, palette)
    name.append(" ")
    name.append(node.node, style=palette.health[health] if health is not Health.OK else "")
    return (
        name,
        short_model(summaries.node_model(node)),
        heat_cells(summaries.gpu_rows(node), metric, palette),
        facet_lights(summaries.facets(node), palette),
        f"{counts.free}/{counts.total}",
        fmt.kilowatts(summaries.node_power_w(node)),
        fmt.celsius(summaries.node_hottest_c(node)),
        seen_text,
    )


def placeholder_cells(node: NodeSnapshot) -> tuple[Cell, ...]:
    """A row that has not been in view yet: its name and nothing else."""
    return (Text(f"· {node.node}"), *("" for _ in COLUMNS[1:]))


class FleetScreen(BaseView):
    """Every node at a glance."""

    BINDINGS = [
        Binding("enter", "open", "Node"),
        FilterBar.KEY,
        Binding("m", "metric", "Colour by"),
        Binding("s", "sort", "Sort"),
        Binding("o", "topology", "Topology"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]
    HELP_EXTRA = (("↑ ↓ PgUp PgDn", "move between nodes"), ("click", "select a node"))
    HELP_LEGEND = (
        ("GPUs", "a cell per GPU, coloured by what m chooses (util %, temp, power, memory)"),
        ("m", "in a cell: the GPU is in MIG mode (its instances are in its SM map)"),
        ("\u2716 in a cell", "the GPU is lost (fell off the bus)"),
        ("GBFT", "a light per source: GPU (NVML), BMC, Fabric, Tenancy (owners)"),
        ("free", "GPUs nobody holds, of the node's GPUs"),
        ("power", "the node's GPUs' power draw"),
        ("hot", "the node's hottest GPU"),
        ("seen", "how long ago its least fresh source answered"),
    )

    def __init__(self) -> None:
        super().__init__()
        self.metric = summaries.Metric.UTIL
        self.sort = Sort.NAME
        self.query_text = ""
        self._latest: dict[str, NodeSnapshot] = {}  # newest reading of every row
        self._shown: dict[str, NodeSnapshot] = {}  # the reading each row's cells show
        # every node's health and counts, with the reading they were worked out from
        self._facts: dict[str, tuple[NodeSnapshot, summaries.NodeFacts]] = {}
        self._summary: Text | None = None  # the summary line on screen
        self._told: frozenset[str] | None = None  # the rows in view, as the hub was told

    def crumbs(self) -> list[str]:
        return ["Fleet"]

    def compose_body(self) -> ComposeResult:
        yield Static(id="fleet-summary", classes="summary")
        yield RowTable(COLUMNS, on_view_change=self._fill_visible, id="fleet-table")
        yield FilterBar(placeholder="filter: name, model, owner or state (Enter keeps, Esc clears)")

    @property
    def table(self) -> RowTable:
        return self.query_one("#fleet-table", RowTable)

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        facts = self._update_facts(snapshot.nodes)
        nodes = snapshot.nodes
        if self.query_text:
            nodes = tuple(n for n in nodes if summaries.matches(n, self.query_text))
        ordered = (
            sorted(nodes, key=sort_key(self.sort, facts)) if self.sort is not Sort.NAME else nodes
        )
        keys = [n.node for n in ordered]
        table = self.table
        self._latest = {n.node: n for n in ordered}
        if force or set(keys) != set(table.row_keys):
            self._shown.clear()
            table.set_label("gpus", f"GPUs: {summaries.metric_unit(self.metric)}")
            table.set_rows((n.node, placeholder_cells(n)) for n in ordered)
        elif keys != list(table.row_keys):
            table.reorder(keys)
        self._fill_visible()
        # the counts of the rows shown: a filtered fleet counts what it lists
        self._show_summary({n.node: facts[n.node] for n in nodes}, len(facts))

    def _update_facts(self, nodes: tuple[NodeSnapshot, ...]) -> dict[str, summaries.NodeFacts]:
        """Health and counts of every node, worked out once per reading of that node."""
        seen = self._facts
        self._facts = {}
        facts: dict[str, summaries.NodeFacts] = {}
        for node in nodes:
            hit = seen.get(node.node)
            found = hit[1] if hit is not None and hit[0] is node else summaries.node_facts(node)
            self._facts[node.node] = (node, found)
            facts[node.node] = found
        return facts

    def _fill_visible(self) -> None:
        """Bring the rows in view up to date with the newest readings; a row whose reading
        has not changed is left alone, and one whose cells came out the same is not drawn."""
        if not self._latest:
            return
        table = self.table
        palette, now, metric = self.palette, self.console.clock(), self.metric
        order = table.row_keys
        visible = table.visible_rows()
        for index in visible:
            name = order[index]
            node = self._latest.get(name)
            if node is None or self._shown.get(name) is node:
                continue
            facts = self._facts[name][1]
            table.update_row(name, row_cells(node, facts, metric, palette, now))
            self._shown[name] = node
        in_view = frozenset(order[index] for index in visible)
        if in_view != self._told:  # the hub reads these rows' GPUs each round
            self._told = in_view
            self.console.show_rows(in_view)

    def _show_summary(self, facts: dict[str, summaries.NodeFacts], of: int) -> None:
        """Counts over the nodes `facts` holds (those the filter lets through) of `of`."""
        # every node listed, not only the rows in view: counts, not rows, keep 1,000 cheap
        counts = summaries.GpuCounts.add_up(f.counts for f in facts.values())
        lost, guests = counts.lost, counts.passthrough
        bad = sum(1 for f in facts.values() if f.health in _NEEDS_A_LOOK)
        text = Text(no_wrap=True, overflow="ellipsis")
        listed = f"{len(facts)} of {of}" if len(facts) != of else f"{of}"
        text.append(f"{listed} nodes · {counts.total} GPUs · {counts.in_use} in use · "
                    f"{counts.free} free")  # fmt: skip
        if guests:
            text.append(f" · {guests} ")
            text.append(summaries.PASSTHROUGH_GLYPH, style=self.palette.passthrough_fg)
            text.append(" vfio")
        if lost:
            text.append(f" · {lost} lost", style=self.palette.health[Health.CRITICAL])
        if bad:
            text.append(f" · {bad} need a look", style=self.palette.health[Health.WARNING])
        text.append(f" · cells: {summaries.metric_unit(self.metric)} · sort: {self.sort.value}")
        if self.query_text:
            text.append(f" · filter: {self.query_text}", style="bold")
        if text != self._summary:  # on a busy fleet the counts hold still more than not
            # one line, never wrapped: only the first showing can change the layout
            self.query_one("#fleet-summary", Static).update(text, layout=self._summary is None)
            self._summary = text

    def _selected_name(self) -> str | None:
        return self.table.cursor_key

    # --- actions -------------------------------------------------------------------

    def on_row_table_row_selected(self, event: RowTable.RowSelected) -> None:
        self.console.open_node(event.key)

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

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "filter" and self.is_mounted and self.query_one(FilterBar).typing:
            return False
        return super().check_action(action, parameters)

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
