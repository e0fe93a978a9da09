"""Alerts: what fires (and what waits out its `for`), since when, how bad, and who silenced
it in Alertmanager; read from the snapshot, which the alert engine fills."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from gpuconsole import format as fmt
from gpuconsole.readings.alerts import ActiveAlert, AlertState
from gpuconsole.readings.base import Health, Severity
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.screens.base import BaseView, update_text
from gpuconsole.tui.themes import Palette

COLUMNS = ("severity", "alert", "state", "since", "node", "GPU", "summary", "silenced by")
SEVERITY_HEALTH = {
    Severity.CRITICAL: Health.CRITICAL,
    Severity.WARNING: Health.WARNING,
    Severity.INFO: Health.OK,
}


def alert_cells(alert: ActiveAlert, palette: Palette, now: float) -> tuple[Text, ...]:
    """One row of the alerts table."""
    style = palette.health[SEVERITY_HEALTH[alert.severity]]
    pending = alert.state is AlertState.PENDING
    muted = palette.dim if pending or alert.silenced_by else style
    since = f"{fmt.age(alert.since, now)} ({fmt.clock_time(alert.since)})"
    return (
        Text(alert.severity.value, style=style),
        Text(alert.name, style=muted),
        Text(alert.state.value, style=palette.dim if pending else style),
        Text(since),
        Text(alert.node or ""),
        Text(alert.gpu_bus_id or ""),
        Text(alert.summary),
        Text(alert.silenced_by or "", style=palette.dim),
    )


def headline(alerts: tuple[ActiveAlert, ...]) -> str:
    firing = [a for a in alerts if a.state is AlertState.FIRING]
    critical = sum(1 for a in firing if a.severity is Severity.CRITICAL)
    silenced = sum(1 for a in firing if a.silenced_by)
    pending = len(alerts) - len(firing)
    if not alerts:
        return "Nothing fires. (Rules: `gpuconsole rules`; delivery: [alerts] in the config.)"
    return f"{len(firing)} firing ({critical} critical, {silenced} silenced), {pending} pending"


class AlertsScreen(BaseView):
    """Every alert the rules hold now, worst first."""

    def crumbs(self) -> list[str]:
        return ["Alerts"]

    def compose_body(self) -> ComposeResult:
        yield Static(id="alerts-headline")
        table: DataTable[Text] = DataTable(id="alerts-table", cursor_type="row")
        table.add_columns(*COLUMNS)
        yield table

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        update_text(self.query_one("#alerts-headline", Static), headline(snapshot.alerts))
        table = self.query_one("#alerts-table", DataTable)
        now = self.console.clock()
        table.clear()
        for alert in snapshot.alerts:
            table.add_row(*alert_cells(alert, self.palette, now))
