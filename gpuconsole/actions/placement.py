"""Placement help: which free GPUs to give a request of N GPUs (of a model), and the NIC
rails that go with them.

The GPUs share one NVLink domain; for a guest on an NVSwitch baseboard they also form a
partition the baseboard allows, together with what the guest holds already. Each GPU's NIC
is the one `gpuconsole.facts.pairing` says it uses (its own rail while that is up, else the
fallback), as the topology view and the exporter show it; a SYS path is flagged. Choices
that need no flag come first, then those on fewer NUMA nodes, then those with nearer NICs.
A node with a critical problem (a lost GPU, a failed PSU) is proposed only after every node
without one, and its proposal says what the problem is.
Pure functions of snapshots, so the console and the command line propose the same.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpuconsole.actions.plan import (
    PlanContext,
    Target,
    TargetKind,
    already_there,
    bus_positions,
    guest_named,
    nvswitch_board,
    owners_of,
    partition_switches,
)
from gpuconsole.facts.ownership import Ownership
from gpuconsole.facts.pairing import GpuNic, gpu_nics
from gpuconsole.facts.verdict import node_verdict
from gpuconsole.readings.base import Severity
from gpuconsole.readings.fabric import LEVELS, FabricReading, PortRole
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import OwnerKind

if TYPE_CHECKING:
    from gpuconsole.actions.executor import Executor

__all__ = ["Placement", "Proposal", "Rail", "placements", "propose"]

# Past this many ways to choose, only runs of neighbours are weighed (a big NVLink domain).
MAX_CHOICES = 5000
FAR_LEVEL = "SYS"


@dataclass(frozen=True, slots=True)
class Rail:
    """The NIC one proposed GPU should use for GPUDirect RDMA, how near it is, and what is
    wrong with it (nothing, when all is well)."""

    gpu: str  # bus id, sysfs form
    index: int | None  # NVML's, as the console and plans show it: only a label
    device: str | None  # mlx5_3; None: no usable NIC, or no fabric reading
    level: str | None  # PIX, PXB, PHB, NODE, SYS
    flags: tuple[str, ...] = ()

    def describe(self) -> str:
        gpu = f"GPU {self.index} ({self.gpu})" if self.index is not None else f"GPU {self.gpu}"
        nic = f"NIC {self.device} ({self.level})" if self.device else "no NIC"
        return f"{gpu}  {nic}" + (f"  ! {'; '.join(self.flags)}" if self.flags else "")


@dataclass(frozen=True, slots=True)
class Proposal:
    """GPUs of one node for a request, the NIC each should use, and why these."""

    node: str
    indexes: tuple[int, ...]  # NVML's, as the console and plans show them: only labels
    bus_ids: tuple[str, ...]
    rails: tuple[Rail, ...]
    reason: str
    numa_nodes: int = 1
    alternatives: tuple[tuple[int, ...], ...] = ()
    switches: tuple[str, ...] = ()  # a guest's partition: the NVSwitches that go with it
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # what is critical on its node

    @property
    def nics(self) -> tuple[str, ...]:
        """The NICs the GPUs use, each once, in GPU order."""
        return tuple(dict.fromkeys(r.device for r in self.rails if r.device))

    @property
    def flagged(self) -> int:
        """How many of its GPUs have a NIC worth a warning."""
        return sum(1 for r in self.rails if r.flags)

    @property
    def distance(self) -> int:
        """The NICs' PCIe distance from their GPUs, summed (PIX 1 ... SYS 5; none 6)."""
        return sum(LEVELS.index(r.level) if r.level else len(LEVELS) for r in self.rails)

    @property
    def keys(self) -> tuple[str, ...]:
        """The GPUs as `gpuconsole assign` and `make_plan` take them (bus ids: stable)."""
        return self.bus_ids

    def describe(self) -> str:
        lines = [f"{self.node}: GPU {', '.join(map(str, self.indexes))}: {self.reason}"]
        lines += [f"  ! {self.node}: {p}" for p in self.problems]
        lines += [f"  {r.describe()}" for r in self.rails]
        lines += [f"  note: {n}" for n in self.notes]
        if self.alternatives:
            others = "; ".join(", ".join(map(str, a)) for a in self.alternatives)
            lines.append(f"  also possible: GPU {others}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Placement:
    """Proposals for a request across nodes, best first, and why the other nodes cannot."""

    proposals: tuple[Proposal, ...]
    refusals: tuple[tuple[str, str], ...]  # (node, why not)

    @property
    def best(self) -> Proposal | None:
        return self.proposals[0] if self.proposals else None

    def why_not(self) -> str:
        return "; ".join(f"{node}: {why}" for node, why in self.refusals) or "no node"


def _is_rail(fabric: FabricReading, device: str) -> bool:
    found = fabric.device(device)
    return found is not None and any(p.role is PortRole.COMPUTE for p in found.ports)


def _downtrained(fabric: FabricReading, device: str) -> bool:
    found = fabric.device(device)
    return found is not None and any(p.downtrained for p in found.ports)


def _rails(
    fabric: FabricReading | None,
    nics: Mapping[str, GpuNic],
    picks: Sequence[tuple[int | None, str]],
) -> tuple[Rail, ...]:
    """The NIC for each picked GPU (index, bus id): `nics`, the node's `gpu_nics`."""
    rails = []
    for index, bus in picks:
        choice = nics.get(bus)
        if fabric is None or choice is None:
            rails.append(Rail(bus, index, None, None, ("no fabric reading for it",)))
            continue
        pick, level = choice.nic, choice.level
        flags: list[str] = []
        if choice.own and pick != choice.own and _is_rail(fabric, choice.own):
            flags.append(f"its own rail {choice.own} is down")
        if pick is None:
            flags.append("no compute NIC is up")
        elif level == FAR_LEVEL:
            flags.append("SYS path: its RDMA traffic crosses the socket link")
        if pick is not None and _downtrained(fabric, pick):
            flags.append(f"rail {pick} is downtrained")
        if fabric.peermem_loaded is False:
            flags.append("nvidia-peermem not loaded: no GPUDirect RDMA")
        rails.append(Rail(bus, index, pick, level, tuple(flags)))
    return tuple(rails)


def _domains(node: NodeSnapshot, indexes: Iterable[int]) -> list[list[int]]:
    """GPUs (NVML indexes) grouped by NVLink domain: bonded NVLinks between them, through
    NVSwitch or not."""
    wanted = sorted(indexes)
    topo = node.nvml.gpu_topology if node.nvml is not None else ()
    parent = {i: i for i in wanted}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a in wanted:
        for b in wanted:
            if a < b and a < len(topo) and b < len(topo[a]) and topo[a][b].startswith("NV"):
                parent[root(b)] = root(a)
    groups: dict[int, list[int]] = {}
    for i in wanted:
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: (-len(g), g))


def _choices(domain: list[int], count: int) -> Iterable[tuple[int, ...]]:
    if math.comb(len(domain), count) <= MAX_CHOICES:
        return itertools.combinations(domain, count)
    return (tuple(domain[k : k + count]) for k in range(len(domain) - count + 1))


def _free(node: NodeSnapshot, ownership: Ownership, model: str | None) -> dict[int, str]:
    """Free GPUs NVML sees, healthy, of the model: NVML index -> bus id."""
    free = {}
    for g in ownership.gpus:
        reading = node.nvml.gpu(g.index) if node.nvml and g.index is not None else None
        if (
            reading is not None
            and g.index is not None
            and g.kind is OwnerKind.FREE
            and not g.all_problems
            and not reading.lost
            and not reading.unreadable
            and (model is None or model.lower() in (g.model or "").lower())
        ):
            free[g.index] = g.bus_id
    return free


def _propose(
    node: NodeSnapshot,
    count: int,
    model: str | None,
    target: Target | None,
    context: PlanContext,
) -> Proposal | str:
    """A proposal for the node, or why it has none."""
    what = f"{model} GPU(s)" if model else "GPU(s)"
    if count < 1:
        return "ask for one GPU or more"
    ownership = owners_of(node)
    free = _free(node, ownership, model)
    there = {
        i
        for i, bus in free.items()
        if target is not None
        and (g := ownership.gpu(bus)) is not None
        and already_there(node, g, target, context)
    }
    if len(free) - len(there) < count:
        also = f" ({len(there)} of them already {target})" if there else ""
        return f"{len(free)} free {what}{also}, {count} asked for"
    free = {i: bus for i, bus in free.items() if i not in there}
    arch, switches = nvswitch_board(node)
    guest = target.guest if target is not None and target.kind is TargetKind.VM else None
    held: list[str] = []
    if guest is not None:
        found = guest_named(node, guest)
        if found is None:
            return f"no guest {guest}"
        known = {g.bus_id for g in ownership.gpus}
        held = [b for b in found.bus_ids if b in known]
    place = bus_positions(ownership)
    nics = gpu_nics(node.fabric) if node.fabric is not None else {}
    name = {g.bus_id: g.index for g in ownership.gpus}
    options: list[Proposal] = []
    widest = 0
    for domain in _domains(node, free):
        widest = max(widest, len(domain))
        for pick in _choices(domain, count):
            buses = tuple(free[i] for i in pick)
            taken: tuple[str, ...] = ()
            if guest is not None and arch is not None:
                slots = [place[b] for b in (*held, *buses)]
                partition = partition_switches(arch, switches, slots, len(place))
                if partition is None:
                    continue
                taken = partition
            gpus = [node.nvml.gpu(i) for i in pick] if node.nvml is not None else []
            options.append(
                Proposal(
                    node.node,
                    tuple(n for b in buses if (n := name[b]) is not None),
                    buses,
                    _rails(node.fabric, nics, [(name[b], b) for b in buses]),
                    "",
                    len({r.numa_node for r in gpus if r is not None}),
                    switches=taken,
                )
            )
    if not options:
        if widest < count:
            return f"{len(free)} free {what}, at most {widest} in one NVLink domain"
        shape = "1 or all 8 GPUs" if arch == "hopper" else "1, 2, 4 or 8 neighbouring GPUs"
        with_held = f" with the {len(held)} it holds" if held else ""
        return f"no {count} free {what} form a guest partition{with_held} ({arch}: {shape})"
    options.sort(key=_rank)
    best = options[0]
    problems = tuple(
        f.message for f in node_verdict(node).findings if f.severity is Severity.CRITICAL
    )
    notes = []
    if guest is not None and arch is not None:
        if best.switches:
            notes.append(f"full passthrough: NVSwitches {', '.join(best.switches)} go with them")
        elif count + len(held) == 1:
            notes.append("single-GPU passthrough: the guest must run with NVLinks disabled")
    reason = (
        f"{count} free {what} in one NVLink domain, {best.numa_nodes} NUMA node(s)"
        if count > 1
        else f"a free {model + ' ' if model else ''}GPU"
    )
    if problems:
        reason += f", on a node with {len(problems)} critical problem(s)"
    return replace(
        best,
        reason=reason,
        alternatives=tuple(o.indexes for o in options[1:4]),
        notes=tuple(notes),
        problems=problems,
    )


def _rank(p: Proposal) -> tuple[bool, int, int, int, int, tuple[str, ...]]:
    """No critical problem on the node, fewer warnings, fewer NUMA nodes, nearer NICs, fewer
    GPUs sharing a NIC."""
    shared = len(p.rails) - len(p.nics)
    return (bool(p.problems), p.flagged, p.numa_nodes, p.distance, shared, p.bus_ids)


def propose(
    node: NodeSnapshot,
    count: int,
    model: str | None = None,
    target: Target | None = None,
    context: PlanContext | None = None,
) -> Proposal | None:
    """`count` free GPUs of one node (of `model`, when given) for `target`, with their NICs;
    None when the node cannot serve the request (`placements` says why). `context` (the
    executor's) says which GPUs Kubernetes may schedule, so that none already at the
    target is proposed."""
    found = _propose(node, count, model, target, context or PlanContext())
    return found if isinstance(found, Proposal) else None


def placements(
    nodes: Iterable[NodeSnapshot],
    count: int,
    model: str | None = None,
    target: Target | None = None,
    contexts: Mapping[str, PlanContext] | None = None,
) -> Placement:
    """The best proposal of each node that can serve the request, best first, and why the
    others cannot: what the console shows when asked for N GPUs. `contexts`: each node's
    executor context, by node name."""
    found: list[Proposal] = []
    refused: list[tuple[str, str]] = []
    for node in nodes:
        context = (contexts or {}).get(node.node, PlanContext())
        answer = _propose(node, count, model, target, context)
        if isinstance(answer, Proposal):
            found.append(answer)
        else:
            refused.append((node.node, answer))
    return Placement(tuple(sorted(found, key=_rank)), tuple(refused))


async def propose_with(
    executor: Executor, count: int, model: str | None = None, target: Target | None = None
) -> Placement:
    """Placement help on the executor's node, from a fresh reading (this machine's includes
    the fabric, for the NIC rails) and the executor's cordons."""
    if executor.reader is None:
        raise RuntimeError("this executor has no reader to propose from")
    node = await executor.reader()
    return placements([node], count, model, target, {node.node: await executor.context()})
