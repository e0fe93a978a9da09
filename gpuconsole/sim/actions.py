"""The simulator's drivers: steps move GPUs in a simulated node's tenancy plan and sysfs tree.

A `SimWorld` is one simulated node whose tenants (guests, pods, jobs), Kubernetes cordons
and sysfs/procfs trees live under a folder and survive the process: `gpuconsole assign
--demo` runs against it, and a demo process killed mid-plan leaves it as a real node would
be left, for recovery to find. The PCI steps run the real vfio driver over the world's
sysfs tree, with `SysfsKernel` playing the kernel's part (driver_override, unbind,
drivers_probe); guests and Kubernetes are the world's plan. Reading the world goes through
the real NVML and tenancy sources, so the plan is made from what the console would show.

A `LiveWorld` is a node of a running demo hub instead: the demo console's executor moves GPUs
in the very tree and SimNode that hub's sources read, so its views show each step land.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.drivers import Drivers, StepFailed
from gpuconsole.actions.drivers.vfio import VfioDriver
from gpuconsole.actions.executor import Executor, StepUpdate
from gpuconsole.actions.journal import Journal
from gpuconsole.actions.plan import Step, StepKind
from gpuconsole.actions.store import AUDIT_FILE, JOURNAL_FILE
from gpuconsole.hub import Hub
from gpuconsole.readings.base import normal_bus_id
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sim.cluster import tenanted_node
from gpuconsole.sim.node import Scenario, SimNode
from gpuconsole.sim.profiles import NodeProfile
from gpuconsole.sim.tenancy import (
    SIM_RULES,
    SimGuest,
    SimJob,
    SimPlan,
    SimPod,
    SimTenancyTree,
    plan_for,
)
from gpuconsole.sources.base import EmitEvent
from gpuconsole.sources.pci import read_attribute

__all__ = [
    "SIM_WAITS",
    "SLURM_JOB_ENDS_S",
    "LiveWorld",
    "SimWorld",
    "SysfsKernel",
    "live_actions",
    "live_executor",
    "live_world",
    "sim_drivers",
]

# How long a simulated node's Slurm jobs run on once the node is drained: a job's end, soon
# enough that the demo's plans that wait for it go on.
SLURM_JOB_ENDS_S = 6.0


# How an executor waits on a simulated node (Executor's idle_timeout_s, settle_s, poll_s):
# its tenants go at once (its Slurm jobs in SLURM_JOB_ENDS_S), and its GPUs come back at once
# after a reset or power cycle, or never; a real node's minutes would only keep the demo's
# operator waiting for a GPU that stays lost.
class SimWaits(TypedDict):
    idle_timeout_s: float
    settle_s: float
    poll_s: float


SIM_WAITS: SimWaits = {"idle_timeout_s": 30.0, "settle_s": 8.0, "poll_s": 0.5}
# Drivers a fake kernel binds by PCI class when driver_override is empty.
_DEFAULT_DRIVERS = {0x03: "nvidia", 0x04: "snd_hda_intel", 0x06: "nvidia"}


class SysfsKernel:
    """What the kernel does after a write to a fake sysfs tree: bind, unbind, store overrides.

    `bound` is told each function's new driver (None: unbound), as a driver's probe and
    remove would be run; the simulator uses it for /proc/driver/nvidia.
    """

    def __init__(
        self, sysfs_root: str, bound: Callable[[str, str | None], None] | None = None
    ) -> None:
        self.sysfs_root = sysfs_root
        self.bound = bound
        self.writes: list[tuple[str, str]] = []  # (path relative to the root, text)

    def _device(self, bdf: str) -> str:
        return os.path.realpath(os.path.join(self.sysfs_root, "bus", "pci", "devices", bdf))

    def default_driver(self, bdf: str) -> str | None:
        text = read_attribute(os.path.join(self._device(bdf), "class")) or ""
        try:
            return _DEFAULT_DRIVERS.get(int(text, 16) >> 16)
        except ValueError:
            return None

    def __call__(self, path: str, text: str) -> None:
        self.writes.append((os.path.relpath(path, self.sysfs_root), text))
        name = os.path.basename(path)
        if name == "driver_override":
            if not text.strip():
                with open(path, "w", encoding="ascii") as f:
                    f.write("(null)\n")
            return
        bdf = text.strip()
        device = self._device(bdf)
        link = os.path.join(device, "driver")
        if name == "unbind":
            if os.path.islink(link):
                os.unlink(link)
                if self.bound is not None:
                    self.bound(bdf, None)
        elif name == "drivers_probe":
            if os.path.islink(link):
                return
            override = read_attribute(os.path.join(device, "driver_override")) or ""
            if override == "none":
                return
            driver = override if override and override != "(null)" else self.default_driver(bdf)
            if driver is None:
                return
            folder = os.path.join(self.sysfs_root, "bus", "pci", "drivers", driver)
            os.makedirs(folder, exist_ok=True)
            os.symlink(os.path.relpath(folder, device), link)
            if self.bound is not None:
                self.bound(bdf, driver)


class _WorldNode(SimNode):
    """A SimNode that NVML sees through the world's sysfs tree; its compute processes run
    where the world's plan puts a tenant (`SimWorld.follow`)."""

    world: SimWorld | None = None

    def visible(self, index: int) -> bool:
        """NVML sees a GPU while the nvidia driver holds it in the world's sysfs tree."""
        if self.world is None:
            return True
        bdf = normal_bus_id(self.profile.gpus[index].bus_id)
        return VfioDriver(self.world.tree.sysfs_root).driver(bdf) == "nvidia"

    def power_cycle(self) -> None:
        """Its BMC cycled it (a plan's step, `gpuconsole power --demo`): kept in the world,
        for the next command to find it booted again."""
        super().power_cycle()
        if self.world is not None:
            self.world.save()


def _plan_json(plan: SimPlan) -> dict[str, Any]:
    return dataclasses.asdict(plan)


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _plan_from(data: dict[str, Any]) -> SimPlan:
    def build(cls: Any, items: list[dict[str, Any]]) -> tuple[Any, ...]:
        return tuple(cls(**{k: _tuples(v) for k, v in item.items()}) for item in items)

    return SimPlan(
        guests=build(SimGuest, data.get("guests", [])),
        pods=build(SimPod, data.get("pods", [])),
        jobs=build(SimJob, data.get("jobs", [])),
        loose=tuple(int(g) for g in data.get("loose", [])),
    )


class SimWorld:
    """One simulated node's tenants, cordons and trees, kept under `root`."""

    def __init__(
        self,
        name: str,
        profile: NodeProfile,
        root: Path,
        plan: SimPlan | None = None,
        scenarios: Sequence[Scenario] = (),
    ) -> None:
        self.root = root
        self.state_file = root / "world.json"
        # the journal its executor writes, read with the node as a real node's hub reads its
        # own: how its GPUs' last repairs went is part of their verdict
        self.journal: Path | None = None
        fresh = not self.state_file.exists()
        data: dict[str, Any] = (
            {} if fresh else json.loads(self.state_file.read_text(encoding="utf-8"))
        )
        if not fresh:
            plan = _plan_from(data["plan"])
        if plan is None:
            plan = plan_for(name, profile)
        # as the demo's hub has the node: its tenants decide who computes, on which MIG
        # instances, in which shared GPUs
        node = tenanted_node(_WorldNode, name, profile, plan, scenarios=scenarios)
        node.world = self
        self.node: SimNode = node
        self.tree = SimTenancyTree(self.node, str(root), plan)
        self.slurm_drained = False
        self.slurm_drained_at: float | None = None
        if not fresh:
            self.tree.cordoned = set(data.get("cordoned", []))
            self.tree.switches = dict(data.get("switches", {}))
            self.slurm_drained = bool(data.get("slurm_drained", False))
            at = data.get("slurm_drained_at")
            self.slurm_drained_at = float(at) if isinstance(at, int | float) else None
            # one timeline for every process that acts on the world: a scenario due 45 s
            # after the world began has happened for the next command too
            node.t0 = float(data.get("started", node.t0))
            repairs = data.get("repairs", {})
            node.restore_repairs(
                [(str(k), int(g)) for k, g in repairs.get("cleared", [])],
                {int(g): int(n) for g, n in repairs.get("resets", {}).items()},
                int(repairs.get("power_cycles", 0)),
            )
            # the tree is on disk already: its processes must not be written twice
            self.tree._pids = {int(n) for n in os.listdir(self.tree.proc_root) if n.isdigit()}
            self.tree.write_boot()  # as the power cycles so far left it
        if fresh:
            root.mkdir(parents=True, exist_ok=True)
            self.tree.create()
            self.save()

    @classmethod
    def demo(cls, name: str, root: Path) -> SimWorld:
        """A node of the demo cluster, with the demo's own tenants the first time."""
        from gpuconsole.sim.cluster import demo_cluster
        from gpuconsole.sim.profiles import get_profile

        specs = {s.name: s for s in demo_cluster()}
        if name not in specs:
            raise KeyError(f"no simulated node {name!r} (known: {', '.join(specs)})")
        profile = get_profile(specs[name].profile)
        return cls(name, profile, root, plan_for(name, profile), specs[name].scenarios)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def cordoned(self) -> set[str]:
        """GPU UUIDs its Kubernetes may not schedule."""
        return self.tree.cordoned

    @cordoned.setter
    def cordoned(self, uuids: set[str]) -> None:
        self.tree.cordoned = uuids

    @property
    def switches(self) -> dict[str, list[str]]:
        """Guest -> NVSwitches of a partial partition."""
        return self.tree.switches

    @property
    def plan(self) -> SimPlan:
        return self.tree.plan

    @plan.setter
    def plan(self, plan: SimPlan) -> None:
        self.tree.plan = plan
        self.save()

    def follow(self) -> None:
        """Tell the SimNode which GPUs the host's NVML now sees (those nvidia holds), which
        nobody computes on, and which MIG instances and shared GPUs run a process, as the
        tenants and the kernel now have it."""
        vfio = VfioDriver(self.tree.sysfs_root)
        gpus = self.node.profile.gpus
        hidden = frozenset(
            g.index for g in gpus if vfio.driver(normal_bus_id(g.bus_id)) != "nvidia"
        )
        plan = self.plan
        self.node.retenant(
            passthrough=hidden,
            idle=plan.idle_gpus(len(gpus)),
            mig_slots=plan.mig_slots,
            sharers=plan.sharers,
        )
        self.tree.write_boot()  # a power cycle booted it again

    def save(self) -> None:
        """Follow the tenants, and write the world's state atomically: a kill leaves the old
        file or the new one."""
        self.follow()
        body = json.dumps(
            {
                "plan": _plan_json(self.plan),
                "cordoned": sorted(self.cordoned),
                "switches": self.switches,
                "slurm_drained": self.slurm_drained,
                "slurm_drained_at": self.slurm_drained_at,
                "repairs": self.node.repairs(),
                "started": self.node.t0,
            }
        )
        tmp = self.state_file.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_file)

    def index_of(self, bdf: str) -> int | None:
        for gpu in self.node.profile.gpus:
            if normal_bus_id(gpu.bus_id) == normal_bus_id(bdf):
                return gpu.index
        return None

    def nvidia_bound(self, bdf: str, driver: str | None) -> None:
        """The nvidia driver's /proc entry appears on bind and goes on unbind."""
        index = self.index_of(bdf)
        if index is None:
            return
        folder = os.path.join(self.tree.proc_root, "driver", "nvidia", "gpus", normal_bus_id(bdf))
        info = os.path.join(folder, "information")
        if driver == "nvidia":
            os.makedirs(folder, exist_ok=True)
            with open(info, "w", encoding="utf-8") as f:
                f.write(
                    f"Model: \t\t {self.node.profile.gpu_model.name}\n"
                    f"GPU UUID: \t {self.node.uuids[index]}\n"
                    f"Bus Location: \t {normal_bus_id(bdf)}\nDevice Minor: \t {index}\n"
                )
        elif os.path.exists(info):
            os.unlink(info)

    def owners(self, index: int) -> list[str]:
        """Every claim on a GPU: guests defining it, pods and jobs holding it, or the pool it
        sits in (free, k8s, drained, vfio). Exactly one, when all is well."""
        plan = self.plan
        bdf = normal_bus_id(self.node.profile.gpus[index].bus_id)
        claims = [f"vm {g.name}" for g in plan.guests if index in g.gpus]
        claims += [
            f"pod {p.namespace}/{p.pod}"
            for p in plan.pods
            if index in p.gpus or any(g == index for g, _ in p.mig + p.replicas)
        ]
        claims += [f"job {j.job}" for j in plan.jobs if index in j.gpus]
        if claims:
            return claims
        driver = VfioDriver(self.tree.sysfs_root).driver(bdf)
        uuid = self.node.uuids[index]
        if driver == "nvidia":
            return ["free" if uuid in self.cordoned else "k8s"]
        if driver is None:
            return ["drained"]
        return [f"unassigned ({driver})"]

    def _jobs_end(self) -> None:
        """Slurm lets a drained node's jobs run to their end: here they end
        SLURM_JOB_ENDS_S after the drain."""
        at = self.slurm_drained_at
        if not self.plan.jobs or not self.slurm_drained or at is None:
            return
        if self.node.clock() - at >= SLURM_JOB_ENDS_S:
            self.plan = dataclasses.replace(self.plan, jobs=())

    async def snapshot(self, *, fabric: bool = False) -> NodeSnapshot:
        """The node as the console would read it: the real NVML and tenancy sources, and
        with `fabric` the fabric source too (GPU-NIC affinity, for placement help)."""
        from gpuconsole.sim.nvml import SimNvml
        from gpuconsole.sources.nvml.source import NvmlSource
        from gpuconsole.sources.tenancy import TenancySource

        self._jobs_end()
        await asyncio.to_thread(self.tree.refresh)
        hub = Hub()
        hub.add_node(self.name, simulated=True, profile=self.node.profile.name)
        hub.add_source(
            NvmlSource(
                self.name,
                lib=SimNvml(self.node),
                events=False,
                simulated=True,
                fabric_manager=lambda: True,  # the simulated node runs its Fabric Manager
            )
        )
        tree = self.tree
        hub.add_source(
            TenancySource(
                self.name,
                sysfs_root=tree.sysfs_root,
                proc_root=tree.proc_root,
                libvirt_uri="sim:///" + self.name,
                libvirt_connect=lambda _uri: tree.libvirt(),
                kubelet_stub=tree.kubelet(),
                qemu_scan=False,
                rules=SIM_RULES,
                passwd_file=tree.passwd_file,
                simulated=True,
            )
        )
        if fabric:
            from gpuconsole.sim.fabric import SimFabricSource

            hub.add_source(SimFabricSource(self.node, netlink=False))
        if self.journal is not None:
            from gpuconsole.actions.journal_events import JournalEvents

            hub.add_source(JournalEvents(self.name, self.journal, proc_root=tree.proc_root))
        fleet = await hub.poll_once()
        found = fleet.node(self.name)
        assert found is not None
        return found


class SimPciDriver(VfioDriver):
    """The vfio driver over the world's sysfs tree; idle means no tenant holds the GPU."""

    def __init__(self, world: SimWorld) -> None:
        kernel = SysfsKernel(world.tree.sysfs_root, world.nvidia_bound)
        super().__init__(world.tree.sysfs_root, world.tree.proc_root, kernel=kernel, settle_s=1.0)
        self.world = world

    def check_idle(self, step: Step) -> str:
        busy = []
        for bdf in step.gpus:
            index = self.world.index_of(bdf)
            if index is not None and index in self.world.plan.busy_gpus:
                busy += [c for c in self.world.owners(index) if not c.startswith("vm ")]
        if busy:
            raise StepFailed(f"{', '.join(step.gpus)} is busy: {', '.join(busy)}; stop it first")
        return f"idle: no process on {', '.join(step.gpus)}"


class SimGuestsDriver:
    """Guests of the world: <hostdev>s become GPU indexes of a SimGuest; hotplug always works."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    def _change(self, name: str | None, add: tuple[str, ...], remove: tuple[str, ...]) -> str:
        plan = self.world.plan
        guest = next((g for g in plan.guests if g.name == name), None)
        if guest is None:
            raise StepFailed(f"no guest {name!r} on {self.world.name}: define it first")
        if remove and guest.state == 1:
            raise StepFailed(f"guest {name} is running: shut it down before its GPU leaves")
        switches = {normal_bus_id(s.bus_id) for s in self.world.node.profile.nvswitches}
        indexes = set(guest.gpus)
        indexes |= {i for b in add if (i := self.world.index_of(b)) is not None}
        indexes -= {i for b in remove if (i := self.world.index_of(b)) is not None}
        before = set(self.world.switches.get(guest.name, []))
        before |= switches if guest.nvswitches else set()
        held = (before | (set(add) & switches)) - set(remove)
        nvswitches = bool(switches) and held == switches
        new = dataclasses.replace(guest, gpus=tuple(sorted(indexes)), nvswitches=nvswitches)
        if new == guest and held == before:
            return f"{name}'s definition already as planned"
        if held and not nvswitches:
            self.world.switches[guest.name] = sorted(held)
        else:
            self.world.switches.pop(guest.name, None)
        self.world.plan = dataclasses.replace(
            plan, guests=tuple(new if g is guest else g for g in plan.guests)
        )
        live = " (hotplugged)" if guest.state == 1 and add else ""
        return f"defined {name} with GPUs {', '.join(map(str, new.gpus)) or 'none'}{live}"

    async def run(self, step: Step) -> str:
        if step.kind is StepKind.ATTACH:
            return self._change(step.guest, step.functions, ())
        if step.kind is StepKind.DETACH:
            return self._change(step.guest, (), step.functions)
        raise StepFailed(f"the simulated guests do not do {step.kind.value}")

    async def undo(self, step: Step) -> str:
        if step.kind is StepKind.ATTACH:
            return self._change(step.guest, (), step.functions)
        if step.kind is StepKind.DETACH:
            return self._change(step.guest, step.functions, ())
        return "nothing to undo"


class SimKubernetesDriver:
    """The world's Kubernetes: a set of cordoned UUIDs, and pods that go when evicted."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    async def cordoned(self) -> frozenset[str]:
        return frozenset(self.world.cordoned)

    def _cordon(self, uuids: tuple[str, ...], on: bool) -> str:
        before = set(self.world.cordoned)
        if on:
            self.world.cordoned |= set(uuids)
        else:
            self.world.cordoned -= set(uuids)
        if self.world.cordoned != before:
            self.world.save()
        return f"{'cordoned' if on else 'uncordoned'} {', '.join(uuids)}"

    async def run(self, step: Step) -> str:
        if step.kind in (StepKind.CORDON, StepKind.UNCORDON):
            return self._cordon(step.uuids, step.kind is StepKind.CORDON)
        if step.kind is StepKind.EVICT and step.pod:
            plan = self.world.plan
            pods = tuple(p for p in plan.pods if f"{p.namespace}/{p.pod}" != step.pod)
            if len(pods) == len(plan.pods):
                return f"pod {step.pod} already gone"
            self.world.plan = dataclasses.replace(plan, pods=pods)
            return f"evicted pod {step.pod}"
        raise StepFailed(f"the simulated Kubernetes does not do {step.kind.value}")

    async def undo(self, step: Step) -> str:
        if step.kind in (StepKind.CORDON, StepKind.UNCORDON):
            return self._cordon(step.uuids, step.kind is not StepKind.CORDON)
        return "nothing to undo" if step.kind is not StepKind.EVICT else "pod stays evicted"


class SimGpuDriver:
    """`nvidia-smi -r -i BUS[,BUS...]` on the world's node, one command for the step's GPUs:
    refused while a tenant or process holds one of them, as the driver refuses, and before
    Ampere unless every GPU NVLink joins to one being reset is in the command too (nvidia-smi
    names those missing and resets none); a fault a reset cannot clear leaves it lost."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    async def run(self, step: Step) -> str:
        command = f"nvidia-smi -r -i {','.join(step.gpus)}"
        indexes: dict[int, str] = {}
        for bus in step.gpus:
            index = self.world.index_of(bus)
            if index is None:
                raise StepFailed(f"{command}: no such GPU {bus}")
            indexes[index] = bus
        gpus = self.world.node.profile.gpus
        missing = sorted(self.world.node.profile.reset_together(indexes) - set(indexes))
        if missing:
            names = ", ".join(normal_bus_id(gpus[i].bus_id) for i in missing)
            raise StepFailed(
                f"{command}: unable to reset: GPUs with NVLink connections to a GPU being "
                f"reset must be reset in the same command; add {names} to -i, or omit -i "
                "to reset every GPU"
            )
        for index, bus in indexes.items():
            if index in self.world.plan.busy_gpus:
                held = ", ".join(self.world.owners(index))
                raise StepFailed(f"{command}: the GPU {bus} is in use ({held})")
        if any(self.world.node.profile.reset_together([i]) != {i} for i in indexes):
            # GPUs that cannot be reset one by one: no other GPU may compute meanwhile
            others = [
                f"{normal_bus_id(g.bus_id)} ({', '.join(self.world.owners(g.index))})"
                for g in gpus
                if g.index not in indexes and g.index in self.world.plan.busy_gpus
            ]
            if others:
                raise StepFailed(
                    f"{command}: unable to reset: compute applications run on other GPUs "
                    f"({', '.join(others)})"
                )
        lost = []
        for index, bus in indexes.items():
            if not self.world.node.reset_gpu(index):
                lost.append(bus)
        self.world.save()
        if lost:
            raise StepFailed(
                f"{command}: unable to reset {', '.join(lost)}: still lost (fell off the bus)"
            )
        return f"reset {', '.join(step.gpus)} (nvidia-smi -r)"

    async def undo(self, step: Step) -> str:
        return "a reset cannot be undone"


class SimSlurmDriver:
    """The world's Slurm node: drained (no new job starts) or not; running jobs go on."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    def _set(self, drained: bool) -> str:
        if drained and not self.world.slurm_drained:
            self.world.slurm_drained_at = self.world.node.clock()
        self.world.slurm_drained = drained
        self.world.save()
        return f"Slurm node {self.world.name} {'draining' if drained else 'resumed'}"

    async def run(self, step: Step) -> str:
        return self._set(True)

    async def undo(self, step: Step) -> str:
        return self._set(False)


class SimBmcDriver:
    """The world's BMC: a power cycle brings back what a reset would, on every GPU."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    async def run(self, step: Step) -> str:
        self.world.node.power_cycle()
        self.world.save()
        return f"power cycle requested through the simulated BMC of {self.world.name}"

    async def undo(self, step: Step) -> str:
        return "a power cycle cannot be undone"


def sim_drivers(world: SimWorld) -> Drivers:
    """Every layer of a simulated node."""
    return Drivers(
        pci=SimPciDriver(world),
        guests=SimGuestsDriver(world),
        kubernetes=SimKubernetesDriver(world),
        gpu=SimGpuDriver(world),
        slurm=SimSlurmDriver(world),
        bmc=SimBmcDriver(world),
    )


# --- a running demo hub's nodes ----------------------------------------------------------


class LiveWorld(SimWorld):
    """A node of a running demo hub, as a world: steps move GPUs in the very tree and SimNode
    that hub's sources read, so every console on the hub sees each step land on its next poll.

    It lives as long as the hub (its tree is the tenancy simulator's temporary one); its
    journal and audit log sit in that tree's folder, shared by every session of the process.
    """

    def __init__(self, node: SimNode, tree: SimTenancyTree) -> None:
        # not SimWorld.__init__, which opens or lays out a world of its own under a folder
        self.root = Path(tree.root)
        self.state_file = self.root / "world.json"
        self.journal = None
        self.node = node
        self.tree = tree
        self.slurm_drained = False
        self.slurm_drained_at = None

    def save(self) -> None:
        """Nothing to keep on disk: the hub's node follows its tenants instead."""
        self.follow()

    def nvidia_bound(self, bdf: str, driver: str | None) -> None:
        super().nvidia_bound(bdf, driver)
        self.follow()


def live_actions(tree: SimTenancyTree) -> Path:
    """Where a node of a running demo hub keeps its journal and audit log: in its tenancy
    tree, for as long as the hub runs."""
    return Path(tree.root) / "actions"


def live_world(hub: Hub, node: str) -> LiveWorld | None:
    """The world of a simulated node whose tenants `hub` reads; None when it reads none there
    (a real node, or one past the simulator's limit on tenancy trees)."""
    from gpuconsole.sim.tenancy import SimTenancySource

    for source in hub.sources:
        if isinstance(source, SimTenancySource) and source.node == node:
            return LiveWorld(source.sim, source.tree)
    return None


def live_executor(
    hub: Hub,
    node: str,
    emit: EmitEvent | None = None,
    on_step: Callable[[StepUpdate], None] | None = None,
) -> Executor:
    """The executor for a simulated node of a running demo hub: it acts on what the hub
    reads. Raises ValueError when the hub has no such world (yet)."""
    world = live_world(hub, node)
    if world is None:
        raise ValueError(f"{node}: the demo simulates no tenants there, so nothing can move")
    if not os.path.isdir(world.tree.sysfs_root):
        raise ValueError(f"{node}: the demo has not laid out its tenants yet; try again")
    state = live_actions(world.tree)
    world.journal = state / JOURNAL_FILE
    return Executor(
        node,
        sim_drivers(world),
        Journal(world.journal, proc_root=world.tree.proc_root),
        AuditLog(state / AUDIT_FILE),
        reader=world.snapshot,
        emit=emit,
        on_step=on_step,
        **SIM_WAITS,
    )
