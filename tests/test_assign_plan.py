"""Plans: the steps they list and the preconditions that stop them, from what a node shows."""

from __future__ import annotations

from pathlib import Path

from gpuconsole.actions.plan import (
    PlanContext,
    StepKind,
    Target,
    _a100_partition_ok,
    make_plan,
    propose,
)
from gpuconsole.model import NodeSnapshot
from gpuconsole.readings.tenancy import Guest, TenancyReading
from gpuconsole.sim.tenancy import SimGuest, SimPlan
from gpuconsole.sources.tenancy.pci_binding import read_gpus
from tests.assign_fixtures import world
from tests.tenancy_fixtures import AUDIO_CLASS, FakeHost

KUBE = PlanContext(kubernetes=True)


async def test_a_pod_is_evicted_but_a_slurm_job_stops_the_plan_with_what_to_do(
    tmp_path: Path,
) -> None:
    node = await world(tmp_path).snapshot()
    pod = make_plan(node, ["0"], Target.parse("vm:tenant-b-vm1"), KUBE)
    assert not pod.blocked, pod.describe()
    kinds = [s.kind for s in pod.steps]
    assert kinds == [
        StepKind.CORDON,
        StepKind.EVICT,
        StepKind.CHECK_IDLE,
        StepKind.OVERRIDE,
        StepKind.UNBIND,
        StepKind.PROBE,
        StepKind.RESET,
        StepKind.ATTACH,
        StepKind.VERIFY,
    ]
    assert pod.steps[1].pod == "team-nlp/train-0"
    job = make_plan(node, ["3"], Target.parse("free"), KUBE)
    assert job.blocked
    (failed,) = job.failed
    assert "job 4711" in failed.detail and "scancel" in failed.remedy


async def test_an_h100_guest_asking_for_two_gpus_is_refused_with_the_nvswitch_rule(
    tmp_path: Path,
) -> None:
    plan = SimPlan(guests=(SimGuest("tenant-b-vm7", (2,), state=5),))
    node = await world(tmp_path, plan, "h100").snapshot()
    two = make_plan(node, ["3"], Target.parse("vm:tenant-b-vm7"), KUBE)
    (failed,) = two.failed
    assert failed.name == "NVSwitch partition"
    assert "would hold 2 GPU(s)" in failed.detail and "1 GPU" in failed.detail
    assert "all 8" in failed.detail
    one = make_plan(node, ["3"], Target.parse("vm:tenant-b-vm2"), KUBE)
    assert one.failed[0].name == "guest defined"  # no such guest: define it first


async def test_a_single_h100_guest_is_told_to_disable_nvlinks(tmp_path: Path) -> None:
    plan = SimPlan(guests=(SimGuest("tenant-b-vm7", (), state=5),))
    node = await world(tmp_path, plan, "h100").snapshot()
    one = make_plan(node, ["3"], Target.parse("vm:tenant-b-vm7"), KUBE)
    assert not one.blocked, one.describe()
    assert any("NvLinkDisable" in n for n in one.notes)


def test_a100_partitions_are_neighbouring_sets_of_1_2_4_8() -> None:
    assert _a100_partition_ok([4, 5]) and _a100_partition_ok([4, 5, 6, 7])
    assert not _a100_partition_ok([5, 6]) and not _a100_partition_ok([0, 1, 2])


def _fake_node(host: FakeHost, guests: tuple[Guest, ...] = ()) -> NodeSnapshot:
    gpus = read_gpus(host.sysfs_root, host.proc_root)
    return NodeSnapshot("n1", tenancy=TenancyReading(at=0.0, gpus=gpus, guests=guests))


def test_the_whole_iommu_group_moves_and_a_foreign_device_in_it_stops_the_plan(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    host.pci("0000:1b:00.0", driver="nvidia", group=40)
    host.pci("0000:1b:00.1", driver="snd_hda_intel", group=40, pci_class=AUDIO_CLASS)
    host.pci("0000:43:00.0", driver="nvidia", group=41)
    host.pci("0000:43:00.1", driver="mlx5_core", group=41, vendor=0x15B3, pci_class=0x020000)
    guest = Guest("vm1", "shut off", (), "libvirt")
    node = _fake_node(host, (guest,))
    plan = make_plan(node, ["0000:1b:00.0"], Target.parse("vm:vm1"))
    assert not plan.blocked, plan.describe()
    unbind = next(s for s in plan.steps if s.kind is StepKind.UNBIND)
    assert unbind.functions == ("0000:1b:00.0", "0000:1b:00.1")
    assert unbind.before_drivers == ("nvidia", "snd_hda_intel")
    attach = next(s for s in plan.steps if s.kind is StepKind.ATTACH)
    assert attach.functions == ("0000:1b:00.0", "0000:1b:00.1")
    blocked = make_plan(node, ["0000:43:00.0"], Target.parse("vm:vm1"))
    (failed,) = blocked.failed
    assert "0000:43:00.1 (mlx5_core)" in failed.detail and "ACS" in failed.remedy


async def test_a_lost_gpu_can_only_be_drained(tmp_path: Path) -> None:
    from gpuconsole.actions.drivers.sim import SimWorld
    from gpuconsole.sim.node import Scenario
    from gpuconsole.sim.profiles import DGX_H100

    lost = SimWorld("sim-02", DGX_H100, tmp_path, SimPlan(), (Scenario("xid79", 5),))
    node = await lost.snapshot()
    free = make_plan(node, ["5"], Target.parse("free"), KUBE)
    assert any("lost" in p.detail and "drain" in p.remedy for p in free.failed)
    drained = make_plan(node, ["5"], Target.parse("drained"), KUBE)
    assert not drained.blocked, drained.describe()
    assert StepKind.RESET not in [s.kind for s in drained.steps]


async def test_a_gpu_already_there_is_nothing_to_do(tmp_path: Path) -> None:
    node = await world(tmp_path).snapshot()
    plan = make_plan(node, ["1"], Target.parse("k8s"), KUBE)
    assert plan.blocked and plan.failed[0].remedy == "nothing to do"


async def test_placement_proposes_free_gpus_of_one_nvlink_domain(tmp_path: Path) -> None:
    plan = SimPlan(guests=(SimGuest("vm", (0, 1, 2), state=5),))
    node = await world(tmp_path, plan, "a100").snapshot()
    two = propose(node, 2, "A100", for_guest=True)
    assert two is not None  # 3 is free, but 2 and 3 are one partition
    pairs = {("0000:b7:00.0", "0000:bd:00.0"), ("0000:87:00.0", "0000:90:00.0")}
    assert two.bus_ids in pairs and "1 NUMA node" in two.reason
    assert propose(node, 8) is None
    three_for_guest = propose(node, 3, for_guest=True)
    assert three_for_guest is None  # no 3-GPU A100 partition
