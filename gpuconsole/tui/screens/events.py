"""Events: XID, ECC, throttle, source stale/recovered and later ones, filtered."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from gpuconsole import format as fmt
from gpuconsole.readings.base import Event, Health, Severity
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.screens.base import BaseView
from gpuconsole.tui.widgets.filter_bar import FilterBar

_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
_SEVERITY_HEALTH = {Severity.INFO: Health.OK, Severity.WARNING: Health.WARNING,
                    Severity.CRITICAL: Health.CRITICAL}  # fmt: skip


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events to show: node, GPU, lowest severity, and free words."""

    node: str | None = None
    gpu: int | None = None
    min_severity: Severity = Severity.INFO
    words: str = ""

    @classmethod
    def parse(cls, text: str, base: EventFilter) -> EventFilter:
        """`node:dgx-003 gpu:5 sev:critical xid` → a filter (unknown keys stay words)."""
        node, gpu, sev, words = base.node, base.gpu, base.min_severity, []
        for token in text.split():
            key, _, value = token.partition(":")
            if key == "node" and value:
                node = value
            elif key == "gpu" and value.isascii() and value.isdigit():
                gpu = int(value)
            elif key in ("sev", "severity") and value in Severity._value2member_map_:
                sev = Severity(value)
            else:
                words.append(token.lower())
        return cls(node, gpu, sev, " ".join(words))

    def keep(self, event: Event) -> bool:
        if self.node is not None and event.node != self.node:
            return False
        if self.gpu is not None and event.gpu_index != self.gpu:
            return False
        if _SEVERITY_RANK[event.severity] < _SEVERITY_RANK[self.min_severity]:
            return False
        text = f"{event.node} {event.source} {event.kind} {event.message}".lower()
        return all(word in text for word in self.words.split())

    def describe(self) -> str:
        parts = []
        if self.node:
            parts.append(f"node {self.node}")
        if self.gpu is not None:
            parts.append(f"GPU {self.gpu}")
        parts.append(f"severity ≥ {self.min_severity.value}")
        if self.words:
            parts.append(f"“{self.words}”")
        return ", ".join(parts)


EventOrder = tuple[float, str, str, str, str, int, int]


def event_order(event: Event) -> EventOrder:
    """Oldest first; events of one instant (sources polled together) in a stable order."""
    gpu = -1 if event.gpu_index is None else event.gpu_index
    return (event.at, event.node, event.source, event.kind, event.message, gpu,
            -1 if event.code is None else event.code)  # fmt: skip


def filtered(events: Iterable[Event], flt: EventFilter) -> list[Event]:
    """The events `flt` keeps, newest first."""
    return [e for e in sorted(events, key=event_order, reverse=True) if flt.keep(e)]


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
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("v", "severity", "Severity"),
        Binding("n", "all_nodes", "All nodes"),
        Binding("escape", "back_or_clear", "Back", show=False),
    ]
    HELP_EXTRA = (
        ("/ node:NAME gpu:N sev:LEVEL words", "filter syntax"),
        ("Enter", "open the event's GPU (or node)"),
    )

    def __init__(self, *, node: str | None = None, gpu: int | None = None) -> None:
        super().__init__()
        self.base = EventFilter(node=node, gpu=gpu)
        self.flt = self.base
        self.node_name = node
        self.gpu_index = gpu
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
        yield FilterBar(placeholder="node:NAME gpu:N sev:warning|critical words…")

    @property
    def table(self) -> DataTable[Text | str]:
        return self.query_one("#events-table", DataTable)

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        """Key rows by event: remove the ones that aged out or no longer match, add only the
        new ones, then put them in order; `force` (a new palette) rebuilds every row."""
        events = filtered(snapshot.events, self.flt)
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
                table.add_row(*self._cells(row[0]), key=key)
            if added and len(added) != len(wanted):
                self._sort(table)
            self._shown = wanted

    def _cells(self, event: Event) -> tuple[Text | str, ...]:
        style = self.palette.health[_SEVERITY_HEALTH[event.severity]]
        return (
            Stamp(event),
            Text(event.severity.value, style=style),
            event.node,
            fmt.number(event.gpu_index),
            event.kind,
            event.message,
        )

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
        if self.console.snapshot is None or self.console.snapshot.node(happened.node) is None:
            self.notify(f"{happened.node} is not in the latest snapshot")
        elif happened.gpu_index is not None:
            self.console.open_gpu(happened.node, happened.gpu_index)
        else:
            self.console.open_node(happened.node)

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
        self.flt = EventFilter.parse(event.value, self.base)
        self._refilter()

    def on_filter_bar_closed(self, event: FilterBar.Closed) -> None:
        self.table.focus()
