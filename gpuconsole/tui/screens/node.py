"""Node: the GPU table with sparklines, and BMC, fabric and owner panels.

The table has a row per GPU, keyed by bus id: NVML's GPUs and those a guest holds through
vfio-pci, which NVML on the host cannot read (their readings show "-", never a guess).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding

from gpuconsole import format as fmt
from gpuconsole.facts import summaries
from gpuconsole.facts.inventory import GpuRow, ownership_problems
from gpuconsole.facts.verdict import node_verdict
from gpuconsole.hardware import product_name, short_model
from gpuconsole.readings.base import Health, Severity, known_bus_id
from gpuconsole.readings.nvml import GpuReading
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.tui.screens.base import BaseView, acting_keys
from gpuconsole.tui.themes import Palette
from gpuconsole.tui.widgets.cells import HEALTH_GLYPH, health_light, spark
from gpuconsole.tui.widgets.panel import Backdrop, Panel
from gpuconsole.tui.widgets.rich_lines import RichLines
from gpuconsole.tui.widgets.row_table import Cell, RowTable

SPARK_WIDTH = 8
COLUMNS: tuple[tuple[str, str], ...] = (
    ("gpu", "GPU"),
    ("util", "util"),
    ("trend", "history"),
    ("mem", "mem GiB"),
    ("temp", "temp"),
    ("power", "power"),
    ("clock", "SM MHz"),
    ("throttle", "throttle"),
    ("ecc", "ECC"),
    ("owner", "owner"),
)


def ecc_text(gpu: GpuReading, palette: Palette) -> Text:
    """Volatile uncorrected/corrected, and a remap mark: what needs a look now."""
    ecc = gpu.ecc
    if ecc.volatile_corrected is None and ecc.volatile_uncorrected is None:
        return Text(fmt.NA)
    unc, cor = ecc.volatile_uncorrected or 0, ecc.volatile_corrected or 0
    text = Text(f"{unc}/{cor}")
    if unc:
        text.stylize(palette.health[Health.CRITICAL])
    elif cor:
        text.stylize(palette.health[Health.WARNING])
    if ecc.remap_failure:
        text.append(" remap!", style=palette.health[Health.CRITICAL])
    elif ecc.remap_pending:
        text.append(" pend", style=palette.health[Health.WARNING])
    return text


def gpu_label(node: NodeSnapshot, row: GpuRow, palette: Palette) -> Text:
    """'● 3' for a GPU NVML numbers; '◆ 52:00.0' (its bus id) for one a guest holds; the
    light or the mark in its verdict's colour."""
    if row.index is not None:
        label = health_light(summaries.row_health(node, row), palette)
        label.append(f" {row.index}")
        return label
    glyph = summaries.PASSTHROUGH_GLYPH if row.passthrough else summaries.UNSEEN_GLYPH
    health = summaries.row_health(node, row)
    style = palette.passthrough_fg if row.passthrough else palette.dim
    if health in (Health.CRITICAL, Health.WARNING):
        style = palette.health[health]
    label = Text()
    label.append(glyph, style=style)
    label.append(f" {row.short_bus[:5]}")
    return label


def gpu_row(node: NodeSnapshot, row: GpuRow, palette: Palette) -> tuple[Cell, ...]:
    """The cells of one GPU's row, in COLUMNS order."""
    label = gpu_label(node, row, palette)
    gpu = row.reading
    if gpu is None and row.guest is not None and row.guest.reading is not None:
        return _guest_row(label, row, row.guest.reading, palette)
    if gpu is None:
        why = Text(summaries.unseen_words(row), style=palette.dim)
        na = fmt.NA
        return (label, na, "", na, na, na, na, why, na, row.label)
    if gpu.lost:
        lost = Text(summaries.gpu_state_words(gpu), style=palette.health[Health.CRITICAL])
        return (label, Text("LOST", style=palette.health[Health.CRITICAL]), "", "", "", "", "",
                lost, "", row.label)  # fmt: skip
    history = node.history
    util_series = history.series("gpu", gpu.uuid, "util_gpu_pct") if history else ()
    if not util_series and history is not None:
        util_series = history.series("gpu", gpu.uuid, "sm_util_pct")
    util = gpu.util_gpu_pct
    util_text = Text(fmt.pct(util) if util is not None else ("MIG" if gpu.mig_enabled else "-"))
    throttle = fmt.throttle_words(gpu.throttle_reasons)
    throttle_text = Text(throttle)
    if throttle != fmt.NA:
        throttle_text.stylize(palette.health[Health.WARNING])
    temp = Text(fmt.celsius(gpu.temp_gpu_c))
    if gpu.temp_gpu_c is not None and gpu.temp_slowdown_c and gpu.temp_gpu_c >= gpu.temp_slowdown_c:
        temp.stylize(palette.health[Health.CRITICAL])
    return (
        label,
        util_text,
        spark(util_series, SPARK_WIDTH, palette, hi=100.0),
        fmt.mem_of(gpu.mem_used_bytes, gpu.mem_total_bytes).replace(" GiB", ""),
        temp,
        fmt.watts_of(gpu.power_w, gpu.power_limit_w).replace(" W", ""),
        fmt.number(gpu.sm_clock_mhz),
        throttle_text,
        ecc_text(gpu, palette),
        row.label,
    )


def _guest_row(label: Text, row: GpuRow, gpu: GpuReading, palette: Palette) -> tuple[Cell, ...]:
    """A passthrough GPU's row from what its guest's agent read: marked as the guest's, and
    as stale while the guest does not answer."""
    guest = row.guest
    silent = guest is not None and guest.error is not None
    where = Text(
        "guest silent" if silent else "from its guest",
        style=palette.health[Health.WARNING] if silent else palette.passthrough_fg,
    )
    util = gpu.util_gpu_pct
    return (
        label,
        Text(fmt.pct(util) if util is not None else fmt.NA, style=palette.passthrough_fg),
        "",
        fmt.mem_of(gpu.mem_used_bytes, gpu.mem_total_bytes).replace(" GiB", ""),
        fmt.celsius(gpu.temp_gpu_c),
        fmt.watts_of(gpu.power_w, gpu.power_limit_w).replace(" W", ""),
        fmt.number(gpu.sm_clock_mhz),
        where,
        ecc_text(gpu, palette),
        row.label,
    )


def node_info(node: NodeSnapshot, palette: Palette, now: float) -> Text:
    """Two lines about the node: what it is, and how fresh each source is."""
    nvml = node.nvml
    rows = summaries.gpu_rows(node)
    text = Text(no_wrap=True, overflow="ellipsis")
    verdict = node_verdict(node)
    text.append_text(health_light(verdict.health, palette, word=True))
    if not verdict.fit:
        text.append(f": {verdict.short_advice}", style=palette.health[verdict.health])
    product = product_name(node.profile) or short_model(summaries.node_model(node))
    text.append(f"  {product} · {len(rows)}\u00d7 {short_model(summaries.node_model(node))}")
    guests = sum(1 for r in rows if r.passthrough)
    if guests:
        text.append(f" ({guests} ")
        text.append(summaries.PASSTHROUGH_GLYPH, style=palette.passthrough_fg)
        text.append(" vfio-pci, not in NVML)")
    if nvml is not None:
        text.append(
            f" · driver {nvml.driver_version or '-'} · CUDA {nvml.cuda_driver_version or '-'}"
        )
    text.append("\n")
    for status in node.statuses:
        if status.ok:
            text.append(f"{status.source}: ok, {fmt.age(status.last_ok_at, now)} ago  ",
                        style=palette.health[Health.OK])  # fmt: skip
        else:
            since = fmt.clock_time(status.stale_since)
            text.append(f"{status.source}: stale since {since} ({status.error or '?'})  ",
                        style=palette.health[Health.STALE])  # fmt: skip
    for source in summaries.PENDING_SOURCES:
        if node.status(source) is None:
            text.append(f"{source}: not configured  ", style=palette.dim)
    return text


def owners_text(node: NodeSnapshot, palette: Palette) -> Text:
    """Who holds which GPUs, after what does not add up about it (that first: it matters)."""
    pending = summaries.pending_panel(node, "tenancy")
    if pending is not None:
        lines = [pending]
        procs = sum(len(g.processes) for g in node.gpus)
        if procs:
            lines.append(f"NVML sees {procs} compute processes (PIDs, not owners)")
        return Text("\n".join(lines))
    text = Text()
    for problem in ownership_problems(node):
        health = Health.CRITICAL if problem.severity is Severity.CRITICAL else Health.WARNING
        text.append(f"{HEALTH_GLYPH[health]} {problem.message}\n", style=palette.health[health])
    owners: dict[str, list[str]] = {}
    for row in summaries.gpu_rows(node):
        where = str(row.index) if row.index is not None else row.short_bus[:5]
        owners.setdefault(row.label, []).append(where)
    text.append("\n".join(f"{o}: GPU {', '.join(w)}" for o, w in sorted(owners.items())))
    return text


def worst_row(node: NodeSnapshot, rows: Sequence[GpuRow]) -> GpuRow | None:
    """The first critical GPU, else the first with a warning; None if all are fine."""
    for health in (Health.CRITICAL, Health.WARNING):
        found = next((r for r in rows if summaries.row_health(node, r) is health), None)
        if found is not None:
            return found
    return None


class NodeScreen(BaseView):
    """One node: its GPUs and what its other sources say."""

    BINDINGS = [
        Binding("enter", "open", "GPU"),
        Binding("m", "sm_map", "SM map"),
        Binding("o", "topology", "Topology"),
        # only for those who may act (check_action); others are told why
        *acting_keys("a", "assign", "Assign"),
        *acting_keys("r", "remediate", "Repair"),
        *acting_keys("P", "power", "Power"),
    ]
    HELP_EXTRA = (("↑ ↓", "move between GPUs"),)
    HELP_LEGEND = (
        ("GPU", "NVML's number (only a label: a GPU is its bus id); \u25c6 52:00: a guest's"),
        ("history", "utilization over the last minutes (wide terminals)"),
        ("mem GiB", "used / total"),
        ("power", "draw / limit, in W"),
        ("throttle", "why the SM clock is held down, when it is"),
        ("ECC", "volatile uncorrected/corrected; pend: a row remap waits for a reset"),
        ("owner", "who holds the GPU: pod, guest (vm), free, drained"),
        ("\u2026 +N more", "a panel has N more lines than it can show: widen or heighten"),
    )
    node_name: str

    def __init__(self, node_name: str) -> None:
        super().__init__()
        self.node_name = node_name
        self._rows: dict[str, GpuRow] = {}  # by bus id
        self._shown_node: NodeSnapshot | None = None

    def crumbs(self) -> list[str]:
        return ["Fleet", self.node_name]

    def compose_body(self) -> ComposeResult:
        yield RichLines(id="node-info", classes="summary")
        # below NARROW_BELOW the trend goes (the GPU view has it), the cells sit closer and
        # throttle and owner give way, so that every reading and the owner stay in view
        yield RowTable(COLUMNS, give_way={"throttle": 8, "owner": 14}, id="gpu-table")
        with Backdrop(id="node-panels"):
            for panel_id, title in (("bmc", "BMC"), ("fabric", "fabric"), ("owners", "owners")):
                panel = Panel(id=f"panel-{panel_id}", classes="panel")
                panel.border_title = title
                yield panel

    @property
    def table(self) -> RowTable:
        return self.query_one("#gpu-table", RowTable)

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        node = snapshot.node(self.node_name)
        info = self.query_one("#node-info", RichLines)
        if node is None:
            info.update(f"{self.node_name}: not in the latest snapshot")
            self.table.set_rows(())
            self._rows.clear()
            self._shown_node = None
            return
        palette, now = self.palette, self.console.clock()
        info.update(node_info(node, palette, now))
        if force or node is not self._shown_node:
            narrow = self.has_class("-narrow")
            self.table.show_columns(hide=("trend",) if narrow else (), compact=narrow)
            self._update_table(node, palette, force)
            self._shown_node = node
        bmc = self.query_one("#panel-bmc", Panel)
        bmc.update(summaries.bmc_panel(node))
        schema = summaries.bmc_schema(node.bmc)
        if bmc.border_subtitle != schema:  # setting it repaints the whole panel, same or not
            bmc.border_subtitle = schema
        self.query_one("#panel-fabric", Panel).update(summaries.fabric_panel(node))
        self.query_one("#panel-owners", Panel).update(owners_text(node, palette))

    def _update_table(self, node: NodeSnapshot, palette: Palette, force: bool) -> None:
        """Every GPU's cells; the table draws again only the rows whose cells changed."""
        table = self.table
        rows = summaries.gpu_rows(node)
        self._rows = {row.bus_id: row for row in rows}
        cells = [(row.bus_id, gpu_row(node, row, palette)) for row in rows]
        if force or list(self._rows) != list(table.row_keys):
            first = not table.row_count
            table.set_rows(cells)
            if first:  # the view opens on the GPU that needs a look, if one does
                worst = worst_row(node, rows)
                if worst is not None:
                    table.move_cursor(worst.bus_id)
            return
        table.update_rows(cells)

    def selected_row(self) -> GpuRow | None:
        """The GPU under the cursor, whether NVML sees it or not."""
        key = self.table.cursor_key
        return self._rows.get(key) if key is not None else None

    def _open(self, row: GpuRow | None) -> None:
        if row is None:
            return
        # by bus id, the GPU under the cursor whatever NVML numbers it by the next snapshot
        self.console.open_gpu(self.node_name, row.index, bus_id=known_bus_id(row.bus_id))

    def on_row_table_row_selected(self, event: RowTable.RowSelected) -> None:
        self._open(self._rows.get(event.key))

    def action_open(self) -> None:
        self._open(self.selected_row())

    def action_sm_map(self) -> None:
        row = self.selected_row()
        if row is not None and row.index is not None:
            self.console.open_sm_map(self.node_name, row.index, bus_id=known_bus_id(row.bus_id))
        elif row is not None:
            self.notify(f"{row.name} is bound to {row.driver or 'no driver'}: NVML cannot map it")

    def action_topology(self) -> None:
        self.console.open_topology(self.node_name)

    def action_assign(self) -> None:
        from gpuconsole.tui.screens.assign import AssignScreen

        row = self.selected_row()
        self.app.push_screen(AssignScreen(self.node_name, [row.bus_id] if row else []))

    def action_remediate(self) -> None:
        """The plan the selected GPU's verdict asks for."""
        from gpuconsole.tui.screens.remediate import RemediateScreen

        row = self.selected_row()
        if row is None or ":" not in row.bus_id:
            self.notify("choose a GPU whose bus id is known: a plan acts on it by bus id")
            return
        self.app.push_screen(RemediateScreen(self.node_name, row.bus_id))

    def action_power(self) -> None:
        from gpuconsole.tui.screens.power import PowerScreen

        self.app.push_screen(PowerScreen(self.node_name))
