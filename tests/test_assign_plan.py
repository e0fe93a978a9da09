"""Plans: the steps they list and the preconditions that stop them, from what a node shows."""

from __future__ import annotations

from pathlib import Path

from gpuconsole.actions.plan import (
    Layer,
    PlanContext,
    StepKind,
    Target,
    find_gpu,
    make_plan,
    partition_switches,
)
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.readings.base import normal_bus_id
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import Guest, TenancyReading
from gpuconsole.sim.plans import plan_for
from gpuconsole.sim.profiles import DGX_H100
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


A100_SWITCHES = tuple(f"0000:{b:02x}:00.0" for b in range(0xC4, 0xCA))
H100_SWITCHES = A100_SWITCHES[:4]
H100_SWITCHES_SIM = tuple(normal_bus_id(s.bus_id) for s in DGX_H100.nvswitches)


def test_a100_partitions_take_12_6_3_1_0_switches_and_neighbours_never_share_one() -> None:
    def take(slots: list[int], total: int = 8) -> tuple[str, ...] | None:
        return partition_switches("ampere", A100_SWITCHES, slots, total)

    assert take(list(range(8))) == A100_SWITCHES
    assert take([4, 5, 6, 7]) == A100_SWITCHES[3:] and take([0, 1, 2, 3]) == A100_SWITCHES[:3]
    pairs = [take([k, k + 1]) for k in range(0, 8, 2)]
    assert all(p is not None and len(p) == 1 for p in pairs)
    assert len(set(pairs)) == 4  # each pair its own switch...
    assert pairs[2] is not None and set(pairs[2]) <= set(A100_SWITCHES[3:])  # ...in its quad
    assert take([3]) == ()
    board = tuple(f"0000:{b:02x}:00.0" for b in range(0x10, 0x1C))
    assert partition_switches("ampere", board, list(range(8, 16)), 16) == board[6:]
    assert partition_switches("ampere", board, list(range(16)), 16) == board
    for wrong in ([5, 6], [0, 1, 2], [0, 1, 2, 4], list(range(1, 9))):
        assert take(wrong) is None, wrong


def test_h100_partitions_are_one_gpu_without_switches_or_all_eight_with_them() -> None:
    assert partition_switches("hopper", H100_SWITCHES, [5], 8) == ()
    assert partition_switches("hopper", H100_SWITCHES, list(range(8)), 8) == H100_SWITCHES
    assert partition_switches("hopper", H100_SWITCHES, [0, 1], 8) is None
    assert partition_switches("hopper", H100_SWITCHES, [0, 1, 2, 3], 8) is None


async def test_an_a100_guest_takes_the_switches_of_its_partition_and_odd_shapes_are_refused(
    tmp_path: Path,
) -> None:
    plan = SimPlan(guests=(SimGuest("tenant-c-vm4", (), state=5),))
    node = await world(tmp_path, plan, "a100").snapshot()
    quad = make_plan(node, ["4", "5", "6", "7"], Target.parse("vm:tenant-c-vm4"), KUBE)
    assert not quad.blocked, quad.describe()
    switches = ("0000:c7:00.0", "0000:c8:00.0", "0000:c9:00.0")
    for kind in (StepKind.OVERRIDE, StepKind.UNBIND, StepKind.PROBE, StepKind.RESET):
        step = next(s for s in quad.steps if s.kind is kind)  # the switches go first
        assert step.functions == switches and step.gpus == () and step.layer is Layer.PCI
    assert quad.steps[[s.kind for s in quad.steps].index(StepKind.PROBE)].driver == "vfio-pci"
    (attach,) = [s for s in quad.steps if s.kind is StepKind.ATTACH]
    assert set(switches) <= set(attach.functions) and len(attach.functions) == 7
    assert any("NVSwitches 0000:c7:00.0, 0000:c8:00.0, 0000:c9:00.0" in n for n in quad.notes)
    three = make_plan(node, ["4", "5", "6"], Target.parse("vm:tenant-c-vm4"), KUBE)
    (failed,) = three.failed
    assert failed.name == "NVSwitch partition" and "would hold 3 GPU(s)" in failed.detail
    assert "4-7" in failed.remedy and "--propose" in failed.remedy  # what it can ask for


async def test_a_guest_keeps_a_whole_partition_and_gives_its_switches_back_with_it(
    tmp_path: Path,
) -> None:
    full = SimPlan(guests=(SimGuest("acme", tuple(range(8)), state=5, nvswitches=True),))
    node = await world(tmp_path, full, "h100").snapshot()
    one = make_plan(node, ["0000:1b:00.0"], Target.parse("free"), KUBE)
    (failed,) = one.failed
    assert "guest acme would keep GPU(s)" in failed.detail
    # the guest's GPUs have no NVML number: the command names them as the console does
    every_word = "1b:00.0 43:00.0 52:00.0 61:00.0 9d:00.0 c3:00.0 d1:00.0 df:00.0"
    assert f"assign {every_word} --to free" in failed.remedy
    every = sorted(g.bus_id for g in (node.tenancy.gpus if node.tenancy else ()))
    back = make_plan(node, every, Target.parse("free"), KUBE)
    assert not back.blocked, back.describe()
    detach = [s for s in back.steps if s.kind is StepKind.DETACH]
    assert detach[0].functions == H100_SWITCHES_SIM and detach[0].guest == "acme"
    probe = next(s for s in back.steps if s.kind is StepKind.PROBE)
    assert probe.functions == H100_SWITCHES_SIM and probe.driver == "nvidia"
    assert probe.before_drivers == ("vfio-pci",) * 4  # so a rollback puts them back


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
    from gpuconsole.sim.actions import SimWorld
    from gpuconsole.sim.node import Scenario

    lost = SimWorld("sim-02", DGX_H100, tmp_path, SimPlan(), (Scenario("xid79", 5),))
    node = await lost.snapshot()
    free = make_plan(node, ["5"], Target.parse("free"), KUBE)
    assert any("lost" in p.detail and "drain" in p.remedy for p in free.failed)
    drained = make_plan(node, ["5"], Target.parse("drained"), KUBE)
    assert not drained.blocked, drained.describe()
    assert StepKind.RESET not in [s.kind for s in drained.steps]
    # what holds is ticked, and "healthy" does not: the plan says the GPU is lost
    assert not any("healthy" in p.name for p in drained.preconditions if p.ok)
    assert any(p.ok and "lost" in p.name for p in drained.preconditions)
    assert any("GPU 5 (0000:c3:00.0): fell off the bus (XID 79)" in n for n in drained.notes)
    # NVML never read its UUID: Kubernetes is told the one the nvidia driver knows it by
    (cordon,) = [s for s in drained.steps if s.kind is StepKind.CORDON]
    assert cordon.uuids == drained.uuids == (lost.node.uuids[5],)


async def test_a_gpu_already_there_is_nothing_to_do(tmp_path: Path) -> None:
    node = await world(tmp_path).snapshot()
    plan = make_plan(node, ["1"], Target.parse("k8s"), KUBE)
    assert plan.blocked and plan.failed[0].remedy == "nothing to do"


async def test_after_nvml_renumbers_a_plan_names_each_gpu_as_the_console_shows_it(
    tmp_path: Path,
) -> None:
    # dgx-004's GPU 2 is a guest's: NVML numbers the seven others 0-6, so the console shows
    # 0000:df:00.0 as GPU 6
    node = await world(tmp_path, plan_for("dgx-004", DGX_H100), "h100").snapshot()
    last = "0000:df:00.0"
    shown = {row.bus_id: row.name for row in node_gpus(node)}
    assert shown[last] == "GPU 6" and shown["0000:52:00.0"] == "GPU 52:00.0"
    plan = make_plan(node, [last], Target.parse("drained"), KUBE)
    assert plan.gpus == (last,) and plan.labels == (f"GPU 6 ({last})",)
    assert all("GPU 7" not in s.title for s in plan.steps)
    # the confirmation is the number on screen or the bus id, never another GPU's number
    assert plan.confirmations() == ("sim-01", "6", "df:00.0")
    assert plan.confirmation_words() == "sim-01, 6 or df:00.0"
    # `gpuconsole assign 6` means the GPU shown as 6; the guest's GPU has no number
    for key, bus in (("6", last), ("2", "0000:61:00.0"), ("52:00.0", "0000:52:00.0")):
        gpu = find_gpu(node, key)
        assert gpu is not None and gpu.bus_id == bus
    assert find_gpu(node, "7") is None
    nothing = make_plan(node, ["7"], Target.parse("drained"), KUBE)
    assert "NVML numbers 7 GPUs" in nothing.failed[0].detail
