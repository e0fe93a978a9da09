"""Events: XID, ECC, throttle, source stale/recovered and later ones, filtered."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.widgets import DataTable, Static
from textual.widgets.data_table import ColumnKey

from gpuconsole import format as fmt
from gpuconsole.facts.inventory import GpuRow, event_gpu, gpu_and_bus, node_gpus, short_bus_id
from gpuconsole.readings.base import Event, Health, Severity, known_bus_id, normal_bus_id
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.screens.base import BaseView
from gpuconsole.tui.widgets.filter_bar import FilterBar

MESSAGE_LEAST = 20  # the message column's width where the view leaves it less
_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
_SEVERITY_HEALTH = {Severity.INFO: Health.OK, Severity.WARNING: Health.WARNING,
                    Severity.CRITICAL: Health.CRITICAL}  # fmt: skip


@dataclass(frozen=True, slots=True)
class GpuPick:
    """The GPU (or, across nodes, GPUs) an events filter means, by what NVML's numbering
    does not change: node and bus id, or UUID for an event that names no bus id."""

    name: str  # as the summary says it: "GPU 4 (c3:00.0)"
    places: frozenset[tuple[str | None, str]]  # (node, bus id); node None: on any node
    uuids: frozenset[str] = frozenset()  # lower case

    def keep(self, event: Event) -> bool:
        for bus in (event.gpu_bus_id, *event.gpu_bus_ids):
            if bus is not None and ((event.node, bus) in self.places or (None, bus) in self.places):
                return True
        uuids = (event.gpu_uuid, *event.gpu_uuids)
        return any(u is not None and u.lower() in self.uuids for u in uuids)


def _names_a_gpu(value: str) -> bool:
    """A number, a bus id or a UUID, as `gpu:` takes them; anything else stays a word."""
    if value.isascii() and value.isdigit():  # int() also reads other scripts' digits
        return True
    return value.count(":") in (1, 2) or value.lower().startswith(("gpu-", "mig-"))


def pick_gpu(value: str, node: str | None, snapshot: FleetSnapshot | None) -> GpuPick:
    """`gpu:VALUE` as the console means it now: a number is the label the console shows a
    GPU by now, else a bus id ('c3:00.0', either form) or a UUID."""
    nodes = snapshot.nodes if snapshot is not None else ()
    rows: list[tuple[str, GpuRow]] = [
        (n.node, row) for n in nodes if node is None or n.node == node for row in node_gpus(n)
    ]
    places: set[tuple[str | None, str]] = set()
    uuids: set[str] = set()
    if value.isascii() and value.isdigit():  # int() also reads other scripts' digits
        found = [(n, r) for n, r in rows if r.index == int(value)]
    elif ":" in value:
        bus = normal_bus_id(value)
        places.add((None, bus))
        found = [(n, r) for n, r in rows if r.bus_id == bus]
    else:
        uuids.add(value.lower())
        found = [(n, r) for n, r in rows if r.uuid is not None and r.uuid.lower() in uuids]
    for name, row in found:
        if ":" in row.bus_id:
            places.add((name, row.bus_id))
        if row.uuid:
            uuids.add(row.uuid.lower())
    shown = {gpu_and_bus(r.index, r.bus_id) for _n, r in found}
    said = shown.pop() if len(shown) == 1 else f"GPU {value}"
    return GpuPick(said, frozenset(places), frozenset(uuids))


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events to show: node, GPU, lowest severity, and free words."""

    node: str | None = None
    gpu: GpuPick | None = None
    min_severity: Severity = Severity.INFO
    words: str = ""

    @classmethod
    def parse(
        cls, text: str, base: EventFilter, snapshot: FleetSnapshot | None = None
    ) -> EventFilter:
        """`node:dgx-003 gpu:5 sev:critical xid` → a filter (unknown keys stay words); a GPU
        is looked up in `snapshot`, as the console shows it now (see `pick_gpu`)."""
        node, gpu, sev, words = base.node, base.gpu, base.min_severity, []
        wanted: str | None = None
        for token in text.split():
            key, _, value = token.partition(":")
            if key == "node" and value:
                node = value
            elif key == "gpu" and _names_a_gpu(value):
                wanted = value
            elif key in ("sev", "severity") and value in Severity._value2member_map_:
                sev = Severity(value)
            else:
                words.append(token.lower())
        if wanted is not None:
            gpu = pick_gpu(wanted, node, snapshot)
        return cls(node, gpu, sev, " ".join(words))

    def keep(self, event: Event, snapshot: FleetSnapshot | None = None) -> bool:
        if self.node is not None and event.node != self.node:
            return False
        if self.gpu is not None and not self._about_gpu(event, snapshot):
            return False
        if _SEVERITY_RANK[event.severity] < _SEVERITY_RANK[self.min_severity]:
            return False
        text = f"{event.node} {event.source} {event.kind} {event.message}".lower()
        return all(word in text for word in self.words.split())

    def _about_gpu(self, event: Event, snapshot: FleetSnapshot | None) -> bool:
        assert self.gpu is not None
        if self.gpu.keep(event):
            return True
        if event.gpu_bus_id is not None or event.gpu_uuid is not None or snapshot is None:
            return False
        node = snapshot.node(event.node)  # a GPU NVML lost before it could name it
        row = event_gpu(node, event) if node is not None else None
        return row is not None and (event.node, row.bus_id) in self.gpu.places

    def describe(self) -> str:
        parts = []
        if self.node:
            parts.append(f"node {self.node}")
        if self.gpu is not None:
            parts.append(self.gpu.name)
        parts.append(f"severity ≥ {self.min_severity.value}")
        if self.words:
            parts.append(f"“{self.words}”")
        return ", ".join(parts)


def _gpu_cell(event: Event, snapshot: FleetSnapshot) -> str:
    """The event's GPU by bus id, which outlives NVML's numbering; by the number it had
    then only where neither the event nor the snapshot can say its bus id. An event about
    several GPUs: the first (the one asked for) and how many more."""
    if event.gpu_bus_ids:
        return f"{short_bus_id(event.gpu_bus_ids[0])} +{len(event.gpu_bus_ids) - 1}"
    bus = event.gpu_bus_id
    if bus is None and event.gpu_index is not None and (node := snapshot.node(event.node)):
        row = event_gpu(node, event)
        bus = known_bus_id(row.bus_id) if row is not None else None
    return short_bus_id(bus) if bus is not None else fmt.number(event.gpu_index)


EventOrder = tuple[float, str, str, str, str, int, int]


def event_order(event: Event) -> EventOrder:
    """Oldest first; events of one instant (sources polled together) in a stable order."""
    gpu = -1 if event.gpu_index is None else event.gpu_index
    return (event.at, event.node, event.source, event.kind, event.message, gpu,
            -1 if event.code is None else event.code)  # fmt: skip


def filtered(
    events: Iterable[Event], flt: EventFilter, snapshot: FleetSnapshot | None = None
) -> list[Event]:
    """The events `flt` keeps, newest first; `snapshot` tells which GPU an event is about
    where the event cannot say (see `event_gpu`)."""
    return [e for e in sorted(events, key=event_order, reverse=True) if flt.keep(e, snapshot)]


class Stamp(Text):
    """The time cell of an event's row; carries the event's order so the table can sort."""

    def __init__(self, event: Event) -> None:
        super().__init__(fmt.clock_time(event.at))
        self.order = event_order(event)


# An event as a row: identical events (same instant, same words) are told apart by a count.
RowId = tuple[Event, int]


def row_ids(events: Iterable[Event]) -> list[RowId]:
    seen: dict[Event, int] = {}
    out = []
    for event in events:
        n = seen.get(event, 0)
        seen[event] = n + 1
        out.append((event, n))
    return out


class EventsScreen(BaseView):
    """The hub's recent events, newest first."""

    BINDINGS = [
        FilterBar.KEY,
        Binding("v", "severity", "Severity"),
        Binding("n", "all_nodes", "All nodes"),
        Binding("escape", "back_or_clear", "Back", show=False),
    ]
    HELP_EXTRA = (
        ("/ node:NAME gpu:N|BUS|UUID sev:LEVEL words", "filter syntax (N: the GPU shown as N)"),
        ("Enter", "open the event's GPU (or node)"),
    )

    def __init__(self, *, node: str | None = None, gpu: GpuPick | None = None) -> None:
        super().__init__()
        self.base = EventFilter(node=node, gpu=gpu)
        self.flt = self.base
        self.node_name = node
        self._shown: list[RowId] = []  # in table order, newest first
        self._keys: dict[RowId, str] = {}  # each shown event's row key
        self._serial = 0

    def crumbs(self) -> list[str]:
        return ["Events"] + ([self.base.node] if self.base.node else [])

    def compose_body(self) -> ComposeResult:
        yield Static(id="events-summary", classes="summary")
        table: DataTable[Text | str] = DataTable(id="events-table", cursor_type="row")
        for key, label in (("at", "time"), ("sev", "sev"), ("node", "node"), ("gpu", "GPU"),
                           ("kind", "kind"), ("message", "message")):  # fmt: skip
            table.add_column(label, key=key)
        yield table
        yield FilterBar(placeholder="node:NAME gpu:N|BUS|UUID sev:warning|critical words…")

    @property
    def table(self) -> DataTable[Text | str]:
        return self.query_one("#events-table", DataTable)

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        """Key rows by event: remove the ones that aged out or no longer match, add only the
        new ones, then put them in order; `force` (a new palette) rebuilds every row."""
        events = filtered(snapshot.events, self.flt, snapshot)
        summary = f"{len(events)} of {len(snapshot.events)} recent events · {self.flt.describe()}"
        self.query_one("#events-summary", Static).update(summary)
        wanted = row_ids(events)
        if not force and wanted == self._shown:
            return
        table = self.table
        with self.app.batch_update():
            if force:
                table.clear()
                self._keys.clear()
                self._shown = []
            keep = set(wanted)
            for row in self._shown:
                if row not in keep:
                    table.remove_row(self._keys.pop(row))
            added = [row for row in wanted if row not in self._keys]
            for row in added:
                self._serial += 1
                self._keys[row] = key = f"event-{self._serial}"
                table.add_row(*self._cells(row[0], snapshot), key=key)
            if added and len(added) != len(wanted):
                self._sort(table)
            self._shown = wanted

    def _cells(self, event: Event, snapshot: FleetSnapshot) -> tuple[Text | str, ...]:
        style = self.palette.health[_SEVERITY_HEALTH[event.severity]]
        return (
            Stamp(event),
            Text(event.severity.value, style=style),
            event.node,
            _gpu_cell(event, snapshot),
            event.kind,
            # one line: the message column is as wide as the view leaves (see on_resize),
            # and a longer message ends in an ellipsis rather than at the edge
            Text(event.message, no_wrap=True, overflow="ellipsis"),
        )

    def on_resize(self, event: Resize) -> None:
        super().on_resize(event)
        self.call_after_refresh(self._fit_message)

    def _fit_message(self) -> None:
        """Give the message column the width the other columns leave in the view."""
        if not self.is_mounted:
            return
        table = self.table
        column = table.columns.get(ColumnKey("message"))
        if column is None:
            return
        others = sum(c.get_render_width(table) for c in table.columns.values() if c is not column)
        view = table.scrollable_content_region.width
        width = max(MESSAGE_LEAST, view - others - 2 * table.cell_padding)
        if column.auto_width or column.width != width:
            column.auto_width, column.width = False, width
            table._require_update_dimensions = True  # textual's own: the widths changed
            table._clear_caches()  # and the rows drawn at the old width
            table.refresh()

    def _sort(self, table: DataTable[Text | str]) -> None:
        """New rows were appended below: newest first again, the cursor on the same event."""
        selected = None
        if table.row_count and table.cursor_row > 0:
            selected = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        table.sort("at", key=lambda stamp: stamp.order, reverse=True)
        if selected is not None:
            table.move_cursor(row=table.get_row_index(selected), animate=False)

    def _refilter(self) -> None:
        """Show the latest snapshot through a changed filter (rows added and removed)."""
        snapshot = self.console.snapshot
        if snapshot is not None and self.is_mounted:
            self.apply(snapshot)
            self.update_status()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter drills down: to the event's GPU, or its node."""
        shown = {key: row for row, key in self._keys.items()}
        row = shown.get(str(event.row_key.value))
        if row is None:
            return
        happened = row[0]
        snapshot = self.console.snapshot
        node = snapshot.node(happened.node) if snapshot is not None else None
        if node is None:
            self.notify(f"{happened.node} is not in the latest snapshot")
            return
        gpu = event_gpu(node, happened)
        if gpu is not None:
            self.console.open_gpu(happened.node, gpu.index, bus_id=known_bus_id(gpu.bus_id))
        else:  # none, or one that is gone: NVML's number then may be another GPU's now
            self.console.open_node(happened.node)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "filter" and self.is_mounted and self.query_one(FilterBar).typing:
            return False
        return super().check_action(action, parameters)

    def action_filter(self) -> None:
        self.query_one(FilterBar).open()

    def action_severity(self) -> None:
        order = list(Severity)
        current = order.index(self.flt.min_severity)
        sev = order[(current + 1) % len(order)]
        self.base = EventFilter(self.base.node, self.base.gpu, sev)
        self.flt = EventFilter(self.flt.node, self.flt.gpu, sev, self.flt.words)
        self._refilter()

    def action_all_nodes(self) -> None:
        self.base = EventFilter(min_severity=self.base.min_severity)
        self.flt = EventFilter(min_severity=self.flt.min_severity, words=self.flt.words)
        self._refilter()

    def action_back_or_clear(self) -> None:
        if self.flt != self.base:
            self.flt = self.base
            self._refilter()
        else:
            self.app.pop_screen()

    def on_filter_bar_changed(self, event: FilterBar.Changed) -> None:
        self.flt = EventFilter.parse(event.value, self.base, self.console.snapshot)
        self._refilter()

    def on_filter_bar_closed(self, event: FilterBar.Closed) -> None:
        self.table.focus()
