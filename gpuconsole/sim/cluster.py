"""The simulated cluster that `gpuconsole demo` shows: which nodes, which scenarios."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.nvml import NvmlReading
from gpuconsole.sim.node import Scenario, SimNode
from gpuconsole.sim.nvml import SimNvml
from gpuconsole.sim.plans import SimPlan, plan_for
from gpuconsole.sim.profiles import NodeProfile, get_profile
from gpuconsole.sources.base import EmitEvent
from gpuconsole.sources.nvml.source import NvmlSource

_N = TypeVar("_N", bound=SimNode)


@dataclass(frozen=True, slots=True)
class SimNodeSpec:
    """One node of the demo cluster."""

    name: str
    profile: str
    scenarios: tuple[Scenario, ...] = ()


# The small cluster: every profile and every scenario on at least one node, each on a GPU
# the host's NVML sees (the tenants are in gpuconsole.sim.plans: dgx-001's eight GPUs and
# dgx-004's GPU 2 are passed through to guests, so dgx-004's ECC trouble is on GPU 3,
# which NVML numbers 2 there, and its MIG GPU 7 is NVML's 6).
# BMC trouble: dgx-002's FAN 3 stops (its GPU 3 runs hot), dgxa-001 loses PSU 2,
# dgxa-002's BMC stops answering 60 s in.
# NVLink trouble: from 20 s in, NVLink 0 of dgxa-001's GPU 6 (in Slurm job 4712) replays and
# sees CRC errors and retrains every 20 s. The NVML source reads the counters every 30 polls:
# about 30 s in the GPU is "watch", from about 90 s (3 retrains) "drain, then reseat".
# An older DGX-1 (V100, before Ampere: pages are retired, not rows remapped): its GPU 2 has
# retired two pages for single-bit errors and one for a double-bit error, and a retirement
# waits for a GPU reset.
# GPU trouble and its repair (`r`, `remediate --demo`), each on a GPU a pod holds:
# - dgx-003's GPU 5 falls off the bus (XID 79) 45 s in (story 1): its reset brings it back, fit;
# - dgx-005's GPU 2 sees a double-bit ECC error (XID 48) 30 s in, a row remap pending
#   (story 8): drained and reset, the spare row is in and it is fit, the node never rebooted;
# - dgx-006's GPU 1 falls off the bus 75 s in and stays off: its reset fails, so does the
#   node's power cycle through its BMC, and it goes back for service.
DEMO_CLUSTER: tuple[SimNodeSpec, ...] = (
    SimNodeSpec("dgx-001", "dgx-h100"),
    SimNodeSpec("dgx-002", "dgx-h100", (Scenario("thermal", 3), Scenario("fan", 3))),
    SimNodeSpec("dgx-003", "dgx-h100", (Scenario("xid79", 5, 45.0),)),
    SimNodeSpec("dgx-004", "dgx-h100", (Scenario("mig", 7), Scenario("ecc", 3))),
    SimNodeSpec("dgx-005", "dgx-h100", (Scenario("xid48", 2, 30.0),)),
    SimNodeSpec("dgx-006", "dgx-h100", (Scenario("xid79hard", 1, 75.0),)),
    SimNodeSpec(
        "dgxa-001",
        "dgx-a100",
        (Scenario("mig", 0), Scenario("psu", 2), Scenario("nvlinkerr", 6, 20.0)),
    ),
    SimNodeSpec("dgxa-002", "dgx-a100", (Scenario("bmcsilent", 0, 60.0),)),
    SimNodeSpec("apollo-01", "apollo-pcie"),
    SimNodeSpec("dgx1-001", "dgx-1v", (Scenario("retired", 2),)),
)


def demo_cluster(nodes: int | None = None) -> tuple[SimNodeSpec, ...]:
    """The demo cluster, or `nodes` nodes in the same proportions with scenarios sprinkled."""
    if nodes is None or nodes == len(DEMO_CLUSTER):
        return DEMO_CLUSTER
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    specs: list[SimNodeSpec] = []
    kinds = ("thermal", "ecc", "mig", "xid79")
    for i in range(nodes):
        if i % 20 == 19:
            name, profile = f"apollo-{i // 20 + 1:02d}", "apollo-pcie"
        elif i % 5 == 4:
            name, profile = f"dgxa-{i + 1:03d}", "dgx-a100"
        else:
            name, profile = f"dgx-{i + 1:03d}", "dgx-h100"
        scenarios: tuple[Scenario, ...] = ()
        if i % 7 == 1:
            kind = kinds[(i // 7) % len(kinds)]
            at = 45.0 + (i % 11) * 30 if kind == "xid79" else 0.0
            gpu = (i * 3) % 8
            while gpu in plan_for(name, get_profile(profile)).vfio_gpus:
                gpu = (gpu + 1) % 8  # trouble NVML can see: not on a guest's GPU
            scenarios = (Scenario(kind, gpu, at),)
        specs.append(SimNodeSpec(name, profile, scenarios))
    return tuple(specs)


def build_sim_nodes(
    specs: Sequence[SimNodeSpec],
    *,
    seed: int = 0,
    clock: Callable[[], float] = time.time,
    start: float | None = None,
) -> list[SimNode]:
    """SimNodes for the specs, all started at the same instant, each told by its tenancy
    plan which GPUs are passed through to guests and which nobody computes on."""
    t0 = clock() if start is None else start
    nodes = []
    for s in specs:
        profile = get_profile(s.profile)
        plan = plan_for(s.name, profile)
        node = tenanted_node(
            SimNode, s.name, profile, plan, seed=seed, scenarios=s.scenarios, clock=clock, start=t0
        )
        nodes.append(node)
    return nodes


def tenanted_node(
    kind: type[_N],
    name: str,
    profile: NodeProfile,
    plan: SimPlan,
    *,
    seed: int = 0,
    scenarios: Sequence[Scenario] = (),
    clock: Callable[[], float] = time.time,
    start: float | None = None,
) -> _N:
    """A SimNode (of `kind`) told by a tenancy plan which GPUs are passed through, which
    nobody computes on, which MIG instances and shared GPUs run a process, and which GPUs
    run one workload together: the demo's hub and `assign --demo`'s world alike."""
    return kind(
        name,
        profile,
        seed=seed,
        scenarios=scenarios,
        clock=clock,
        start=start,
        passthrough=plan.vfio_gpus,
        idle=plan.idle_gpus(len(profile.gpus)),
        mig_slots=plan.mig_slots,
        sharers=plan.sharers,
        workloads=plan.workloads,
    )


class SimNvmlSource(NvmlSource):
    """The NVML source over a SimNode. NVML numbers GPUs when it starts, so when the
    simulated kernel rebinds one (an assign in the demo), NVML is started again to see it."""

    def __init__(self, node: SimNode, **options: Any) -> None:
        # a simulated NVSwitch node runs its Fabric Manager (this machine's /proc says nothing)
        options.setdefault("fabric_manager", lambda: True)
        super().__init__(node.name, lib=SimNvml(node), simulated=True, **options)
        self.sim = node
        self._numbered = self._visible()
        self._emit_to: EmitEvent | None = None

    def _visible(self) -> frozenset[int]:
        return frozenset(g.index for g in self.sim.profile.gpus if self.sim.visible(g.index))

    async def start(self, emit: EmitEvent) -> None:
        self._emit_to = emit
        self._numbered = self._visible()
        await super().start(emit)

    async def poll(self) -> NvmlReading:
        if self._emit_to is not None and self._visible() != self._numbered:
            await self.close()
            await self.start(self._emit_to)
        return await super().poll()


def add_sim_sources(
    hub: Hub,
    nodes: Sequence[SimNode],
    *,
    interval_s: float = 1.0,
    events: bool = True,
    clock: Callable[[], float] = time.time,
) -> None:
    """Give the hub an NVML source per simulated node, running over the simulator."""
    for node in nodes:
        hub.add_node(node.name, simulated=True, profile=node.profile.name)
        hub.add_source(SimNvmlSource(node, interval_s=interval_s, events=events, clock=clock))


def add_sim_bmc_sources(
    hub: Hub,
    nodes: Sequence[SimNode],
    *,
    interval_s: float = 5.0,
    clock: Callable[[], float] = time.time,
) -> None:
    """Give the hub a BMC source per simulated node, over its simulated BMC (IPMI-shaped)."""
    from gpuconsole.sim.bmc import sim_link
    from gpuconsole.sources.bmc import BmcPool, BmcSource
    from gpuconsole.sources.bmc.sel import SelCursor

    pool = BmcPool()
    for node in nodes:
        hub.add_node(node.name, simulated=True, profile=node.profile.name)
        hub.add_source(
            BmcSource(
                node.name,
                sim_link(node),
                interval_s=interval_s,
                timeout_s=max(2.0, interval_s),
                pool=pool,
                # a simulated cluster starts fresh: its whole SEL is news
                sel_cursor=SelCursor(last_record_id=0, loaded=True),
                simulated=True,
                clock=clock,
            )
        )


def demo_hub(
    nodes: int | None = None,
    *,
    seed: int = 0,
    interval_s: float = 1.0,
    events: bool = True,
    clock: Callable[[], float] = time.time,
    start: float | None = None,
    settings: HubSettings | None = None,
    bmc: bool = True,
    fabric: bool = True,
    tenancy: bool = True,
    fabric_interval_s: float = 2.0,
    tenancy_interval_s: float = 5.0,
    specs: Sequence[SimNodeSpec] | None = None,
) -> Hub:
    """A hub over the simulated demo cluster, or the nodes `specs` names (not started): NVML,
    and unless turned off the BMC, fabric and tenancy of every node."""
    # A simulated world on a test's clock derives its rates on that clock too.
    hub = Hub(settings, clock=clock, monotonic=time.monotonic if clock is time.time else clock)
    chosen = demo_cluster(nodes) if specs is None else specs
    sims = build_sim_nodes(chosen, seed=seed, clock=clock, start=start)
    add_sim_sources(hub, sims, interval_s=interval_s, events=events, clock=clock)
    if bmc:
        add_sim_bmc_sources(hub, sims, clock=clock)
    if fabric:
        from gpuconsole.sim.fabric import add_sim_fabric_sources

        add_sim_fabric_sources(hub, sims, interval_s=fabric_interval_s, clock=clock)
    if tenancy:
        from gpuconsole.sim.tenancy import add_sim_tenancy_sources

        add_sim_tenancy_sources(hub, sims, interval_s=tenancy_interval_s, clock=clock)
    return hub
