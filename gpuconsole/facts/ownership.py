"""Who owns each GPU and MIG instance: NVML's view and the tenancy source's, merged.

`resolve_owners` is pure: it joins the PCI inventory (every GPU, NVML-visible or not) to
NVML's GPUs by bus id, kubelet device IDs to GPUs and MIG instances by UUID, guests'
<hostdev> addresses by bus id, and NVML's compute processes to what their cgroup says, and
flags what does not add up instead of hiding it. A GPU NVML lost lists no process: the
processes holding its /dev/nvidiaN (the minor the driver's /proc information gives its bus id)
say who holds it then, system services left out. Consumers (console, exporter) call it on
a NodeSnapshot through `node_ownership`, which remembers the last few answers.
"""

from __future__ import annotations

import enum
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from gpuconsole import format as fmt
from gpuconsole.readings.base import Severity, normal_bus_id
from gpuconsole.readings.nvml import GpuReading, MigInstance, NvmlReading, ProcessReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import (
    ACTIVE_GUEST_STATES,
    DraDevice,
    Guest,
    HostProcess,
    OwnerKind,
    PartStatus,
    PciGpu,
    PodDevice,
    ShareLimits,
    TenancyReading,
)

__all__ = [
    "GpuOwner",
    "Inconsistency",
    "MigOwner",
    "Owner",
    "OwnerKind",
    "Ownership",
    "ProblemKind",
    "ProcessOwner",
    "node_ownership",
    "resolve_owners",
]

# Host drivers that leave an IOMMU group viable for VFIO (the kernel's own list, less pcieport).
_VFIO_SAFE = frozenset({None, "vfio-pci", "pci-stub"})
_ORDER = {
    OwnerKind.VM: 0,
    OwnerKind.POD: 1,
    OwnerKind.JOB: 2,
    OwnerKind.PROCESS: 3,
    OwnerKind.FREE: 4,
    OwnerKind.UNAVAILABLE: 5,
}


class ProblemKind(enum.StrEnum):
    """The inconsistencies ownership flags."""

    VFIO_WITH_PROCESSES = "vfio_with_processes"  # guest's GPU, yet host processes on it
    TWO_OWNERS = "two_owners"  # exclusive claims from more than one owner
    HELD_BUT_LOST = "held_but_lost"  # an owner holds a GPU NVML reports lost
    PARTIAL_IOMMU_GROUP = "partial_iommu_group"  # a guest holds part of an IOMMU group
    GUEST_ON_HOST_DRIVER = "guest_on_host_driver"  # running guest, GPU bound to nvidia
    UNKNOWN_DEVICE = "unknown_device"  # an allocation naming no GPU on this node
    RENUMBERED_DEVICE = "renumbered_device"  # by NVML's index, which changed since
    BAD_GUEST = "bad_guest"  # a domain XML that cannot be read fully
    OVERSUBSCRIBED = "oversubscribed"  # sharers' quotas add up to more than the GPU has


class Inconsistency(msgspec.Struct, frozen=True):
    """Something about ownership that does not add up, and how much it matters."""

    kind: ProblemKind
    severity: Severity
    message: str


class Owner(msgspec.Struct, frozen=True):
    """One holder of a GPU or MIG instance: its kind, tenant, name, identifiers and since."""

    kind: OwnerKind
    name: str  # vm: the domain; pod: namespace/pod; job: its id; process: user; free: pool
    source: str  # which part said so: libvirt, qemu, kubelet, cgroup, nvml, pci
    tenant: str | None = None
    since: float | None = None
    since_observed: bool = False  # since is when gpuconsole first saw it, not when it began
    state: str | None = None  # a guest's: running, paused, shut off
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None  # Kubernetes container name(s), comma-separated
    pod_uid: str | None = None
    container_id: str | None = None  # a runtime's container id (non-Kubernetes containers)
    job: str | None = None
    user: str | None = None
    guest_uuid: str | None = None
    pids: tuple[int, ...] = ()
    replicas: tuple[int, ...] = ()  # time-sliced replicas (uuid::n) this owner holds
    dra: DraDevice | None = None  # the ResourceClaim a pod holds it through (DRA)
    # a sharer's: the quota it runs under (HAMi, MPS) and what its processes use, per NVML
    limits: ShareLimits | None = None
    mem_used_bytes: int | None = None

    @property
    def label(self) -> str:
        """'vm tenant-b-vm7', 'pod team-nlp/train-0', 'job 4711', 'free', ...; what a table shows."""
        if self.kind is OwnerKind.FREE:
            return "free" if self.name in ("", "host") else f"free ({self.name})"
        if self.kind is OwnerKind.UNAVAILABLE:
            return f"unavailable ({self.name})" if self.name else "unavailable"
        state = f" ({self.state})" if self.state and self.state not in ACTIVE_GUEST_STATES else ""
        return f"{self.kind.value} {self.name}{state}"

    @property
    def holds(self) -> bool:
        """True for a real holder (not free or unavailable)."""
        return self.kind not in (OwnerKind.FREE, OwnerKind.UNAVAILABLE)

    def __str__(self) -> str:
        return self.label


class ProcessOwner(msgspec.Struct, frozen=True):
    """Whom one NVML compute process works for: its cgroup's job, pod or container, else its
    user; a process in the only pod on its GPU or MIG instance is that pod's."""

    pid: int
    gpu_instance_id: int | None  # the MIG instance it runs in; None: the whole GPU
    owner: Owner


class MigOwner(msgspec.Struct, frozen=True):
    """The owners of one MIG instance."""

    gpu_instance_id: int
    uuid: str
    profile: str
    owners: tuple[Owner, ...]
    problems: tuple[Inconsistency, ...] = ()

    @property
    def owner(self) -> Owner:
        return self.owners[0]


class GpuOwner(msgspec.Struct, frozen=True):
    """Who owns one GPU (and each of its MIG instances), and what does not add up."""

    bus_id: str  # sysfs form
    uuid: str | None
    index: int | None  # NVML's index; None when NVML cannot see it (vfio-pci)
    model: str | None
    driver: str | None
    iommu_group: int | None
    owners: tuple[Owner, ...]  # never empty: free or unavailable when nobody holds it
    migs: tuple[MigOwner, ...] = ()
    problems: tuple[Inconsistency, ...] = ()
    processes: tuple[ProcessOwner, ...] = ()  # NVML's compute processes, in its order

    @property
    def owner(self) -> Owner:
        return self.owners[0]

    def mig(self, gpu_instance_id: int) -> MigOwner | None:
        """One MIG instance's owners, by its GPU instance id."""
        for mig in self.migs:
            if mig.gpu_instance_id == gpu_instance_id:
                return mig
        return None

    def process_owner(self, pid: int) -> Owner | None:
        """The owner of one of NVML's compute processes on this GPU, by PID."""
        for process in self.processes:
            if process.pid == pid:
                return process.owner
        return None

    @property
    def kind(self) -> OwnerKind:
        return self.owners[0].kind

    @property
    def label(self) -> str:
        """The first owner's label, with a count of the others: 'pod a/b +1'."""
        extra = len(self.owners) - 1
        return self.owner.label + (f" +{extra}" if extra else "")

    @property
    def all_problems(self) -> tuple[Inconsistency, ...]:
        return self.problems + tuple(p for mig in self.migs for p in mig.problems)


@dataclass(frozen=True, slots=True)
class Ownership:
    """Every GPU of a node with its owners, plus problems that belong to no single GPU."""

    gpus: tuple[GpuOwner, ...]
    problems: tuple[Inconsistency, ...] = ()
    parts: tuple[PartStatus, ...] = ()
    _by_key: dict[str, GpuOwner] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for gpu in self.gpus:
            self._by_key[gpu.bus_id] = gpu
            if gpu.uuid:
                self._by_key[gpu.uuid] = gpu

    def gpu(self, key: str) -> GpuOwner | None:
        """A GPU by UUID or bus id (NVML or sysfs form)."""
        found = self._by_key.get(key)
        if found is None and ":" in key:
            found = self._by_key.get(normal_bus_id(key))
        return found

    def owner_of(self, key: str) -> GpuOwner | None:
        """The GPU's ownership (its label reads as the owner), by UUID or bus id."""
        return self.gpu(key)

    @property
    def all_problems(self) -> tuple[Inconsistency, ...]:
        return self.problems + tuple(p for gpu in self.gpus for p in gpu.all_problems)

    def count_by_tenant(self) -> dict[str, int]:
        """GPUs per tenant ("" for owners with no tenant); free and unavailable excluded."""
        counts: dict[str, int] = {}
        for gpu in self.gpus:
            tenants = {o.tenant or "" for o in gpu.owners if o.holds}
            for tenant in tenants:
                counts[tenant] = counts.get(tenant, 0) + 1
        return counts


# --- the merge ------------------------------------------------------------------------


class _Claim(msgspec.Struct):
    owner: Owner
    exclusive: bool  # False: time-sliced replicas, shut-off guests


class _Gpu(msgspec.Struct):
    bus_id: str
    pci: PciGpu | None = None
    nvml: GpuReading | None = None
    claims: list[_Claim] = msgspec.field(default_factory=list)
    mig_claims: dict[int, list[_Claim]] = msgspec.field(default_factory=dict)
    problems: list[Inconsistency] = msgspec.field(default_factory=list)
    mig_problems: dict[int, list[Inconsistency]] = msgspec.field(default_factory=dict)

    @property
    def named_by_nvml(self) -> bool:
        """NVML read its identity: not one it lost first ('unknown-N', model 'unknown')."""
        return self.nvml is not None and ":" in self.nvml.pci_bus_id

    @property
    def uuid(self) -> str | None:
        """NVML's UUID; else the nvidia driver's; None where neither is known."""
        if self.nvml is not None and self.named_by_nvml:
            return self.nvml.uuid
        return self.pci.uuid if self.pci is not None else None

    @property
    def model(self) -> str | None:
        if self.nvml is not None and self.named_by_nvml:
            return self.nvml.name
        return self.pci.model if self.pci is not None else None

    @property
    def driver(self) -> str | None:
        if self.pci is not None:
            return self.pci.driver
        return "nvidia" if self.nvml is not None else None

    @property
    def migs(self) -> tuple[MigInstance, ...]:
        return self.nvml.mig_instances if self.nvml is not None else ()

    def where(self) -> str:
        index = f"GPU {self.nvml.index} " if self.nvml is not None else "GPU "
        return f"{index}({self.bus_id})"


def _guest_owner(guest: Guest) -> Owner:
    return Owner(
        kind=OwnerKind.VM,
        name=guest.name,
        source=guest.source,
        tenant=guest.tenant,
        since=guest.since,
        since_observed=guest.since_observed,
        state=guest.state,
        guest_uuid=guest.uuid,
        pids=(guest.pid,) if guest.pid is not None else (),
    )


def _pod_owner(devices: list[PodDevice]) -> Owner:
    first = devices[0]
    containers = sorted({d.container for d in devices})
    since = [d.since for d in devices if d.since is not None]
    return Owner(
        kind=OwnerKind.POD,
        name=f"{first.namespace}/{first.pod}",
        source="kubelet",
        tenant=first.tenant,
        since=min(since) if since else None,
        since_observed=True,
        namespace=first.namespace,
        pod=first.pod,
        container=",".join(containers),
        replicas=tuple(sorted({d.replica for d in devices if d.replica is not None})),
        dra=next((d.dra for d in devices if d.dra is not None), None),
        pod_uid=next((d.pod_uid for d in devices if d.pod_uid is not None), None),
    )


def _process_key(pid: int, host: HostProcess | None) -> tuple[OwnerKind, str]:
    if host is None:
        return OwnerKind.PROCESS, f"pid {pid}"
    if host.slurm_job is not None:
        return OwnerKind.JOB, host.slurm_job
    if host.pod_uid is not None:
        return OwnerKind.POD, f"pod-uid {host.pod_uid}"
    if host.container_id is not None:
        return OwnerKind.PROCESS, f"container {host.container_id[:12]}"
    return OwnerKind.PROCESS, host.user or f"pid {pid}"


def _process_owners(
    pids: Iterable[int], hosts: dict[int, HostProcess], used: dict[int, int | None]
) -> list[Owner]:
    """Owners for NVML's compute processes, grouped by job, pod, container or user."""
    groups: dict[tuple[OwnerKind, str], list[int]] = {}
    for pid in pids:
        groups.setdefault(_process_key(pid, hosts.get(pid)), []).append(pid)
    owners = []
    for (kind, name), members in groups.items():
        infos = [hosts[p] for p in members if p in hosts]
        first = infos[0] if infos else None
        started = [i.started_at for i in infos if i.started_at is not None]
        memory = [m for p in members if (m := used.get(p)) is not None]
        owners.append(
            Owner(
                kind=kind,
                name=name,
                source="cgroup" if first is not None else "nvml",
                tenant=first.tenant if first else None,
                since=min(started) if started else None,
                user=first.user if first else None,
                job=first.slurm_job if first else None,
                pod_uid=first.pod_uid if first else None,
                container_id=first.container_id if first else None,
                pids=tuple(sorted(members)),
                limits=next((i.limits for i in infos if i.limits is not None), None),
                mem_used_bytes=sum(memory) if memory else None,
            )
        )
    return owners


# A system service's cgroup (systemd's system.slice): nvidia-persistenced, nv-hostengine,
# an exporter keep every /dev/nvidiaN open and run no one's work. A Slurm step, a container
# or a user's session is someone's work.
_SERVICE = re.compile(r"^/(?:init\.scope|system\.slice/[^/]+\.service)(?:/|$)")


def _service(host: HostProcess) -> bool:
    """Whether a process is a system service, holding GPUs for no tenant."""
    if host.slurm_job is not None or host.pod_uid is not None or host.container_id is not None:
        return False
    return _SERVICE.match(host.cgroup) is not None


def _dedupe(claims: list[_Claim]) -> list[_Claim]:
    """One claim per owner identity; libvirt's word beats QEMU's for the same guest."""
    out: dict[tuple[OwnerKind, str], _Claim] = {}
    for claim in claims:
        key = (claim.owner.kind, claim.owner.name)
        if key not in out:
            out[key] = claim
    return list(out.values())


def _settle(
    claims: list[_Claim], where: str, lost: bool
) -> tuple[tuple[Owner, ...], list[Inconsistency]]:
    """Owners in order from a list of claims; two exclusive holders is a problem."""
    claims = _dedupe(claims)
    active = [c for c in claims if c.owner.state is None or c.owner.state in ACTIVE_GUEST_STATES]
    reserved = [c for c in claims if c not in active]
    problems: list[Inconsistency] = []
    holders = active or reserved
    exclusive = {(c.owner.kind, c.owner.name) for c in active if c.exclusive}
    shared = {(c.owner.kind, c.owner.name) for c in active if not c.exclusive}
    if len(exclusive) > 1 or (exclusive and shared):
        names = ", ".join(f"{c.owner.label} ({c.owner.source})" for c in active)
        problems.append(
            Inconsistency(
                ProblemKind.TWO_OWNERS,
                Severity.CRITICAL,
                f"{where} is claimed by {len(exclusive | shared)} owners: {names}",
            )
        )
    if lost:
        for claim in active:
            problems.append(
                Inconsistency(
                    ProblemKind.HELD_BUT_LOST,
                    Severity.CRITICAL,
                    f"{claim.owner.label} holds {where}, which NVML reports lost",
                )
            )
    owners = tuple(sorted((c.owner for c in holders), key=lambda o: _ORDER[o.kind]))
    return owners, problems


def _idle_owner(entry: _Gpu) -> Owner:
    """Free or unavailable, from the driver, for a GPU nobody holds."""
    pci, nvml = entry.pci, entry.nvml
    since = pci.bound_since if pci is not None else None
    if nvml is not None and nvml.lost:
        return Owner(
            OwnerKind.UNAVAILABLE, "lost", "nvml", since=nvml.lost_since, since_observed=True
        )
    driver = entry.driver
    if driver == "vfio-pci":
        return Owner(OwnerKind.FREE, "vfio-pci", "pci", since=since, since_observed=True)
    if driver == "nvidia":
        return Owner(OwnerKind.FREE, "host", "pci", since=since, since_observed=True)
    reason = "no driver bound" if driver is None else f"bound to {driver}"
    return Owner(OwnerKind.UNAVAILABLE, reason, "pci", since=since, since_observed=True)


def resolve_owners(nvml: NvmlReading | None, tenancy: TenancyReading | None) -> Ownership:
    """Every GPU's owners and inconsistencies, from NVML's reading and the tenancy reading."""
    entries: dict[str, _Gpu] = {}
    for pci in tenancy.gpus if tenancy is not None else ():
        bus = pci.bus_id
        entries[bus] = _Gpu(bus, pci=pci)
    pci_by_uuid = {e.pci.uuid: e for e in entries.values() if e.pci is not None and e.pci.uuid}
    unnamed: list[GpuReading] = []
    for gpu in nvml.gpus if nvml is not None else ():
        bus = gpu.pci_bus_id
        if bus not in entries and gpu.uuid in pci_by_uuid:
            bus = pci_by_uuid[gpu.uuid].bus_id  # NVML could not read its bus id (lost at start)
        elif bus not in entries and ":" not in bus:
            unnamed.append(gpu)  # nor its UUID: lost before NVML first read it
            continue
        entries.setdefault(bus, _Gpu(bus)).nvml = gpu
    unread = [e for e in entries.values() if e.nvml is None and e.pci and e.pci.driver == "nvidia"]
    if len(unnamed) == 1 and len(unread) == 1:
        unread[0].nvml = unnamed[0]  # the one nvidia-bound GPU NVML names nowhere is that one
    else:
        for gpu in unnamed:
            entries.setdefault(gpu.pci_bus_id, _Gpu(gpu.pci_bus_id)).nvml = gpu
    by_uuid = {e.uuid: e for e in entries.values() if e.uuid}
    for e in entries.values():  # the driver's UUID, for a GPU NVML lost before it could read it
        if e.pci is not None and e.pci.uuid:
            by_uuid.setdefault(e.pci.uuid, e)
    by_index = {e.nvml.index: e for e in entries.values() if e.nvml is not None}
    by_mig: dict[str, tuple[_Gpu, MigInstance]] = {
        mig.uuid: (e, mig) for e in entries.values() for mig in e.migs
    }
    node_problems: list[Inconsistency] = []
    hosts = {p.pid: p for p in tenancy.processes} if tenancy is not None else {}

    if tenancy is not None:
        _claim_guests(tenancy, entries, node_problems)
        _claim_pods(tenancy, entries, by_uuid, by_index, by_mig, node_problems)

    part = tenancy.part("kubelet") if tenancy is not None else None
    kubelet = part is not None and part.ok and part.enabled
    # the processes holding each /dev/nvidiaN, by the GPU the driver gives that minor
    by_minor: dict[int, list[HostProcess]] = {}
    for host in hosts.values():
        if not _service(host):
            for minor in host.gpu_minors:
                by_minor.setdefault(minor, []).append(host)
    gpus = []
    for bus in sorted(entries):
        entry = entries[bus]
        number = entry.pci.minor if entry.pci is not None else None
        holders = by_minor.get(number, []) if number is not None else []
        unlisted = entry.driver == "nvidia" and (
            (entry.nvml is not None and entry.nvml.lost)
            or (entry.nvml is None and nvml is not None)
        )
        gpus.append(_resolve_gpu(entry, hosts, holders, unlisted, kubelet))
    gpus.sort(key=lambda g: (g.index is None, g.index or 0, g.bus_id))
    parts = tenancy.parts if tenancy is not None else ()
    return Ownership(tuple(gpus), tuple(node_problems), parts)


def _claim_guests(
    tenancy: TenancyReading, entries: dict[str, _Gpu], problems: list[Inconsistency]
) -> None:
    held: dict[str, list[Guest]] = {}
    for guest in tenancy.guests:
        for text in guest.problems:
            problems.append(
                Inconsistency(
                    ProblemKind.BAD_GUEST, Severity.WARNING, f"guest {guest.name}: {text}"
                )
            )
        for bus in guest.bus_ids:
            held.setdefault(bus, []).append(guest)
    for bus, guests in held.items():
        entry = entries.get(bus)
        if entry is None:
            continue  # an NVSwitch, a NIC, an audio function: only IOMMU groups care
        for guest in guests:
            entry.claims.append(_Claim(_guest_owner(guest), exclusive=True))
            if not guest.active:
                continue
            if entry.driver not in (None, "vfio-pci"):
                entry.problems.append(
                    Inconsistency(
                        ProblemKind.GUEST_ON_HOST_DRIVER,
                        Severity.WARNING,
                        f"guest {guest.name} is {guest.state} with {entry.where()}, "
                        f"but the host's {entry.driver} driver holds it",
                    )
                )
            _check_group(entry, guest)


def _check_group(entry: _Gpu, guest: Guest) -> None:
    """A guest must hold every non-bridge function of its GPU's IOMMU group."""
    if entry.pci is None or entry.pci.iommu_group is None:
        return
    mine = set(guest.bus_ids)
    missing = [p for p in entry.pci.iommu_peers if not p.bridge and p.bus_id not in mine]
    if not missing:
        return
    blocking = [p for p in missing if p.driver not in _VFIO_SAFE]
    names = ", ".join(f"{p.bus_id} ({p.driver or 'no driver'})" for p in missing)
    entry.problems.append(
        Inconsistency(
            ProblemKind.PARTIAL_IOMMU_GROUP,
            Severity.CRITICAL if blocking else Severity.WARNING,
            f"guest {guest.name} holds {entry.where()} but not the rest of IOMMU group "
            f"{entry.pci.iommu_group}: {names}",
        )
    )


def _claim_pods(
    tenancy: TenancyReading,
    entries: dict[str, _Gpu],
    by_uuid: dict[str, _Gpu],
    by_index: dict[int, _Gpu],
    by_mig: dict[str, tuple[_Gpu, MigInstance]],
    problems: list[Inconsistency],
) -> None:
    # group one pod's devices per GPU (or MIG instance): one owner, its replicas together
    groups: dict[tuple[str, int | None, str, str], list[PodDevice]] = {}
    for device in tenancy.pod_devices:
        target: tuple[str, int | None] | None = None
        if device.uuid is not None and device.uuid in by_uuid:
            target = (by_uuid[device.uuid].bus_id, None)
        elif device.uuid is not None and device.uuid in by_mig:
            entry, mig = by_mig[device.uuid]
            target = (entry.bus_id, mig.gpu_instance_id)
        elif device.minor is not None:
            target = _by_minor(entries, device)
        elif device.uuid is None and device.index is not None:
            rebound = _rebound_since(tenancy, device.since)
            if rebound:
                problems.append(_renumbered(device, rebound))
                continue
            if device.index in by_index:
                target = (by_index[device.index].bus_id, None)
        if target is None:
            problems.append(
                Inconsistency(
                    ProblemKind.UNKNOWN_DEVICE,
                    Severity.WARNING,
                    f"pod {device.namespace}/{device.pod} (container {device.container}) "
                    f"holds {device.resource} device {device.device_id!r}, "
                    "which names no GPU NVML or sysfs knows on this node",
                )
            )
            continue
        key = (*target, device.namespace, device.pod)
        groups.setdefault(key, []).append(device)
    for (bus, gi, _ns, _pod), devices in groups.items():
        owner = _pod_owner(devices)
        claim = _Claim(owner, exclusive=not owner.replicas)
        entry = entries[bus]
        if gi is None:
            entry.claims.append(claim)
        else:
            entry.mig_claims.setdefault(gi, []).append(claim)


def _by_minor(entries: dict[str, _Gpu], device: PodDevice) -> tuple[str, int | None] | None:
    """The GPU (and MIG instance) a DRA device names by its /dev/nvidiaN minor and, for a MIG
    device, its placement: (bus id, GPU instance id or None), None where none matches."""
    for entry in entries.values():
        if entry.pci is None or entry.pci.minor != device.minor:
            continue
        if device.mig_placement is None:
            return entry.bus_id, None
        start, size = device.mig_placement
        for mig in entry.migs:
            if mig.placement_start == start and mig.slice_count == size:
                return entry.bus_id, mig.gpu_instance_id
        return None
    return None


def _rebound_since(tenancy: TenancyReading, since: float | None) -> list[str]:
    """The GPUs whose driver changed after `since`: NVML has numbered the GPUs again since
    (a GPU that leaves or joins the nvidia driver moves the numbers of those after it)."""
    if since is None:
        return []
    return [g.bus_id for g in tenancy.gpus if g.bound_since is not None and g.bound_since > since]


def _renumbered(device: PodDevice, rebound: list[str]) -> Inconsistency:
    """An index-strategy allocation older than NVML's numbering: its number may be another
    GPU's now, so it is said, not guessed."""
    return Inconsistency(
        ProblemKind.RENUMBERED_DEVICE,
        Severity.WARNING,
        f"pod {device.namespace}/{device.pod} (container {device.container}) holds "
        f"{device.resource} device {device.device_id!r}, NVML's number for a GPU when it "
        f"started; {', '.join(rebound)} changed driver since, so NVML numbers the GPUs "
        "differently now and which GPU that is cannot be told (the device plugin's "
        "uuid strategy names GPUs by UUID)",
    )


def _resolve_gpu(
    entry: _Gpu,
    hosts: dict[int, HostProcess],
    holders: Sequence[HostProcess] = (),
    unlisted: bool = False,
    kubelet: bool = False,
) -> GpuOwner:
    """One GPU's owners. `holders`: the processes with its /dev/nvidiaN open (none of them
    a system service); `unlisted`: NVML cannot list its processes (it lost the GPU), so
    they are its processes; `kubelet`: the kubelet said which pods hold which GPUs."""
    nvml = entry.nvml
    lost = nvml is not None and nvml.lost
    processes = nvml.processes if nvml is not None else ()
    by_gi: dict[int | None, list[ProcessReading]] = {}
    mig_ids = {m.gpu_instance_id for m in entry.migs}
    for p in processes:
        gi = p.gpu_instance_id if p.gpu_instance_id in mig_ids else None
        by_gi.setdefault(gi, []).append(p)

    guests = [c for c in entry.claims if c.owner.kind is OwnerKind.VM]
    in_guest = (
        any(c.owner.state in ACTIVE_GUEST_STATES for c in guests) or entry.driver == "vfio-pci"
    )
    all_pids = [p.pid for p in processes]
    if in_guest and all_pids:
        holder = next((c.owner.label for c in guests if c.owner.state in ACTIVE_GUEST_STATES), None)
        why = f"is held by {holder}" if holder else "is bound to vfio-pci"
        entry.problems.append(
            Inconsistency(
                ProblemKind.VFIO_WITH_PROCESSES,
                Severity.CRITICAL,
                f"{entry.where()} {why}, yet NVML reports host processes "
                f"{', '.join(str(p) for p in sorted(all_pids))}",
            )
        )

    by_pid: dict[int, Owner] = {}
    migs = []
    for mig in entry.migs:
        claims = list(entry.mig_claims.get(mig.gpu_instance_id, []))
        by_pid.update(_add_processes(claims, by_gi.get(mig.gpu_instance_id, []), hosts))
        where = f"MIG {mig.gpu_instance_id} of {entry.where()}"
        owners, problems = _settle(claims, where, lost)
        if not owners:
            owners = (Owner(OwnerKind.FREE, "", "nvml"),)
        problems = list(entry.mig_problems.get(mig.gpu_instance_id, [])) + problems
        migs.append(
            MigOwner(mig.gpu_instance_id, mig.uuid, mig.profile_name, owners, tuple(problems))
        )

    claims = list(entry.claims)
    # a VM-held GPU's host processes are one problem (above), not also a second owner
    by_pid.update(_add_processes(claims, by_gi.get(None, []), hosts, claim=not in_guest))
    if unlisted and not in_guest:
        # NVML lists nothing for a GPU it lost: who still holds its /dev/nvidiaN says. Where
        # the kubelet answered, a pod it did not give this GPU (dcgm-exporter, the device
        # plugin: DaemonSets holding every device) is no owner: the pods it names are (by
        # UID; any pod, where one it names has none)
        given = {c.owner.pod_uid for c in claims if c.owner.kind is OwnerKind.POD}
        holding = [
            h
            for h in holders
            if h.pod_uid is None or not kubelet or h.pod_uid in given or None in given
        ]
        _add_processes(claims, [ProcessReading(h.pid) for h in holding], hosts)
    owners, problems = _settle(claims, entry.where(), lost)
    if migs and not any(o.holds for o in owners):
        # a MIG GPU belongs to whoever holds its instances, each counted once
        held = {o.label: o for mig in migs for o in mig.owners if o.holds}
        owners = tuple(sorted(held.values(), key=lambda o: _ORDER[o.kind])) or owners
    if not owners:
        owners = (_idle_owner(entry),)
    problems += _oversubscribed(entry, owners)
    pci = entry.pci
    return GpuOwner(
        bus_id=entry.bus_id,
        uuid=entry.uuid,
        index=nvml.index if nvml is not None else None,
        model=entry.model,
        driver=entry.driver,
        iommu_group=pci.iommu_group if pci is not None else None,
        owners=owners,
        migs=tuple(migs),
        problems=tuple(entry.problems + problems),
        processes=tuple(
            ProcessOwner(p.pid, p.gpu_instance_id if p.gpu_instance_id in mig_ids else None, owner)
            for p in processes
            if (owner := by_pid.get(p.pid)) is not None
        ),
    )


def _oversubscribed(entry: _Gpu, owners: tuple[Owner, ...]) -> list[Inconsistency]:
    """A shared GPU whose sharers' quotas together exceed its memory or its SMs: each may
    reach its limit and still fail (an MPS or HAMi limit is a ceiling, not a reservation)."""
    limited = [(o, o.limits) for o in owners if o.limits is not None]
    if len(limited) < 2:
        return []
    out = []
    total = entry.nvml.mem_total_bytes if entry.nvml is not None else None
    memory = [lim.mem_bytes for _, lim in limited if lim.mem_bytes is not None]
    if total and sum(memory) > total:
        out.append(f"memory quotas add up to {fmt.gib(sum(memory))}, the GPU has {fmt.gib(total)}")
    sms = [lim.sm_pct for _, lim in limited if lim.sm_pct is not None]
    if sum(sms) > 100.0:
        out.append(f"SM quotas add up to {sum(sms):.0f} %")
    if not out:
        return []
    names = ", ".join(o.label for o, _ in limited)
    return [
        Inconsistency(
            ProblemKind.OVERSUBSCRIBED,
            Severity.WARNING,
            f"{entry.where()} is shared by {names}: {'; '.join(out)}",
        )
    ]


def _add_processes(
    claims: list[_Claim],
    processes: list[ProcessReading],
    hosts: dict[int, HostProcess],
    *,
    claim: bool = True,
) -> dict[int, Owner]:
    """Claims for compute processes (unless `claim` is False), and each PID's owner.

    Processes in a pod's cgroup belong to the pod the kubelet names: with one pod on the GPU
    (or MIG instance) that pod; with several (a shared GPU), the one whose UID the kubelet's
    device checkpoint gives and the cgroup names; else they stay apart, by pod UID.
    """
    if not processes:
        return {}
    used = {p.pid: p.used_mem_bytes for p in processes}
    owners = _process_owners(list(used), hosts, used)
    pods = [k for k, c in enumerate(claims) if c.owner.kind is OwnerKind.POD]
    by_pid: dict[int, Owner] = {}
    for owner in owners:
        mapped = owner
        if owner.kind is OwnerKind.POD and pods:
            k = pods[0] if len(pods) == 1 else _same_pod(claims, pods, owner.pod_uid)
            if k is not None:
                # The kubelet already names this pod (cgroups only know its UID). Its
                # processes' start bounds when the pod took the GPU; their memory and
                # quota are the pod's.
                held = claims[k]
                found = msgspec.structs.replace(
                    held.owner,
                    limits=owner.limits or held.owner.limits,
                    mem_used_bytes=owner.mem_used_bytes,
                    pids=owner.pids,
                )
                if owner.since is not None and (
                    held.owner.since is None or owner.since < held.owner.since
                ):
                    found = msgspec.structs.replace(found, since=owner.since, since_observed=False)
                held = claims[k] = _Claim(found, held.exclusive)
                mapped = held.owner
        elif claim:
            claims.append(_Claim(owner, exclusive=True))
        for pid in owner.pids:
            by_pid[pid] = mapped
    return by_pid


def _same_pod(claims: list[_Claim], pods: list[int], pod_uid: str | None) -> int | None:
    """Which of several pods' claims is the pod with this UID."""
    if pod_uid is None:
        return None
    return next((k for k in pods if claims[k].owner.pod_uid == pod_uid), None)


# --- consumers' entry point -------------------------------------------------------------

# The latest answers per node: the current one and the one before (a viewer a frame behind).
_PER_NODE = 2
# More nodes than any fleet one process shows (a 100,000-GPU site is 12,500 nodes): views ask
# about every node in turn, and a least-recently-used cache smaller than the fleet evicts
# each node just before it is asked again, resolving the whole fleet afresh on every pass.
_MAX_NODES = 65_536
_NvmlKey = tuple[object, ...]


class _Answer(msgspec.Struct):
    key: _NvmlKey
    tenancy: TenancyReading
    ownership: Ownership
    # the NVML reading last asked about with this answer, while it is the node's newest
    # answer: the same reading again is answered without reading it (a publish hands every
    # consumer the nodes that did not change as the very same objects). Only the newest
    # holds one, and it is the reading the node's snapshot holds anyway.
    nvml: NvmlReading | None = None


_cache: OrderedDict[str, list[_Answer]] = OrderedDict()
_cache_lock = threading.Lock()


def _nvml_key(nvml: NvmlReading | None) -> _NvmlKey:
    """What `resolve_owners` reads of NVML's reading, and nothing else.

    NVML's reading is new every poll (utilization, temperatures), but who owns a GPU changes
    only with its identity, state, processes or MIG layout: keyed on those, a fleet of
    1,000 nodes resolves only the nodes where one of them changed.
    """
    if nvml is None:
        return ()
    key: list[object] = []
    for g in nvml.gpus:  # a loop, not nested generators: this runs for every node every poll
        key += (g.index, g.uuid, g.pci_bus_id, g.name, g.state, g.lost_since)
        for p in g.processes:
            key += ("p", p.pid, p.gpu_instance_id)
        for m in g.mig_instances:
            key += ("m", m.gpu_instance_id, m.uuid, m.profile_name)
    return tuple(key)


def _same_tenancy(seen: TenancyReading, tenancy: TenancyReading) -> bool:
    """Whether two tenancy readings say the same, whenever each was read: its source reads
    every few seconds and mostly finds what it found before, which resolves to the same
    owners (`resolve_owners` does not read when)."""
    return seen is tenancy or msgspec.structs.replace(tenancy, at=seen.at) == seen


def node_ownership(node: NodeSnapshot) -> Ownership | None:
    """The ownership of a node's GPUs, or None until its tenancy source has read once.

    Snapshots are immutable and shared by every viewer, so the answer is remembered per
    node, tenancy reading and what ownership reads of NVML's: ten consoles, and a node whose
    load moves every second, resolve it once per change of owner-relevant facts; the same
    readings asked again (a node the last publish left as it was) are not even looked at.
    Only the last two answers of a node are kept, so old readings do not pile up on a big
    fleet.
    """
    tenancy = node.tenancy
    if tenancy is None:
        return None
    nvml = node.nvml
    with _cache_lock:
        entries = _cache.get(node.node)
        if entries and entries[0].tenancy is tenancy and entries[0].nvml is nvml is not None:
            return entries[0].ownership
    key = _nvml_key(nvml)
    with _cache_lock:
        entries = _cache.get(node.node) or []
        for at, seen in enumerate(entries):
            if seen.key == key and _same_tenancy(seen.tenancy, tenancy):
                seen.tenancy = tenancy  # asked by identity next time
                if at == 0:
                    seen.nvml = nvml
                _cache.move_to_end(node.node)
                return seen.ownership
    result = resolve_owners(nvml, tenancy)
    with _cache_lock:
        entries = _cache.setdefault(node.node, [])
        for seen in entries:
            seen.nvml = None
        entries.insert(0, _Answer(key, tenancy, result, nvml))
        del entries[_PER_NODE:]
        _cache.move_to_end(node.node)
        while len(_cache) > _MAX_NODES:
            _cache.popitem(last=False)
    return result
