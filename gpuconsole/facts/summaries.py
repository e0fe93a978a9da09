"""Pure functions from snapshots to what the views show: metrics, facets, owners, panels.

Nothing here touches a widget, so the fleet view, the node view, the wallboard and the
benchmark share one definition of "how hot is this GPU" and "is this node healthy". A
node's GPUs are `gpu_rows(node)`: NVML's and those only sysfs sees (a guest's), by bus id.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from gpuconsole import format as fmt
from gpuconsole.facts.inventory import GpuRow, node_gpus, ownership_problems
from gpuconsole.facts.ownership import GpuOwner, Owner, OwnerKind, Ownership, node_ownership
from gpuconsole.facts.verdict import gpu_verdict, node_verdict, unfit_gpus
from gpuconsole.hardware import model_for_pci_device
from gpuconsole.readings.base import Health, PartStatus, Severity
from gpuconsole.readings.bmc import BmcReading
from gpuconsole.readings.nvml import GpuReading, GpuState
from gpuconsole.readings.snapshot import NodeSnapshot

gpu_rows = node_gpus  # every GPU of a node, NVML's or not, with its owner
PASSTHROUGH_GLYPH = "◆"  # a GPU a guest holds through vfio-pci: no NVML reading to colour
UNSEEN_GLYPH = "·"  # a GPU sysfs lists that NVML cannot see, not bound to vfio-pci
BUSY_PCT = 50  # a GPU this busy (utilization, %) or more counts as busy

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
    seen = row.seen  # NVML's, else what the guest's agent read of it
    if seen is not None:
        return cell_text(seen, metric)
    return f" {PASSTHROUGH_GLYPH if row.passthrough else UNSEEN_GLYPH} "


def row_health(node: NodeSnapshot, row: GpuRow) -> Health:
    """A GPU's light: its verdict's health (a guest's GPU by what its guest's agent read of
    it, and its ownership)."""
    return gpu_verdict(node, row).health


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


def gpu_ownership(node: NodeSnapshot, gpu: GpuReading) -> GpuOwner | None:
    """The owners of one of NVML's GPUs (and of its MIG instances and processes); None until
    the tenancy source has read the node."""
    ownership = node_ownership(node)
    if ownership is None:
        return None
    found = ownership.owner_of(gpu.uuid)
    return found or next((g for g in ownership.gpus if g.index == gpu.index), None)


def gpu_owner(node: NodeSnapshot, gpu: GpuReading) -> str:
    """Who holds the GPU, from the tenancy reading once there is one; '-' until then."""
    owner = gpu_ownership(node, gpu)
    return owner.label if owner is not None else fmt.NA


def mig_owner(node: NodeSnapshot, gpu: GpuReading, gpu_instance_id: int) -> str:
    """Who holds one MIG instance (its own owner, not the GPU's); '-' until tenancy reads."""
    owner = gpu_ownership(node, gpu)
    mig = owner.mig(gpu_instance_id) if owner is not None else None
    if mig is None:
        return fmt.NA
    extra = len(mig.owners) - 1
    return mig.owner.label + (f" +{extra}" if extra else "")


def process_owner(node: NodeSnapshot, gpu: GpuReading, pid: int) -> Owner | None:
    """Whom one compute process works for: its job, pod or container, else its user."""
    owner = gpu_ownership(node, gpu)
    return owner.process_owner(pid) if owner is not None else None


# Which part of the tenancy source said who owns a GPU, in an operator's words.
OWNER_SOURCES = {
    "libvirt": "libvirt (the domain's <hostdev>)",
    "qemu": "a QEMU command line (vfio-pci,host=)",
    "kubelet": "the kubelet's pod-resources API",
    "cgroup": "the processes' cgroups",
    "nvml": "NVML alone (no /proc entry for it)",
    "pci": "sysfs: the driver bound to it",
}


def owner_source(owner: Owner) -> str:
    return OWNER_SOURCES.get(owner.source, owner.source)


def owner_since(owner: Owner, now: float) -> str:
    """'02:41:07, 12 m ago' ('first seen' when that is all gpuconsole knows); '-' if unknown."""
    if owner.since is None:
        return fmt.NA
    seen = " (first seen)" if owner.since_observed else ""
    return f"{fmt.clock_time(owner.since)}{seen}, {fmt.age(owner.since, now)} ago"


def owner_ids(owner: Owner) -> str:
    """The owner's identifiers beyond its name: container, user, guest UUID, PIDs."""
    parts = []
    if owner.container:
        parts.append(f"container {owner.container}")
    if owner.container_id and owner.kind is not OwnerKind.POD:
        parts.append(f"container id {owner.container_id[:12]}")
    if owner.pod_uid and owner.pod is None:
        parts.append(f"pod uid {owner.pod_uid}")
    if owner.user:
        parts.append(f"user {owner.user}")
    if owner.guest_uuid:
        parts.append(f"uuid {owner.guest_uuid}")
    if owner.dra is not None:
        parts.append(f"claim {owner.dra.claim} ({owner.dra.device})")
    if owner.replicas:
        parts.append("replicas " + ",".join(str(r) for r in owner.replicas))
    limits = owner.limits
    if limits is not None:
        quota = [fmt.gib(limits.mem_bytes)] if limits.mem_bytes is not None else []
        quota += [f"{limits.sm_pct:g} % of SMs"] if limits.sm_pct is not None else []
        parts.append(f"limit {', '.join(quota)} ({limits.by})")
    if owner.mem_used_bytes is not None and (owner.replicas or limits is not None):
        parts.append(f"uses {fmt.gib(owner.mem_used_bytes)}")
    if owner.pids:
        parts.append(("PID " if len(owner.pids) == 1 else "PIDs ")
                     + ", ".join(str(p) for p in owner.pids))  # fmt: skip
    return " · ".join(parts)


class GpuCounts(msgspec.Struct, frozen=True):
    """How many of a node's GPUs are in each state: what the fleet view sums every second."""

    total: int = 0
    in_use: int = 0
    free: int = 0
    lost: int = 0
    passthrough: int = 0

    def __add__(self, other: GpuCounts) -> GpuCounts:
        return GpuCounts(
            self.total + other.total,
            self.in_use + other.in_use,
            self.free + other.free,
            self.lost + other.lost,
            self.passthrough + other.passthrough,
        )

    @classmethod
    def add_up(cls, counts: Iterable[GpuCounts]) -> GpuCounts:
        """Every node's counts added up, without a GpuCounts per step."""
        total = in_use = free = lost = passthrough = 0
        for c in counts:
            total += c.total
            in_use += c.in_use
            free += c.free
            lost += c.lost
            passthrough += c.passthrough
        return cls(total, in_use, free, lost, passthrough)


class _OwnedCounts(msgspec.Struct, frozen=True):
    counts: GpuCounts  # with none lost: what most nodes come to, built once
    indexes: frozenset[int]  # NVML indexes the owners list


# node -> the counts of its last two Ownerships (node_ownership keeps no more of a node):
# an older one is never asked about again, and counts remembered for it would keep it, and
# every owner of every GPU it lists, alive.
_OWNED: OrderedDict[str, list[tuple[Ownership, _OwnedCounts]]] = OrderedDict()
_OWNED_PER_NODE = 2
_OWNED_NODES = 65_536  # as many as node_ownership keeps, or a large fleet misses every time


def _owned_counts(node: str, ownership: Ownership) -> _OwnedCounts:
    """Counts from the owners alone, remembered per node and Ownership (which
    `node_ownership` keeps while a node's owners stand still, though its NVML reading is new
    every poll)."""
    seen = _OWNED.get(node)
    for kept, counts in seen or ():
        if kept is ownership:
            return counts
    in_use = free = passthrough = 0
    indexes = set()
    for owner in ownership.gpus:
        if owner.index is not None:
            indexes.add(owner.index)
        elif owner.driver == "vfio-pci":
            passthrough += 1
        first = owner.owners[0]
        if first.holds:
            in_use += 1
        elif first.kind is OwnerKind.FREE:
            free += 1
    found = GpuCounts(len(ownership.gpus), in_use, free, 0, passthrough)
    counts = _OwnedCounts(found, frozenset(indexes))
    if seen is None:
        seen = _OWNED[node] = []
        while len(_OWNED) > _OWNED_NODES:
            _OWNED.popitem(last=False)
    seen.insert(0, (ownership, counts))
    del seen[_OWNED_PER_NODE:]
    return counts


def gpu_counts(node: NodeSnapshot) -> GpuCounts:
    """The counts `gpu_rows` would give, straight from the owners and NVML's readings.

    A 1,000-node fleet sums these every snapshot, so they skip building rows: the owners'
    part is remembered per owner-relevant change, the rest is one pass over NVML's GPUs.
    """
    readings = node.gpus
    ownership = node_ownership(node)
    lost, gone_state = 0, GpuState.LOST
    if ownership is None:
        busy = idle = 0
        for g in readings:
            gone = g.state is gone_state
            lost += gone
            if g.processes:
                busy += 1
            elif not gone and not g.unreadable:  # no process seen is not idle when unread
                idle += 1
        return GpuCounts(len(readings), busy, idle, lost, 0)
    owned = _owned_counts(node.node, ownership)
    listed, base = owned.indexes, owned.counts
    extra: list[GpuReading] = []  # NVML GPUs the owners do not list (`gpu_rows` keeps them)
    for g in readings:
        lost += g.state is gone_state
        if g.index not in listed:
            extra.append(g)
    if not extra:
        return base if not lost else msgspec.structs.replace(base, lost=lost)
    # judged by their processes, as `gpu_rows` judges them
    return GpuCounts(
        base.total + len(extra),
        base.in_use + sum(1 for g in extra if g.processes),
        base.free + sum(1 for g in extra if not g.processes and not g.lost and not g.unreadable),
        lost,
        base.passthrough,
    )


class NodeFacts(NamedTuple):
    """What the fleet view needs of every node, not only of the rows in view."""

    health: Health
    counts: GpuCounts
    unfit: int = 0  # GPUs whose verdict is critical: out of work now
    action_rank: int = 0  # the verdict's action, 0 fit up to 6 service


def node_facts(node: NodeSnapshot) -> NodeFacts:
    """A node's health (its verdict's), GPU counts, GPUs out of work and what its verdict
    asks for: worked out once per reading, then shared by the fleet's summary, its sort and
    the node's row."""
    verdict = node_verdict(node)
    unfit = unfit_gpus(node) if verdict.health is Health.CRITICAL else 0
    return NodeFacts(verdict.health, gpu_counts(node), unfit, verdict.action.rank)


def gpu_count(node: NodeSnapshot) -> int:
    """Every GPU of the node, those NVML cannot see (a guest's) included."""
    return gpu_counts(node).total


def in_use_count(node: NodeSnapshot) -> int:
    """GPUs some tenant holds (from the owners once tenancy has read; else by processes)."""
    return gpu_counts(node).in_use


def tenancy_facet(node: NodeSnapshot) -> tuple[Health | None, str]:
    """The tenancy light: the source's freshness, or the worst ownership inconsistency."""
    health = source_facet(node, "tenancy")
    if health is None:
        return None, PENDING_SOURCES["tenancy"][1]
    problems = ownership_problems(node)
    detail = f"tenancy: {len(problems)} ownership problem(s)" if problems else "tenancy"
    return health, detail


class Facet(msgspec.Struct, frozen=True):
    """One health light on a fleet row: GPU, BMC, fabric or tenancy."""

    letter: str
    name: str
    health: Health | None  # None: that source is not configured on this node
    detail: str


def source_facet(node: NodeSnapshot, source: str) -> Health | None:
    """One source's light on a node: stale while it is, else the worst of the node's verdict
    findings that source gave (critical wins over stale); None when it is not configured."""
    if node.status(source) is None:
        return None
    return source_health(node, source)


def source_health(node: NodeSnapshot, source: str) -> Health:
    """What one source says of a node's health, as its light shows it: stale while it is,
    else the worst of the node's verdict findings that source gave (critical wins)."""
    status = node.status(source)
    worst = Health.STALE if status is not None and status.stale else Health.OK
    for finding in node_verdict(node).findings:
        if finding.source != source:
            continue
        if finding.severity is Severity.CRITICAL:
            return Health.CRITICAL
        if finding.severity is Severity.WARNING and worst is Health.OK:
            worst = Health.WARNING
    return worst


def gpu_facet_health(node: NodeSnapshot) -> Health:
    return source_facet(node, "nvml") or Health.UNKNOWN


def facets(node: NodeSnapshot) -> tuple[Facet, ...]:
    out = [Facet("G", "GPU", gpu_facet_health(node), "NVML")]
    for source, (name, how) in PENDING_SOURCES.items():
        if source == "tenancy":
            health, detail = tenancy_facet(node)
        else:
            health = source_facet(node, source)
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
    return gpu_counts(node).free


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


def stale_words(node: NodeSnapshot, source: str) -> str | None:
    """'fabric stale since 14:02:11 (timeout): last reading shown'; None while it is fresh."""
    status = node.status(source)
    if status is None or not status.stale:
        return None
    return (f"{source} stale since {fmt.clock_time(status.stale_since)} "
            f"({status.error or '?'}): last reading shown")  # fmt: skip


def gpu_state_words(gpu: GpuReading) -> str:
    if gpu.state is GpuState.LOST:
        return f"LOST since {fmt.clock_time(gpu.lost_since)}"
    if gpu.state is GpuState.ERROR:
        return f"error: {gpu.error or '?'}"
    if gpu.state is GpuState.UNREADABLE:
        return f"unreadable: {gpu.error or '?'}"
    return "ok"


def filter_text(node: NodeSnapshot) -> str:
    """What `/` matches a node against: name, model, owners, health, profile."""
    parts = [node.node, node_verdict(node).health.value, node.profile or ""]
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
    """The BMC panel: what of the BMC failed, power, temperatures, fans, PSUs and the
    newest SEL record. (Which Redfish schema was read is the panel's subtitle.)"""
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
    lines.append(f"fans {fans - fans_bad}/{fans} ok · {reading.psu_words}")
    sel = getattr(reading, "sel_recent", ())
    if sel:
        last = sel[-1]
        lines.append(f"SEL {fmt.clock_time(last.at)} {last.sensor}: {last.event}")
    unread = bmc_unread(reading)
    if unread:  # on top, as a stale source is: the panel is short (details: the events)
        lines.insert(0, "not read: " + ", ".join(p.part for p in unread))
    status = node.status("bmc")
    if status is not None and status.stale:
        lines.insert(0, f"stale since {fmt.clock_time(status.stale_since)}: {status.error or '?'}")
    return "\n".join(lines)


def bmc_unread(reading: BmcReading) -> tuple[PartStatus, ...]:
    """The parts of a BMC that failed in its last poll (a Redfish resource, power)."""
    return tuple(p for p in getattr(reading, "parts", ()) if p.enabled and not p.ok)


_NEWER = ("Sensors", "ThermalSubsystem", "PowerSubsystem", "EnvironmentMetrics")
_OLDER = ("Thermal", "Power")


def bmc_schema(reading: BmcReading | None) -> str:
    """Which Redfish resources were read: "Sensors read" (DMTF 2020.4 and later),
    "Thermal/Power read" (the deprecated ones), and where a Chassis has both, that the
    deprecated ones were left out; empty where the BMC has none (IPMI)."""
    kinds = {
        (p.part.rsplit("/", 1)[-1], p.enabled)
        for p in getattr(reading, "parts", ())
        if p.part.startswith("Chassis/")
    }
    read = [
        words
        for words, names in (("Sensors", _NEWER), ("Thermal/Power", _OLDER))
        if any((name, True) in kinds for name in names)
    ]
    left = any((name, False) in kinds for name in _OLDER)
    if not read and not left:
        return ""
    return " and ".join(read or ["nothing"]) + " read" + (", not Thermal/Power" if left else "")


def fabric_panel(node: NodeSnapshot) -> str:
    """The fabric panel: ports up against ports present, those trained below their rate,
    and GPUDirect's kernel module."""
    pending = pending_panel(node, "fabric")
    reading = getattr(node, "fabric", None)
    if pending is not None or reading is None:
        return pending or fmt.NA
    ports = tuple(getattr(reading, "ports", ()))
    down = [p for p in ports if getattr(p, "state", "") != "ACTIVE"]
    slow = [p for p in ports if p.downtrained]
    lines = [f"{len(ports) - len(down)}/{len(ports)} ports active"
             + (f", {len(slow)} downtrained" if slow else "")]  # fmt: skip
    for port in down[:2]:
        lines.append(f"{port.device}/{port.port} {port.state} ({port.phys_state})")
    for port in slow[:2]:
        lines.append(f"{port.name} at {port.rate_text or fmt.NA}, expected "
                     f"{port.expected_rate_gbps:g} Gb/s")  # fmt: skip
    peermem = getattr(reading, "peermem_loaded", None)
    if peermem is not None:
        lines.append(f"nvidia-peermem {'loaded' if peermem else 'NOT loaded'}")
    status = node.status("fabric")
    if status is not None and status.stale:
        lines.insert(0, f"stale since {fmt.clock_time(status.stale_since)}: {status.error or '?'}")
    return "\n".join(lines)
