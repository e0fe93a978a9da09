"""The alerts view (`!` from any view) and the wallboard's alerts page: what fires, since
when, how bad, who silenced it."""

from __future__ import annotations

from typing import Any

import msgspec
from textual.widgets import DataTable, Static

from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.alerts.rules import DEFAULT_RULES
from gpuconsole.alerts.silences import parse_silences, silenced_alerts
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.screens.alerts import AlertsScreen
from gpuconsole.tui.themes import Palette
from gpuconsole.tui.wallboard import alerts_page
from tests.alert_fixtures import NODE, fleet
from tests.conftest_tui import FIXED, frozen_fleet

SIZE = (120, 40)


def with_alerts() -> FleetSnapshot:
    """The frozen demo fleet, with what the default rules hold for a lost GPU on dgx-007
    and an overheating one, one silenced by alice."""
    engine = AlertEngine(DEFAULT_RULES)
    engine.evaluate(fleet(FIXED - 600, lost=True))
    engine.silences = parse_silences(
        [
            {
                "id": "1",
                "status": {"state": "active"},
                "createdBy": "alice",
                "comment": "reseat\x1b[2J",
                "endsAt": "2026-12-05T00:00:00Z",
                "matchers": [{"name": "alertname", "value": "GpuLost", "isRegex": False}],
            }
        ]
    )
    # what Alertmanager answers of the alerts it holds silenced
    held = [
        {"labels": a.labels, "status": {"silencedBy": ["1"]}}
        for a in engine.alerts.values()
        if a.rule == "GpuLost"
    ]
    engine.silenced = silenced_alerts(held, engine.silences)
    # the lost GPU's verdict (reboot the node) fires the verdict rules as well; one alert
    # is all these views need
    fired = engine.active()
    assert {a.name for a in fired} == {"GpuLost", "GpuNotFitForWork", "NodeNotFitForWork"}
    alerts = tuple(a for a in fired if a.name == "GpuLost")
    return msgspec.structs.replace(frozen_fleet(), alerts=alerts)


def table_rows(screen: Any) -> list[list[str]]:
    table = screen.query_one("#alerts-table", DataTable)
    return [[cell.plain for cell in table.get_row_at(i)] for i in range(table.row_count)]


async def test_bang_opens_the_alerts_view_with_who_silenced_what(console_app: Any) -> None:
    app = console_app(with_alerts())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("exclamation_mark")
        await pilot.pause()
        assert isinstance(app.screen, AlertsScreen)
        [row] = table_rows(app.screen)
        severity, name, state, since, node, _gpu, summary, silenced = row
        assert (severity, name, state, node) == ("critical", "GpuLost", "firing", NODE)
        assert since.startswith("10 min (")
        assert NODE in summary
        # Alertmanager's words are shown escaped, never acted on by the terminal
        assert silenced.startswith("alice (reseat") and "\x1b" not in silenced
        headline = app.screen.query_one("#alerts-headline", Static).content
        assert "1 firing (1 critical, 1 silenced), 0 pending" in str(headline)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, AlertsScreen)


async def test_the_alerts_key_is_in_the_footer_of_every_view(console_app: Any) -> None:
    app = console_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        shown = {b.binding.action for b in app.screen.active_bindings.values() if b.binding.show}
        assert "alerts" in shown
        await pilot.press("exclamation_mark")
        await pilot.pause()
        [[only]] = [[str(app.screen.query_one("#alerts-headline", Static).content)]]
        assert only.startswith("Nothing fires.")


def test_the_wallboards_alerts_page_leads_with_what_fires() -> None:
    palette = Palette.from_variables(_theme_variables())
    page = alerts_page(with_alerts(), palette, FIXED)
    first = page.body.plain.splitlines()[0] if hasattr(page.body, "plain") else ""
    assert "GpuLost since" in first and "[silenced: alice" in first


def _theme_variables() -> dict[str, str]:
    from gpuconsole.tui.themes import load_themes

    themes = load_themes([])
    return dict(themes["gpuconsole-high-contrast"].variables)
