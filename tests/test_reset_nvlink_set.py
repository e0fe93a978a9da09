"""Before Ampere, nvidia-smi resets a GPU only in one command with every GPU NVLink joins it
to (man nvidia-smi, -r/--gpu-reset): the demo's DGX-1 (V100, hybrid cube mesh) resets GPU 2
with its whole NVLink set, drained and idle, in one `nvidia-smi -r -i` of all their bus ids;
a plan that cannot make one of them idle is refused, and the simulator, like the real tool,
refuses a reset that leaves one out."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuconsole import codec
from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.drivers.repair import NvidiaSmiDriver
from gpuconsole.actions.executor import action_event
from gpuconsole.actions.journal import Journal, PlanState
from gpuconsole.actions.locks import holders
from gpuconsole.actions.plan import Layer, Step, StepKind
from gpuconsole.actions.remediation import reset_set
from gpuconsole.facts.inventory import short_bus_id
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.readings.base import Event, Severity
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sim.actions import SLURM_JOB_ENDS_S, SimGpuDriver, SimWorld, sim_drivers
from gpuconsole.sim.fakenvml import write_profile
from gpuconsole.sim.node import Scenario
from gpuconsole.sim.profiles import DGX_1V, DGX_H100
from gpuconsole.sim.tenancy import SimGuest, SimJob, SimPlan
from gpuconsole.tui.screens.events import EventFilter, _gpu_cell, pick_gpu
from tests.test_remediation import OPS, _DieAt, audit, kinds, quick

JOB = SimPlan(jobs=(SimJob("4690", "bio", 1000, tuple(range(8))),))  # the demo's 8-GPU job


def dgx1(root: Path, plan: SimPlan = JOB) -> SimWorld:
    """The demo's DGX-1: GPU 2 waits for a page retirement (its verdict: reset GPU 2)."""
    return SimWorld("dgx1-001", DGX_1V, root, plan, (Scenario("retired", 2),))


def bus(index: int) -> str:
    return DGX_1V.gpus[index].bus_id.lower().replace("00000000:", "0000:")


# GPU 2 first, then every GPU the hybrid cube mesh reaches from it (all of them), by bus id
SET = (bus(2), *sorted(bus(i) for i in (0, 1, 3, 4, 5, 6, 7)))


async def _end_the_job_once_drained(world: SimWorld) -> None:
    """Slurm lets a drained node's job run to its end: here it ends once the node drains."""
    while not world.slurm_drained:
        await asyncio.sleep(0.05)
    world.plan = dataclasses.replace(world.plan, jobs=())


async def test_the_demo_dgx1_resets_gpu_2_with_its_whole_nvlink_set_in_one_command(
    tmp_path: Path,
) -> None:
    world = SimWorld.demo("dgx1-001", tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    node = await world.snapshot()
    assert gpu_verdict(node, bus(2)).advice == "reset GPU 2 (0a:00.0), then verify"
    plan = await executor.plan_remedy("2")
    assert plan.remedy == "reset_gpu" and not plan.blocked, plan.describe()
    assert plan.gpus == SET  # locked, journaled and audited by bus id, GPU 2 first
    assert kinds(plan) == [StepKind.CORDON] * 8 + [
        StepKind.SLURM_DRAIN,
        StepKind.WAIT_IDLE,
        StepKind.GPU_RESET,
        StepKind.VERIFY,
    ]
    # each GPU of the set kept from Kubernetes, the Slurm node drained
    assert tuple(s.gpus[0] for s in plan.steps[:8]) == SET
    drain, wait, reset, verify = plan.steps[8:]
    assert "job 4690 runs to its end" in drain.title
    assert set(wait.gpus) == set(SET) and wait.owners == ("job 4690",)
    (one,) = [s for s in plan.steps if s.kind is StepKind.GPU_RESET]
    assert one.gpus == SET and one.layer is Layer.GPU
    assert f"(nvidia-smi -r -i {','.join(SET)})" in reset.title
    assert verify.gpus == SET  # each GPU reset is checked before further use
    (note,) = [n for n in plan.notes if "NVLink" in n]
    assert note.startswith("V100 GPUs linked by NVLink reset together: nvidia-smi resets GPU 2")
    for index in (0, 1, 3, 4, 5, 6, 7):
        assert f"GPU {index} ({bus(index)})" in note
    assert reset_set(node, "2") == SET


async def test_the_reset_drains_waits_for_and_resets_every_gpu_of_the_set_then_gpu_2_is_fit(
    tmp_path: Path,
) -> None:
    world = dgx1(tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    plan = await executor.plan_remedy("2", Action.RESET_GPU)
    ending = asyncio.create_task(_end_the_job_once_drained(world))
    outcome = await executor.execute(plan, OPS, "dgx1-001")
    await ending
    assert outcome.ok, outcome.message
    assert world.node.resets == dict.fromkeys(range(8), 1)  # one command, every GPU once
    assert world.node.retired_pages(2) == (2, 1, False)  # the page is retired, none waits
    records = audit(tmp_path / "s")
    assert {tuple(r["args"]["gpus"]) for r in records} == {SET}
    assert records[-1]["outcome"] == "ok"
    assert holders(Journal(tmp_path / "s" / "actions.db")) == []


async def test_in_the_demo_the_drained_slurm_node_s_job_ends_and_the_reset_goes_on(
    tmp_path: Path,
) -> None:
    """`gpuconsole remediate --demo --node dgx1-001 2`: the simulated Slurm lets job 4690
    run to its end a while after the node drains (it never ended, so the demo's reset
    waited until it gave up), then the set is reset and GPU 2 is fit."""
    world = SimWorld.demo("dgx1-001", tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    executor.idle_timeout_s = SLURM_JOB_ENDS_S + 5.0
    plan = await executor.plan_remedy("2")
    outcome = await executor.execute(plan, OPS, "dgx1-001")
    assert outcome.ok, outcome.message
    assert world.plan.jobs == () and world.slurm_drained
    assert world.node.resets == dict.fromkeys(range(8), 1)


async def test_a_set_reset_is_confirmed_by_the_gpu_asked_for_and_each_gpu_s_events_show_it(
    tmp_path: Path,
) -> None:
    """`r` on GPU 2 resets 8 GPUs: the operator confirms by naming GPU 2, as for a GPU reset
    alone, and the prompt says how many it resets. Every event, audit record and the journal
    name each GPU of the set by bus id and UUID: a filter on any of them (the GPU view's
    events) shows the reset that touched it."""
    world = dgx1(tmp_path / "w", SimPlan())
    told: list[Event] = []
    executor = quick(world, tmp_path / "s")
    executor.emit = told.append
    plan = await executor.plan_remedy("2", Action.RESET_GPU)
    assert {"2", "0a:00.0", "dgx1-001"} <= set(plan.confirmations())
    assert plan.confirmation_words().endswith("(resets 8 GPUs together)")
    outcome = await executor.execute(plan, OPS, "0a:00.0")
    assert outcome.ok, outcome.message
    uuids = tuple(world.node.uuids[int(i)] for i in (2, 0, 1, 3, 4, 5, 6, 7))
    assert all(uuids) and plan.uuids == uuids
    for event in told:
        assert event.gpu_bus_ids == SET and event.gpu_uuids == uuids, event
    for index in range(8):
        pick = EventFilter(gpu=pick_gpu(bus(index), None, None))
        shown = [e.message for e in told if pick.keep(e)]
        assert any(f" done: reset GPU 2 ({bus(2)}), GPU 0" in m for m in shown), (index, shown)
        assert any(m.startswith("remediate reset_gpu by ops") for m in shown)
    for record in audit(tmp_path / "s"):
        assert tuple(record["args"]["gpus"]) == SET
        assert tuple(record["args"]["uuids"]) == uuids
    (journaled,) = Journal(tmp_path / "s" / "actions.db").plans()
    assert journaled.gpus == SET and journaled.plan.uuids == uuids
    # another process's console tells the plan from the journal: the same GPUs
    again = action_event(journaled.plan, 0.0, Severity.INFO, "told")
    assert again.gpu_bus_ids == SET and again.gpu_uuids == uuids
    # the Events view's GPU column: the GPU asked for, and how many more
    assert _gpu_cell(again, FleetSnapshot(0, 0.0, ())) == "0a:00.0 +7"
    # an agent's JSON writes NVML's form of each, as of any GPU; a head reads sysfs's back
    sent = codec.dumps(FleetSnapshot(0, 0.0, (), (again,)))
    assert json.loads(sent)["events"][0]["gpu_bus_ids"][0] == DGX_1V.gpus[2].bus_id
    assert codec.loads(sent).events == (again,)


async def test_a_gpu_reset_alone_still_ties_its_events_to_that_gpu(tmp_path: Path) -> None:
    world = SimWorld("dgx-003", DGX_H100, tmp_path / "w", SimPlan(), (Scenario("xid79", 5),))
    told: list[Event] = []
    executor = quick(world, tmp_path / "s")
    executor.emit = told.append
    plan = await executor.plan_remedy("5", Action.RESET_GPU)
    assert plan.confirmation_words() == f"dgx-003, 5 or {short_bus_id(plan.gpus[0])}"
    assert (await executor.execute(plan, OPS, "5")).ok
    assert told and all(e.gpu_bus_id == plan.gpus[0] and not e.gpu_bus_ids for e in told)


def _gpu_reads(node: NodeSnapshot, index: int, **ecc: Any) -> NodeSnapshot:
    """`node` with GPU `index`'s ECC reading changed, as a later reading could find it."""
    assert node.nvml is not None
    gpus = tuple(
        msgspec.structs.replace(g, ecc=msgspec.structs.replace(g.ecc, **ecc))
        if g.index == index
        else g
        for g in node.nvml.gpus
    )
    return msgspec.structs.replace(node, nvml=msgspec.structs.replace(node.nvml, gpus=gpus))


@pytest.mark.parametrize(
    ("index", "ecc", "words"),
    [
        (2, {"retired_pending": True}, "a page retirement is still pending"),
        (5, {"remap_failure": True}, "row remapping failed"),
    ],
    ids=["gpu-2-retirement-still-pending", "a-peer-unfit"],
)
async def test_the_final_check_fails_while_a_gpu_of_the_set_is_not_fit(
    tmp_path: Path, index: int, ecc: dict[str, Any], words: str
) -> None:
    """The reset ran, but a fresh reading after it finds GPU 2's page retirement still
    pending, or another GPU of the set not fit: the plan fails there and asks for more."""
    world = dgx1(tmp_path / "w", SimPlan())
    executor = quick(world, tmp_path / "s")
    executor.settle_s = 0.3

    async def reader() -> NodeSnapshot:
        node = await world.snapshot()
        return _gpu_reads(node, index, **ecc) if world.node.resets else node

    executor.reader = reader
    outcome = await executor.execute(await executor.plan_remedy("2"), OPS, "dgx1-001")
    assert outcome.state is PlanState.FAILED
    assert f"{bus(index)}: {words}; next: reboot_node" in outcome.message
    assert world.node.resets == dict.fromkeys(range(8), 1)


async def test_a_process_on_one_gpu_of_the_set_refuses_the_reset_and_names_that_gpu(
    tmp_path: Path,
) -> None:
    world = dgx1(tmp_path / "w", SimPlan(loose=(5,)))
    executor = quick(world, tmp_path / "s")
    plan = await executor.plan_remedy("2", Action.RESET_GPU)
    (failed,) = plan.failed
    assert failed.name == f"no processes remain on the NVLink set of GPU 2 ({bus(2)})"
    assert f"on GPU 5 ({bus(5)})" in failed.detail and "pids" in failed.detail
    assert world.node.resets == {}


async def test_a_gpu_of_the_set_on_vfio_pci_refuses_the_reset(tmp_path: Path) -> None:
    world = dgx1(tmp_path / "w", SimPlan(guests=(SimGuest("tenant-b-vm1", (7,), state=5),)))
    plan = await quick(world, tmp_path / "s").plan_remedy("2", Action.RESET_GPU)
    (failed,) = plan.failed
    assert failed.name == "every GPU of the NVLink set on the nvidia driver"
    # NVML no longer numbers a GPU on vfio-pci: its bus id names it
    assert f"GPU {bus(7)} is on vfio-pci (vm tenant-b-vm1 (shut off))" in failed.detail
    assert "give those GPUs back to the host" in failed.remedy


async def test_the_simulator_refuses_a_reset_that_leaves_out_a_linked_v100(
    tmp_path: Path,
) -> None:
    """As nvidia-smi does: an error that names the GPUs to add, and no GPU reset."""
    world = dgx1(tmp_path / "w", SimPlan())
    driver = SimGpuDriver(world)
    alone = Step(StepKind.GPU_RESET, Layer.GPU, "reset GPU 2", gpus=(bus(2),))
    with pytest.raises(StepFailed) as refused:
        await driver.run(alone)
    text = str(refused.value)
    assert text.startswith(f"nvidia-smi -r -i {bus(2)}: unable to reset: GPUs with NVLink")
    assert f"add {', '.join(bus(i) for i in (0, 1, 3, 4, 5, 6, 7))} to -i" in text
    assert world.node.resets == {} and world.node.retired_pages(2) == (2, 1, True)
    # GPU 2's direct peers alone are not enough: theirs must come too
    direct = Step(StepKind.GPU_RESET, Layer.GPU, "r", gpus=tuple(bus(i) for i in (2, 0, 1, 3, 6)))
    with pytest.raises(StepFailed, match=f"add {bus(4)}, {bus(5)}, {bus(7)} to -i"):
        await driver.run(direct)
    assert await driver.run(Step(StepKind.GPU_RESET, Layer.GPU, "r", gpus=SET))
    assert world.node.resets == dict.fromkeys(range(8), 1)
    # a Hopper GPU behind NVSwitches is reset on its own
    h100 = SimWorld("dgx-003", DGX_H100, tmp_path / "h", SimPlan())
    one = DGX_H100.gpus[5].bus_id.lower().replace("00000000:", "0000:")
    await SimGpuDriver(h100).run(Step(StepKind.GPU_RESET, Layer.GPU, "r", gpus=(one,)))
    assert h100.node.resets == {5: 1}


# A DGX-1 whose mesh is cut in two halves of four GPUs (the links between the halves gone)
HALVES = dataclasses.replace(
    DGX_1V,
    gpu_nvlinks=tuple(p for p in DGX_1V.gpu_nvlinks if (p[0] < 4) == (p[1] < 4)),
)


async def test_the_set_is_what_nvlink_reaches_and_no_other_gpu_may_compute_meanwhile(
    tmp_path: Path,
) -> None:
    """man nvidia-smi: no compute application may run on any other GPU of the system where
    a GPU cannot be reset individually; the plan refuses and names it, as the driver does."""
    world = SimWorld("dgx1-002", HALVES, tmp_path / "w", SimPlan(loose=(5,)))
    plan = await quick(world, tmp_path / "s").plan_remedy("2", Action.RESET_GPU)
    assert plan.gpus == (bus(2), bus(0), bus(1), bus(3))  # its half, not GPU 5's
    (failed,) = plan.failed
    assert failed.name == "no compute work on the node's other GPUs"
    assert failed.detail.startswith(f"GPU 5 ({bus(5)}): process alice")
    half = Step(StepKind.GPU_RESET, Layer.GPU, "r", gpus=plan.gpus)
    with pytest.raises(StepFailed, match=f"compute applications run on other GPUs \\({bus(5)}"):
        await SimGpuDriver(world).run(half)
    assert world.node.resets == {}
    world.plan = SimPlan()
    assert not (await quick(world, tmp_path / "s").plan_remedy("2", Action.RESET_GPU)).blocked
    await SimGpuDriver(world).run(half)
    assert world.node.resets == dict.fromkeys((0, 1, 2, 3), 1)


def test_the_fake_library_refuses_a_reset_scenario_that_leaves_out_a_linked_v100(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError) as refused:
        write_profile(DGX_1V, tmp_path / "p", scenarios=["retired 2", "reset 2 at 0.5"])
    assert str(refused.value) == (
        "scenario reset at 0.5: GPUs with NVLink connections to a GPU being reset must be "
        "reset in the same command on Tesla V100-SXM2-32GB: add reset scenarios for GPUs "
        "0, 1, 3, 4, 5, 6, 7 at 0.5"
    )
    assert not (tmp_path / "p").exists()
    # the whole set at once is what a reset there is; a Hopper GPU resets alone
    write_profile(DGX_1V, tmp_path / "p", scenarios=[f"reset {i} at 0.5" for i in range(8)])
    write_profile(DGX_H100, tmp_path / "h", scenarios=["xid79 5", "reset 5 at 1"])


async def test_nvidia_smi_is_run_once_with_every_gpu_of_the_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    said = tmp_path / "argv"
    tool = folder / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {said}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    await NvidiaSmiDriver().run(Step(StepKind.GPU_RESET, Layer.GPU, "reset", gpus=SET))
    assert said.read_text().splitlines() == [f"-r -i {','.join(SET)}"]


# --- crash recovery --------------------------------------------------------------------------


def _doomed(root: Path, after: bool) -> None:
    async def go() -> None:
        world = dgx1(root / "w", SimPlan())
        drivers = sim_drivers(world)
        assert drivers.gpu is not None
        drivers.gpu = _DieAt(drivers.gpu, StepKind.GPU_RESET, after)
        executor = quick(world, root / "s", drivers)
        await executor.execute(await executor.plan_remedy("2"), OPS, "dgx1-001")

    asyncio.run(go())


@pytest.mark.parametrize("after", [False, True], ids=["before-reset", "after-reset"])
def test_a_set_reset_killed_at_its_reset_is_finished_by_recovery(
    tmp_path: Path, after: bool
) -> None:
    import multiprocessing

    dgx1(tmp_path / "w", SimPlan())
    child = multiprocessing.get_context("fork").Process(target=_doomed, args=(tmp_path, after))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL

    async def restart() -> Any:
        world = dgx1(tmp_path / "w", SimPlan())
        return world, await quick(world, tmp_path / "s").recover()

    world, (outcome,) = asyncio.run(restart())
    assert outcome.recovered and outcome.ok, outcome.message
    # a reset is repeatable: the whole set once more where the crash left it unrecorded
    assert world.node.resets == dict.fromkeys(range(8), 2 if after else 1)
    assert world.node.retired_pages(2) == (2, 1, False)
    record = Journal(tmp_path / "s" / "actions.db").plans()[0]
    assert record.state is PlanState.DONE and record.gpus == SET
    assert holders(Journal(tmp_path / "s" / "actions.db")) == []
