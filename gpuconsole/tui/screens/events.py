"""Events: XID, ECC, throttle, source stale/recovered and later ones, filtered."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from gpuconsole import format as fmt
from gpuconsole.model import Event, FleetSnapshot, Health, Severity
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
            elif key == "gpu" and value.isdigit():
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


def filtered(events: Iterable[Event], flt: EventFilter) -> list[Event]:
    """Newest first."""
    # Newest first; events of one instant (sources polled together) in a stable order.
    ordered = sorted(events, key=lambda e: (e.at, e.node, e.source, e.kind, e.message))
    return [e for e in reversed(ordered) if flt.keep(e)]


class EventsScreen(BaseView):
    """The hub's recent events, newest first."""

    BINDINGS = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("v", "severity", "Severity"),
        Binding("n", "all_nodes", "All nodes"),
        Binding("escape", "back_or_clear", "Back", show=False),
    ]
    HELP_EXTRA = (("/ node:NAME gpu:N sev:LEVEL words", "filter syntax"),)

    def __init__(self, *, node: str | None = None, gpu: int | None = None) -> None:
        super().__init__()
        self.base = EventFilter(node=node, gpu=gpu)
        self.flt = self.base
        self.node_name = node
        self.gpu_index = gpu
        self._shown: tuple[Event, ...] = ()

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

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        events = tuple(filtered(snapshot.events, self.flt))
        summary = f"{len(events)} of {len(snapshot.events)} recent events · {self.flt.describe()}"
        self.query_one("#events-summary", Static).update(summary)
        if not force and events == self._shown:
            return
        self._shown = events
        table: DataTable[Text | str] = self.query_one("#events-table", DataTable)
        palette = self.palette
        with self.app.batch_update():
            table.clear()
            for i, event in enumerate(events):
                style = palette.health[_SEVERITY_HEALTH[event.severity]]
                table.add_row(
                    fmt.clock_time(event.at),
                    Text(event.severity.value, style=style),
                    event.node,
                    fmt.number(event.gpu_index),
                    event.kind,
                    event.message,
                    key=str(i),
                )

    def action_filter(self) -> None:
        self.query_one(FilterBar).open()

    def action_severity(self) -> None:
        order = list(Severity)
        current = order.index(self.flt.min_severity)
        sev = order[(current + 1) % len(order)]
        self.base = EventFilter(self.base.node, self.base.gpu, sev)
        self.flt = EventFilter(self.flt.node, self.flt.gpu, sev, self.flt.words)
        self.render_latest(force=True)

    def action_all_nodes(self) -> None:
        self.base = EventFilter(min_severity=self.base.min_severity)
        self.flt = EventFilter(min_severity=self.flt.min_severity, words=self.flt.words)
        self.render_latest(force=True)

    def action_back_or_clear(self) -> None:
        if self.flt != self.base:
            self.flt = self.base
            self.render_latest(force=True)
        else:
            self.app.pop_screen()

    def on_filter_bar_changed(self, event: FilterBar.Changed) -> None:
        self.flt = EventFilter.parse(event.value, self.base)
        self.render_latest(force=True)

    def on_filter_bar_closed(self, event: FilterBar.Closed) -> None:
        self.query_one("#events-table", DataTable).focus()
