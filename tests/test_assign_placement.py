"""Placement help: free GPUs of one NVLink domain (a partition, for a guest on an NVSwitch
baseboard) and the NIC rails the fabric source pairs them with; and `assign --propose`."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gpuconsole.actions.placement import placements, propose
from gpuconsole.actions.plan import PlanContext, Target
from gpuconsole.cli.main import main
from gpuconsole.readings.bmc import BmcReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sim.actions import SimWorld
from gpuconsole.sim.node import Scenario
from gpuconsole.sim.profiles import DGX_H100
from gpuconsole.sim.tenancy import SimGuest, SimJob, SimPlan
from tests.assign_fixtures import world


def _rails_down(node: NodeSnapshot, *devices: str) -> NodeSnapshot:
    """The node as the fabric source reads it once these NICs' links are down."""
    fabric = node.fabric
    assert fabric is not None
    down = tuple(
        msgspec.structs.replace(
            d, ports=tuple(msgspec.structs.replace(p, state="DOWN") for p in d.ports)
        )
        if d.name in devices
        else d
        for d in fabric.devices
    )
    return msgspec.structs.replace(node, fabric=msgspec.structs.replace(fabric, devices=down))


async def test_a_guest_on_an_a100_board_is_offered_a_free_pair_partition_and_its_rails(
    tmp_path: Path,
) -> None:
    plan = SimPlan(
        guests=(SimGuest("tenant-c-vm9", (), state=5),),
        jobs=(SimJob("4711", "physics", 1001, (0, 1, 2)),),
    )
    node = await world(tmp_path, plan, "a100").snapshot(fabric=True)
    two = propose(node, 2, "A100", Target.parse("vm:tenant-c-vm9"))
    assert two is not None  # GPU 3 is free too, but 2 and 3 are one partition
    pairs = {("0000:b7:00.0", "0000:bd:00.0"), ("0000:87:00.0", "0000:90:00.0")}
    assert two.bus_ids in pairs and "1 NUMA node" in two.reason
    assert len(two.switches) == 1 and any("NVSwitches" in n for n in two.notes)
    # on a DGX A100 two GPUs share a PCIe switch with two rails: one each
    assert [r.level for r in two.rails] == ["PXB", "PXB"] and len(two.nics) == 2
    assert not two.flagged
    found = placements([node], 3, target=Target.parse("vm:tenant-c-vm9"))
    assert found.best is None and "form a guest partition" in found.why_not()
    assert "5 free GPU(s), 8 asked for" in placements([node], 8).why_not()


async def test_each_gpu_gets_its_own_pix_rail_and_a_down_rail_steers_the_choice(
    tmp_path: Path,
) -> None:
    node = await world(tmp_path, SimPlan(), "h100").snapshot(fabric=True)
    four = propose(node, 4)
    assert four is not None and four.indexes == (0, 1, 2, 3)
    assert [(r.device, r.level) for r in four.rails] == [
        ("mlx5_0", "PIX"),
        ("mlx5_3", "PIX"),
        ("mlx5_4", "PIX"),
        ("mlx5_5", "PIX"),
    ]
    # GPU 0's rail goes down: the four on the other socket need no warning
    one_down = _rails_down(node, "mlx5_0")
    other = propose(one_down, 4)
    assert other is not None and other.indexes == (4, 5, 6, 7) and not other.flagged
    forced = propose(one_down, 8)
    assert forced is not None
    gpu0 = forced.rails[0]
    assert gpu0.device == "mlx5_3" and gpu0.level == "NODE"  # the nearest rail still up
    assert gpu0.flags == ("its own rail mlx5_0 is down",)


async def test_a_gpu_whose_only_rails_are_across_the_sockets_is_flagged_sys(
    tmp_path: Path,
) -> None:
    node = await world(tmp_path, SimPlan(), "h100").snapshot(fabric=True)
    socket1 = _rails_down(node, "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
    every = propose(socket1, 8)
    assert every is not None and every.flagged == 4
    far = every.rails[4]
    assert far.index == 4 and far.level == "SYS" and far.device in ("mlx5_0", "mlx5_3")
    assert "SYS path: its RDMA traffic crosses the socket link" in far.flags
    assert "its own rail mlx5_6 is down" in far.flags
    assert "SYS" in far.describe() and "!" in far.describe()


def test_assign_propose_shows_free_gpus_and_moves_them_with_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    demo = ["assign", "--demo", "--node", "dgx-003"]
    assert main([*demo, "--propose", "1", "--model", "H100"]) == 0
    out = capsys.readouterr().out
    # dgx-003's pods hold every GPU but 3; its rail is the PIX one under the same switch
    assert "Proposed: dgx-003: GPU 3: a free H100 GPU" in out
    assert "GPU 3 (0000:61:00.0)  NIC mlx5_5 (PIX)" in out and "Steps" not in out
    root = tmp_path / "gpuconsole" / "demo" / "dgx-003"
    assert SimWorld.demo("dgx-003", root).owners(3) == ["k8s"]
    assert main([*demo, "--propose", "1", "--to", "drained", "--yes"]) == 0
    assert "done: GPU 3 (0000:61:00.0) now drained" in capsys.readouterr().out
    assert SimWorld.demo("dgx-003", root).owners(3) == ["drained"]
    assert main([*demo, "--propose", "2", "--model", "H100", "--to", "k8s"]) == 1
    assert "No proposal: dgx-003: 0 free H100 GPU(s), 2 asked for" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["2", "--propose", "1", "--to", "free"], "name GPUs or ask for --propose N, not both"),
        (["--to", "free"], "name the GPUs to move"),
        (["2"], "say where the GPUs go: --to"),
        (["2", "--model", "H100", "--to", "free"], "--model goes with --propose"),
        (["--propose", "0"], "1 or more"),
    ],
)
def test_assign_says_what_is_missing_from_a_request(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["assign", "--demo", "--node", "dgx-003", *args]) == 2
    assert says in capsys.readouterr().err


async def test_gpus_already_at_the_target_are_not_proposed(tmp_path: Path) -> None:
    node = await world(tmp_path, SimPlan(), "h100").snapshot()  # no fabric source here
    k8s = Target.parse("k8s")
    schedulable = {"sim-01": PlanContext(kubernetes=True)}
    nothing = placements([node], 1, target=k8s, contexts=schedulable)
    assert nothing.best is None and "8 of them already k8s" in nothing.why_not()
    cordoned = PlanContext(kubernetes=True, cordoned=frozenset(g.uuid for g in node.gpus[6:]))
    two = propose(node, 2, target=k8s, context=cordoned)
    assert two is not None and two.indexes == (6, 7)
    assert all(r.flags == ("no fabric reading for it",) for r in two.rails)


async def test_a_node_with_a_critical_problem_is_proposed_last_and_says_what_it_is(
    tmp_path: Path,
) -> None:
    clean = await world(tmp_path / "clean", SimPlan(), "h100").snapshot(fabric=True)
    lost = SimWorld("sim-02", DGX_H100, tmp_path / "lost", SimPlan(), (Scenario("xid79", 5),))
    with_lost_gpu = await lost.snapshot(fabric=True)
    failed_psu = BmcReading(at=0.0, psus_present=2, psus_failed=1, simulated=True)
    with_failed_psu = msgspec.structs.replace(clean, node="sim-03", bmc=failed_psu)
    found = placements([with_lost_gpu, with_failed_psu, clean], 1, "H100")
    assert [p.node for p in found.proposals] == ["sim-01", "sim-02", "sim-03"]
    assert not found.proposals[0].problems
    gpu_down, psu_down = found.proposals[1], found.proposals[2]
    (problem,) = gpu_down.problems
    assert problem.startswith("GPU 5 (c3:00.0): fell off the bus (XID 79)")
    assert psu_down.problems == ("1 of 2 PSUs failed",)
    # said wherever the proposal is shown: `assign --propose` prints describe()
    assert "! sim-02: GPU 5 (c3:00.0): fell off the bus" in gpu_down.describe()
    assert "critical" in gpu_down.reason
