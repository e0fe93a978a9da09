"""GPU detail: every NVML reading of one GPU, its links, processes, history and spec.

A GPU a guest holds through vfio-pci has no NVML reading on the host; its detail shows what
sysfs and the tenancy source know (identity, driver, IOMMU group, owner, guest state) and
says so, instead of readings it cannot have.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, VerticalScroll
from textual.widgets import Static

from gpuconsole import format as fmt
from gpuconsole.facts import summaries
from gpuconsole.facts.inventory import GpuRow
from gpuconsole.facts.ownership import GpuOwner
from gpuconsole.facts.verdict import gpu_verdict, node_verdict
from gpuconsole.hardware import model_spec
from gpuconsole.readings.base import Health, Severity, nvml_bus_id
from gpuconsole.readings.nvml import GpuReading, RemoteKind
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.tui.screens.base import GpuView, acting_keys
from gpuconsole.tui.themes import Palette
from gpuconsole.tui.widgets.cells import health_light, spark

# In grid order, two to a row; the tables wide enough to need it span both columns.
BOXES: tuple[tuple[str, str], ...] = (
    ("readings", "readings"),
    ("owner", "owner"),
    ("history", "history"),
    ("pcie", "PCIe"),
    ("ecc", "ECC and row remapping"),
    ("spec", "spec"),
    ("nvlink", "NVLink"),
    ("processes", "processes"),
    ("mig", "MIG"),
)
WIDE = frozenset({"nvlink", "processes", "mig"})
SOURCE_WORDS = {"nvml": "NVML", "bmc": "BMC", "fabric": "fabric", "tenancy": "tenancy"}


def kv(rows: list[tuple[str, RenderableType]]) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")  # a UUID or bus id wraps rather than losing its end
    for key, value in rows:
        table.add_row(key, value)
    return table


def owner_rows(
    node: NodeSnapshot, owner: GpuOwner | None, palette: Palette, now: float
) -> list[tuple[str, RenderableType]]:
    """Each owner of a GPU: who, tenant, identifiers, since when and which source said so;
    then what does not add up about it."""
    if owner is None:
        why = summaries.pending_panel(node, "tenancy") or "tenancy: no reading for this GPU"
        return [("owner", Text(why, style=palette.dim))]
    rows: list[tuple[str, RenderableType]] = []
    stale = summaries.stale_words(node, "tenancy")
    if stale is not None:
        rows.append(("stale", Text(stale, style=palette.health[Health.STALE])))
    for held in owner.owners:
        rows.append(("owner", Text(held.label, style="bold")))
        rows.append(("  tenant", held.tenant or fmt.NA))
        ids = summaries.owner_ids(held)
        if ids:
            rows.append(("  identifiers", ids))
        if held.state is not None:
            rows.append(("  guest state", held.state))
        rows.append(("  since", summaries.owner_since(held, now)))
        rows.append(("  said by", summaries.owner_source(held)))
    for problem in owner.all_problems:
        health = Health.CRITICAL if problem.severity is Severity.CRITICAL else Health.WARNING
        rows.append(("problem", Text(problem.message, style=palette.health[health])))
    return rows


def verdict_box(node: NodeSnapshot, row: GpuRow, palette: Palette) -> RenderableType:
    """What to do with this GPU and why, in words: its verdict's action, then each piece of
    evidence with the source that showed it; then what the node around it asks for, and
    why."""
    verdict = gpu_verdict(node, row)
    text = health_light(verdict.health, palette, word=False)
    text.append(f" {verdict.advice}", style="bold")
    for finding in verdict.findings:
        health = _finding_health(finding.severity)
        text.append(f"\n  • {finding.text}", style=palette.health[health])
        text.append(f"  ({SOURCE_WORDS.get(finding.source, finding.source)})", style=palette.dim)
    around = [f for f in node_verdict(node).problems if f.bus_id is None]
    if around:
        # what its node's own evidence asks for, as a verdict takes it (the worst finding's
        # action): a GPU fit by its own evidence may sit on a node that cannot run CUDA
        text.append(f"\non its node: {around[0].action.words}", style="bold")
        for finding in around[:3]:
            health = _finding_health(finding.severity)
            text.append(f"\n  • {finding.message}", style=palette.health[health])
            text.append(f"  ({SOURCE_WORDS.get(finding.source, finding.source)})",
                        style=palette.dim)  # fmt: skip
        if len(around) > 3:
            text.append(f"\n  +{len(around) - 3} more", style=palette.dim)
    return text


def _finding_health(severity: Severity) -> Health:
    if severity is Severity.CRITICAL:
        return Health.CRITICAL
    return Health.WARNING if severity is Severity.WARNING else Health.OK


def readings_box(
    node: NodeSnapshot, row: GpuRow, gpu: GpuReading, palette: Palette
) -> RenderableType:
    state = health_light(gpu_verdict(node, row).health, palette)
    state.append(f" {summaries.gpu_state_words(gpu)}")
    if gpu.unreadable:  # nothing else is known: say why instead of a column of dashes
        bus = f"{row.bus_id} (sysfs)" if ":" in row.bus_id else fmt.NA
        return kv([("state", state), ("PCI bus", bus)])
    throttle = Text(fmt.throttle_words(gpu.throttle_reasons, include_idle=True))
    if any(r != "gpu_idle" for r in gpu.throttle_reasons):
        throttle.stylize(palette.health[Health.WARNING])
    energy = node.rate("gpu", gpu.uuid, "energy_mj")
    energy_w = energy / 1000.0 if energy is not None else None
    hidden: list[tuple[str, RenderableType]] = []
    if gpu.denied:
        words = f"{fmt.denied_words(gpu.denied)}: NVML answers these to root only"
        hidden.append(("hidden from this user", Text(words, style=palette.dim)))
    return kv([
        ("state", state),
        *hidden,
        ("model", gpu.name if gpu.name != "unknown" else (summaries.row_model(row) or gpu.name)),
        ("uuid", gpu.uuid if gpu.uuid == row.uuid else f"{row.uuid or fmt.NA} (the driver's)"),
        ("serial / module", f"{gpu.serial or fmt.NA} / {fmt.number(gpu.module_id)}"),
        # a GPU lost before NVML read it has no bus id there; sysfs still has it
        ("PCI bus", nvml_bus_id(gpu.pci_bus_id) if ":" in gpu.pci_bus_id
                    else f"{row.bus_id} (sysfs)"),
        ("util gpu / mem", f"{fmt.pct(gpu.util_gpu_pct)} / {fmt.pct(gpu.util_mem_pct)}"),
        ("memory", f"{fmt.mem_of(gpu.mem_used_bytes, gpu.mem_total_bytes)}"
                   f" (reserved {fmt.gib(gpu.mem_reserved_bytes)})"),
        ("temp gpu / HBM", f"{fmt.celsius(gpu.temp_gpu_c)} / {fmt.celsius(gpu.temp_hbm_c)}"
                           f" (slowdown {fmt.celsius(gpu.temp_slowdown_c)})"),
        ("power", f"{fmt.watts_of(gpu.power_w, gpu.power_limit_w)}"
                  f" ({fmt.watts(energy_w)} from the energy counter)"),
        ("SM clock", f"{fmt.mhz(gpu.sm_clock_mhz)} of {fmt.mhz(gpu.sm_clock_max_mhz)}"),
        ("mem clock", f"{fmt.mhz(gpu.mem_clock_mhz)} of {fmt.mhz(gpu.mem_clock_max_mhz)}"),
        ("P-state", f"P{gpu.pstate}" if gpu.pstate is not None else fmt.NA),
        ("throttle", throttle),
        ("NUMA / CPUs", f"{fmt.number(gpu.numa_node)} / {gpu.cpu_affinity or fmt.NA}"),
        ("virtualization", gpu.virtualization_mode or fmt.NA),
        ("fabric", gpu.fabric_state or fmt.NA),
        ("not supported", ", ".join(gpu.unsupported) or fmt.NA),
    ])  # fmt: skip


NO_NVML = (
    "NVML on the host cannot read a GPU bound to vfio-pci: its utilization, memory, "
    "temperature, power, clocks, ECC and processes are the guest's to see"
)


def guest_rows(row: GpuRow, palette: Palette, now: float) -> list[tuple[str, RenderableType]]:
    """What a passthrough GPU's guest agent read of it: the guest's word, with its age; what
    the guest does not share stays unknown."""
    guest = row.guest
    if guest is None:
        return [("NVML", Text(NO_NVML, style=palette.dim))]
    heard = f"{fmt.age(guest.seen_at, now)} ago" if guest.seen_at is not None else "not yet"
    source = Text(f"{guest.guest}'s agent, {heard}", style=palette.passthrough_fg)
    rows: list[tuple[str, RenderableType]] = [
        ("read by", source),
        ("guest sees it at", guest.guest_bus_id),
    ]
    if guest.error is not None:
        rows.append(("guest", Text(f"silent: {guest.error}", style="bold")))
    gpu = guest.reading
    if gpu is None:
        return rows
    xids = ", ".join(f"XID {x.code} ({x.count} times)" for x in gpu.xids) or fmt.NA
    rows += [
        ("util gpu / mem", f"{fmt.pct(gpu.util_gpu_pct)} / {fmt.pct(gpu.util_mem_pct)}"),
        ("memory", fmt.mem_of(gpu.mem_used_bytes, gpu.mem_total_bytes)),
        ("temp gpu / HBM", f"{fmt.celsius(gpu.temp_gpu_c)} / {fmt.celsius(gpu.temp_hbm_c)}"),
        ("power", fmt.watts_of(gpu.power_w, gpu.power_limit_w)),
        ("SM clock", f"{fmt.mhz(gpu.sm_clock_mhz)} of {fmt.mhz(gpu.sm_clock_max_mhz)}"),
        ("ECC unc / cor", f"{fmt.number(gpu.ecc.volatile_uncorrected)} / "
                          f"{fmt.number(gpu.ecc.volatile_corrected)}"),
        ("XIDs", xids),
    ]  # fmt: skip
    return rows


def unseen_box(row: GpuRow, palette: Palette, now: float) -> RenderableType:
    """What the host knows of a GPU NVML cannot see: its sysfs identity (owners: `owner_rows`)."""
    pci, owner = row.pci, row.owner
    state = Text()
    state.append(summaries.PASSTHROUGH_GLYPH if row.passthrough else summaries.UNSEEN_GLYPH,
                 style=palette.passthrough_fg if row.passthrough else palette.dim)  # fmt: skip
    state.append(f" {summaries.unseen_words(row)}")
    rows: list[tuple[str, RenderableType]] = [
        ("state", state),
        ("model", summaries.row_model(row) or fmt.NA),
        ("PCI bus", row.bus_id),
        ("PCI device", f"10de:{pci.device_id:04x}" if pci and pci.device_id else fmt.NA),
        ("uuid", row.uuid or f"{fmt.NA} (only the nvidia driver reports it)"),
        ("driver / override", f"{row.driver or 'none'} / "
                              f"{(pci.driver_override if pci else None) or fmt.NA}"),
        ("NUMA node", fmt.number(pci.numa_node if pci else None)),
    ]  # fmt: skip
    group = owner.iommu_group if owner is not None else None
    peers = (
        ", ".join(f"{p.bus_id} ({p.driver or 'no driver'})" for p in pci.iommu_peers) if pci else ""
    )
    rows.append(("IOMMU group", f"{fmt.number(group)}" + (f": also {peers}" if peers else "")))
    rows += guest_rows(row, palette, now)
    return kv(rows)


def ecc_box(gpu: GpuReading, palette: Palette) -> RenderableType:
    ecc = gpu.ecc

    def flag(value: bool | None, bad: Health) -> Text:
        if value is None:
            return Text(fmt.NA)
        return Text("yes", style=palette.health[bad]) if value else Text("no")

    return kv([
        ("volatile corr / unc", f"{fmt.count(ecc.volatile_corrected)} / "
                                f"{fmt.count(ecc.volatile_uncorrected)}"),
        ("aggregate corr / unc", f"{fmt.count(ecc.aggregate_corrected)} / "
                                 f"{fmt.count(ecc.aggregate_uncorrected)}"),
        ("remapped rows corr / unc", f"{fmt.count(ecc.remapped_corrected)} / "
                                     f"{fmt.count(ecc.remapped_uncorrected)}"),
        ("remap pending (reset)", flag(ecc.remap_pending, Health.WARNING)),
        ("remap failure", flag(ecc.remap_failure, Health.CRITICAL)),
    ])  # fmt: skip


def pcie_box(node: NodeSnapshot, gpu: GpuReading, palette: Palette) -> RenderableType:
    pcie = gpu.pcie
    link = Text(f"{fmt.pcie_link(pcie.gen_current, pcie.width_current)} of "
                f"{fmt.pcie_link(pcie.gen_max, pcie.width_max)}")  # fmt: skip
    if pcie.downtrained:
        link.append("  DOWNTRAINED", style=palette.health[Health.WARNING])
    tx, rx = node.pcie_rates(gpu)
    return kv([
        ("link", link),
        ("tx / rx", f"{fmt.rate(tx)} / {fmt.rate(rx)}"),
        ("replays", f"{fmt.count(pcie.replay_count)}"
                    f" ({fmt.number(node.rate('gpu', gpu.uuid, 'pcie_replays'), 1)}/s)"),
    ])  # fmt: skip


def remote_name(node: NodeSnapshot, kind: RemoteKind, bus_id: str | None) -> str:
    """A link's far end as an operator names it: 'GPU 3' or 'NVSwitch 1'."""
    if bus_id is None:
        return kind.value
    if kind is RemoteKind.GPU:
        for other in node.gpus:
            if other.pci_bus_id == bus_id:
                return f"GPU {other.index}"
    if kind is RemoteKind.NVSWITCH:
        switches = sorted({
            link.remote_pci_bus_id for g in node.gpus for link in g.nvlinks
            if link.remote_kind is RemoteKind.NVSWITCH and link.remote_pci_bus_id
        })  # fmt: skip
        if bus_id in switches:
            return f"NVSwitch {switches.index(bus_id)}"  # its bus id: the topology view
    return f"{kind.value} {nvml_bus_id(bus_id)}"


def nvlink_box(node: NodeSnapshot, gpu: GpuReading, palette: Palette) -> RenderableType:
    if not gpu.nvlinks:
        return Text("no NVLink on this GPU" if not gpu.lost else fmt.NA, style="dim")
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    for header in ("link", "state", "gen", "remote", "tx", "rx"):
        table.add_column(header, no_wrap=True)
    for link in gpu.nvlinks:
        base = ("gpu", gpu.uuid, "nvlink", str(link.link))
        tx, rx = node.rate(*base, "tx_kib"), node.rate(*base, "rx_kib")
        state = Text("up") if link.active else Text("down", style=palette.health[Health.WARNING])
        table.add_row(
            str(link.link),
            state,
            fmt.number(link.version),
            remote_name(node, link.remote_kind, link.remote_pci_bus_id),
            fmt.rate(tx * 1024 if tx is not None else None),
            fmt.rate(rx * 1024 if rx is not None else None),
        )
    return table


def processes_box(node: NodeSnapshot, gpu: GpuReading) -> RenderableType:
    """NVML's compute processes, each with its own owner (job, pod, container or user)."""
    if not gpu.processes:
        return Text("no compute processes", style="dim")
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    for header in ("pid", "memory", "GI/CI", "owner", "tenant", "said by"):
        table.add_column(header, no_wrap=True)
    for proc in gpu.processes:
        gi = "-" if proc.gpu_instance_id is None else str(proc.gpu_instance_id)
        ci = "-" if proc.compute_instance_id is None else str(proc.compute_instance_id)
        owner = summaries.process_owner(node, gpu, proc.pid)
        table.add_row(
            str(proc.pid), fmt.bytes_(proc.used_mem_bytes), f"{gi}/{ci}",
            owner.label if owner is not None else fmt.NA,
            (owner.tenant if owner is not None else None) or fmt.NA,
            owner.source if owner is not None else fmt.NA,
        )  # fmt: skip
    return table


def mig_box(node: NodeSnapshot, gpu: GpuReading) -> RenderableType:
    """The MIG instances, each with its own owner (a pod by its MIG UUID, or its processes')."""
    if not gpu.mig_enabled:
        pending = " (pending: on after reset)" if gpu.mig_pending else ""
        return Text(f"MIG off{pending}" if gpu.mig_enabled is not None else fmt.NA, style="dim")
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    for header in ("GI", "profile", "SMs", "slices", "memory", "SM act", "owner"):
        table.add_column(header, no_wrap=True)
    for mig in gpu.mig_instances:
        table.add_row(
            str(mig.gpu_instance_id), mig.profile_name, str(mig.sm_count),
            f"{fmt.number(mig.placement_start)}+{mig.slice_count}",
            fmt.mem_of(mig.mem_used_bytes, mig.mem_total_bytes),
            fmt.pct(mig.gpm.sm_util_pct if mig.gpm else None),
            summaries.mig_owner(node, gpu, mig.gpu_instance_id),
        )  # fmt: skip
    return table


HISTORY: tuple[tuple[str, str, float | None], ...] = (
    ("util_gpu_pct", "util", 100.0),
    ("sm_util_pct", "SM act", 100.0),
    ("mem_used_pct", "memory", 100.0),
    ("temp_gpu_c", "temp", None),
    ("power_w", "power", None),
    ("sm_clock_mhz", "SM clock", None),
)


def history_box(
    node: NodeSnapshot, gpu: GpuReading, palette: Palette, width: int
) -> RenderableType:
    history = node.history
    rows: list[tuple[str, RenderableType]] = []
    for key, label, hi in HISTORY:
        values = history.series("gpu", gpu.uuid, key) if history is not None else ()
        if not values:
            continue
        top = hi
        if key == "power_w":
            top = gpu.power_limit_w
        elif key == "temp_gpu_c":
            top = gpu.temp_slowdown_c
        elif key == "sm_clock_mhz":
            top = float(gpu.sm_clock_max_mhz) if gpu.sm_clock_max_mhz else None
        line = spark(values, width, palette, hi=top)
        line.append(f" {fmt.number(values[-1])}")
        rows.append((label, line))
    if not rows:
        return Text("no history yet", style="dim")
    points = max(len(history.series("gpu", gpu.uuid, k)) for k, _, _ in HISTORY) if history else 0
    rows.append(("", Text(f"{points} samples, newest right", style="dim")))
    return kv(rows)


def spec_box(name: str) -> RenderableType:
    spec = model_spec(name)
    if spec is None:
        return Text(f"no datasheet entry for {name!r}", style="dim")
    nvlink = (f"gen{spec.nvlink_gen}, {spec.nvlink_count} links, {spec.nvlink_gbytes_per_s} GB/s"
              if spec.nvlink_gen else "none")  # fmt: skip
    return kv([
        ("architecture", spec.architecture),
        ("SMs", f"{spec.sm_count} ({spec.gpc_count} GPCs, {sum(spec.tpc_per_gpc)} TPCs)"),
        ("cores / SM", f"{spec.fp32_cores_per_sm} FP32, {spec.tensor_cores_per_sm} tensor"),
        ("L2", fmt.bytes_(spec.l2_bytes).replace(".0 ", " ")),
        ("memory", f"{fmt.bytes_(spec.mem_bytes).replace('.0 ', ' ')} {spec.mem_kind}, "
                   f"{fmt.gbytes_per_s(spec.mem_bandwidth_bytes_per_s)}"),
        ("NVLink", nvlink),
        ("PCIe", fmt.pcie_link(spec.pcie_gen_max, spec.pcie_width_max)),
        ("TDP", fmt.watts(spec.tdp_w)),
        ("GPM", "yes (Hopper+)" if spec.gpm else "no"),
    ])  # fmt: skip


class GpuScreen(GpuView):
    """Everything about one GPU."""

    BINDINGS = [
        # Enter drills down everywhere: below a GPU is its SM map
        Binding("enter", "sm_map", "SM map", show=False, key_display="Enter"),
        Binding("m", "sm_map", "SM map"),
        Binding("o", "topology", "Topology"),
        # only for those who may act (check_action); others are told why
        *acting_keys("a", "assign", "Assign"),
        *acting_keys("r", "remediate", "Repair"),
    ]
    HELP_EXTRA = (("↑ ↓ PgUp PgDn", "scroll"),)

    def crumbs(self) -> list[str]:
        return ["Fleet", self.node_name, self.gpu_crumb()]

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(classes="scroll-body", id="gpu-body"):
            yield Static(id="gpu-missing", classes="summary")
            # above the grid, the width of the screen: what to do comes first
            verdict = Static(id="box-verdict", classes="box")
            verdict.border_title = "verdict"
            yield verdict
            with Container(classes="grid-2"):
                for box_id, title in BOXES:
                    box = Static(id=f"box-{box_id}", classes="box span-2" if box_id in WIDE
                                 else "box")  # fmt: skip
                    box.border_title = title
                    yield box

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        node = snapshot.node(self.node_name)
        row = self.find_row(node) if node is not None else None
        missing = self.query_one("#gpu-missing", Static)
        if node is None or row is None:
            where = self.crumbs()[-1]
            missing.update(f"{where} of {self.node_name} is not in the latest snapshot")
            return
        missing.update("")
        missing.display = False
        palette = self.palette
        gpu = row.reading
        if gpu is None:
            self._show_unseen(node, row, palette)
            return
        self.query_one("#box-readings", Static).border_title = "readings"
        width = max(8, min(40, self.size.width // 2 - 22))
        owners = owner_rows(node, row.owner, palette, self.console.clock())
        self.query_one("#box-verdict", Static).update(verdict_box(node, row, palette))
        boxes: dict[str, RenderableType] = {
            "readings": readings_box(node, row, gpu, palette),
            "owner": kv(owners),
            "history": history_box(node, gpu, palette, width),
            "ecc": ecc_box(gpu, palette),
            "pcie": pcie_box(node, gpu, palette),
            "processes": processes_box(node, gpu),
            "mig": mig_box(node, gpu),
            "nvlink": nvlink_box(node, gpu, palette),
            "spec": spec_box(gpu.name),
        }
        for box_id, content in boxes.items():
            self.query_one(f"#box-{box_id}", Static).update(content)

    def _show_unseen(self, node: NodeSnapshot, row: GpuRow, palette: Palette) -> None:
        readings = self.query_one("#box-readings", Static)
        readings.border_title = "identity (sysfs)"
        now = self.console.clock()
        readings.update(unseen_box(row, palette, now))
        owners = owner_rows(node, row.owner, palette, now)
        self.query_one("#box-owner", Static).update(kv(owners))
        self.query_one("#box-verdict", Static).update(verdict_box(node, row, palette))
        spec = model_spec(summaries.row_model(row))
        for box_id, _title in BOXES[2:]:
            if box_id == "spec" and spec is not None:
                content: RenderableType = spec_box(spec.name)
            else:
                content = Text(fmt.NA, style="dim")
            self.query_one(f"#box-{box_id}", Static).update(content)

    def action_sm_map(self) -> None:
        if self.gpu_index is None:
            self.notify("NVML cannot see this GPU, so there is no SM map to draw")
            return
        self.console.open_sm_map(self.node_name, self.gpu_index, bus_id=self.bus_id)

    def action_topology(self) -> None:
        self.console.open_topology(self.node_name)

    def action_assign(self) -> None:
        from gpuconsole.tui.screens.assign import AssignScreen

        marked = [self.bus_id] if self.bus_id is not None else []
        self.app.push_screen(AssignScreen(self.node_name, marked))

    def action_remediate(self) -> None:
        """The plan this GPU's verdict asks for (drain, reset, power cycle, service)."""
        from gpuconsole.tui.screens.remediate import RemediateScreen

        if self.bus_id is None or ":" not in self.bus_id:
            self.notify("this GPU's bus id is not known yet: a plan acts on it by bus id")
            return
        self.app.push_screen(RemediateScreen(self.node_name, self.bus_id))
