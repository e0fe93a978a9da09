"""Remediation, planned: from a GPU's verdict (NVIDIA's recommended action) to the steps it takes.

`make_remediation_plan` is pure, like `make_plan`, and returns the same `Plan`, so the same
executor checks who asks, the typed confirmation, the preconditions and the GPU locks,
journals each step before it runs, recovers after a crash and audits it all. What it plans:

- drain: the GPU's owners drained (cordoned out of Kubernetes and its pods evicted, the Slurm
  node drained, a guest's tenant told), until it is idle; then nothing may bind it.
- reset_gpu: drained and idle, then `nvidia-smi -r -i BUS` (all its processes gone and, on an
  NVSwitch baseboard, no NVLink peer busy with it), then a fresh reading must find it fit.
  Before Ampere nvidia-smi resets a GPU only in one command with every GPU NVLink joins it to
  (and theirs in turn): all of that set is drained, waited for and reset together.
- reboot_node: every GPU of the node drained and idle, and the tenants of its running
  guests that hold no GPU told and waited for too (the power cycle stops them as well),
  then a power cycle through the BMC, then a fresh reading must find the GPU fit. It is
  confirmed by the node's name.
- reseat, service: drained, idle, nothing may bind it, marked for service.

A remediation puts nothing back when a step fails: a GPU under repair stays out of work. A
reset that does not bring the GPU back is followed by the node's power cycle, and that by
service (`escalation`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuconsole.actions.plan import (
    HOST_DRIVER,
    VFIO_DRIVER,
    Layer,
    Plan,
    PlanContext,
    Precondition,
    Step,
    StepKind,
    Target,
    TargetKind,
    _label,
    _pci_steps,
    find_gpu,
    nvswitch_board,
    owners_of,
)
from gpuconsole.facts.inventory import short_bus_id
from gpuconsole.facts.ownership import GpuOwner, Owner, Ownership
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.hardware import BEFORE_AMPERE, model_spec, short_model
from gpuconsole.readings.base import normal_bus_id
from gpuconsole.readings.nvml import GpuReading, RemoteKind
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import ACTIVE_GUEST_STATES, Guest, OwnerKind

__all__ = [
    "REMEDIES",
    "busy_owners",
    "escalation",
    "guest_owner",
    "make_remediation_plan",
    "power_stops",
    "remedy_words",
    "reset_set",
    "verdict_action",
]

# The actions a plan carries out; fit and watch need none.
REMEDIES = (Action.DRAIN, Action.RESET_GPU, Action.REBOOT_NODE, Action.RESEAT, Action.SERVICE)

_WORDS = {
    Action.FIT: "fit for work",
    Action.WATCH: "watch it",
    Action.DRAIN: "drain it",
    Action.RESET_GPU: "drain it, reset the GPU, then verify",
    Action.REBOOT_NODE: "drain the node, power-cycle it through its BMC, then verify",
    Action.RESEAT: "drain it and reseat it (check the mechanicals)",
    Action.SERVICE: "drain it and return it for service",
}


def remedy_words(action: Action) -> str:
    """What the action asks for, in words: 'drain it, reset the GPU, then verify'."""
    return _WORDS[action]


def escalation(action: Action) -> Action | None:
    """What follows a remediation that did not make the GPU fit: a reset, the node's power
    cycle; a power cycle, service; None after service."""
    return {
        Action.DRAIN: Action.RESET_GPU,
        Action.RESET_GPU: Action.REBOOT_NODE,
        Action.REBOOT_NODE: Action.SERVICE,
    }.get(action)


def verdict_action(node: NodeSnapshot, key: str) -> Action:
    """The verdict's action for one GPU (bus id, UUID or number); fit for one not found."""
    gpu = find_gpu(node, key)
    return gpu_verdict(node, gpu.bus_id).action if gpu is not None else Action.FIT


# --- who holds what ----------------------------------------------------------------------


def _busy(owner: Owner) -> bool:
    """A holder that keeps the GPU busy: a shut-off guest's definition does not."""
    if owner.kind is OwnerKind.VM:
        return owner.state in ACTIVE_GUEST_STATES
    return owner.holds


def busy_owners(gpu: GpuOwner) -> tuple[Owner, ...]:
    """What keeps a GPU busy: its owners and its MIG instances' (a shut-off guest does not)."""
    found = [o for o in gpu.owners if _busy(o)]
    found += [o for m in gpu.migs for o in m.owners if _busy(o) and o not in found]
    return tuple(found)


def _peers(node: NodeSnapshot, ownership: Ownership, gpu: GpuOwner) -> list[GpuOwner]:
    """The GPUs an NVSwitch baseboard joins this one to over NVLink; none elsewhere."""
    arch, _switches = nvswitch_board(node)
    if arch is None:
        return []
    return [g for g in ownership.gpus if g.bus_id != gpu.bus_id]


def _nvlink_graph(node: NodeSnapshot) -> dict[str, set[str]]:
    """Bus id -> the GPUs NVLink joins it to, as NVML reads each GPU's links: the GPU at the
    far end of a GPU-to-GPU link, and every other GPU on the NVSwitches it reaches. Links go
    both ways, so a GPU NVML cannot see (vfio-pci) still has the links of those it can."""
    switched = {
        normal_bus_id(g.pci_bus_id)
        for g in node.gpus
        if any(link.remote_kind is RemoteKind.NVSWITCH for link in g.nvlinks)
    }
    graph: dict[str, set[str]] = {}
    for gpu in node.gpus:
        bus = normal_bus_id(gpu.pci_bus_id)
        peers = {
            normal_bus_id(link.remote_pci_bus_id)
            for link in gpu.nvlinks
            if link.remote_kind is RemoteKind.GPU and link.remote_pci_bus_id
        }
        if bus in switched:
            peers |= switched
        peers.discard(bus)
        graph.setdefault(bus, set()).update(peers)
        for peer in peers:
            graph.setdefault(peer, set()).add(bus)
    return graph


def _reading(node: NodeSnapshot, gpu: GpuOwner) -> GpuReading | None:
    bus = normal_bus_id(gpu.bus_id)
    return next((g for g in node.gpus if normal_bus_id(g.pci_bus_id) == bus), None)


def _architecture(node: NodeSnapshot, gpu: GpuOwner) -> str | None:
    """What NVML says the GPU's architecture is, else its model's datasheet; None unknown."""
    reading = _reading(node, gpu)
    if reading is not None and reading.architecture:
        return reading.architecture
    spec = model_spec(reading.name if reading is not None else gpu.model)
    return spec.architecture if spec is not None else None


def reset_set(node: NodeSnapshot, key: str) -> tuple[str, ...]:
    """The bus ids `nvidia-smi -r` resets in one command with the GPU `key` names: that GPU
    first, then (before Ampere, or where its architecture is unknown) every GPU NVLink
    reaches from it, link after link; () for a GPU not found."""
    ownership = owners_of(node)
    gpu = find_gpu(node, key, ownership)
    if gpu is None:
        return ()
    return tuple(_reset_buses(node, gpu))


def _reset_buses(node: NodeSnapshot, gpu: GpuOwner) -> list[str]:
    first = normal_bus_id(gpu.bus_id)
    graph = _nvlink_graph(node)
    if not graph.get(first):
        return [gpu.bus_id]
    arch = _architecture(node, gpu)
    if arch is not None and arch not in BEFORE_AMPERE:
        return [gpu.bus_id]  # Ampere and newer: each GPU alone
    # man nvidia-smi (-r): any GPU NVLink joins to a GPU being reset is reset in the same
    # command; the set is closed under that rule, so it is the whole NVLink-connected part
    found, todo = [first], [first]
    while todo:
        for peer in sorted(graph.get(todo.pop(), ())):
            if peer not in found:
                found.append(peer)
                todo.append(peer)
    return [gpu.bus_id, *sorted(found[1:])]


# --- the plan ------------------------------------------------------------------------------


class _Draft:
    """The parts of a remediation plan as its rules add them."""

    def __init__(self) -> None:
        self.conds: list[Precondition] = []
        self.steps: list[Step] = []
        self.notes: list[str] = []


def make_remediation_plan(
    node: NodeSnapshot, key: str, action: Action, context: PlanContext | None = None
) -> Plan:
    """The plan that carries out `action` for the GPU `key` names (bus id, UUID or number)."""
    ctx = context or PlanContext()
    ownership = owners_of(node)
    gpu = find_gpu(node, key, ownership)
    draft = _Draft()
    if gpu is None:
        draft.conds.append(
            Precondition("GPU exists", False, f"no GPU {key!r} on {node.node}", "name it by bus id")
        )
        return _plan(node, action, (), draft, Target(TargetKind.DRAINED))
    draft.conds.append(_remedy_needed(action))
    if node.tenancy is None:
        draft.conds.append(
            Precondition(
                "ownership known",
                False,
                f"the tenancy source has not read {node.node}",
                "enable [tenancy] and wait for its first reading",
            )
        )
    whole = action is Action.REBOOT_NODE
    together = _together(node, ownership, gpu, draft) if action is Action.RESET_GPU else [gpu]
    drained = list(ownership.gpus) if whole else together
    # a power cycle stops every guest of the node, those that hold no GPU too
    bystanders = _guests_without_gpus(node, ownership) if whole else []
    _drain(node, ownership, gpu, drained, ctx, draft, whole, bystanders)
    target = _target(gpu, action)
    if action is Action.RESET_GPU:
        _reset(node, ownership, gpu, together, ctx, draft)
    elif whole:
        _power_cycle(node, gpu, ctx, draft)
    elif action in (Action.DRAIN, Action.RESEAT, Action.SERVICE):
        _out_of_work(node, gpu, action, draft)
    draft.steps.append(_verify(node, together, action, target))
    return _plan(node, action, together, draft, target)


def _together(
    node: NodeSnapshot, ownership: Ownership, gpu: GpuOwner, draft: _Draft
) -> list[GpuOwner]:
    """The GPUs reset with `gpu` (it first): itself alone, or before Ampere its NVLink set,
    which the plan drains and resets as one; a note says which and why, and a GPU of the
    set that nvidia-smi cannot reset (not on the nvidia driver, not found) refuses the plan."""
    buses = _reset_buses(node, gpu)
    if len(buses) == 1:
        return [gpu]
    found = [ownership.gpu(b) for b in buses]
    together = [g for g in found if g is not None]
    reading = _reading(node, gpu)
    model = short_model(reading.name if reading is not None else gpu.model)
    known = _architecture(node, gpu) is not None and model != "-"
    kind = f"{model} GPUs" if known else "GPUs of an architecture not known"
    others = ", ".join(_label(g) for g in together[1:])
    draft.notes.append(
        f"{kind} linked by NVLink reset together: nvidia-smi resets {_label(gpu)} only in "
        f"one command with every GPU NVLink joins it to, and theirs in turn ({others}); "
        "before Ampere a GPU is never reset alone, so all of them are drained and reset"
    )
    # nor may any other GPU of the node compute while GPUs are reset that cannot be alone
    elsewhere_busy = [
        f"{_label(g)}: {', '.join(o.label for o in busy_owners(g))}"
        for g in ownership.gpus
        if g not in together and g.driver == HOST_DRIVER and busy_owners(g)
    ]
    draft.conds.append(
        Precondition(
            "no compute work on the node's other GPUs",
            not elsewhere_busy,
            "; ".join(elsewhere_busy) or "none runs outside the NVLink set",
            "drain or stop that work too, then ask again: nvidia-smi resets GPUs that "
            "cannot be reset one by one only while no other GPU of the node computes",
        )
    )
    missing = [b for b, g in zip(buses, found, strict=True) if g is None]
    elsewhere = [
        f"{_label(g)} is on {g.driver or 'no driver'}"
        + (f" ({', '.join(o.label for o in g.owners)})" if g.driver else "")
        for g in together
        if g.driver != HOST_DRIVER
    ]
    problems = [f"{b} is not found on {node.node}" for b in missing] + elsewhere
    draft.conds.append(
        Precondition(
            "every GPU of the NVLink set on the nvidia driver",
            not problems,
            "; ".join(problems)
            or f"{len(together)} GPUs, each on the nvidia driver: one nvidia-smi -r resets them",
            "give those GPUs back to the host (assign them free), then ask again: nvidia-smi "
            "resets only GPUs its driver holds, and this one only with all of them",
        )
    )
    return together


def _plan(
    node: NodeSnapshot,
    action: Action,
    gpus: Sequence[GpuOwner],
    draft: _Draft,
    target: Target,
) -> Plan:
    return Plan(
        node=node.node,
        target=target,
        gpus=tuple(g.bus_id for g in gpus),
        labels=tuple(_label(g) for g in gpus),
        indexes=tuple(g.index for g in gpus),
        owners=tuple(g.label for g in gpus),
        preconditions=tuple(draft.conds),
        steps=tuple(draft.steps),
        notes=tuple(dict.fromkeys(draft.notes)),
        simulated=node.simulated,
        uuids=tuple(g.uuid or "" for g in gpus),
        remedy=action.value,
    )


def _target(gpu: GpuOwner, action: Action) -> Target:
    """Where the GPU ends: back on its driver after a reset or power cycle (a guest's GPU
    stays its guest's), else unbound with nothing allowed to bind it."""
    if action in (Action.RESET_GPU, Action.REBOOT_NODE):
        guest = next((o.name for o in gpu.owners if o.kind is OwnerKind.VM), None)
        if gpu.driver == VFIO_DRIVER and guest is not None:
            return Target(TargetKind.VM, guest)
        return Target(TargetKind.FREE)
    return Target(TargetKind.DRAINED)


def _remedy_needed(action: Action) -> Precondition:
    if action in REMEDIES:
        return Precondition("the verdict asks for it", True, f"{action.value}: {_WORDS[action]}")
    return Precondition(
        "the verdict asks for it",
        False,
        f"the verdict is {action.value} ({_WORDS[action]}): there is nothing to remediate",
        "assign moves a GPU that is fit (a)",
    )


def guest_owner(guest: Guest) -> Owner:
    """A guest as the owner of what it holds: 'vm NAME' while it runs."""
    return Owner(OwnerKind.VM, guest.name, guest.source, tenant=guest.tenant, state=guest.state)


def _guests_without_gpus(node: NodeSnapshot, ownership: Ownership) -> list[Owner]:
    """The node's running guests that hold none of its GPUs (one waiting for its passthrough
    GPU, one without any): no GPU's owners, yet the node's power cycle stops them."""
    holding = {o.label for g in ownership.gpus for o in busy_owners(g)}
    guests = node.tenancy.guests if node.tenancy is not None else ()
    found = [guest_owner(g) for g in guests if g.active]
    return [o for o in found if o.label not in holding]


def power_stops(node: NodeSnapshot) -> tuple[Owner, ...]:
    """What a power cycle (or off) of the node stops: each GPU's busy owners and the running
    guests that hold no GPU."""
    ownership = owners_of(node)
    found = {o.label: o for g in ownership.gpus for o in busy_owners(g)}
    found.update((o.label, o) for o in _guests_without_gpus(node, ownership))
    return tuple(found.values())


def _drain(
    node: NodeSnapshot,
    ownership: Ownership,
    gpu: GpuOwner,
    drained: Sequence[GpuOwner],
    ctx: PlanContext,
    draft: _Draft,
    whole: bool = False,
    bystanders: Sequence[Owner] = (),
) -> None:
    """Each drained GPU's owners go: cordoned and evicted (Kubernetes), the Slurm node
    drained, guests' tenants told; then the wait until they are idle. Processes outside
    any of those stop the plan: nothing here would end them. `whole`: every GPU of the
    node is drained (else more than one is the NVLink set reset with `gpu`); `bystanders`:
    guests holding no GPU that must go too (told and waited for as the others)."""
    owners = {o.label: o for g in drained for o in busy_owners(g)}
    owners.update((o.label, o) for o in bystanders)
    pods = [o for o in owners.values() if o.kind is OwnerKind.POD]
    jobs = [o for o in owners.values() if o.kind is OwnerKind.JOB]
    guests = [o for o in owners.values() if o.kind is OwnerKind.VM]
    processes = [o for o in owners.values() if o.kind is OwnerKind.PROCESS]
    # which GPU each holds, where more than one is drained
    held_by = {o.label: _label(g) for g in drained for o in busy_owners(g) if len(drained) > 1}
    if whole:
        where = "the node"
    elif len(drained) > 1:
        where = f"the NVLink set of {_label(gpu)}"
    else:
        where = _label(gpu)
    members = f": {', '.join(_label(g) for g in drained)}" if len(drained) > 1 and not whole else ""
    draft.conds.append(
        Precondition(
            f"no processes remain on {where}",
            not processes,
            "processes: " + ", ".join(_process_words(o, held_by) for o in processes)
            if processes
            else "none outside a pod, job or guest",
            "stop them (" + "; ".join(_process_words(o) for o in processes) + "), then ask again",
        )
    )
    if pods and not ctx.kubernetes:
        draft.conds.append(
            Precondition(
                "Kubernetes reachable",
                False,
                "pods to evict: " + ", ".join(p.name for p in pods),
                "no Kubernetes API is configured: drain the pods yourself, then ask again",
            )
        )
    if jobs and not ctx.slurm:
        draft.conds.append(
            Precondition(
                "Slurm reachable",
                False,
                "Slurm jobs: " + ", ".join(j.job or j.name for j in jobs),
                f"no Slurm control here: scontrol update nodename={node.node} state=drain "
                f'reason="gpuconsole remediation", wait for the jobs to end, then ask again',
            )
        )
    for target in drained:
        uuids = (target.uuid,) if target.uuid else ()
        if ctx.kubernetes and target.uuid and target.uuid not in ctx.cordoned:
            draft.steps.append(
                Step(
                    StepKind.CORDON,
                    Layer.KUBERNETES,
                    f"cordon {_label(target)} out of Kubernetes scheduling",
                    gpus=(target.bus_id,),
                    uuids=uuids,
                )
            )
    for pod in pods:
        # by label: the pod's owner on each GPU carries that GPU's own processes
        held = [g for g in drained if any(o.label == pod.label for o in busy_owners(g))]
        where_held = ", ".join(_label(g) for g in held) or _label(gpu)
        draft.steps.append(
            Step(
                StepKind.EVICT,
                Layer.KUBERNETES,
                f"evict pod {pod.name} from {where_held} and wait until it is gone",
                gpus=tuple(g.bus_id for g in held) or (gpu.bus_id,),
                uuids=tuple(g.uuid for g in held if g.uuid),
                pod=pod.name,
            )
        )
    if jobs:
        names = ", ".join(j.job or j.name for j in jobs)
        draft.steps.append(
            Step(
                StepKind.SLURM_DRAIN,
                Layer.SLURM,
                f"drain Slurm node {node.node} (scontrol update state=drain): "
                f"no new job starts there; job {names} runs to its end",
                gpus=(gpu.bus_id,),
                uuids=(gpu.uuid,) if gpu.uuid else (),
            )
        )
        draft.notes.append(
            f"Slurm drains the whole of {node.node}: no new job starts on any of its GPUs"
        )
    for guest in guests:
        tenant = f"tenant {guest.tenant}" if guest.tenant else "the tenant"
        draft.steps.append(
            Step(
                StepKind.NOTIFY,
                None,
                f"tell {tenant} of guest {guest.name} that {where} is drained for repair, "
                "and ask them to shut the guest down",
                gpus=(gpu.bus_id,),
                uuids=(gpu.uuid,) if gpu.uuid else (),
                guest=guest.name,
            )
        )
    if guests and whole:
        draft.notes.append(
            "the node runs guests ("
            + ", ".join(g.name for g in guests)
            + "): it is power-cycled only once they have shut down"
        )
    workload = {o.label for o in owners.values()}
    peers = [p for p in _peers(node, ownership, gpu) if p not in drained]
    shared = tuple(p.bus_id for p in peers if {o.label for o in busy_owners(p)} & workload)
    draft.steps.append(
        Step(
            StepKind.WAIT_IDLE,
            None,
            f"wait until {where} is idle{members}"
            + (
                f" ({', '.join(sorted(workload))} gone"
                + (
                    f", also from NVLink peers {', '.join(map(short_bus_id, shared))}"
                    if shared
                    else ""
                )
                + ")"
                if workload
                else ""
            ),
            gpus=tuple(g.bus_id for g in drained),
            uuids=tuple(g.uuid for g in drained if g.uuid),
            functions=shared,
            owners=tuple(sorted(workload)),
        )
    )


def _process_words(owner: Owner, held_by: dict[str, str] | None = None) -> str:
    pids = " ".join(str(p) for p in owner.pids)
    where = f" on {held_by[owner.label]}" if held_by and owner.label in held_by else ""
    return (f"{owner.label} (pids {pids})" if pids else owner.label) + where


def _reset(
    node: NodeSnapshot,
    ownership: Ownership,
    gpu: GpuOwner,
    together: Sequence[GpuOwner],
    ctx: PlanContext,
    draft: _Draft,
) -> None:
    """nvidia-smi --gpu-reset's rules: nothing may run on the GPUs reset (`gpu` and those
    reset with it in the one command), nor, on an NVSwitch baseboard, on an NVLink peer
    with them outside what the plan drains."""
    mine = {o.label for g in together for o in busy_owners(g)}
    busy = []
    peers = [p for p in _peers(node, ownership, gpu) if p not in together]
    for peer in peers:
        # a process outside any pod, job or guest the plan drains may use the peer's
        # NVLinks to this GPU (P2P), and no step of the plan ends it
        stays = [
            o for o in busy_owners(peer) if o.kind is OwnerKind.PROCESS and o.label not in mine
        ]
        if stays:
            busy.append(f"{_label(peer)}: {', '.join(_process_words(o) for o in stays)}")
    if peers:
        draft.conds.append(
            Precondition(
                "no NVLink peer busy",
                not busy,
                "; ".join(busy) or "no peer on the NVSwitch baseboard runs work with it",
                "stop the work on those peers (a reset on an NVSwitch system needs its NVLink "
                "peers idle), then ask again",
            )
        )
    fm = node.nvml.fabric_manager_running if node.nvml is not None else None
    arch, _switches = nvswitch_board(node)
    if arch == "ampere" and fm is False:
        draft.conds.append(
            Precondition(
                "Fabric Manager running",
                False,
                "Fabric Manager is not running: an Ampere NVSwitch system resets a GPU through it",
                "start it (systemctl start nvidia-fabricmanager), then ask again",
            )
        )
    # one command for the whole set: -i takes a comma-separated list
    command = "nvidia-smi -r -i " + ",".join(g.bus_id for g in together)
    if gpu.driver == HOST_DRIVER and not ctx.gpu_reset:
        draft.conds.append(
            Precondition(
                "GPU reset available",
                False,
                "no way to reset a GPU on this node (nvidia-smi not found)",
                f"reset {'them' if len(together) > 1 else 'it'} on {node.node}: {command}",
            )
        )
    how = command if gpu.driver == HOST_DRIVER else "a PCI function reset (vfio-pci holds it)"
    what = (
        f"{', '.join(_label(g) for g in together)} together, in one command"
        if len(together) > 1
        else _label(gpu)
    )
    draft.steps.append(
        Step(
            StepKind.GPU_RESET,
            Layer.GPU if gpu.driver == HOST_DRIVER else Layer.PCI,
            f"reset {what} ({how})",
            gpus=tuple(g.bus_id for g in together),
            uuids=tuple(g.uuid for g in together if g.uuid),
            functions=tuple(g.bus_id for g in together),
            driver=gpu.driver,
        )
    )


def _power_cycle(node: NodeSnapshot, gpu: GpuOwner, ctx: PlanContext, draft: _Draft) -> None:
    if not ctx.bmc:
        draft.conds.append(
            Precondition(
                "BMC reachable",
                False,
                f"no BMC is configured for {node.node}",
                f"add a [[bmc]] for {node.node}, or power-cycle it yourself",
            )
        )
    running = [o.label for o in power_stops(node)]
    if running:
        draft.notes.append(
            f"{node.node} runs {', '.join(dict.fromkeys(running))}: the power cycle waits "
            "until they are drained, and stops the node for every GPU"
        )
    draft.steps.append(
        Step(
            StepKind.POWER_CYCLE,
            Layer.BMC,
            f"power-cycle {node.node} through its BMC",
            gpus=(gpu.bus_id,),
            uuids=(gpu.uuid,) if gpu.uuid else (),
        )
    )


def _out_of_work(node: NodeSnapshot, gpu: GpuOwner, action: Action, draft: _Draft) -> None:
    """Unbound with driver_override none (nothing binds it), and for reseat or service the
    mark that says why."""
    reading = node.nvml.gpu(gpu.index) if node.nvml and gpu.index is not None else None
    lost = reading is not None and reading.lost
    if gpu.driver is not None:
        draft.steps += _pci_steps(
            node, (gpu.bus_id,), None, _label(gpu), gpu_bus=(gpu.bus_id,), reset=not lost
        )
    if action is Action.DRAIN:
        return
    why = "reseat it and check the mechanicals" if action is Action.RESEAT else "return it (RMA)"
    draft.steps.append(
        Step(
            StepKind.MARK_SERVICE,
            None,
            f"mark {_label(gpu)} for service: {why}",
            gpus=(gpu.bus_id,),
            uuids=(gpu.uuid,) if gpu.uuid else (),
        )
    )


def _verify(node: NodeSnapshot, gpus: Sequence[GpuOwner], action: Action, target: Target) -> Step:
    """The final check of the GPU (first) and of every GPU reset with it: nvidia-smi asks
    for each reset GPU's health to be verified before further use."""
    gpu = gpus[0]
    fit = action in (Action.RESET_GPU, Action.REBOOT_NODE)
    what = (
        f"a fresh reading finds {'it' if len(gpus) == 1 else 'each'} fit (answers NVML, "
        "no XID since, no recovery action, no remap or page retirement pending, "
        "fabric complete)"
        if fit
        else "idle, unbound, nothing may bind it"
    )
    return Step(
        StepKind.VERIFY,
        None,
        f"final check: {what}",
        gpus=tuple(g.bus_id for g in gpus),
        uuids=tuple(g.uuid for g in gpus if g.uuid),
        driver=gpu.driver if fit else None,
        guest=target.guest,
        xids=tuple(node.last_xid.get(g.uuid, -1) if g.uuid else -1 for g in gpus),
    )
