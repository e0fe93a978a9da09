"""SM map: the GPU's GPC/TPC/SM layout, who holds which slice, and what GPM measures.

NVML has no per-SM figures. Each SM is coloured by the MIG instance that holds it and
shaded by that instance's GPM SM activity (or the GPU's); the view says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container, VerticalScroll
from textual.widgets import Static

from gpuconsole import format as fmt
from gpuconsole.facts import summaries
from gpuconsole.hardware import GpuModel, model_spec
from gpuconsole.readings.nvml import GpmMetrics, GpuReading, MigInstance
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.tui.screens.base import GpuView
from gpuconsole.tui.themes import Palette

SHADES = "░▒▓█"
UNASSIGNED = "·"


@dataclass(frozen=True, slots=True)
class Holder:
    """What holds a group of SMs and the one activity figure that applies to all of them."""

    label: str
    instance: MigInstance | None
    activity_pct: float | None
    scope: str  # where the figure comes from, said out loud in the view


def sm_layout(spec: GpuModel) -> list[list[int]]:
    """SM ids per GPC, two SMs per TPC, numbered in GPC order."""
    gpcs, next_id = [], 0
    for tpcs in spec.tpc_per_gpc:
        gpcs.append(list(range(next_id, next_id + 2 * tpcs)))
        next_id += 2 * tpcs
    return gpcs


def assign(spec: GpuModel, gpu: GpuReading) -> dict[int, int]:
    """SM id → index into gpu.mig_instances, placing each instance from its first slice's GPC.

    NVML says how many SMs an instance has and where its slices start, not which physical
    SMs those are; drawing them in GPC order is a picture of the share, not a floor plan.
    """
    gpcs = sm_layout(spec)
    order = [sm for gpc in gpcs for sm in gpc]
    owner: dict[int, int] = {}
    for k, mig in enumerate(gpu.mig_instances):
        start_gpc = min(mig.placement_start or 0, len(gpcs) - 1)
        position = order.index(gpcs[start_gpc][0]) if gpcs[start_gpc] else 0
        taken = 0
        for sm in order[position:] + order[:position]:
            if taken >= mig.sm_count:
                break
            if sm not in owner:
                owner[sm] = k
                taken += 1
    return owner


def holders(gpu: GpuReading) -> list[Holder]:
    """One holder per MIG instance, or the whole GPU."""
    if gpu.mig_enabled and gpu.mig_instances:
        out = []
        for mig in gpu.mig_instances:
            act = mig.gpm.sm_util_pct if mig.gpm is not None else None
            scope = "GPM, this instance" if act is not None else "no GPM sample for this instance"
            out.append(Holder(f"GI {mig.gpu_instance_id} {mig.profile_name}", mig, act, scope))
        return out
    if gpu.gpm is not None and gpu.gpm.sm_util_pct is not None:
        return [Holder("whole GPU", None, gpu.gpm.sm_util_pct, "GPM SM activity, GPU-wide")]
    if gpu.util_gpu_pct is not None:
        return [Holder("whole GPU", None, gpu.util_gpu_pct,
                       "NVML utilization, GPU-wide (time a kernel ran, not SM activity)")]  # fmt: skip
    return [Holder("whole GPU", None, None, "no activity figure")]


def shade(activity: float | None) -> str:
    if activity is None:
        return "▪"
    return SHADES[min(len(SHADES) - 1, int(max(0.0, activity) / 100.0 * len(SHADES)))]


def sm_grid(spec: GpuModel, gpu: GpuReading, palette: Palette) -> Text:
    """One line per GPC: its TPCs as pairs of SMs, each SM in its holder's colour."""
    hold = holders(gpu)
    mig = bool(gpu.mig_enabled and gpu.mig_instances)
    owner = assign(spec, gpu) if mig else {}
    colours = palette.instances or (Style(),)
    text = Text(no_wrap=True)
    for g, sms in enumerate(sm_layout(spec)):
        if g:
            text.append("\n")
        text.append(f"GPC{g} ", style="bold")
        for i, sm in enumerate(sms):
            if i and i % 2 == 0:
                text.append(" ")
            if mig:
                k = owner.get(sm)
                if k is None:
                    text.append(UNASSIGNED, style=palette.dim)
                    continue
                text.append(shade(hold[k].activity_pct), style=colours[k % len(colours)])
            else:
                text.append(shade(hold[0].activity_pct), style=colours[0])
        text.append(f"  {len(sms)}", style="dim")
    return text


def _gpm_cells(gpm: GpmMetrics | None) -> list[str]:
    if gpm is None:
        return [fmt.NA] * 7
    return [fmt.pct(gpm.sm_util_pct), fmt.pct(gpm.sm_occupancy_pct), fmt.pct(gpm.tensor_util_pct),
            fmt.pct(gpm.fp64_util_pct), fmt.pct(gpm.fp32_util_pct), fmt.pct(gpm.fp16_util_pct),
            fmt.pct(gpm.dram_bw_util_pct)]  # fmt: skip


def holder_owner(node: NodeSnapshot, gpu: GpuReading, holder: Holder) -> tuple[str, str]:
    """(owner, tenant) of a holder: a MIG instance's own owner, else the whole GPU's."""
    owner = summaries.gpu_ownership(node, gpu)
    if owner is None:
        return fmt.NA, fmt.NA
    if holder.instance is None:
        return owner.label, owner.owner.tenant or fmt.NA
    mig = owner.mig(holder.instance.gpu_instance_id)
    if mig is None:
        return fmt.NA, fmt.NA
    return summaries.mig_owner(node, gpu, mig.gpu_instance_id), mig.owner.tenant or fmt.NA


def holders_table(node: NodeSnapshot, gpu: GpuReading, palette: Palette) -> Table:
    """Each holder: its colour, SMs, and who owns it (each MIG instance its own owner)."""
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    for header in ("", "holder", "SMs", "owner", "tenant"):
        table.add_column(header, no_wrap=True)
    colours = palette.instances or (Style(),)
    for k, holder in enumerate(holders(gpu)):
        sms = holder.instance.sm_count if holder.instance else (gpu.sm_count or 0)
        owner, tenant = holder_owner(node, gpu, holder)
        table.add_row(Text("█", style=colours[k % len(colours)]), holder.label, str(sms),
                      owner, tenant)  # fmt: skip
    return table


def gpm_table(gpu: GpuReading, palette: Palette) -> Table:
    """Every GPM figure that applies to each holder (its instance's, or the GPU's)."""
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    for header in ("", "holder", "SM act", "occ", "tensor", "FP64", "FP32", "FP16", "DRAM bw"):
        table.add_column(header, no_wrap=True, justify="left" if header in ("", "holder")
                         else "right")  # fmt: skip
    colours = palette.instances or (Style(),)
    for k, holder in enumerate(holders(gpu)):
        gpm = holder.instance.gpm if holder.instance else gpu.gpm
        cells = _gpm_cells(gpm)
        if gpm is None and holder.activity_pct is not None:
            cells[0] = fmt.pct(holder.activity_pct) + "*"
        table.add_row(Text("█", style=colours[k % len(colours)]), holder.label, *cells)
    return table


def explanation(gpu: GpuReading, spec: GpuModel) -> Text:
    hold = holders(gpu)
    text = Text(style="dim")
    text.append("NVML and DCGM report no per-SM figures: every SM of a holder gets that "
                "holder's one figure.\n")  # fmt: skip
    scopes = sorted({h.scope for h in hold})
    text.append("shade (░ ▒ ▓ █ = activity quartiles): " + "; ".join(scopes) + ".\n")
    if gpu.mig_enabled and gpu.mig_instances:
        used = sum(m.sm_count for m in gpu.mig_instances)
        text.append(f"MIG: {len(gpu.mig_instances)} instances hold {used} of {spec.sm_count} SMs; "
                    "drawn from each instance's first slice in GPC order (NVML does not say "
                    "which physical SMs).\n")  # fmt: skip
    if not spec.gpm:
        text.append(f"{spec.short} has no GPM (Hopper and newer only): tensor, FP and DRAM "
                    "figures are not available.\n")  # fmt: skip
    elif gpu.gpm is None and not any(m.gpm for m in gpu.mig_instances):
        text.append("GPM: no sample pair yet (figures appear after the second detail poll).\n")
    if any(h.instance is None and h.scope.startswith("NVML") for h in hold):
        text.append("* GPU-wide NVML utilization, not GPM SM activity.\n")
    text.rstrip()
    return text


class SmMapScreen(GpuView):
    """The SMs of one GPU, by holder."""

    HELP_EXTRA = (("↑ ↓", "scroll"),)

    def crumbs(self) -> list[str]:
        return ["Fleet", self.node_name, self.gpu_crumb(), "SM map"]

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(classes="scroll-body"):
            yield Static(id="sm-title", classes="summary")
            with Container(classes="grid-2", id="sm-row"):
                grid = Static(id="sm-grid", classes="box")
                grid.border_title = "GPC / TPC / SM"
                yield grid
                legend = Static(id="sm-holders", classes="box")
                legend.border_title = "holders and owners"
                yield legend
            gpm = Static(id="sm-gpm", classes="box")
            gpm.border_title = "GPM per holder"
            yield gpm
            note = Static(id="sm-note", classes="box")
            note.border_title = "what the shading means"
            yield note

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        node = snapshot.node(self.node_name)
        row = self.find_row(node) if node is not None else None
        gpu = row.reading if row is not None else None
        title = self.query_one("#sm-title", Static)
        grid = self.query_one("#sm-grid", Static)
        if node is None or gpu is None:
            where = self.gpu_crumb()
            title.update(f"{where} of {self.node_name} is not in the latest snapshot")
            return
        spec = model_spec(gpu.name)
        if spec is None or gpu.lost:
            why = "the GPU is lost" if gpu.lost else f"no SM layout known for {gpu.name!r}"
            title.update(f"GPU {gpu.index}: {why}")
            grid.update(Text(fmt.NA))
            return
        palette = self.palette
        title.update(
            f"GPU {gpu.index} · {spec.name} · {spec.sm_count} SMs in {spec.gpc_count} GPCs "
            f"({sum(spec.tpc_per_gpc)} TPCs \u00d7 2) · MIG {'on' if gpu.mig_enabled else 'off'}"
        )
        grid.update(sm_grid(spec, gpu, palette))
        self.query_one("#sm-holders", Static).update(Group(holders_table(node, gpu, palette)))
        self.query_one("#sm-gpm", Static).update(Group(gpm_table(gpu, palette)))
        self.query_one("#sm-note", Static).update(explanation(gpu, spec))
