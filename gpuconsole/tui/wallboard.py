"""The wallboard: read-only, full screen, for a NOC screen. Pages rotate on a timer.

Pages: the fleet heat grid, the hottest and most power-hungry GPUs, alerts and stale
sources, fabric errors, and who owns how many GPUs. Each page leads with its headline
figures in large digits. There are no actions and no command palette: only pause and quit.
"""

from __future__ import annotations

import heapq
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Protocol

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.widgets import Digits, Static

from gpuconsole import format as fmt
from gpuconsole.facts import summaries
from gpuconsole.facts.ownership import OwnerKind, node_ownership
from gpuconsole.facts.summaries import Metric, stale_sources
from gpuconsole.facts.verdict import Finding, node_verdict
from gpuconsole.hub import Hub
from gpuconsole.paths import user_themes_dir
from gpuconsole.readings.alerts import AlertState
from gpuconsole.readings.base import Health, Severity
from gpuconsole.readings.fabric import ERROR_RULES, port_deltas, port_problems, port_rates
from gpuconsole.readings.nvml import GpuReading, GpuState
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.tui.driver import terminal_driver
from gpuconsole.tui.feed import HubFeed, SnapshotFeed
from gpuconsole.tui.messages import SnapshotArrived
from gpuconsole.tui.themes import Palette, load_themes, resolve_theme_name
from gpuconsole.tui.widgets.cells import HEALTH_GLYPH

if TYPE_CHECKING:
    from gpuconsole.sources.promql import FleetFigures, PrometheusReader

WALLBOARD_THEME = "gpuconsole-high-contrast"
TOP = 10
_ERROR_COUNTERS = frozenset(rule.counter for rule in ERROR_RULES)  # said as "+N", not a rate


@dataclass(frozen=True, slots=True)
class Page:
    """One wallboard page: its title, up to four headline figures, and its body."""

    title: str
    figures: tuple[tuple[str, str], ...]
    body: Text | Table | Group | HeatGrid


class PageBuilder(Protocol):
    """A page from the latest snapshot; `fleet`: the whole fleet's figures where a source
    aggregates them (Prometheus), `rows`: the nodes the heat grid has room for, from the
    `first`."""

    def __call__(
        self,
        snapshot: FleetSnapshot,
        palette: Palette,
        now: float,
        *,
        fleet: FleetFigures | None = None,
        rows: int | None = None,
        first: int = 0,
    ) -> Page: ...


def heat_rows(snapshot: FleetSnapshot, rows: int | None, first: int) -> list[NodeSnapshot]:
    """The nodes the heat grid shows: `rows` of them from the `first` (all: None)."""
    nodes = snapshot.nodes
    if rows is None or rows >= len(nodes):
        return list(nodes)
    first = first % len(nodes) if nodes else 0
    return list(nodes[first : first + rows])


def _gpus(snapshot: FleetSnapshot) -> Iterator[tuple[NodeSnapshot, GpuReading]]:
    for node in snapshot.nodes:
        for gpu in node.gpus:
            yield node, gpu


@dataclass(frozen=True, slots=True)
class HeatGrid:
    """Every node a row, every GPU a cell (those a guest holds or nobody binds too, with
    their mark), sized at draw time to fill the room it is given: a NOC screen read from
    across the room gets tall rows and wide cells, an 80x24 terminal one line a node."""

    rows: tuple[tuple[Text, tuple[tuple[str, Style], ...], Text], ...]
    note: Text | None = None  # under the rows: which of the fleet's nodes they are

    MAX_ROW_LINES: ClassVar[int] = 5
    MAX_CELL: ClassVar[int] = 9

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        height = (options.height or len(self.rows) + 1) - (self.note is not None)
        name_w = max((r[0].cell_len for r in self.rows), default=0)
        word_w = max((r[2].cell_len for r in self.rows), default=0)
        gpus = max((len(r[1]) for r in self.rows), default=0)
        room = width - name_w - word_w - 4
        cell = max(3, min(self.MAX_CELL, room // max(1, gpus) - 1)) if gpus else 3
        # a blank line between rows once they are tall enough to need one
        lines = max(1, min(self.MAX_ROW_LINES, (height + 1) // max(1, len(self.rows)) - 1))
        gap = 1 if lines > 1 else 0
        for k, (name, cells, word) in enumerate(self.rows):
            for line in range(lines):
                middle = line == lines // 2
                out = Text(no_wrap=True, overflow="crop")
                out.append_text(name if middle else Text(" " * name.cell_len))
                out.append(" " * (name_w - name.cell_len + 2))
                for value, style in cells:
                    out.append(value.strip().center(cell) if middle else " " * cell, style=style)
                    out.append(" ")
                out.append(" ")
                out.append_text(word if middle else Text(""))
                yield out
            if gap and k < len(self.rows) - 1:
                yield Text("")
        if self.note is not None:
            yield self.note


def heat_page(
    snapshot: FleetSnapshot,
    palette: Palette,
    now: float,
    *,
    fleet: FleetFigures | None = None,
    rows: int | None = None,
    first: int = 0,
) -> Page:
    """Every node on a row (as many as there is room for, from the `first`), every GPU a
    cell coloured by temperature: every GPU the console counts, a guest's (◆) and an
    unbound one (·) included. The figures are the whole fleet's."""
    shown = heat_rows(snapshot, rows, first)
    lines = []
    for node in shown:
        cells = []
        for row in summaries.gpu_rows(node):
            gpu = row.reading
            if gpu is None:
                style = palette.passthrough if row.passthrough else palette.dim
                cells.append((summaries.row_cell_text(row, Metric.TEMP), style))
            elif gpu.lost:
                cells.append(("\u2716", palette.health[Health.CRITICAL] + Style(reverse=True)))
            else:
                _, fraction = summaries.metric_value(gpu, Metric.TEMP)
                cells.append((summaries.cell_text(gpu, Metric.TEMP), palette.heat(fraction)))
        health = node_verdict(node).health
        name = Text(f"{HEALTH_GLYPH[health]} {node.node}", style=palette.health[health])
        lines.append((name, tuple(cells), Text(health.value)))
    # the whole fleet's figures from what each node's facts keep (its counts, and its GPUs
    # out of work: those whose verdict is critical), as the fleet view sums them, not from
    # a row and a verdict per GPU of every node on every draw
    counts = []
    busy = critical = 0
    for node in snapshot.nodes:
        facts = summaries.node_facts(node)
        counts.append(facts.counts)
        critical += facts.unfit
        for gpu in node.gpus:
            busy += (gpu.util_gpu_pct or 0) >= summaries.BUSY_PCT
    total = summaries.GpuCounts.add_up(counts).total
    if fleet is not None and fleet.busy is not None:
        busy = fleet.busy  # every GPU's utilization as of this round, not as last read
    figures = (("GPUs", str(total)), ("busy", str(busy)), ("critical", str(critical)))
    note = None
    if len(shown) < len(snapshot.nodes):
        at = first % len(snapshot.nodes) + 1
        words = f"nodes {at}-{at + len(shown) - 1} of {len(snapshot.nodes)}, the rest in turn"
        aggregated = fleet is not None and fleet.busy is not None
        note = Text(words + (_freshness(fleet) if aggregated else ""), style=palette.dim)
    grid = HeatGrid(tuple(lines), note)
    return Page("Fleet heat (GPU temperature, °C)", figures, grid)


def _freshness(fleet: FleetFigures | None) -> str:
    """When Prometheus aggregated the fleet-wide figures."""
    if fleet is not None:
        return f"; fleet figures aggregated by Prometheus at {fmt.clock_time(fleet.at)}"
    return ""


def _aggregated(fleet: FleetFigures | None) -> bool:
    """Whether `fleet` holds what the hottest page shows."""
    return fleet is not None and None not in (fleet.hottest, fleet.power, fleet.watts)


def hottest_page(
    snapshot: FleetSnapshot,
    palette: Palette,
    now: float,
    *,
    fleet: FleetFigures | None = None,
    rows: int | None = None,
    first: int = 0,
) -> Page:
    """The ten hottest GPUs beside the ten drawing the most power: the fleet's, as
    Prometheus aggregates them where it does (`fleet`), else of the snapshot."""
    if fleet is not None and _aggregated(fleet):
        return _hottest_of_fleet(snapshot, fleet, palette)
    lost = GpuState.LOST
    live = [(n, g) for n, g in _gpus(snapshot) if g.state is not lost]
    # the first TOP of 80,000 GPUs, not all of them sorted
    hot = heapq.nlargest(TOP, (p for p in live if p[1].temp_gpu_c is not None),
                         key=lambda p: p[1].temp_gpu_c or 0)  # fmt: skip
    power = heapq.nlargest(TOP, (p for p in live if p[1].power_w is not None),
                           key=lambda p: p[1].power_w or 0)  # fmt: skip
    table = Table(box=None, padding=(0, 2), expand=True, show_edge=False)
    for head in ("hottest GPU", "temp", "HBM", "most power", "power", "limit"):
        table.add_column(head, no_wrap=True)
    for i in range(max(len(hot), len(power))):
        row: list[str | Text] = []
        if i < len(hot):
            n, g = hot[i]
            row += [f"{n.node} #{g.index}", fmt.celsius(g.temp_gpu_c), fmt.celsius(g.temp_hbm_c)]
        else:
            row += ["", "", ""]
        if i < len(power):
            n, g = power[i]
            row += [f"{n.node} #{g.index}", fmt.watts(g.power_w), fmt.watts(g.power_limit_w)]
        else:
            row += ["", "", ""]
        table.add_row(*row)
    total_kw = sum(g.power_w or 0 for _, g in live) / 1000
    figures = (
        ("hottest °C", f"{hot[0][1].temp_gpu_c:.0f}" if hot else fmt.NA),
        ("top W", f"{power[0][1].power_w:.0f}" if power else fmt.NA),
        ("GPU kW", f"{total_kw:.1f}"),
    )
    return Page("Hottest and most power-hungry GPUs", figures, table)


def _hottest_of_fleet(snapshot: FleetSnapshot, fleet: FleetFigures, palette: Palette) -> Page:
    """The hottest page from Prometheus' aggregations: temperature and power as of this
    round, HBM temperature and power limit as the node's last read them."""

    def gpu(node: str, index: int) -> GpuReading | None:
        found = snapshot.node(node)
        return next((g for g in found.gpus if g.index == index), None) if found else None

    table = Table(box=None, padding=(0, 2), expand=True, show_edge=False)
    for head in ("hottest GPU", "temp", "HBM", "most power", "power", "limit"):
        table.add_column(head, no_wrap=True)
    hot, power = (fleet.hottest or ())[:TOP], (fleet.power or ())[:TOP]
    for i in range(max(len(hot), len(power))):
        row: list[str | Text] = []
        if i < len(hot):
            node, index, temp = hot[i]
            read = gpu(node, index)
            row += [f"{node} #{index}", fmt.celsius(temp),
                    fmt.celsius(read.temp_hbm_c if read else None)]  # fmt: skip
        else:
            row += ["", "", ""]
        if i < len(power):
            node, index, watts = power[i]
            read = gpu(node, index)
            row += [f"{node} #{index}", fmt.watts(watts),
                    fmt.watts(read.power_limit_w if read else None)]  # fmt: skip
        else:
            row += ["", "", ""]
        table.add_row(*row)
    figures = (
        ("hottest °C", f"{hot[0][2]:.0f}" if hot else fmt.NA),
        ("top W", f"{power[0][2]:.0f}" if power else fmt.NA),
        ("GPU kW", f"{(fleet.watts or 0) / 1000:.1f}"),
    )
    note = Text(f"Every GPU of the fleet{_freshness(fleet)}; HBM and limit as last read",
                style=palette.dim)  # fmt: skip
    return Page("Hottest and most power-hungry GPUs", figures, Group(table, note))


def alerts_page(snapshot: FleetSnapshot, palette: Palette, now: float, **_unused: object) -> Page:
    """The alerts that fire, what the verdicts found (worst first), sources gone stale, and
    the latest warnings."""
    lines = Text()
    for alert in [a for a in snapshot.alerts if a.state is AlertState.FIRING][:TOP]:
        health = Health.CRITICAL if alert.severity is Severity.CRITICAL else Health.WARNING
        quiet = f" [silenced: {alert.silenced_by}]" if alert.silenced_by else ""
        lines.append(f"{HEALTH_GLYPH[health]} {alert.name} since {fmt.clock_time(alert.since)}: "
                     f"{alert.summary}{quiet}\n", style=palette.health[health])  # fmt: skip
    judged = [(node, node_verdict(node)) for node in snapshot.nodes]
    # each troubled node's worst finding first, so that every one is on the board; then
    # the rest of their evidence, as room allows
    first: list[tuple[NodeSnapshot, Finding]] = []
    rest: list[tuple[NodeSnapshot, Finding]] = []
    for node, verdict in judged:
        problems = verdict.problems
        if problems:
            first.append((node, problems[0]))
            rest += [(node, f) for f in problems[1:]]
    for found in (first, rest):
        found.sort(key=lambda b: (b[1].severity is not Severity.CRITICAL, -b[1].action.rank,
                                  b[0].node))  # fmt: skip
    for node, finding in (first + rest)[:TOP]:
        health = Health.CRITICAL if finding.severity is Severity.CRITICAL else Health.WARNING
        lines.append(f"{HEALTH_GLYPH[health]} {node.node} {finding.message}\n",
                     style=palette.health[health])  # fmt: skip
    stale = [(n, s) for n in snapshot.nodes for s in n.statuses if s.stale]
    for node, status in stale[:TOP]:
        since = fmt.clock_time(status.stale_since)
        lines.append(f"{HEALTH_GLYPH[Health.STALE]} {node.node} {status.source} stale since "
                     f"{since}: {status.error or '?'}\n", style=palette.health[Health.STALE])  # fmt: skip
    events = [e for e in snapshot.events if e.severity is not Severity.INFO][-TOP:]
    for event in reversed(events):
        health = Health.CRITICAL if event.severity is Severity.CRITICAL else Health.WARNING
        lines.append(f"{fmt.clock_time(event.at)} {event.node} {event.message}\n",
                     style=palette.health[health])  # fmt: skip
    if not lines.plain:
        lines.append("No alerts. Every source is fresh.", style=palette.health[Health.OK])
    stale_count = sum(len(stale_sources(n)) for n in snapshot.nodes)
    critical = sum(1 for _, v in judged if v.health is Health.CRITICAL)
    warning = sum(1 for _, v in judged if v.health is Health.WARNING)
    figures = (("critical nodes", str(critical)), ("warning", str(warning)),
               ("stale", str(stale_count)))  # fmt: skip
    return Page("Alerts and stale sources", figures, lines)


def _UNMOVED(name: str) -> int | None:  # an error counter of a port whose node's did not move
    return 0


def fabric_page(snapshot: FleetSnapshot, palette: Palette, now: float, **_unused: object) -> Page:
    """Ports that are down, downtrained, erring or congested, worst first; an error counter
    is said as how far it climbed in the last interval ("symbol errors +37")."""
    rows: list[tuple[Severity, str, str, bool]] = []  # the last: it says a climb
    total = down = 0
    for node in snapshot.nodes:
        if node.fabric is None:
            continue
        # the node's deltas hold only counters that moved: where no fabric counter did, no
        # port's error counter climbed, and none need be looked up (8 ports x 16 counters)
        moved = any(key[0] == "fabric" for key in node.deltas)
        for port in node.fabric.ports:
            total += 1
            down += not port.active
            deltas = port_deltas(node.delta, port) if moved else _UNMOVED
            found = port_problems(port, port_rates(node.rate, port), deltas)
            for problem in found[:1]:
                climbed = problem.delta is not None and problem.counter in _ERROR_COUNTERS
                rows.append((problem.severity, f"{node.node} {port.name}", problem.what, climbed))
    rows.sort(key=lambda r: (r[0] is not Severity.CRITICAL, r[1]))
    text = Text()
    shown = rows[: TOP * 2]
    for severity, where, what, _ in shown:
        health = Health.CRITICAL if severity is Severity.CRITICAL else Health.WARNING
        text.append(f"{HEALTH_GLYPH[health]} {where}: {what}\n", style=palette.health[health])
    if not rows:
        text.append("No fabric errors.", style=palette.health[Health.OK])
    elif any(climbed for *_, climbed in shown):
        text.append("+N: how far the counter climbed in the last interval", style=palette.dim)
    figures = (("ports", str(total)), ("down", str(down)), ("erring", str(len(rows))))
    return Page("Fabric errors", figures, text)


def owners_page(snapshot: FleetSnapshot, palette: Palette, now: float, **_unused: object) -> Page:
    """Who owns how many GPUs, largest first, and how many are free."""
    tenants: Counter[str] = Counter()
    free = known = 0
    for node in snapshot.nodes:
        ownership = node_ownership(node)
        if ownership is None:
            continue
        known += len(ownership.gpus)
        free += sum(1 for g in ownership.gpus if g.kind is OwnerKind.FREE)
        for tenant, count in ownership.count_by_tenant().items():
            tenants[tenant or "(no tenant)"] += count
    table = Table(box=None, padding=(0, 2), show_edge=False)
    table.add_column("tenant", no_wrap=True)
    table.add_column("GPUs", justify="right")
    for tenant, count in tenants.most_common(TOP * 2):
        table.add_row(tenant, str(count))
    figures = (("owned", str(sum(tenants.values()))), ("free", str(free)),
               ("tenants", str(len(tenants))))  # fmt: skip
    if not known:
        return Page("Who owns the GPUs", figures, Text("No tenancy readings yet."))
    return Page("Who owns the GPUs", figures, table)


PAGES: tuple[PageBuilder, ...] = (heat_page, hottest_page, alerts_page, fabric_page, owners_page)
# the whole fleet's figures (sources.promql.FIGURES) each page shows, where aggregated
PAGE_FIGURES: dict[PageBuilder, tuple[str, ...]] = {
    heat_page: ("busy",),
    hottest_page: ("hottest", "power", "watts"),
}


def _promql() -> ModuleType | None:
    """The PromQL source's module where loaded: only a hub that reads Prometheus has
    loaded it, and only such a hub's figures can be aggregated (a wallboard over agents or
    the demo starts without it)."""
    return sys.modules.get("gpuconsole.sources.promql")


class Figure(Vertical):
    """A headline figure: large digits over a label."""

    def __init__(self, index: int) -> None:
        super().__init__(id=f"figure-{index}", classes="figure")

    def compose(self) -> ComposeResult:
        yield Digits("", classes="figure-digits")
        yield Static("", classes="figure-label")

    def show(self, label: str, value: str) -> None:
        self.display = True
        self.query_one(Digits).update(value)
        self.query_one(".figure-label", Static).update(label)


class WallboardApp(App[None]):
    """The read-only NOC wallboard over one Hub."""

    CSS_PATH = "wallboard.tcss"
    TITLE = "gpuconsole wallboard"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p,space", "pause", "Pause"),
        Binding("q", "quit", "Quit"),
    ]

    def get_driver_class(self) -> type[Driver]:
        return terminal_driver(super().get_driver_class())

    def __init__(
        self,
        hub: Hub | None,
        *,
        feed: SnapshotFeed | None = None,
        theme: str | None = WALLBOARD_THEME,
        page_s: float = 15.0,
        start_hub: bool = True,
        snapshot: FleetSnapshot | None = None,
        clock: Callable[[], float] = time.time,
        theme_dirs: list[Path] | None = None,
    ) -> None:
        """`hub`: the hub this wallboard reads (None: `snapshot` only), its snapshots through
        `feed` where given (an ssh session's, paced), else from the hub itself."""
        super().__init__()
        self.hub = hub
        self.page_s = page_s
        self.clock = clock
        self.snapshot = snapshot
        self.page_index = 0
        self.current: Page | None = None  # the page on screen
        self.paused = False
        self.read_only = True
        self._feed = HubFeed(hub, feed=feed, start=start_hub)
        self._heat_from = 0  # the heat grid's first row: it pages through a large fleet
        self._told: frozenset[str] | None = None  # the rows last told to the hub
        self._relaid = False  # whether a page drawn before the layout was drawn again
        # the Prometheus servers this hub reads, which aggregate the fleet's figures
        self._readers: dict[int, PrometheusReader] = {}
        promql = _promql()
        if hub is not None and promql is not None:
            for source in hub.sources:
                if isinstance(source, promql.PromQLSource):
                    self._readers[id(source.reader)] = source.reader
        themes = load_themes([user_themes_dir()] if theme_dirs is None else theme_dirs)
        for loaded in themes.values():
            self.register_theme(loaded)
        self.theme = resolve_theme_name(theme or WALLBOARD_THEME, list(themes))
        self.palette = Palette.from_variables(dict(self.current_theme.variables))

    def compose(self) -> ComposeResult:
        yield Static("", id="wallboard-title")
        with Horizontal(id="figures"):
            for index in range(3):
                yield Figure(index)
        yield Static("", id="wallboard-body")

    async def on_mount(self) -> None:
        self._want_figures()
        await self._feed.attach(self)
        self._rotation = self.set_interval(self.page_s, self.next_page)
        self.set_interval(1.0, self._show_title)
        self.render_page()

    async def on_unmount(self) -> None:
        for reader in self._readers.values():
            reader.want_figures(self, None)
        if self.hub is not None:
            self.hub.show(None, viewer=self)
        await self._feed.detach()

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        self.snapshot = message.snapshot
        self.render_page()

    @property
    def page(self) -> PageBuilder:
        return PAGES[self.page_index % len(PAGES)]

    def _want_figures(self) -> None:
        """The fleet's figures the page on screen shows, aggregated by Prometheus each
        round while it is up (each has Prometheus find every GPU's series)."""
        kinds = PAGE_FIGURES.get(self.page, ())
        for reader in self._readers.values():
            reader.want_figures(self, TOP if kinds else None, kinds)

    def next_page(self) -> None:
        self.page_index = (self.page_index + 1) % len(PAGES)
        self._want_figures()
        if self.page is heat_page and self.snapshot is not None:  # the next rows in turn
            room = self._heat_room()
            if room is not None and room < len(self.snapshot.nodes):
                self._heat_from = (self._heat_from + room) % len(self.snapshot.nodes)
        self.render_page()

    @property
    def fleet(self) -> FleetFigures | None:
        """The fleet's figures, as the Prometheus servers aggregated them last (None: no
        such source, or none yet)."""
        found = [r.figures for r in self._readers.values() if r.figures is not None]
        promql = _promql()
        if promql is None or not found or len(found) < len(self._readers):
            return None
        merged: FleetFigures | None = promql.FleetFigures.merged(found, TOP)
        return merged

    def _heat_room(self) -> int | None:
        """How many rows the heat grid has room for (a line each, one for its note);
        None: not laid out yet."""
        try:
            height = self.query_one("#wallboard-body", Static).size.height
        except NoMatches:
            return None
        if not height and self.size.height:
            # before the body's layout: the screen's at most, drawn again once laid out
            if not self._relaid:
                self._relaid = True
                self.call_after_refresh(self.render_page)
            height = self.size.height
        return max(1, height - 1) if height else None

    def _tell_hub(self, snapshot: FleetSnapshot, fleet: FleetFigures | None) -> None:
        """The rows this board shows, so that a source reads their GPUs each round (the
        rest's with the fleet's health, less often): the heat grid's, and the nodes of the
        hottest GPUs."""
        try:
            laid_out = self.query_one("#wallboard-body", Static).size.height > 0
        except NoMatches:
            return
        room = self._heat_room()
        if self.hub is None or room is None or not laid_out:
            return  # told once laid out: until then its room is only the screen's
        rows = {n.node for n in heat_rows(snapshot, room, self._heat_from)}
        if fleet is not None:
            listed = (*(fleet.hottest or ())[:TOP], *(fleet.power or ())[:TOP])
            rows.update(node for node, _, _ in listed)
        shown = frozenset(rows)
        if shown != self._told:
            self._told = shown
            self.hub.show(shown, viewer=self)

    def action_pause(self) -> None:
        self.paused = not self.paused
        if self.paused:
            self._rotation.pause()
        else:
            self._rotation.resume()
        self._show_title()

    def render_page(self) -> None:
        """Draw the current page from the latest snapshot."""
        snapshot = self.snapshot
        try:
            body = self.query_one("#wallboard-body", Static)
        except NoMatches:  # a page timer that fired while the app shuts down
            return
        if snapshot is None:
            body.update("Waiting for the first reading...")
            for figure in self.query(Figure):
                figure.display = False
            self._show_title()
            return
        fleet = self.fleet
        self._tell_hub(snapshot, fleet)
        page = self.current = self.page(
            snapshot,
            self.palette,
            self.clock(),
            fleet=fleet,
            rows=self._heat_room(),
            first=self._heat_from,
        )
        if self._readers and not _aggregated(fleet) and self.page is hottest_page:
            errors = {r.figures_error for r in self._readers.values() if r.figures_error}
            why = f" (Prometheus: {'; '.join(sorted(errors))})" if errors else ""
            note = Text(
                f"GPUs as the head last read them{why}: those out of view up to "
                f"{max(r.out_of_view_s for r in self._readers.values()):g} s old",
                style=self.palette.dim,
            )
            page = self.current = Page(page.title, page.figures, Group(page.body, note))
        figures = list(self.query(Figure))
        for figure, (label, value) in zip(figures, page.figures, strict=False):
            figure.show(label, value)
        for figure in figures[len(page.figures) :]:
            figure.display = False
        body.update(page.body)
        self._show_title()

    def _show_title(self) -> None:
        snapshot = self.snapshot
        # the page on screen's (built with the snapshot, not again each second)
        title = self.current.title if snapshot and self.current else ""
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f" {title} ", style="bold")
        text.append(f" page {self.page_index % len(PAGES) + 1}/{len(PAGES)} ")
        if self.paused:
            text.append(" PAUSED (p to resume) ", style="reverse")
        text.append(f" {fmt.clock_time(self.clock())} ")
        if snapshot is not None and snapshot.simulated:
            text.append(" SIMULATED ", style=self.palette.simulated)
        text.append("  p pause · q quit", style=self.palette.dim)
        try:
            self.query_one("#wallboard-title", Static).update(text)
        except NoMatches:  # a timer that fired while the app shuts down
            return
