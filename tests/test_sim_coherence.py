"""The simulator agrees with its own tenants: NVML, physics and /proc tell one story."""

from __future__ import annotations

from gpuconsole.facts.ownership import OwnerKind, ProblemKind, node_ownership
from gpuconsole.sim.cluster import DEMO_CLUSTER, build_sim_nodes, demo_cluster
from gpuconsole.sim.node import NODE_SCENARIO_KINDS, SimNode
from gpuconsole.sim.nvml import SimNvml
from gpuconsole.sim.plans import plan_for
from gpuconsole.sim.profiles import DGX_H100, get_profile
from gpuconsole.sources.nvml.source import NvmlSource
from tests.conftest_tui import frozen_fleet

T0 = 1000.0


def nvml_of(node: SimNode) -> SimNvml:
    lib = SimNvml(node)
    lib.nvmlInit()
    return lib


def demo_nodes(at: float = T0 + 30.0) -> dict[str, SimNode]:
    return {n.name: n for n in build_sim_nodes(DEMO_CLUSTER, clock=lambda: at, start=T0)}


def test_nvml_does_not_see_a_passed_through_gpu_and_renumbers_the_rest() -> None:
    node = SimNode("dgx-x", DGX_H100, clock=lambda: T0, start=T0, passthrough=frozenset({2}))
    lib = nvml_of(node)
    assert lib.nvmlDeviceGetCount() == 7
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(7)]
    assert [lib.nvmlDeviceGetIndex(h) for h in handles] == list(range(7))
    buses = [lib.nvmlDeviceGetPciInfo(h).busId for h in handles]
    assert buses == [g.bus_id for g in DGX_H100.gpus if g.index != 2]
    assert [lib.nvmlDeviceGetUUID(h) for h in handles] == [
        u for i, u in enumerate(node.uuids) if i != 2
    ]
    # identity, topology and NVLink follow the GPU, not its new number
    assert lib.nvmlDeviceGetModuleId(handles[2]) == DGX_H100.gpus[3].module_id
    assert lib.nvmlDeviceGetNumaNodeId(handles[6]) == DGX_H100.gpus[7].numa_node


def test_without_passthrough_nvml_numbers_the_gpus_as_the_profile_does() -> None:
    lib = nvml_of(SimNode("dgx-x", DGX_H100, clock=lambda: T0, start=T0))
    assert lib.nvmlDeviceGetCount() == 8
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    assert [lib.nvmlDeviceGetPciInfo(h).busId for h in handles] == [g.bus_id for g in DGX_H100.gpus]


async def test_the_nvml_source_reads_the_gpus_the_host_sees_by_their_bus_ids() -> None:
    node = demo_nodes()["dgx-004"]
    source = NvmlSource(node.name, lib=SimNvml(node), events=False, clock=lambda: T0 + 30.0)
    await source.start(lambda _e: None)
    try:
        reading = await source.poll()
    finally:
        await source.close()
    assert [g.index for g in reading.gpus] == list(range(7))
    assert "0000:52:00.0" not in {g.pci_bus_id for g in reading.gpus}  # tenant-b-vm7's
    mig = reading.gpu(6)
    assert mig is not None and mig.pci_bus_id == "0000:df:00.0" and mig.mig_enabled


def test_idle_gpus_run_nothing_and_held_ones_run_their_owners_processes() -> None:
    for name, node in demo_nodes().items():
        plan = plan_for(name, node.profile)
        for gpu in range(len(node.profile.gpus)):
            procs = node.processes(gpu)
            if gpu in plan.vfio_gpus:
                assert procs == [], (name, gpu)  # the guest's processes are not the host's
            elif gpu in plan.busy_gpus:
                assert procs, (name, gpu)
            else:
                assert procs == [] and node.gpu(gpu).util_pct == 0, (name, gpu)


def test_pids_are_distinct_on_every_node_at_every_moment() -> None:
    for at in (T0, T0 + 45.0, T0 + 600.0, T0 + 3600.0):
        for name, node in demo_nodes(at).items():
            pids = [p for g in range(len(node.profile.gpus)) for p, _, _ in node.processes(g)]
            assert len(pids) == len(set(pids)), (name, at, pids)


def test_mig_processes_run_in_the_instances_pods_hold() -> None:
    node = demo_nodes()["dgx-004"]
    slices = node.migs[7]
    held = {gi for _, _, gi in node.processes(7)}
    assert held == {slices[0].gpu_instance_id, slices[1].gpu_instance_id}  # infer-0, embed-1


def test_a_guests_gpu_still_draws_power_and_moves_the_fabric() -> None:
    node = demo_nodes(T0 + 300.0)["dgx-001"]  # acme-train-vm holds all eight
    assert nvml_of(node).nvmlDeviceGetCount() == 0
    idle_w = 0.11 * node.model.tdp_w
    for gpu in range(8):
        physics = node.gpu(gpu)
        assert physics.power_w > 2 * idle_w and physics.activity_s > 0
    stopped = demo_nodes(T0 + 300.0)["dgxa-002"]  # tenant-c-vm2 is shut off: GPUs 6 and 7 idle
    assert stopped.gpu(6).util_pct == 0 and stopped.gpu(6).power_w == 0.11 * stopped.model.tdp_w


def test_every_demo_scenario_lands_on_a_gpu_nvml_sees() -> None:
    for spec in (*DEMO_CLUSTER, *demo_cluster(60)):
        vfio = plan_for(spec.name, get_profile(spec.profile)).vfio_gpus
        for scenario in spec.scenarios:
            if scenario.kind not in NODE_SCENARIO_KINDS:
                assert scenario.gpu not in vfio, (spec.name, str(scenario))


def test_the_stories_gpus_keep_their_numbers() -> None:
    nodes = demo_nodes()
    hot = nvml_of(nodes["dgx-002"]).nvmlDeviceGetHandleByIndex(3)
    assert nodes["dgx-002"].active("thermal", hot.index) is not None  # story 2: GPU 3 runs hot
    lost = nvml_of(nodes["dgx-003"]).nvmlDeviceGetHandleByIndex(5)
    assert lost.index == 5 and 5 in plan_for("dgx-003", DGX_H100).pods[0].gpus  # story 1


def test_a_guests_gpu_does_not_fire_host_events() -> None:
    node = SimNode(
        "dgx-x",
        DGX_H100,
        scenarios=["xid79:2"],
        clock=lambda: T0,
        start=T0,
        passthrough=frozenset({2}),
    )
    lib = nvml_of(node)
    events = lib.nvmlEventSetCreate()
    for i in range(lib.nvmlDeviceGetCount()):
        lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(i), 0x8, events)
    assert lib._due_event(events) is None


def test_the_demo_owners_come_from_the_plan_and_only_the_lost_gpu_is_a_problem() -> None:
    for node in frozen_fleet().nodes:
        ownership = node_ownership(node)
        assert ownership is not None, node.node
        kinds = {o.kind for g in ownership.gpus for o in g.owners}
        assert OwnerKind.PROCESS not in kinds, node.node  # every process is a tenant's
        problems = [p.kind for p in ownership.all_problems]
        # dgx-003's GPU 5 and dgx-006's GPU 1 fell off the bus under their pods
        lost = node.node in ("dgx-003", "dgx-006")
        expected = [ProblemKind.HELD_BUT_LOST] if lost else []
        assert problems == expected, (node.node, ownership.all_problems)
