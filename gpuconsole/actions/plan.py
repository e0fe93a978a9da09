"""Reassigning GPUs, planned: explicit steps and the preconditions they need, from a snapshot.

`make_plan` is pure: it reads a NodeSnapshot (NVML, tenancy, fabric), the ownership merged
from it and what the Kubernetes layer says is cordoned, and returns a Plan that says every
step before anything runs. A failed precondition blocks the plan and says what to do.
Each rule returns its part of the plan (preconditions, steps, notes); `make_plan` joins the
parts in order and puts the steps in StepKind's order. Placement help (which GPUs to ask
for) lives in placement.py.

Targets (what each means for the layers below):

- free: bound to nvidia, driver_override cleared, cordoned from Kubernetes (the host pool:
  Slurm, notebooks, processes).
- k8s: bound to nvidia, not cordoned: the device plugin hands it to one container at a time.
- drained: unbound with driver_override "none" (nothing can bind it), cordoned.
- vm:NAME: bound to vfio-pci with its whole IOMMU group, a <hostdev> in guest NAME, cordoned.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import msgspec

from gpuconsole.facts.inventory import gpu_name, short_bus_id
from gpuconsole.facts.ownership import (
    GpuOwner,
    Owner,
    Ownership,
    node_ownership,
    resolve_owners,
)
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.hardware import (
    A100_BOARD_GPUS,
    A100_BOARD_SWITCHES,
    A100_PARTITIONS,
    A100_SWITCHES,
    H100_PARTITIONS,
    H100_SWITCHES,
)
from gpuconsole.readings.base import Severity
from gpuconsole.readings.nvml import GpuReading, RemoteKind
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import Guest, OwnerKind, PciGpu

__all__ = [
    "Layer",
    "Plan",
    "PlanContext",
    "Precondition",
    "Step",
    "StepKind",
    "Target",
    "TargetKind",
    "already_there",
    "bus_positions",
    "find_gpu",
    "guest_named",
    "make_plan",
    "nvswitch_board",
    "owners_of",
    "partition_switches",
]

HOST_DRIVER = "nvidia"
VFIO_DRIVER = "vfio-pci"
BLOCK_DRIVER = "none"  # driver_override "none": nothing binds the function
# Functions that go to a guest with their GPU: display/3D, audio (HDMI), other bridges
# (NVSwitch). PCI bridges (0x0604) stay with the host; anything else in the group stops a plan.
_FOLLOWING_CLASSES = (0x03, 0x0403, 0x0680)


class TargetKind(enum.StrEnum):
    """Where a GPU can go."""

    FREE = "free"
    DRAINED = "drained"
    VM = "vm"
    K8S = "k8s"


@dataclass(frozen=True, slots=True)
class Target:
    """A target as `--to` spells it: free, drained, k8s or vm:NAME."""

    kind: TargetKind
    guest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Target:
        word, _, name = text.strip().partition(":")
        try:
            kind = TargetKind(word.lower())
        except ValueError:
            raise ValueError(f"unknown target {text!r}: free, drained, k8s or vm:NAME") from None
        if kind is TargetKind.VM:
            if not name:
                raise ValueError("a vm target names its guest: vm:NAME")
            return cls(kind, name)
        if name:
            raise ValueError(f"target {word} takes no name")
        return cls(kind)

    @property
    def driver(self) -> str | None:
        """The driver its GPUs end bound to (None: unbound)."""
        return {TargetKind.VM: VFIO_DRIVER, TargetKind.DRAINED: None}.get(self.kind, HOST_DRIVER)

    @property
    def override(self) -> str | None:
        """The driver_override its GPUs end with (None: cleared)."""
        if self.driver is None:
            return BLOCK_DRIVER
        return None if self.driver == HOST_DRIVER else self.driver

    @property
    def cordoned(self) -> bool:
        """Whether its GPUs are out of Kubernetes scheduling."""
        return self.kind is not TargetKind.K8S

    def __str__(self) -> str:
        return f"vm:{self.guest}" if self.kind is TargetKind.VM else self.kind.value


class Layer(enum.StrEnum):
    """Which driver carries a step out."""

    PCI = "pci"  # sysfs: driver_override, unbind, drivers_probe, reset (vfio driver)
    GUESTS = "guests"  # libvirt: the domain's <hostdev>
    KUBERNETES = "kubernetes"  # the API server: cordon, evict
    GPU = "gpu"  # the nvidia driver: a GPU reset (nvidia-smi -r)
    SLURM = "slurm"  # the Slurm controller: drain the node
    BMC = "bmc"  # the node's BMC: power


class StepKind(enum.StrEnum):
    """The steps a reassignment is made of, in the order they run."""

    CORDON = "cordon"  # take the GPU out of Kubernetes scheduling
    EVICT = "evict"  # evict the pod holding it and wait until it is gone
    CHECK_IDLE = "check_idle"  # no process holds /dev/nvidiaN
    DETACH = "detach"  # remove its <hostdev> from a shut-off guest's definition
    OVERRIDE = "override"  # driver_override of every function of the IOMMU group
    UNBIND = "unbind"  # from the driver holding it
    PROBE = "probe"  # drivers_probe: the override's driver binds it
    RESET = "reset"  # function reset (applies pending row remaps)
    ATTACH = "attach"  # add the <hostdev>s to the guest; hotplug or restart a running one
    UNCORDON = "uncordon"  # back into Kubernetes scheduling
    VERIFY = "verify"  # UUID visible or vfio-bound, fabric complete, no new XID, no remap
    # remediation's own (gpuconsole.actions.remediation), in the order it writes them
    SLURM_DRAIN = "slurm_drain"  # scontrol update state=drain: no new job starts there
    NOTIFY = "notify"  # tell a guest's tenant its GPU is being drained
    WAIT_IDLE = "wait_idle"  # until no owner, process or NVLink peer of its workload is left
    GPU_RESET = "gpu_reset"  # nvidia-smi -r -i BUS: all of the GPU's state cleared
    POWER_CYCLE = "power_cycle"  # through the node's BMC
    MARK_SERVICE = "mark_service"  # it goes back to the vendor (or to be reseated)

    @property
    def mutates(self) -> bool:
        return self not in (StepKind.CHECK_IDLE, StepKind.VERIFY, StepKind.WAIT_IDLE)

    @property
    def reversible(self) -> bool:
        """An evicted pod cannot be un-evicted, a told tenant untold, a reset or power cycle
        unmade; everything else can be put back."""
        return self not in (
            StepKind.EVICT,
            StepKind.NOTIFY,
            StepKind.GPU_RESET,
            StepKind.POWER_CYCLE,
            StepKind.MARK_SERVICE,
        )

    @property
    def repeatable(self) -> bool:
        """Whether recovery may run it again when a crash left it unrecorded: a power cycle
        may have gone through, and a second one would take the node down again."""
        return self is not StepKind.POWER_CYCLE


@dataclass(frozen=True, slots=True)
class Step:
    """One step: what it does, to which functions, and what was there before (for undo)."""

    kind: StepKind
    layer: Layer | None  # None: the executor's own check
    title: str
    gpus: tuple[str, ...] = ()  # GPU bus ids (sysfs form) the step is about
    uuids: tuple[str, ...] = ()
    minors: tuple[int, ...] = ()  # /dev/nvidiaN, for the idle check
    functions: tuple[str, ...] = ()  # every PCI function it touches
    driver: str | None = None  # the driver the functions go to (None: unbound)
    before_drivers: tuple[str, ...] = ()  # per function, "" for unbound
    before_overrides: tuple[str, ...] = ()  # per function, "" for cleared
    guest: str | None = None
    pod: str | None = None  # namespace/name
    xids: tuple[int, ...] = ()  # last XID per GPU at plan time (-1: none), for VERIFY
    owners: tuple[str, ...] = ()  # WAIT_IDLE: the workloads (owner labels) that must end

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        values = dict(data)
        values["kind"] = StepKind(values["kind"])
        values["layer"] = Layer(values["layer"]) if values.get("layer") else None
        for name in ("gpus", "uuids", "minors", "functions", "before_drivers"):
            values[name] = tuple(values.get(name, ()))
        values["before_overrides"] = tuple(values.get("before_overrides", ()))
        values["xids"] = tuple(values.get("xids", ()))
        values["owners"] = tuple(values.get("owners", ()))
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Precondition:
    """Something that must hold before the plan runs; when it does not, what to do."""

    name: str
    ok: bool
    detail: str
    remedy: str = ""

    def __str__(self) -> str:
        mark = "ok" if self.ok else "STOP"
        text = f"[{mark}] {self.name}: {self.detail}"
        return text + (f" -> {self.remedy}" if not self.ok and self.remedy else "")


@dataclass(frozen=True, slots=True)
class Plan:
    """What moving some GPUs of one node to a target takes: preconditions, then steps."""

    node: str
    target: Target
    gpus: tuple[str, ...]  # bus ids, sysfs form: what the plan acts on
    labels: tuple[str, ...]  # "GPU 2 (0000:52:00.0)", for people
    indexes: tuple[int | None, ...]  # NVML's, as the console showed them: only labels
    owners: tuple[str, ...]  # each GPU's owner label when planned
    preconditions: tuple[Precondition, ...]
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()
    simulated: bool = False
    uuids: tuple[str, ...] = ()  # per GPU, "" where unknown
    # NVML does not number every GPU of the node (some left its driver): its numbers are
    # not the ones it gave before, nor those it will give once they return
    renumbered: bool = False
    # a remediation's: the verdict's action it carries out (facts.verdict.Action's value);
    # "" for a reassignment
    remedy: str = ""

    @property
    def action(self) -> str:
        """What the plan does, as events, refusals and the audit log name it."""
        return f"remediate {self.remedy}" if self.remedy else f"assign {self.target}"

    @property
    def blocked(self) -> bool:
        return any(not p.ok for p in self.preconditions)

    @property
    def failed(self) -> tuple[Precondition, ...]:
        return tuple(p for p in self.preconditions if not p.ok)

    def confirmations(self) -> tuple[str, ...]:
        """What a person may type to confirm: the node name; for a single GPU also its
        number and its bus id as the console shows them ('4', 'c3:00.0'); for a
        remediation, those of the GPU it repairs (first), however many GPUs it resets with
        it: the operator names the GPU they asked to repair, as for one reset alone. A
        node's power cycle stops all of it: the node name alone, as the power dialog asks."""
        words = [self.node]
        if self.remedy == Action.REBOOT_NODE.value:
            return tuple(words)
        if len(self.gpus) == 1 or (self.remedy and self.gpus):
            if self.indexes and self.indexes[0] is not None:
                words.append(str(self.indexes[0]))
            words.append(short_bus_id(self.gpus[0]))
        return tuple(words)

    def confirmation_words(self, *, quoted: bool = False) -> str:
        """The confirmations as a prompt says them: 'dgx-003, 4 or c3:00.0'; a remediation
        of several GPUs says how many ('dgx1-001, 2 or 0a:00.0 (resets 8 GPUs together)')."""
        *others, last = (repr(w) if quoted else w for w in self.confirmations())
        words = f"{', '.join(others)} or {last}" if others else last
        if self.remedy and len(self.gpus) > 1:
            verb = "resets" if self.remedy == "reset_gpu" else "acts on"
            words += f" ({verb} {len(self.gpus)} GPUs together)"
        return words

    def describe(self) -> str:
        """The plan as text: what moves where, preconditions, notes, numbered steps."""
        head = f"{self.node}: {', '.join(self.labels)} -> {self.remedy or self.target}"
        lines = [head + ("  (simulated)" if self.simulated else "")]
        for gpu, owner in zip(self.labels, self.owners, strict=True):
            lines.append(f"  {gpu} now: {owner}")
        lines.append("Preconditions:")
        lines += [f"  {p}" for p in self.preconditions]
        if self.notes:
            lines.append("Notes:")
            lines += [f"  {n}" for n in self.notes]
        if not self.blocked:
            lines.append("Steps:")
            lines += [f"  {k}. {s.title}" for k, s in enumerate(self.steps, start=1)]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "target": str(self.target),
            "gpus": list(self.gpus),
            "labels": list(self.labels),
            "indexes": list(self.indexes),
            "owners": list(self.owners),
            "steps": [s.to_json() for s in self.steps],
            "notes": list(self.notes),
            "simulated": self.simulated,
            "uuids": list(self.uuids),
            "renumbered": self.renumbered,
            "remedy": self.remedy,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(
            node=data["node"],
            target=Target.parse(data["target"]),
            gpus=tuple(data["gpus"]),
            labels=tuple(data["labels"]),
            indexes=tuple(data["indexes"]),
            owners=tuple(data["owners"]),
            preconditions=(),
            steps=tuple(Step.from_json(s) for s in data["steps"]),
            notes=tuple(data.get("notes", ())),
            simulated=bool(data.get("simulated", False)),
            uuids=tuple(data.get("uuids", ())),
            renumbered=bool(data.get("renumbered", False)),
            remedy=str(data.get("remedy", "")),
        )


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What the plan needs besides the snapshot: the Kubernetes layer, if any, and its cordons."""

    kubernetes: bool = False
    cordoned: frozenset[str] = frozenset()  # GPU UUIDs out of Kubernetes scheduling
    slurm: bool = False  # a Slurm controller to drain the node through
    gpu_reset: bool = False  # a way to reset a GPU (nvidia-smi -r)
    bmc: bool = False  # a BMC to power the node through


# --- finding GPUs ---------------------------------------------------------------------


def owners_of(node: NodeSnapshot) -> Ownership:
    found = node_ownership(node)
    owners = found if found is not None else resolve_owners(node.nvml, node.tenancy)
    # A GPU lost before NVML first read it has no bus id or UUID there; sysfs still has it,
    # bound to nvidia yet unseen by NVML. One of each: they are the same GPU.
    lost = [g for g in owners.gpus if g.index is not None and ":" not in g.bus_id]
    unseen = [g for g in owners.gpus if g.index is None and g.driver == "nvidia"]
    if len(lost) == 1 and len(unseen) == 1:
        merged = msgspec.structs.replace(unseen[0], index=lost[0].index, owners=lost[0].owners)
        rest = [g for g in owners.gpus if g is not lost[0] and g is not unseen[0]]
        owners = Ownership(tuple(sorted([*rest, merged], key=lambda g: g.bus_id)), owners.problems)
    # NVML's UUID for such a GPU is only a placeholder: the nvidia driver's is the one
    # Kubernetes and the final check know it by
    driver = {p.bus_id: p.uuid for p in node.tenancy.gpus if p.uuid} if node.tenancy else {}
    unread = {g.index for g in node.gpus if ":" not in g.pci_bus_id}
    if any(g.index in unread and g.bus_id in driver for g in owners.gpus):
        named = tuple(
            msgspec.structs.replace(g, uuid=driver[g.bus_id])
            if g.index in unread and g.bus_id in driver
            else g
            for g in owners.gpus
        )
        owners = Ownership(named, owners.problems, owners.parts)
    return owners


def find_gpu(node: NodeSnapshot, key: str, ownership: Ownership | None = None) -> GpuOwner | None:
    """A GPU by bus id (either form, or without the domain), UUID, or the number the console
    shows it by now (NVML's index: a GPU on vfio-pci has none)."""
    owners = ownership or owners_of(node)
    text = key.strip()
    if text.isascii() and text.isdigit():
        return next((g for g in owners.gpus if g.index == int(text)), None)
    return owners.gpu(text) or owners.gpu(text.upper()) or owners.gpu(text.lower())


def _label(gpu: GpuOwner) -> str:
    """'GPU 4 (0000:c3:00.0)': the console's name for it and the bus id a plan acts on."""
    if gpu.index is None:
        return f"GPU {gpu.bus_id}"
    return f"{gpu_name(gpu.index, gpu.bus_id)} ({gpu.bus_id})"


def _word(gpu: GpuOwner) -> str:
    """A GPU as `gpuconsole assign` takes it and the console shows it: '4', or '52:00.0'."""
    return str(gpu.index) if gpu.index is not None else short_bus_id(gpu.bus_id)


# --- the rules ------------------------------------------------------------------------


def _pci(node: NodeSnapshot, bus_id: str) -> PciGpu | None:
    for gpu in node.tenancy.gpus if node.tenancy is not None else ():
        if gpu.bus_id == bus_id:
            return gpu
    return None


def _nvml(node: NodeSnapshot, gpu: GpuOwner) -> GpuReading | None:
    if node.nvml is None or gpu.index is None:
        return None
    return node.nvml.gpu(gpu.index)


def guest_named(node: NodeSnapshot, name: str) -> Guest | None:
    for guest in node.tenancy.guests if node.tenancy is not None else ():
        if guest.name == name:
            return guest
    return None


def _guests(node: NodeSnapshot) -> tuple[Guest, ...]:
    return node.tenancy.guests if node.tenancy is not None else ()


def _held(guest: Guest) -> set[str]:
    """The PCI functions a guest's definition holds, by bus id."""
    return set(guest.bus_ids)


def _guests_holding(node: NodeSnapshot, bus_id: str) -> list[Guest]:
    return [g for g in _guests(node) if bus_id in _held(g)]


def nvswitch_board(node: NodeSnapshot) -> tuple[str | None, tuple[str, ...]]:
    """('hopper'|'ampere'|..., NVSwitch bus ids) on an NVSwitch baseboard; (None, ()) if not.

    NVML names a switch at the far end of each GPU's NVLinks; a GPU passed through is gone
    from NVML, so the functions guests hold that are no GPU (nor in a GPU's IOMMU group)
    count as switches too: a guest with all eight GPUs still shows its switches.
    """
    switches: set[str] = set()
    arch = None
    for gpu in node.gpus:
        for link in gpu.nvlinks:
            if link.remote_kind is RemoteKind.NVSWITCH:
                arch = gpu.architecture or ("hopper" if "H100" in gpu.name else "ampere")
                if link.remote_pci_bus_id:
                    switches.add(link.remote_pci_bus_id)
    if arch is None and node.profile in ("dgx-h100", "dgx-a100"):
        arch = "hopper" if node.profile == "dgx-h100" else "ampere"
    if arch is not None and node.tenancy is not None:
        known = {g.bus_id for g in node.tenancy.gpus}
        known |= {p.bus_id for g in node.tenancy.gpus for p in g.iommu_peers}
        for guest in node.tenancy.guests:
            switches |= set(guest.bus_ids) - known
    return arch, tuple(sorted(switches))


def _a100_partition_ok(indexes: Sequence[int]) -> bool:
    """A100 partitions of 2, 4, 8 or 16 are fixed sets of neighbours (FM's default table)."""
    n = len(indexes)
    if n == 1:
        return True
    if n not in A100_PARTITIONS:
        return False
    first = min(indexes)
    return first % n == 0 and sorted(indexes) == list(range(first, first + n))


def partition_switches(
    arch: str, switches: Sequence[str], slots: Sequence[int], total: int
) -> tuple[str, ...] | None:
    """The NVSwitches a full-passthrough guest holding the GPUs at `slots` takes with them;
    None when the baseboard has no such partition.

    A100 partitions nest (a pair inside a quad inside a board), and so do their switches: a
    board's six in bus order, three per quad, one per pair, so that neighbouring partitions
    never share one. Fabric Manager's table for the baseboard is the authority; this
    follows its counts (16/8/4/2/1 GPUs with 12/6/3/1/0 switches).
    """
    n = len(slots)
    if n == 0:
        return ()
    ordered = sorted(switches)
    if arch == "hopper":
        if n == 1:
            return ()
        return tuple(ordered) if n == total and n in H100_PARTITIONS else None
    if not _a100_partition_ok(slots):
        return None
    if n == 1:
        return ()
    board, local = divmod(min(slots), A100_BOARD_GPUS)
    mine = ordered[board * A100_BOARD_SWITCHES :]
    if n >= A100_BOARD_GPUS:
        return tuple(mine[: A100_BOARD_SWITCHES * (n // A100_BOARD_GPUS)])
    quad = mine[3 * (local // 4) : 3 * (local // 4) + 3]
    return tuple(quad) if n == 4 else tuple(quad[(local % 4) // 2 : (local % 4) // 2 + 1])


def bus_positions(ownership: Ownership) -> dict[str, int]:
    """Each GPU's place in PCI bus order, by bus id: what partitions are made of. Fabric
    Manager names a partition's GPUs by their place on the baseboard, which bus order
    follows; NVML's indexes would shift as GPUs leave for vfio-pci."""
    return {bus: k for k, bus in enumerate(sorted(g.bus_id for g in ownership.gpus))}


def _console_order(gpu: GpuOwner) -> tuple[bool, int, str]:
    """NVML's numbers first, in order, then the GPUs it cannot see, by bus id."""
    return gpu.index is None, gpu.index or 0, gpu.bus_id


def _names(ownership: Ownership, buses: Iterable[str]) -> str:
    """GPUs as the console shows them: "4-7", "4+6", "0+52:00.0"."""
    wanted = set(buses)
    gpus = sorted((g for g in ownership.gpus if g.bus_id in wanted), key=_console_order)
    numbers = [g.index for g in gpus if g.index is not None]
    every_numbered = len(numbers) == len(gpus)
    if every_numbered and len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}"
    return "+".join(_word(g) for g in gpus)


def _shapes(arch: str, ownership: Ownership) -> str:
    """The partitions a baseboard allows, in words, for a refusal's remedy."""
    total = len(ownership.gpus)
    if arch == "hopper":
        return f"1 GPU, or all {total} once every one of them is free"
    order = sorted(g.bus_id for g in ownership.gpus)
    sets = [
        _names(ownership, order[first : first + n])
        for n in (2, 4, 8, 16)
        if n <= total
        for first in range(0, total - n + 1, n)
    ]
    return "1 GPU, or GPUs " + ", ".join(sets)


def _following(pci: PciGpu) -> tuple[list[str], list[str]]:
    """(functions that move with the GPU, functions in its group that cannot)."""
    moving, stuck = [], []
    for peer in pci.iommu_peers:
        if peer.bridge:
            continue
        cls = peer.pci_class
        if cls is not None and (cls >> 16 == 0x03 or cls >> 8 in _FOLLOWING_CLASSES[1:]):
            moving.append(peer.bus_id)
        else:
            stuck.append(f"{peer.bus_id} ({peer.driver or 'no driver'})")
    return moving, stuck


# --- composing a plan -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Part:
    """What one rule adds to a plan: preconditions, steps, notes, and the PCI functions
    that go to a guest target (its ATTACH step's <hostdev>s)."""

    conds: tuple[Precondition, ...] = ()
    steps: tuple[Step, ...] = ()
    notes: tuple[str, ...] = ()
    attach: tuple[str, ...] = ()


def _join(*parts: _Part) -> _Part:
    """The parts one after the other, in order."""
    return _Part(
        tuple(c for p in parts for c in p.conds),
        tuple(s for p in parts for s in p.steps),
        tuple(n for p in parts for n in p.notes),
        tuple(f for p in parts for f in p.attach),
    )


# Steps run in StepKind's order: switch steps first, then per GPU, cordon and evict before
# any binding changes.
_STEP_ORDER = {kind: k for k, kind in enumerate(StepKind)}
_SUSPENDED = ("paused", "pmsuspended")


def make_plan(
    node: NodeSnapshot,
    keys: Sequence[str],
    target: Target,
    context: PlanContext | None = None,
) -> Plan:
    """The plan to move the GPUs named by `keys` (index, bus id or UUID) to `target`."""
    ctx = context or PlanContext()
    ownership = owners_of(node)
    gpus, unknown = _lookup(node, keys, ownership)
    part = _join(
        unknown,
        _tenancy_known(node),
        _target_checks(node, target, ctx),
        _switch_part(node, target, gpus),
        *(_gpu_part(node, gpu, target, ctx) for gpu in gpus),
    )
    part = _join(part, _closing(node, target, gpus, part.attach))
    return Plan(
        node=node.node,
        target=target,
        gpus=tuple(g.bus_id for g in gpus),
        labels=tuple(_label(g) for g in gpus),
        indexes=tuple(g.index for g in gpus),
        owners=tuple(g.label for g in gpus),
        preconditions=part.conds,
        steps=tuple(sorted(part.steps, key=lambda s: _STEP_ORDER[s.kind])),
        notes=tuple(dict.fromkeys(part.notes)),
        simulated=node.simulated,
        uuids=tuple(g.uuid or "" for g in gpus),
        renumbered=any(g.index is None for g in ownership.gpus),
    )


def _lookup(
    node: NodeSnapshot, keys: Sequence[str], ownership: Ownership
) -> tuple[list[GpuOwner], _Part]:
    """The GPUs `keys` name, each once, in the order asked; a failed precondition for each
    key that names none."""
    found = [(key, find_gpu(node, key, ownership)) for key in keys]
    gpus: dict[str, GpuOwner] = {}
    for _key, gpu in found:
        if gpu is not None:
            gpus.setdefault(gpu.bus_id, gpu)
    missing = tuple(_no_gpu(node, k, ownership) for k, g in found if g is None)
    return list(gpus.values()), _Part(missing)


def _no_gpu(node: NodeSnapshot, key: str, ownership: Ownership) -> Precondition:
    detail = f"no GPU {key!r} on {node.node}"
    if key.strip().isdigit():
        numbered = sum(1 for g in ownership.gpus if g.index is not None)
        detail += f": NVML numbers {numbered} GPUs there, 0-{numbered - 1}" if numbered else ""
    return Precondition(
        "GPU exists",
        False,
        detail,
        "name it by bus id, UUID or the number the console shows it by (a GPU on vfio-pci "
        "has none); gpuconsole snapshot lists them",
    )


def _tenancy_known(node: NodeSnapshot) -> _Part:
    if node.tenancy is not None:
        return _Part()
    return _Part(
        (
            Precondition(
                "ownership known",
                False,
                f"the tenancy source has not read {node.node}",
                "enable [tenancy] and wait for its first reading",
            ),
        )
    )


def _target_checks(node: NodeSnapshot, target: Target, ctx: PlanContext) -> _Part:
    """What the target itself needs: a guest to go to, a Kubernetes API to hand GPUs to."""
    if target.kind is TargetKind.VM:
        return _guest_ready(node, target)
    if target.kind is TargetKind.K8S and not ctx.kubernetes:
        return _Part((_no_kubernetes(node),))
    return _Part()


def _no_kubernetes(node: NodeSnapshot) -> Precondition:
    return Precondition(
        "Kubernetes reachable",
        False,
        f"no Kubernetes API configured for {node.node}",
        "set [actions] kubernetes = true (and kubeconfig) in the config",
    )


def _guest_ready(node: NodeSnapshot, target: Target) -> _Part:
    """The guest is defined and not suspended; a running one is told how its GPUs arrive."""
    guest = guest_named(node, target.guest or "")
    if guest is None:
        return _Part((_no_guest(node, target),))
    if guest.state in _SUSPENDED:
        return _Part((_guest_suspended(guest),))
    defined = Precondition("guest defined", True, f"{guest.name} ({guest.state})")
    if not guest.active:
        return _Part((defined,))
    note = (
        f"guest {guest.name} is {guest.state}: its GPUs are hotplugged where the "
        "hypervisor can, otherwise it restarts"
    )
    return _Part((defined,), notes=(note,))


def _no_guest(node: NodeSnapshot, target: Target) -> Precondition:
    return Precondition(
        "guest defined",
        False,
        f"no guest {target.guest!r} on {node.node}",
        "define it first (virsh define), then ask again",
    )


def _guest_suspended(guest: Guest) -> Precondition:
    return Precondition(
        "guest not suspended",
        False,
        f"guest {guest.name} is {guest.state}",
        f"resume it or shut it down (virsh shutdown {guest.name}); "
        "passthrough guests cannot be suspended",
    )


def _closing(
    node: NodeSnapshot, target: Target, gpus: Sequence[GpuOwner], attach: Sequence[str]
) -> _Part:
    """The steps that end a plan: attach everything to the guest, then the final check."""
    if not gpus:
        return _Part()
    verify = _verify(node, gpus, target)
    if target.kind is TargetKind.VM and target.guest:
        return _Part(steps=(_attach(target, gpus, attach), verify))
    return _Part(steps=(verify,))


def _attach(target: Target, gpus: Sequence[GpuOwner], functions: Sequence[str]) -> Step:
    return Step(
        StepKind.ATTACH,
        Layer.GUESTS,
        f"define {len(functions)} <hostdev> in guest {target.guest} "
        "(hotplug, or restart it if it runs)",
        gpus=tuple(g.bus_id for g in gpus),
        functions=tuple(dict.fromkeys(functions)),
        guest=target.guest,
    )


_VERIFIED = {
    HOST_DRIVER: "UUID visible to nvidia, fabric state complete, no new XID, no remap pending",
    VFIO_DRIVER: "every function bound to vfio-pci and in the guest",
}


def _verify(node: NodeSnapshot, gpus: Sequence[GpuOwner], target: Target) -> Step:
    what = _VERIFIED.get(target.driver or "", "unbound, nothing may bind it")
    return Step(
        StepKind.VERIFY,
        None,
        f"final check: {what}",
        gpus=tuple(g.bus_id for g in gpus),
        uuids=tuple(g.uuid or "" for g in gpus),
        driver=target.driver,
        guest=target.guest,
        xids=tuple(node.last_xid.get(g.uuid, -1) if g.uuid else -1 for g in gpus),
    )


# --- NVSwitches -------------------------------------------------------------------------

# A guest that gives up NVSwitches in a plan: its name, and those switches.
_Release = tuple[str, tuple[str, ...]]

_H100_RULE = "H100 HGX: a guest gets 1 GPU (NVLinks disabled) or all 8 (with the 4 NVSwitches)"
_A100_RULE = (
    "A100 HGX: a guest gets 1, 2, 4, 8 or 16 neighbouring GPUs (with 0, 1, 3, 6 or 12 NVSwitches)"
)
_SINGLE_GPU_NOTE = (
    "single-GPU passthrough on an NVSwitch baseboard: the guest must run with its "
    "NVLinks disabled (NVreg_NvLinkDisable=1), or it hangs at fabric state in progress"
)


def _switch_part(node: NodeSnapshot, target: Target, gpus: Sequence[GpuOwner]) -> _Part:
    """The NVSwitches a guest's partition takes with it, and those guests losing GPUs give
    up: preconditions, notes, and the steps that move them."""
    refusals, releases = _releases(node, target, gpus)
    released = {s for _guest, release in releases for s in release}
    taken = _partition(node, target, gpus, released) if target.kind is TargetKind.VM else _Part()
    # a switch another guest releases in this plan is on vfio-pci already: it only
    # changes definitions
    bind = [s for s in taken.attach if s not in released]
    binding = _pci_steps(node, bind, VFIO_DRIVER, "NVSwitches", gpu_bus=()) if bind else []
    gives = [_release_part(node, guest, release, taken.attach) for guest, release in releases]
    return _join(_Part(refusals), taken, _Part(steps=tuple(binding)), *gives)


@dataclass(frozen=True, slots=True)
class _Asked:
    """The partition a guest would hold: its GPUs and the NVSwitches they take."""

    arch: str
    board: tuple[str, ...]  # every NVSwitch known on the baseboard
    held: frozenset[str]  # what the guest holds now
    buses: frozenset[str]  # the GPUs it would hold
    wanted: tuple[str, ...] | None  # None: no partition this baseboard allows


def _partition(
    node: NodeSnapshot, target: Target, gpus: Sequence[GpuOwner], released: set[str]
) -> _Part:
    """The NVSwitch rules for a guest's GPUs; `attach` holds the switches that must go with
    them (`released`: those other guests give up in the same plan)."""
    arch, board = nvswitch_board(node)
    if arch is None:
        return _Part((Precondition("NVSwitch partition", True, "no NVSwitch baseboard"),))
    asked = _asked(node, target, gpus, arch, board)
    shape = _shape_check(node, target, asked)
    wanted = asked.wanted
    if wanted is None:
        return _Part((shape,))
    if (unknown := _switches_unknown(node, asked, wanted)) is not None:
        return _Part((shape, unknown))
    n = len(asked.buses)
    return _Part(
        (shape, *_switches_free(node, target, wanted, released), *_mig_off(node, gpus, n)),
        notes=_partition_notes(n, wanted),
        attach=tuple(s for s in wanted if s not in asked.held),
    )


def _asked(
    node: NodeSnapshot, target: Target, gpus: Sequence[GpuOwner], arch: str, board: tuple[str, ...]
) -> _Asked:
    guest = guest_named(node, target.guest or "")
    held = frozenset(_held(guest) if guest is not None else ())
    ownership = owners_of(node)
    place = bus_positions(ownership)
    buses = {g.bus_id for g in ownership.gpus if g.bus_id in held} | {g.bus_id for g in gpus}
    wanted = partition_switches(arch, board, [place[b] for b in buses], len(place))
    return _Asked(arch, board, held, frozenset(buses), wanted)


def _shape_check(node: NodeSnapshot, target: Target, asked: _Asked) -> Precondition:
    ownership = owners_of(node)
    what = f"guest {target.guest} would hold {len(asked.buses)} GPU(s): "
    what += _names(ownership, asked.buses)
    return Precondition(
        "NVSwitch partition",
        asked.wanted is not None,
        f"{what}; {_H100_RULE if asked.arch == 'hopper' else _A100_RULE}",
        f"ask for a partition this baseboard allows: {_shapes(asked.arch, ownership)} "
        f"(gpuconsole assign --propose N --to vm:{target.guest} finds free ones)",
    )


def _switches_unknown(
    node: NodeSnapshot, asked: _Asked, wanted: tuple[str, ...]
) -> Precondition | None:
    """A refusal where fewer NVSwitches are known than the partition takes."""
    counts = H100_SWITCHES if asked.arch == "hopper" else A100_SWITCHES
    expected = counts.get(len(asked.buses), 0)
    if len(wanted) >= expected:
        return None
    return Precondition(
        "NVSwitches known",
        False,
        f"the partition takes {expected} NVSwitches; {len(asked.board)} are known on {node.node}",
        "check that the nvidia driver sees every NVSwitch (nvidia-smi nvlink -s), then ask again",
    )


def _switches_free(
    node: NodeSnapshot, target: Target, wanted: tuple[str, ...], released: set[str]
) -> tuple[Precondition, ...]:
    if not wanted:
        return ()
    others = [
        (g.name, s)
        for g in _guests(node)
        if g.name != target.guest
        for s in wanted
        if s in _held(g) and s not in released
    ]
    return (
        Precondition(
            "NVSwitches free",
            not others,
            "; ".join(f"{s} is in guest {name}'s partition" for name, s in others)
            or f"NVSwitches {', '.join(wanted)} held by no other guest",
            "move that guest's GPUs off first, or ask for GPUs of another partition",
        ),
    )


def _mig_off(node: NodeSnapshot, gpus: Sequence[GpuOwner], n: int) -> tuple[Precondition, ...]:
    """A partition of more than one GPU needs MIG off on each."""
    if n <= 1:
        return ()
    mig = [g for g in gpus if (reading := _nvml(node, g)) is not None and reading.mig_enabled]
    return (
        Precondition(
            "MIG off for the partition",
            not mig,
            "MIG enabled on " + ", ".join(_label(g) for g in mig)
            if mig
            else "no GPU of the partition is in MIG mode",
            "disable MIG first: nvidia-smi -i INDEX -mig 0, then ask again",
        ),
    )


def _partition_notes(n: int, wanted: tuple[str, ...]) -> tuple[str, ...]:
    single = (_SINGLE_GPU_NOTE,) if n == 1 else ()
    if not wanted:
        return single
    return (
        *single,
        f"full passthrough: NVSwitches {', '.join(wanted)} go to the guest with its GPUs",
    )


def _releases(
    node: NodeSnapshot, target: Target, gpus: Sequence[GpuOwner]
) -> tuple[tuple[Precondition, ...], tuple[_Release, ...]]:
    """Guests losing GPUs on an NVSwitch baseboard: what each keeps must still be a
    partition (a failed precondition where not); and the switches each no longer needs."""
    arch, board = nvswitch_board(node)
    if arch is None or node.tenancy is None:
        return (), ()
    moving = {g.bus_id for g in gpus}
    losing = [g for g in node.tenancy.guests if g.name != target.guest and _held(g) & moving]
    kept = [_kept(node, target, (arch, board), guest, moving) for guest in losing]
    refusals = tuple(k for k in kept if isinstance(k, Precondition))
    return refusals, tuple(k for k in kept if isinstance(k, tuple) and k[1])


def _kept(
    node: NodeSnapshot,
    target: Target,
    board: tuple[str, tuple[str, ...]],
    guest: Guest,
    moving: set[str],
) -> Precondition | _Release:
    """What a guest keeps once `moving` leaves it: a partition, with the switches it gives
    up, or a refusal."""
    arch, switches = board
    ownership = owners_of(node)
    place = bus_positions(ownership)
    held = _held(guest)
    mine = [g for g in ownership.gpus if g.bus_id in held]
    keep = [place[g.bus_id] for g in mine if g.bus_id not in moving]
    left = partition_switches(arch, switches, keep, len(place))
    if left is None:
        return _no_partition_left(ownership, target, guest, mine, moving)
    return guest.name, tuple(sorted((held & set(switches)) - set(left)))


def _no_partition_left(
    ownership: Ownership,
    target: Target,
    guest: Guest,
    mine: Sequence[GpuOwner],
    moving: set[str],
) -> Precondition:
    every = " ".join(_word(g) for g in sorted(mine, key=_console_order))
    kept = _names(ownership, (g.bus_id for g in mine if g.bus_id not in moving))
    return Precondition(
        f"guest {guest.name} keeps a partition",
        False,
        f"guest {guest.name} would keep GPU(s) {kept}: not a partition this baseboard allows",
        f"move its GPUs together: gpuconsole assign {every} --to {target}",
    )


def _release_part(
    node: NodeSnapshot, guest: str, release: tuple[str, ...], taken: Sequence[str]
) -> _Part:
    """A guest's definition drops the NVSwitches it gives up; those no guest takes in this
    plan go back to the host."""
    detach = Step(
        StepKind.DETACH,
        Layer.GUESTS,
        f"remove NVSwitches {', '.join(release)} from guest {guest}'s definition",
        functions=release,
        guest=guest,
    )
    back = [s for s in release if s not in taken]
    if not back:
        return _Part(steps=(detach,))
    note = (
        f"guest {guest} gives NVSwitches {', '.join(back)} back to the host "
        "(nvidia, for Fabric Manager)"
    )
    rebind = _pci_steps(node, back, HOST_DRIVER, "NVSwitches", gpu_bus=())
    return _Part(steps=(detach, *rebind), notes=(note,))


# --- PCI functions ----------------------------------------------------------------------


def _pci_steps(
    node: NodeSnapshot,
    functions: Sequence[str],
    driver: str | None,
    what: str,
    *,
    gpu_bus: tuple[str, ...],
    reset: bool = True,
) -> list[Step]:
    """override, unbind, probe, reset for some functions, with what was there before."""
    drivers, overrides = _before(node, functions)
    holders = "/".join(sorted({d for d in drivers if d})) or "its driver"
    titles = [
        (StepKind.OVERRIDE, f"driver_override={driver or BLOCK_DRIVER} on {what}"),
        (StepKind.UNBIND, f"unbind {what}{_also(functions, gpu_bus)} from {holders}"),
    ]
    if driver is not None:
        titles.append((StepKind.PROBE, f"drivers_probe {what}: bind {driver}"))
        if reset:
            titles.append((StepKind.RESET, f"reset {what}"))
    return [
        Step(
            kind,
            Layer.PCI,
            title,
            gpus=gpu_bus,
            functions=tuple(functions),
            driver=driver,
            before_drivers=drivers,
            before_overrides=overrides,
        )
        for kind, title in titles
    ]


def _before(
    node: NodeSnapshot, functions: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Per function, the driver holding it and its driver_override now ("" for none)."""
    gpus = {p.bus_id: p for p in (node.tenancy.gpus if node.tenancy else ())}
    peers = {peer.bus_id: peer.driver for p in gpus.values() for peer in p.iommu_peers}
    # NVSwitches are in no GPU's group: a guest's are on vfio-pci, the host's on nvidia
    in_guests = {b for g in _guests(node) for b in _held(g)}

    def driver(function: str) -> str:
        if (pci := gpus.get(function)) is not None:
            return pci.driver or ""
        return peers.get(function, VFIO_DRIVER if function in in_guests else HOST_DRIVER) or ""

    overrides = tuple((gpus[f].driver_override or "") if f in gpus else "" for f in functions)
    return tuple(driver(f) for f in functions), overrides


def _also(functions: Sequence[str], gpu_bus: tuple[str, ...]) -> str:
    """The functions an unbind takes besides the GPU's, for its title."""
    others = [f for f in functions if f not in gpu_bus]
    if not others:
        return ""
    return f" and {', '.join(others)}" if gpu_bus else f" ({', '.join(others)})"


# --- one GPU ----------------------------------------------------------------------------


def already_there(node: NodeSnapshot, gpu: GpuOwner, target: Target, ctx: PlanContext) -> bool:
    """Whether a GPU is where `target` puts GPUs already: bound as it binds them, in its
    guest (and no other), cordoned as it leaves them, blocked from binding if drained."""
    pci = _pci(node, gpu.bus_id)
    guests = _guests_holding(node, gpu.bus_id)
    here = gpu.driver == target.driver or (target.driver is None and gpu.driver is None)
    if target.kind is TargetKind.VM:
        here = here and bool(guests) and all(g.name == target.guest for g in guests)
    elif ctx.kubernetes and gpu.uuid:
        here = here and (gpu.uuid in ctx.cordoned) == target.cordoned and not guests
    else:
        here = here and not guests
    if target.kind is TargetKind.DRAINED and pci is not None:
        here = here and pci.driver_override == BLOCK_DRIVER
    return here


@dataclass(frozen=True, slots=True)
class _Move:
    """One GPU a plan moves, with what its rules read about it."""

    gpu: GpuOwner
    label: str
    reading: GpuReading | None
    pci: PciGpu | None
    elsewhere: tuple[Guest, ...]  # guests holding it, other than the target's
    cordoned: bool
    functions: tuple[str, ...]  # the GPU's and those of its IOMMU group that go with it
    stuck: tuple[str, ...]  # those of its group that cannot

    @property
    def lost(self) -> bool:
        return self.reading is not None and self.reading.lost

    @property
    def uuids(self) -> tuple[str, ...]:
        return (self.gpu.uuid,) if self.gpu.uuid else ()


def _move(node: NodeSnapshot, gpu: GpuOwner, target: Target, ctx: PlanContext) -> _Move:
    pci = _pci(node, gpu.bus_id)
    grouped = pci is not None and pci.iommu_group is not None
    moving, stuck = _following(pci) if pci is not None and grouped else ([], [])
    return _Move(
        gpu,
        _label(gpu),
        _nvml(node, gpu),
        pci,
        tuple(g for g in _guests_holding(node, gpu.bus_id) if g.name != target.guest),
        gpu.uuid in ctx.cordoned if gpu.uuid else False,
        (gpu.bus_id, *moving),
        tuple(stuck),
    )


def _gpu_part(node: NodeSnapshot, gpu: GpuOwner, target: Target, ctx: PlanContext) -> _Part:
    """What moving one GPU takes: its preconditions and steps, and its functions for a guest."""
    move = _move(node, gpu, target, ctx)
    if already_there(node, gpu, target, ctx):
        return _Part((_not_there(move, target),))
    return _Part(
        (_not_lost(move, target), _quiesced(move, ctx), *_iommu_group(move)),
        _gpu_steps(node, move, target, ctx),
        _trouble(node, move),
        attach=move.functions if target.kind is TargetKind.VM else (),
    )


def _not_there(move: _Move, target: Target) -> Precondition:
    return Precondition(
        f"{move.label} not already there",
        False,
        f"{move.label} is already {target} ({move.gpu.label})",
        "nothing to do",
    )


def _not_lost(move: _Move, target: Target) -> Precondition:
    """A lost GPU (off the bus) can only be drained. Named for what holds, so that a tick
    never stands beside a GPU that is lost."""
    if move.lost and target.kind is TargetKind.DRAINED:
        return Precondition(
            f"{move.label} lost, so drained is the one place it may go",
            True,
            "it fell off the bus (XID 79)",
        )
    return Precondition(
        f"{move.label} not lost",
        not move.lost,
        "lost: it fell off the bus (XID 79)"
        if move.lost
        else "answers NVML"
        if move.reading
        else "not seen by NVML (vfio-pci or unbound)",
        "drain it (--to drained), then reset the GPU or reboot the node",
    )


def _trouble(node: NodeSnapshot, move: _Move) -> tuple[str, ...]:
    """A note for each critical finding of the GPU's verdict that a plan still moves it
    despite (a lost one drained)."""
    if move.reading is None:
        return ()
    verdict = gpu_verdict(node, move.reading)
    return tuple(
        f"{move.label}: {f.text}" for f in verdict.findings if f.severity is Severity.CRITICAL
    )


def _quiesced(move: _Move, ctx: PlanContext) -> Precondition:
    """Pods are evicted (with a Kubernetes API); guests must be shut off, jobs and
    processes stopped."""
    pods = _pod_names(move.gpu)
    blockers, remedies = _blockers(move)
    if pods and not ctx.kubernetes:
        blockers += [f"pod {p}" for p in pods]
        remedies.append("no Kubernetes API is configured to evict: drain the pod yourself")
    detail = (
        "idle"
        if not (blockers or pods)
        else ", ".join(blockers) or "pod(s) to evict: " + ", ".join(pods)
    )
    return Precondition(
        f"{move.label} quiesced", not blockers, detail, "; ".join(remedies) + ", then ask again"
    )


def _pod_names(gpu: GpuOwner) -> list[str]:
    """The pods holding the GPU or one of its MIG instances."""
    pods = [o for o in gpu.owners if o.kind is OwnerKind.POD]
    pods += [o for m in gpu.migs for o in m.owners if o.kind is OwnerKind.POD and o not in pods]
    return [p.name for p in pods]


def _blockers(move: _Move) -> tuple[list[str], list[str]]:
    """What holds the GPU that no step of a plan ends (jobs, processes, running guests),
    and what a person does about each."""
    others = [o for o in move.gpu.owners if o.kind in (OwnerKind.JOB, OwnerKind.PROCESS)]
    running = [g for g in move.elsewhere if g.active]
    blockers = [o.label for o in others] + [f"guest {g.name} ({g.state})" for g in running]
    return blockers, [_stop_owner(o) for o in others] + [_stop_guest(g) for g in running]


def _stop_owner(owner: Owner) -> str:
    if owner.kind is OwnerKind.JOB:
        return f"end Slurm job {owner.job or owner.name} (scancel)"
    pids = " ".join(str(p) for p in owner.pids)
    return f"stop {owner.label} (pids {pids})" if pids else f"stop {owner.label}"


def _stop_guest(guest: Guest) -> str:
    if guest.state in _SUSPENDED:
        return f"resume and shut down guest {guest.name} (a suspended guest keeps its devices)"
    return f"shut down guest {guest.name} (virsh shutdown {guest.name})"


def _iommu_group(move: _Move) -> tuple[Precondition, ...]:
    """The IOMMU group moves together: every function in it follows the GPU."""
    pci = move.pci
    if pci is None or pci.iommu_group is None:
        return ()
    others = f"; others in the group: {', '.join(move.stuck)}" if move.stuck else ""
    return (
        Precondition(
            f"{move.label} IOMMU group {pci.iommu_group} moves together",
            not move.stuck,
            "functions moving: " + ", ".join(move.functions) + others,
            "the group holds devices that are not the GPU's: fix ACS or the slot first",
        ),
    )


def _gpu_steps(
    node: NodeSnapshot, move: _Move, target: Target, ctx: PlanContext
) -> tuple[Step, ...]:
    return (
        *_cordon(move, target, ctx),
        *_evictions(move, ctx),
        *_idle_check(move),
        *_detaches(move),
        *_rebind(node, move, target),
        *_uncordon(move, target, ctx),
    )


def _kube_step(move: _Move, kind: StepKind, title: str, pod: str | None = None) -> Step:
    gpus = (move.gpu.bus_id,)
    return Step(kind, Layer.KUBERNETES, title, gpus=gpus, uuids=move.uuids, pod=pod)


def _cordon(move: _Move, target: Target, ctx: PlanContext) -> tuple[Step, ...]:
    if not (ctx.kubernetes and move.gpu.uuid and target.cordoned and not move.cordoned):
        return ()
    return (_kube_step(move, StepKind.CORDON, f"cordon {move.label} out of Kubernetes scheduling"),)


def _uncordon(move: _Move, target: Target, ctx: PlanContext) -> tuple[Step, ...]:
    if not (ctx.kubernetes and move.gpu.uuid and not target.cordoned and move.cordoned):
        return ()
    return (
        _kube_step(move, StepKind.UNCORDON, f"uncordon {move.label}: Kubernetes may schedule it"),
    )


def _evictions(move: _Move, ctx: PlanContext) -> tuple[Step, ...]:
    if not ctx.kubernetes:
        return ()
    return tuple(
        _kube_step(
            move,
            StepKind.EVICT,
            f"evict pod {pod} from {move.label} and wait until it is gone",
            pod,
        )
        for pod in _pod_names(move.gpu)
    )


def _idle_check(move: _Move) -> tuple[Step, ...]:
    """No process may hold a GPU that leaves nvidia (one lost holds none)."""
    gpu, pci = move.gpu, move.pci
    if gpu.driver != HOST_DRIVER or move.lost:
        return ()
    # the driver's minor, never NVML's index: they part once NVML renumbers
    minor = pci.minor if pci is not None else None
    device = f"/dev/nvidia{minor}" if minor is not None else "its /dev/nvidia device"
    return (
        Step(
            StepKind.CHECK_IDLE,
            Layer.PCI,
            f"check {move.label} is idle (no process holds {device})",
            gpus=(gpu.bus_id,),
            uuids=move.uuids,
            minors=(minor,) if minor is not None else (),
        ),
    )


def _detaches(move: _Move) -> tuple[Step, ...]:
    """The GPU leaves the definitions of the guests that are not its target."""
    return tuple(
        Step(
            StepKind.DETACH,
            Layer.GUESTS,
            f"remove {move.label} from guest {guest.name}'s definition",
            gpus=(move.gpu.bus_id,),
            functions=move.functions,
            guest=guest.name,
        )
        for guest in move.elsewhere
    )


def _rebind(node: NodeSnapshot, move: _Move, target: Target) -> list[Step]:
    """The PCI steps, where the driver or driver_override is not yet the target's."""
    override = move.pci.driver_override if move.pci is not None else None
    if move.gpu.driver == target.driver and (override or None) == target.override:
        return []
    gpu_bus = (move.gpu.bus_id,)
    return _pci_steps(
        node, move.functions, target.driver, move.label, gpu_bus=gpu_bus, reset=not move.lost
    )
