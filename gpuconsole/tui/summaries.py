"""Pure functions from snapshots to what the views show: metrics, facets, owners, panels.

Nothing here touches a widget, so the fleet view, the node view, the wallboard and the
benchmark share one definition of "how hot is this GPU" and "is this node healthy". A
node's GPUs are `gpu_rows(node)`: NVML's and those only sysfs sees (a guest's), by bus id.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from gpuconsole import format as fmt
from gpuconsole.inventory import GpuRow, node_gpus, ownership_problems
from gpuconsole.model import (
    GpuReading,
    GpuState,
    Health,
    NodeSnapshot,
    Severity,
    gpu_health,
    gpus_health,
)
from gpuconsole.ownership import node_ownership
from gpuconsole.tui.hardware import model_for_pci_device

gpu_rows = node_gpus  # every GPU of a node, NVML's or not, with its owner
PASSTHROUGH_GLYPH = "◆"  # a GPU a guest holds through vfio-pci: no NVML reading to colour
UNSEEN_GLYPH = "·"  # a GPU sysfs lists that NVML cannot see, not bound to vfio-pci

# The optional sources of a node: their name, and what turns them on.
PENDING_SOURCES: dict[str, tuple[str, str]] = {
    "bmc": ("BMC", "no BMC configured for this node: add a [[bmc]] table"),
    "fabric": ("fabric", "fabric source off: [fabric] enabled = true"),
    "tenancy": ("tenancy", "tenancy source off: [tenancy] enabled = true"),
}


class Metric(enum.StrEnum):
    """What a heat cell is coloured by; one key cycles through them."""

    UTIL = "util"
    TEMP = "temp"
    POWER = "power"
    MEMORY = "memory"

    def next(self) -> Metric:
        members = list(Metric)
        return members[(members.index(self) + 1) % len(members)]


def metric_value(gpu: GpuReading, metric: Metric) -> tuple[float | None, float | None]:
    """(shown value, fraction of full scale) of one GPU for one metric."""
    if gpu.lost:
        return None, None
    if metric is Metric.UTIL:
        value = gpu.util_gpu_pct
        if value is None and gpu.gpm is not None:
            value = gpu.gpm.sm_util_pct
        return value, None if value is None else value / 100.0
    if metric is Metric.TEMP:
        t = gpu.temp_gpu_c
        if t is None:
            return None, None
        hot = gpu.temp_slowdown_c or 90.0
        return t, (t - 30.0) / max(1.0, hot - 30.0)
    if metric is Metric.POWER:
        p, limit = gpu.power_w, gpu.power_limit_w
        if p is None:
            return None, None
        if not limit:
            return p, None
        share = 100.0 * p / limit
        return share, share / 100.0
    used = gpu.mem_used_pct
    return used, None if used is None else used / 100.0


def metric_unit(metric: Metric) -> str:
    return {Metric.UTIL: "util %", Metric.TEMP: "temp °C", Metric.POWER: "power % of limit",
            Metric.MEMORY: "memory %"}[metric]  # fmt: skip


def cell_text(gpu: GpuReading, metric: Metric) -> str:
    """Three characters for a heat cell: the value, or why there is none."""
    if gpu.lost:
        return " ✖ "
    value, _ = metric_value(gpu, metric)
    if value is None:
        return " m " if gpu.mig_enabled else "  -"
    return f"{min(value, 999):3.0f}"


def row_cell_text(row: GpuRow, metric: Metric) -> str:
    """A heat cell for any GPU of the node: NVML's value, or a mark for one NVML cannot see."""
    if row.reading is not None:
        return cell_text(row.reading, metric)
    return f" {PASSTHROUGH_GLYPH if row.passthrough else UNSEEN_GLYPH} "


def row_health(row: GpuRow) -> Health:
    """A GPU's light: NVML's verdict; a guest's GPU is fine unless ownership says otherwise."""
    if row.reading is not None:
        return gpu_health(row.reading)
    problems = row.owner.all_problems if row.owner is not None else ()
    return _worst(problems) or (Health.OK if row.passthrough else Health.UNKNOWN)


def row_model(row: GpuRow) -> str | None:
    """The GPU's model name: NVML's, the NVIDIA driver's, else by its PCI device id."""
    if row.model:
        return row.model
    spec = model_for_pci_device(row.pci.device_id if row.pci is not None else None)
    return spec.name if spec is not None else None


def unseen_words(row: GpuRow) -> str:
    """Why a GPU has no NVML reading: the driver that holds it instead."""
    driver = row.driver
    if driver == "vfio-pci":
        return "vfio-pci: NVML cannot read it"
    return "no driver bound" if driver is None else f"bound to {driver}"


def gpu_owner(node: NodeSnapshot, gpu: GpuReading) -> str:
    """Who holds the GPU, from the tenancy reading once there is one; '-' until then."""
    if getattr(node, "tenancy", None) is None:
        return fmt.NA
    ownership = node_ownership(node)
    if ownership is None:
        return fmt.NA
    owner = ownership.owner_of(gpu.uuid) or next(
        (g for g in ownership.gpus if g.index == gpu.index), None
    )
    return owner.label if owner is not None else fmt.NA


def gpu_in_use(gpu: GpuReading) -> bool:
    """A GPU with compute processes (or any MIG instance with them) is in use."""
    return bool(gpu.processes)


def gpu_count(node: NodeSnapshot) -> int:
    """Every GPU of the node, those NVML cannot see (a guest's) included."""
    return len(gpu_rows(node))


def in_use_count(node: NodeSnapshot) -> int:
    """GPUs some tenant holds (from the owners once tenancy has read; else by processes)."""
    return sum(1 for row in gpu_rows(node) if row.in_use)


def _worst(problems: Iterable[object]) -> Health | None:
    levels = {getattr(p, "severity", None) for p in problems}
    if Severity.CRITICAL in levels:
        return Health.CRITICAL
    return Health.WARNING if levels else None


def tenancy_facet(node: NodeSnapshot) -> tuple[Health | None, str]:
    """The tenancy light: the source's freshness, or the worst ownership inconsistency."""
    health = source_health(node, "tenancy")
    if health is None:
        return None, PENDING_SOURCES["tenancy"][1]
    problems = ownership_problems(node)
    worst = _worst(problems)
    if worst is not None and health is Health.OK:
        health = worst
    detail = f"tenancy: {len(problems)} ownership problem(s)" if problems else "tenancy"
    return health, detail


@dataclass(frozen=True, slots=True)
class Facet:
    """One health light on a fleet row: GPU, BMC, fabric or tenancy."""

    letter: str
    name: str
    health: Health | None  # None: that source is not configured on this node
    detail: str


def source_health(node: NodeSnapshot, source: str) -> Health | None:
    status = node.status(source)
    if status is None:
        return None
    return Health.OK if status.ok else Health.STALE


def gpu_facet_health(node: NodeSnapshot) -> Health:
    status = node.status("nvml")
    if status is None:
        return Health.UNKNOWN
    return gpus_health(node.gpus, Health.OK if status.ok else Health.STALE)


def facets(node: NodeSnapshot) -> tuple[Facet, ...]:
    out = [Facet("G", "GPU", gpu_facet_health(node), "NVML")]
    for source, (name, how) in PENDING_SOURCES.items():
        if source == "tenancy":
            health, detail = tenancy_facet(node)
        else:
            health = source_health(node, source)
            detail = how if health is None else name
        out.append(Facet(name[0].upper(), name, health, detail))
    return tuple(out)


def oldest_ok(node: NodeSnapshot) -> float | None:
    """When the least fresh source last answered: how stale this row is."""
    times = [s.last_ok_at for s in node.statuses]
    if not times:
        return None
    if any(t is None for t in times):
        return None
    return min(t for t in times if t is not None)


def stale_sources(node: NodeSnapshot) -> list[str]:
    return [s.source for s in node.statuses if s.stale]


def node_model(node: NodeSnapshot) -> str | None:
    names = {g.name for g in node.gpus if g.name and g.name != "unknown"}
    if not names:  # every GPU with a guest: sysfs still knows what they are
        names = {m for m in map(row_model, gpu_rows(node)) if m}
    return sorted(names)[0] if names else None


def mean(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def node_power_w(node: NodeSnapshot) -> float | None:
    got = [g.power_w for g in node.gpus if g.power_w is not None]
    return sum(got) if got else None


def node_hottest_c(node: NodeSnapshot) -> float | None:
    got = [g.temp_gpu_c for g in node.gpus if g.temp_gpu_c is not None]
    return max(got) if got else None


def free_count(node: NodeSnapshot) -> int:
    """GPUs in the free pool: from the owners when the tenancy source reads this node (a
    passed-through GPU counts there though NVML cannot see it), else GPUs with no process."""
    return sum(1 for row in gpu_rows(node) if row.free)


def pending_panel(node: NodeSnapshot, source: str) -> str | None:
    """What a panel for a source that has no reading says; None when it has one."""
    name, how = PENDING_SOURCES[source]
    reading = getattr(node, source, None)
    status = node.status(source)
    if reading is not None:
        return None
    if status is None:
        return how
    if status.stale:
        return f"{name} stale since {fmt.clock_time(status.stale_since)}: {status.error or '?'}"
    return f"{name}: waiting for a first reading"


def gpu_state_words(gpu: GpuReading) -> str:
    if gpu.state is GpuState.LOST:
        return f"LOST since {fmt.clock_time(gpu.lost_since)}"
    if gpu.state is GpuState.ERROR:
        return f"error: {gpu.error or '?'}"
    return "ok"


def filter_text(node: NodeSnapshot) -> str:
    """What `/` matches a node against: name, model, owners, health, profile."""
    parts = [node.node, node.health.value, node.profile or ""]
    model = node_model(node)
    if model:
        parts += [model, model.replace("NVIDIA ", "")]
    for row in gpu_rows(node):
        if row.label != fmt.NA:
            parts.append(row.label)
        if row.lost:
            parts.append("lost")
        if row.passthrough:
            parts.append("vfio passthrough")
    if node.simulated:
        parts.append("simulated")
    return " ".join(parts).lower()


def matches(node: NodeSnapshot, query: str) -> bool:
    """Every word of the query appears in the node's filter text."""
    text = filter_text(node)
    return all(word in text for word in query.lower().split())


def bmc_panel(node: NodeSnapshot) -> str:
    """The BMC panel: power, temperatures, fans, PSUs and the newest SEL record."""
    pending = pending_panel(node, "bmc")
    reading = getattr(node, "bmc", None)
    if pending is not None or reading is None:
        return pending or fmt.NA
    state = getattr(getattr(reading, "power_state", None), "value", "?")
    lines = [
        f"power {state} · {fmt.watts(getattr(reading, 'power_w', None))} · inlet "
        f"{fmt.celsius(getattr(reading, 'inlet_c', None))} · exhaust "
        f"{fmt.celsius(getattr(reading, 'exhaust_c', None))}",
    ]
    fans, fans_bad = getattr(reading, "fans_present", 0), getattr(reading, "fans_failed", 0)
    psus, psus_bad = getattr(reading, "psus_present", 0), getattr(reading, "psus_failed", 0)
    lines.append(f"fans {fans - fans_bad}/{fans} ok · PSUs {psus - psus_bad}/{psus} ok")
    sel = getattr(reading, "sel_recent", ())
    if sel:
        last = sel[-1]
        lines.append(f"SEL {fmt.clock_time(last.at)} {last.sensor}: {last.event}")
    status = node.status("bmc")
    if status is not None and status.stale:
        lines.insert(0, f"stale since {fmt.clock_time(status.stale_since)}: {status.error or '?'}")
    return "\n".join(lines)


def fabric_panel(node: NodeSnapshot) -> str:
    """The fabric panel: ports up against ports present, and GPUDirect's kernel module."""
    pending = pending_panel(node, "fabric")
    reading = getattr(node, "fabric", None)
    if pending is not None or reading is None:
        return pending or fmt.NA
    ports = tuple(getattr(reading, "ports", ()))
    down = [p for p in ports if getattr(p, "state", "") != "ACTIVE"]
    lines = [f"{len(ports) - len(down)}/{len(ports)} ports active"]
    for port in down[:2]:
        lines.append(f"{port.device}/{port.port} {port.state} ({port.phys_state})")
    peermem = getattr(reading, "peermem_loaded", None)
    if peermem is not None:
        lines.append(f"nvidia-peermem {'loaded' if peermem else 'NOT loaded'}")
    status = node.status("fabric")
    if status is not None and status.stale:
        lines.insert(0, f"stale since {fmt.clock_time(status.stale_since)}: {status.error or '?'}")
    return "\n".join(lines)
