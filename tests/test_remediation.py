"""Remediation from a verdict's action: the plan each action implies, the preconditions that
refuse one (processes left, a busy NVLink peer, a viewer), and the simulated node going from
XID 79 to drained to reset to fit, or on to a power cycle and service when the fault stays."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuconsole import format as fmt
from gpuconsole.actions.drivers import StepDriver, StepFailed
from gpuconsole.actions.executor import Executor, StepUpdate
from gpuconsole.actions.journal import Journal, PlanState, StepProgress
from gpuconsole.actions.locks import holders
from gpuconsole.actions.plan import Layer, Plan, PlanContext, Step, StepKind
from gpuconsole.actions.remediation import make_remediation_plan, verdict_action
from gpuconsole.actions.roles import ActionRefused, Actor, Role
from gpuconsole.facts.inventory import short_bus_id
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.sim.actions import SimWorld, sim_drivers
from gpuconsole.sim.node import Scenario
from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_A100, DGX_H100
from gpuconsole.sim.tenancy import SimGuest, SimJob, SimPlan, SimPod
from tests.assign_fixtures import executor_for

OPS = Actor("ops", Role.OPERATOR)
# dgx-003 as story 1 has it: a pod on GPUs 4-7, another on 0-1, GPU 5 fell off the bus
STORY_1 = SimPlan(
    pods=(
        SimPod("team-nlp", "train-llm-7b-0", "trainer", gpus=(4, 5, 6, 7)),
        SimPod("team-vision", "resnet-ft-1", "train", gpus=(0, 1)),
    ),
    jobs=(SimJob("4711", "physics", 1001, (3,)),),
)
PODS_ONLY = SimPlan(pods=STORY_1.pods)


def h100(root: Path, plan: SimPlan = STORY_1, scenario: str = "xid79:5") -> SimWorld:
    return SimWorld("dgx-003", DGX_H100, root, plan, (Scenario.parse(scenario),))


def quick(world: SimWorld, state: Path, drivers: Any = None) -> Executor:
    """An executor that waits seconds, not minutes, for idle GPUs and returning ones."""
    executor = executor_for(world, state, drivers=drivers)
    executor.idle_timeout_s, executor.settle_s, executor.poll_s = 3.0, 1.5, 0.1
    return executor


def kinds(plan: Plan) -> list[StepKind]:
    return [s.kind for s in plan.steps]


def audit(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]


def bus_of(world: SimWorld, index: int) -> str:
    return world.node.profile.gpus[index].bus_id.lower().replace("00000000:", "0000:")


# --- the plan each action implies ---------------------------------------------------------


async def test_a_lost_gpu_s_verdict_asks_for_a_reset_and_its_plan_drains_resets_and_verifies(
    tmp_path: Path,
) -> None:
    world = h100(tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    node = await world.snapshot()
    # NVIDIA's catalog puts XID 79 in RESTART_BM: the verdict asks for the GPU's reset first
    # (the node's reboot follows if it stays lost), and this plan is that reset
    assert verdict_action(node, "5") is Action.RESET_GPU
    plan = await executor.plan_remedy("5")  # what the verdict calls for
    bus = bus_of(world, 5)
    assert plan.remedy == "reset_gpu" and plan.gpus == (bus,) and not plan.blocked
    assert kinds(plan) == [
        StepKind.CORDON,
        StepKind.EVICT,
        StepKind.WAIT_IDLE,
        StepKind.GPU_RESET,
        StepKind.VERIFY,
    ]
    reset = plan.steps[3]
    assert reset.layer is Layer.GPU and f"nvidia-smi -r -i {bus}" in reset.title
    assert reset.uuids == (world.node.uuids[5],)
    wait = plan.steps[2]
    # the pod's other GPUs are GPU 5's NVLink peers: its work must be gone from them too
    assert set(wait.functions) == {bus_of(world, i) for i in (4, 6, 7)}
    assert wait.owners == ("pod team-nlp/train-llm-7b-0",)
    assert "no NVLink peer busy" in [p.name for p in plan.preconditions]


async def test_drain_stops_the_slurm_node_and_leaves_the_gpu_unbound(tmp_path: Path) -> None:
    world = h100(tmp_path / "w")
    plan = await quick(world, tmp_path / "s").plan_remedy("3", Action.DRAIN)
    assert kinds(plan) == [
        StepKind.CORDON,
        StepKind.SLURM_DRAIN,
        StepKind.WAIT_IDLE,
        StepKind.OVERRIDE,
        StepKind.UNBIND,
        StepKind.VERIFY,
    ]
    assert "scontrol update state=drain" in plan.steps[1].title
    assert "job 4711 runs to its end" in plan.steps[1].title
    assert any("Slurm drains the whole of dgx-003" in n for n in plan.notes)
    assert plan.steps[-1].driver is None  # unbound, nothing may bind it


async def test_a_lost_gpu_under_a_slurm_job_drains_the_node_and_waits_for_the_job(
    tmp_path: Path,
) -> None:
    """NVML lists no process on GPU 5 once it fell off the bus; the job's rank still holds
    its /dev/nvidia5, so the job is what the reset waits for, after Slurm drains the node."""
    world = h100(tmp_path / "w", SimPlan(jobs=(SimJob("4801", "physics", 1001, (4, 5, 6, 7)),)))
    executor = quick(world, tmp_path / "s")
    plan = await executor.plan_remedy("5")
    assert kinds(plan) == [
        StepKind.CORDON,
        StepKind.SLURM_DRAIN,
        StepKind.WAIT_IDLE,
        StepKind.GPU_RESET,
        StepKind.VERIFY,
    ]
    assert not plan.blocked and plan.steps[2].owners == ("job 4801",)
    executor.idle_timeout_s = 15.0  # the simulated job ends SLURM_JOB_ENDS_S after the drain
    outcome = await executor.execute(plan, OPS, "dgx-003")
    assert outcome.state is PlanState.DONE, outcome.message
    assert world.slurm_drained and world.plan.jobs == () and world.node.resets == {5: 1}


async def test_a_lost_gpu_under_a_process_of_no_scheduler_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    world = h100(tmp_path / "w", SimPlan(loose=(5,)))
    plan = await quick(world, tmp_path / "s").plan_remedy("5")
    (stop,) = [p for p in plan.preconditions if not p.ok]
    assert stop.name.startswith("no processes remain") and "process alice (pids" in stop.detail


async def test_a_slurm_job_keeps_the_node_from_its_power_cycle_until_it_ends(
    tmp_path: Path,
) -> None:
    world = h100(tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    outcome = await executor.execute(
        await executor.plan_remedy("5", Action.REBOOT_NODE), OPS, "dgx-003"
    )
    assert outcome.state is PlanState.FAILED
    assert "still busy after 3 s: job 4711 on" in outcome.message
    assert world.node.power_cycles == 0 and world.slurm_drained  # drained, not powered


async def test_reboot_node_drains_every_gpu_then_power_cycles_and_says_who_runs_there(
    tmp_path: Path,
) -> None:
    world = h100(tmp_path / "w")
    plan = await quick(world, tmp_path / "s").plan_remedy("5", Action.REBOOT_NODE)
    assert kinds(plan).count(StepKind.CORDON) == 8
    evicted = {s.pod: s for s in plan.steps if s.kind is StepKind.EVICT}
    assert set(evicted) == {"team-nlp/train-llm-7b-0", "team-vision/resnet-ft-1"}
    # each eviction names every GPU its pod holds, by bus id and UUID
    train = evicted["team-nlp/train-llm-7b-0"]
    assert train.gpus == tuple(bus_of(world, i) for i in (4, 5, 6, 7))
    assert train.uuids == tuple(world.node.uuids[i] for i in (4, 5, 6, 7))
    assert "from GPU 4 (0000:9d:00.0), GPU 5 (0000:c3:00.0), GPU 6" in train.title
    assert kinds(plan)[-3:] == [StepKind.WAIT_IDLE, StepKind.POWER_CYCLE, StepKind.VERIFY]
    assert len(plan.steps[-3].gpus) == 8  # the whole node idle before its power goes
    (note,) = [n for n in plan.notes if "power cycle" in n]
    assert "pod team-nlp/train-llm-7b-0" in note and "job 4711" in note


async def test_a_wait_that_cannot_read_who_holds_the_gpus_is_not_idle(tmp_path: Path) -> None:
    """dgx-001's guest holds all eight GPUs. Once its tenant is told, libvirt stops
    answering: the guest is no longer seen, which is not the guest gone. The wait never
    calls the node idle without knowing, and the power cycle is not sent."""
    world = SimWorld.demo("dgx-001", tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    plan = await executor.plan_remedy(bus_of(world, 0), Action.REBOOT_NODE)
    assert not plan.blocked, plan.describe()

    def refused() -> Any:
        raise ConnectionRefusedError("libvirt: connection refused")

    def libvirt_stops(update: StepUpdate) -> None:
        if update.step.kind is StepKind.NOTIFY and update.state is StepProgress.DONE:
            world.tree.libvirt = refused  # type: ignore[method-assign]

    executor.on_step = libvirt_stops
    outcome = await executor.execute(plan, OPS, "dgx-001")
    assert world.node.power_cycles == 0, outcome.message
    assert outcome.state is PlanState.FAILED
    assert "who holds the GPUs is not known" in outcome.message, outcome.message
    assert "connection refused" in outcome.message


async def test_a_power_cycle_is_confirmed_by_the_node_s_name_not_the_gpu_s_number(
    tmp_path: Path,
) -> None:
    """A reset of GPU 5 is confirmed by typing 5; the node's power cycle, which stops every
    GPU there, by typing the node's name, as the power dialog asks."""
    world = h100(tmp_path / "w", PODS_ONLY)
    executor = quick(world, tmp_path / "s")
    reset = await executor.plan_remedy("5", Action.RESET_GPU)
    assert "5" in reset.confirmations()
    cycle = await executor.plan_remedy("5", Action.REBOOT_NODE)
    assert cycle.confirmations() == ("dgx-003",)
    assert cycle.confirmation_words() == "dgx-003"
    for typed in ("5", "c3:00.0"):
        with pytest.raises(ActionRefused, match="does not match 'dgx-003'"):
            await executor.execute(cycle, OPS, typed)
    assert world.node.power_cycles == 0


async def test_a_power_cycle_tells_and_waits_for_a_running_guest_that_holds_no_gpu(
    tmp_path: Path,
) -> None:
    """dgx-003 runs guest tenant-b-vm8, which waits for a passthrough GPU and holds none: a
    power cycle stops it all the same. The plan says so, tells its tenant, and waits for it
    to shut down; it never powers the node while the guest runs."""
    import dataclasses

    world = SimWorld.demo("dgx-003", tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    plan = await executor.plan_remedy("5", Action.REBOOT_NODE)
    assert any("tenant-b-vm8" in n and "shut down" in n for n in plan.notes), plan.notes
    (power_note,) = [n for n in plan.notes if "power cycle" in n]
    assert "vm tenant-b-vm8" in power_note
    (told,) = [s for s in plan.steps if s.kind is StepKind.NOTIFY]
    assert told.guest == "tenant-b-vm8" and "tenant tenant-b" in told.title
    (wait,) = [s for s in plan.steps if s.kind is StepKind.WAIT_IDLE]
    assert "vm tenant-b-vm8" in wait.owners
    outcome = await executor.execute(plan, OPS, "dgx-003")
    assert outcome.state is PlanState.FAILED
    assert "still busy after 3 s: vm tenant-b-vm8" in outcome.message, outcome.message
    assert world.node.power_cycles == 0
    # the tenant shuts the guest down: the next plan runs through to the power cycle
    world.plan = dataclasses.replace(
        world.plan, guests=tuple(dataclasses.replace(g, state=5) for g in world.plan.guests)
    )
    again = await executor.plan_remedy("5", Action.REBOOT_NODE)
    assert not any("tenant-b-vm8" in n for n in again.notes)
    outcome = await executor.execute(again, OPS, "dgx-003")
    assert world.node.power_cycles == 1, outcome.message


async def test_service_and_reseat_take_the_gpu_out_of_work_and_mark_it(tmp_path: Path) -> None:
    world = h100(tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    for action, words in ((Action.SERVICE, "return it (RMA)"), (Action.RESEAT, "reseat it")):
        plan = await executor.plan_remedy("5", action)
        assert kinds(plan)[-2:] == [StepKind.MARK_SERVICE, StepKind.VERIFY]
        assert words in plan.steps[-2].title
        assert StepKind.UNBIND in kinds(plan)
        # a lost GPU is not function-reset on its way out
        assert StepKind.RESET not in kinds(plan)


async def test_a_fit_gpu_has_nothing_to_remediate(tmp_path: Path) -> None:
    world = h100(tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    assert verdict_action(await world.snapshot(), "2") is Action.FIT
    plan = await executor.plan_remedy("2")
    assert plan.blocked
    assert "nothing to remediate" in plan.failed[0].detail
    with pytest.raises(ActionRefused, match="nothing to remediate"):
        await executor.execute(plan, OPS, "dgx-003")


async def test_a_guest_s_gpu_tells_its_tenant_and_resets_through_vfio(tmp_path: Path) -> None:
    plan_ = SimPlan(guests=(SimGuest("tenant-b-vm1", (1,), tenant="acme"),))
    world = SimWorld("sim-01", APOLLO_PCIE, tmp_path / "w", plan_)
    node = await world.snapshot()
    plan = make_remediation_plan(node, bus_of(world, 1), Action.RESET_GPU)
    assert kinds(plan) == [StepKind.NOTIFY, StepKind.WAIT_IDLE, StepKind.GPU_RESET, StepKind.VERIFY]
    assert "tenant acme of guest tenant-b-vm1" in plan.steps[0].title
    assert plan.steps[2].layer is Layer.PCI  # NVML cannot see it: a PCI function reset
    assert str(plan.target) == "vm:tenant-b-vm1"


# --- preconditions that refuse --------------------------------------------------------------


async def test_processes_left_on_the_gpu_refuse_the_reset_and_nothing_changes(
    tmp_path: Path,
) -> None:
    world = h100(tmp_path / "w", SimPlan(loose=(5,)), scenario="ecc:5")
    executor = quick(world, tmp_path / "s")
    plan = await executor.plan_remedy("5", Action.RESET_GPU)
    (failed,) = plan.failed
    assert failed.name.startswith("no processes remain")
    assert "process alice" in failed.detail and "pids" in failed.detail
    with pytest.raises(ActionRefused, match="no processes remain"):
        await executor.execute(plan, OPS, "dgx-003")
    assert world.node.resets == {} and world.cordoned == set()
    assert [r["outcome"] for r in audit(tmp_path / "s")] == ["refused"]


async def test_a_busy_nvlink_peer_refuses_the_reset(tmp_path: Path) -> None:
    world = h100(tmp_path / "w", SimPlan(loose=(4,)))
    plan = await quick(world, tmp_path / "s").plan_remedy("5", Action.RESET_GPU)
    (failed,) = plan.failed
    assert failed.name == "no NVLink peer busy"
    assert f"GPU 4 ({bus_of(world, 4)}): process alice" in failed.detail
    # on a server without NVSwitches the same process does not stand in the way
    pcie = SimWorld("sim-01", APOLLO_PCIE, tmp_path / "p", SimPlan(loose=(0,)))
    node = await pcie.snapshot()
    plan = make_remediation_plan(node, "1", Action.RESET_GPU, PlanContext(gpu_reset=True))
    assert not plan.blocked, plan.describe()
    # and without a way to reset a GPU, the plan says how to do it by hand
    (failed,) = make_remediation_plan(node, "1", Action.RESET_GPU).failed
    assert failed.remedy == "reset it on sim-01: nvidia-smi -r -i 0000:25:00.0"


async def test_an_ampere_nvswitch_node_without_fabric_manager_cannot_reset_a_gpu(
    tmp_path: Path,
) -> None:
    world = SimWorld("dgxa-009", DGX_A100, tmp_path / "w", SimPlan())
    node = await world.snapshot()
    assert node.nvml is not None
    ctx = PlanContext(gpu_reset=True)
    assert not make_remediation_plan(node, "2", Action.RESET_GPU, ctx).blocked
    down = msgspec.structs.replace(
        node, nvml=msgspec.structs.replace(node.nvml, fabric_manager_running=False)
    )
    (failed,) = make_remediation_plan(down, "2", Action.RESET_GPU, ctx).failed
    assert failed.name == "Fabric Manager running"
    assert failed.remedy.startswith("start it (systemctl start nvidia-fabricmanager)")


async def test_a_viewer_is_refused_and_the_refusal_is_audited(tmp_path: Path) -> None:
    world = h100(tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    plan = await executor.plan_remedy("5", Action.RESET_GPU)
    with pytest.raises(ActionRefused, match="role viewer may not act"):
        await executor.execute(plan, Actor("eve", Role.VIEWER), "dgx-003")
    (record,) = audit(tmp_path / "s")
    assert record["action"] == "remediate reset_gpu" and record["outcome"] == "refused"
    assert record["user"] == "eve" and world.cordoned == set()


# --- carried out in the simulator -------------------------------------------------------------


async def test_xid79_drained_reset_and_fit_with_every_step_audited_by_bus_id_and_uuid(
    tmp_path: Path,
) -> None:
    world = h100(tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    gpu5 = next(g for g in (await world.snapshot()).gpus if g.index == 5)
    assert gpu5.lost
    plan = await executor.plan_remedy("5", Action.RESET_GPU)
    outcome = await executor.execute(plan, OPS, "5")
    assert outcome.ok, outcome.message
    after = next(g for g in (await world.snapshot()).gpus if g.index == 5)
    assert not after.lost and world.node.resets == {5: 1}
    assert world.node.uuids[5] in world.cordoned  # drained from Kubernetes until given back
    records = audit(tmp_path / "s")
    steps = [r for r in records if r["outcome"] == "step done"]
    assert len(steps) == len(plan.steps)
    for record in records:
        assert record["args"]["gpus"] == [bus_of(world, 5)]
        assert record["args"]["uuids"] == [world.node.uuids[5]]
        assert record["action"] == "remediate reset_gpu"
    assert records[-1]["outcome"] == "ok"


async def test_the_bmc_s_record_of_the_bus_error_is_history_once_the_reset_made_the_gpu_fit(
    tmp_path: Path,
) -> None:
    """Story 1's evidence is the XID and the BMC's SEL record of the PCIe bus error on GPU 5's
    bus. After a repair that made GPU 5 fit, a one-shot reading of the node (which never saw
    the GPU lost, so only the journal knows of the reset) finds it fit, the record kept as
    history; a record the BMC makes after the repair is news again."""
    from gpuconsole.readings.base import Severity
    from gpuconsole.readings.bmc import BmcReading, SelEntry

    world = h100(tmp_path / "w", PODS_ONLY)
    executor = quick(world, tmp_path / "s")
    bus = bus_of(world, 5)

    def with_sel(node: Any, at: float) -> Any:
        entry = SelEntry(7, at, "PCIe SXM5", "Critical Interrupt",
                         "Bus Fatal Error (bus c3 dev 00 fn 0)", Severity.CRITICAL)  # fmt: skip
        return msgspec.structs.replace(node, bmc=BmcReading(at=time.time(), sel_recent=(entry,)))

    logged = time.time() - 5
    before = with_sel(await world.snapshot(), logged)
    assert gpu_verdict(before, bus).action is Action.RESET_GPU
    outcome = await executor.execute(await executor.plan_remedy(bus), OPS, "5")
    assert outcome.ok, outcome.message

    after = await world.snapshot()
    gpu5 = next(g for g in after.gpus if g.index == 5)
    assert gpu5.reset_at is None  # a fresh reading: NVML never saw it lost
    verdict = gpu_verdict(with_sel(after, logged), bus)
    assert verdict.action is Action.FIT, verdict.findings
    (kept,) = verdict.findings
    assert kept.bus_id == bus and "Bus Fatal Error" in kept.text and "repaired at" in kept.text
    again = gpu_verdict(with_sel(after, time.time() + 1), bus)
    assert again.action is Action.RESET_GPU, again.findings


async def test_a_fault_that_stays_goes_on_to_a_power_cycle_and_then_to_service(
    tmp_path: Path,
) -> None:
    world = h100(tmp_path / "w", PODS_ONLY, scenario="xid79hard:5")
    executor = quick(world, tmp_path / "s")
    reset = await executor.execute(
        await executor.plan_remedy("5", Action.RESET_GPU), OPS, "dgx-003"
    )
    assert reset.state is PlanState.FAILED
    assert "unable to reset" in reset.message and "next: reboot_node" in reset.message
    # the drain is kept: a GPU under repair never goes back to work by itself
    assert world.node.uuids[5] in world.cordoned
    assert "kept: cordon" in reset.message

    cycle = await executor.execute(
        await executor.plan_remedy("5", Action.REBOOT_NODE), OPS, "dgx-003"
    )
    assert world.node.power_cycles == 1, cycle.message
    assert cycle.state is PlanState.FAILED and "still lost" in cycle.message
    assert "next: service" in cycle.message

    service = await executor.execute(
        await executor.plan_remedy("5", Action.SERVICE), OPS, "dgx-003"
    )
    assert service.ok, service.message
    assert world.owners(5) == ["drained"]
    assert holders(Journal(tmp_path / "s" / "actions.db")) == []


async def test_a_reset_that_fails_asks_for_the_node_reboot_and_a_power_cycle_that_fails_service(
    tmp_path: Path,
) -> None:
    """The verdict knows from the node's journal that GPU 5's reset was tried and failed:
    it asks for the power cycle (and plans it), in words that name the GPU and the time,
    then for service once the power cycle did not bring it back either."""
    world = h100(tmp_path / "w", PODS_ONLY, scenario="xid79hard:5")
    executor = quick(world, tmp_path / "s")
    bus = bus_of(world, 5)
    assert gpu_verdict(await world.snapshot(), bus).action is Action.RESET_GPU
    reset = await executor.execute(await executor.plan_remedy("5"), OPS, "dgx-003")
    assert reset.state is PlanState.FAILED, reset.message
    tried = next(r for r in Journal(tmp_path / "s" / "actions.db").plans()[0].steps
                 if r.kind == "gpu_reset")  # fmt: skip

    verdict = gpu_verdict(await world.snapshot(), bus)
    assert verdict.action is Action.REBOOT_NODE
    lost = verdict.findings[0]
    assert lost.bus_id == bus and lost.action is Action.REBOOT_NODE
    assert lost.text.endswith(
        f"reboot the node: the reset of GPU 5 ({short_bus_id(bus)}) at "
        f"{fmt.clock_time(tried.started_at)} failed"
    )
    await _a_head_reads_it_from_the_agent(world, bus)
    cycle_plan = await executor.plan_remedy("5")  # what the verdict now asks for
    assert cycle_plan.remedy == "reboot_node" and StepKind.POWER_CYCLE in kinds(cycle_plan)

    cycle = await executor.execute(cycle_plan, OPS, "dgx-003")
    assert cycle.state is PlanState.FAILED and world.node.power_cycles == 1
    verdict = gpu_verdict(await world.snapshot(), bus)
    assert verdict.action is Action.SERVICE
    assert "return it for service: the node's power cycle at" in verdict.findings[0].text
    assert (await executor.plan_remedy("5")).remedy == "service"


async def test_a_reset_plan_that_stopped_before_its_reset_is_no_failed_reset(
    tmp_path: Path,
) -> None:
    """GPU 3 (a row remap pending) runs a Slurm job to its end, so its reset plan fails
    waiting for it: the reset was never tried, and the verdict still asks for it, not for
    the node's power cycle."""
    world = h100(tmp_path / "w", scenario="ecc:3")
    executor = quick(world, tmp_path / "s")
    outcome = await executor.execute(await executor.plan_remedy("3"), OPS, "dgx-003")
    assert outcome.state is PlanState.FAILED and "still busy" in outcome.message
    node = await world.snapshot()
    assert node.actions is not None and node.actions.repairs == ()
    assert gpu_verdict(node, bus_of(world, 3)).action is Action.RESET_GPU


class _ResetFails:
    """nvidia-smi -r that fails, the GPU left as it was."""

    async def run(self, step: Step) -> str:
        raise StepFailed(f"nvidia-smi -r -i {step.gpus[0]}: timed out")

    async def undo(self, step: Step) -> str:
        return "nothing to undo"


async def test_what_a_reset_would_clear_asks_for_the_power_cycle_once_the_reset_failed(
    tmp_path: Path,
) -> None:
    """A row remap pending asks for GPU 5's reset; once that reset failed, for the node's
    power cycle, its words saying so."""
    world = h100(tmp_path / "w", PODS_ONLY, scenario="ecc:5")
    drivers = sim_drivers(world)
    drivers.gpu = _ResetFails()
    executor = quick(world, tmp_path / "s", drivers)
    bus = bus_of(world, 5)
    before = gpu_verdict(await world.snapshot(), bus)
    assert before.action is Action.RESET_GPU
    outcome = await executor.execute(await executor.plan_remedy("5"), OPS, "dgx-003")
    assert outcome.state is PlanState.FAILED and "timed out" in outcome.message
    after = gpu_verdict(await world.snapshot(), bus)
    assert after.action is Action.REBOOT_NODE
    remap = next(f for f in after.findings if f.code == "remap_pending")
    assert remap.action is Action.REBOOT_NODE
    assert f"; reboot the node: the reset of GPU 5 ({short_bus_id(bus)}) at " in remap.text


async def _a_head_reads_it_from_the_agent(world: SimWorld, bus: str) -> None:
    """A head reading the node through its agent (real, on loopback) shows the verdict the
    node judged from its journal; the journal itself stays on the node. (Each of the world's
    snapshots is a fresh poll, which dates the lost GPU from itself: the words are compared
    with the snapshot the agent serves.)"""
    from gpuconsole.export.agent import Agent
    from gpuconsole.readings.snapshot import FleetSnapshot
    from gpuconsole.wiring import AgentSettings
    from tests.export_fixtures import HeldHub
    from tests.test_verdict_agents import head_of

    node = await world.snapshot()
    assert node.actions is not None and node.actions.repair(bus) is not None
    words = gpu_verdict(node, bus).findings[0].text
    assert "failed" in words
    agent = Agent(HeldHub(FleetSnapshot(1, time.time(), (node,))), AgentSettings(port=0))
    await agent.start()
    try:
        fleet = await head_of((node.node, f"http://127.0.0.1:{agent.port}")).poll_once()
    finally:
        await agent.stop()
    far = fleet.node(node.node)
    assert far is not None and far.verdict is not None and far.actions is None
    verdict = gpu_verdict(far, bus)
    assert verdict.action is Action.REBOOT_NODE and verdict.findings[0].text == words


# --- crash recovery ------------------------------------------------------------------------------


class _DieAt:
    """Passes steps to the simulated driver and SIGKILLs the process at a step kind, before
    or after the driver ran it (the result never journaled)."""

    def __init__(self, inner: StepDriver, kind: StepKind, after: bool) -> None:
        self.inner, self.kind, self.after = inner, kind, after

    async def run(self, step: Step) -> str:
        if step.kind is self.kind and not self.after:
            os.kill(os.getpid(), signal.SIGKILL)
        detail = await self.inner.run(step)
        if step.kind is self.kind:
            os.kill(os.getpid(), signal.SIGKILL)
        return detail

    async def undo(self, step: Step) -> str:
        return await self.inner.undo(step)


def _doomed(root: Path, action: str, kind: str, after: bool) -> None:
    async def go() -> None:
        world = h100(root / "w", PODS_ONLY)
        drivers = sim_drivers(world)
        assert drivers.gpu is not None and drivers.bmc is not None
        drivers.gpu = _DieAt(drivers.gpu, StepKind(kind), after)
        drivers.bmc = _DieAt(drivers.bmc, StepKind(kind), after)
        executor = quick(world, root / "s", drivers)
        plan = await executor.plan_remedy("5", Action(action))
        await executor.execute(plan, OPS, "dgx-003")

    asyncio.run(go())


def _killed_then_recovered(root: Path, action: Action, kind: StepKind, after: bool) -> Any:
    h100(root / "w", PODS_ONLY)
    child = multiprocessing.get_context("fork").Process(
        target=_doomed, args=(root, action.value, kind.value, after)
    )
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL

    async def restart() -> Any:
        world = h100(root / "w", PODS_ONLY)
        return world, await quick(world, root / "s").recover()

    return asyncio.run(restart())


def test_the_command_line_tells_a_recovered_plan_s_steps_as_steps_of_that_plan(
    tmp_path: Path,
) -> None:
    """`gpuconsole remediate` (and `assign`) recover what a crash left before they plan, each
    step told as it ticks through the same report: step N of the plan recovered, which that
    command never showed."""
    import io

    from gpuconsole.actions.progress import TextReport

    h100(tmp_path / "w", PODS_ONLY)
    child = multiprocessing.get_context("fork").Process(
        target=_doomed, args=(tmp_path, Action.RESET_GPU.value, StepKind.GPU_RESET.value, False)
    )
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    out = io.StringIO()
    report = TextReport(out)

    async def restart() -> Any:
        executor = quick(h100(tmp_path / "w", PODS_ONLY), tmp_path / "s")
        executor.on_step = report.step
        return await executor.recover()

    (outcome,) = asyncio.run(restart())
    assert outcome.ok, outcome.message
    told = out.getvalue()
    assert "  [4/5] ok reset GPU 5 (0000:c3:00.0)" in told, told
    assert "  [5/5] ok final check" in told, told


@pytest.mark.parametrize("after", [False, True], ids=["before-reset", "after-reset"])
def test_a_remediation_killed_at_its_reset_is_finished_by_recovery(
    tmp_path: Path, after: bool
) -> None:
    world, (outcome,) = _killed_then_recovered(
        tmp_path, Action.RESET_GPU, StepKind.GPU_RESET, after
    )
    assert outcome.recovered and outcome.ok, outcome.message
    assert "stopped at step 4" in outcome.message
    gpu5 = next(g for g in asyncio.run(world.snapshot()).gpus if g.index == 5)
    assert not gpu5.lost
    # a reset is repeatable: run once more when the crash left it unrecorded
    assert world.node.resets == {5: 2 if after else 1}
    record = Journal(tmp_path / "s" / "actions.db").plans()[0]
    assert record.recovered and record.state is PlanState.DONE
    assert holders(Journal(tmp_path / "s" / "actions.db")) == []
    outcomes = [r["outcome"] for r in audit(tmp_path / "s")]
    assert outcomes[-1] == "recovered"


def test_a_power_cycle_the_crash_left_unrecorded_is_never_sent_twice(tmp_path: Path) -> None:
    world, (outcome,) = _killed_then_recovered(
        tmp_path, Action.REBOOT_NODE, StepKind.POWER_CYCLE, after=True
    )
    assert world.node.power_cycles == 1
    # the node's new boot id says it went through: the reboot is the plan's own, and its
    # final check reads the GPU in the new boot
    assert "is not sent again: it went through: dgx-003 rebooted (boot id" in outcome.message
    assert outcome.ok, outcome.message


def test_a_node_that_runs_again_after_its_power_cycle_is_not_waited_for_by_recovery(
    tmp_path: Path,
) -> None:
    """The power cycle took the process down with the node; the node came back and a pod
    runs on GPU 0 again. Recovery sends no second power cycle, so it waits for nothing:
    it checks GPU 5."""
    import dataclasses

    h100(tmp_path / "w", PODS_ONLY)
    child = multiprocessing.get_context("fork").Process(
        target=_doomed,
        args=(tmp_path, Action.REBOOT_NODE.value, StepKind.POWER_CYCLE.value, True),
    )
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL

    async def restart() -> Any:
        world = h100(tmp_path / "w", PODS_ONLY)
        back = SimPod("team-vision", "resnet-ft-2", "train", gpus=(0,))
        world.plan = dataclasses.replace(world.plan, pods=(back,))
        return world, await quick(world, tmp_path / "s").recover()

    world, (outcome,) = asyncio.run(restart())
    assert world.node.power_cycles == 1
    assert outcome.ok, outcome.message


def _killed_once_idle(root: Path) -> None:
    """A power cycle's plan, killed the moment its wait found the node idle: the journal
    holds the wait done and the power cycle never begun."""

    def die(update: StepUpdate) -> None:
        if update.step.kind is StepKind.WAIT_IDLE and update.state is StepProgress.DONE:
            os.kill(os.getpid(), signal.SIGKILL)

    async def go() -> None:
        world = h100(root / "w", PODS_ONLY)
        executor = quick(world, root / "s")
        executor.on_step = die
        plan = await executor.plan_remedy("5", Action.REBOOT_NODE)
        await executor.execute(plan, OPS, "dgx-003")

    asyncio.run(go())


def test_recovery_waits_for_the_node_to_be_idle_again_before_it_power_cycles(
    tmp_path: Path,
) -> None:
    """The node was idle when the process died; a tenant came since. Recovery finishes the
    plan only once the node is idle again: the wait found idle before the crash vouches
    for then, not for now, and the power cycle is not sent under the new tenant."""
    import dataclasses

    h100(tmp_path / "w", PODS_ONLY)
    child = multiprocessing.get_context("fork").Process(target=_killed_once_idle, args=(tmp_path,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL

    async def restart() -> Any:
        world = h100(tmp_path / "w", PODS_ONLY)
        assert world.plan.pods == ()  # both evicted before the crash
        late = SimPod("team-nlp", "late-job-0", "trainer", gpus=(0,))
        world.plan = dataclasses.replace(world.plan, pods=(late,))
        return world, await quick(world, tmp_path / "s").recover()

    world, (outcome,) = asyncio.run(restart())
    assert world.node.power_cycles == 0, outcome.message
    assert not outcome.ok
    assert "pod team-nlp/late-job-0" in outcome.message, outcome.message


# --- the command line ------------------------------------------------------------------------


def test_gpuconsole_remediate_resets_a_simulated_gpu_and_a_dry_run_changes_nothing(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    base = [sys.executable, "-m", "gpuconsole", "remediate", "5", "--demo", "--node", "dgx-003"]
    base += ["--action", "reset_gpu"]
    dry = subprocess.run([*base, "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "4. reset GPU 5 (0000:c3:00.0) (nvidia-smi -r -i 0000:c3:00.0)" in dry.stdout
    assert "done:" not in dry.stdout
    wrong = subprocess.run(
        [*base, "--confirm", "dgx-004"], capture_output=True, text=True, env=env, timeout=120
    )
    # as `assign` says it: the plan, a line per step as it ticks, the outcome
    assert wrong.returncode == 3
    assert "Refused: confirmation 'dgx-004' does not match 'dgx-003', '5' or" in wrong.stdout
    ran = subprocess.run(
        [*base, "--confirm", "dgx-003"], capture_output=True, text=True, env=env, timeout=120
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "  [4/5] ok reset GPU 5 (0000:c3:00.0)" in ran.stdout
    assert "done: GPU 5 (0000:c3:00.0): drain it, reset the GPU, then verify: done" in ran.stdout


def test_the_demo_s_worlds_run_the_processes_the_demo_shows(tmp_path: Path) -> None:
    """`remediate --demo` and `assign --demo` plan from a world of each demo node: its GPUs
    run the processes the demo's hub shows, one per MIG instance a pod holds and one per pod
    sharing a GPU, none else (a process nobody's pod owns would refuse every plan there)."""
    from gpuconsole.sim.cluster import build_sim_nodes, demo_cluster

    for shown in build_sim_nodes(demo_cluster()):
        world = SimWorld.demo(shown.name, tmp_path / shown.name)
        for gpu in shown.profile.gpus:
            seen = [(pid, gi) for pid, _used, gi in world.node.processes(gpu.index)]
            want = [(pid, gi) for pid, _used, gi in shown.processes(gpu.index)]
            assert seen == want, (shown.name, gpu.index)


async def test_the_demo_s_mig_gpu_is_drained_by_evicting_its_two_pods(tmp_path: Path) -> None:
    """dgx-004's GPU 7 runs two MIG pods and nothing else: its drain evicts both."""
    world = SimWorld.demo("dgx-004", tmp_path / "w")
    executor = quick(world, tmp_path / "s")
    bus = bus_of(world, 7)
    plan = await executor.plan_remedy(bus, Action.DRAIN)
    assert not plan.blocked, plan.failed
    assert [s.pod for s in plan.steps if s.kind is StepKind.EVICT] == [
        "team-vision/infer-0",
        "team-nlp/embed-1",
    ]
    outcome = await executor.execute(plan, OPS, "dgx-004")
    assert outcome.ok, outcome.message
    assert world.owners(7) == ["drained"]


# --- seen by consoles of other processes -------------------------------------------------------


def _remediate_elsewhere(root: Path) -> None:
    """`gpuconsole remediate` in a process of its own: it knows nothing of the hub."""

    async def go() -> None:
        world = h100(root / "w", PODS_ONLY)
        executor = quick(world, root / "s")
        plan = await executor.plan_remedy("5", Action.RESET_GPU)
        assert (await executor.execute(plan, OPS, "dgx-003")).ok

    asyncio.run(go())


async def test_a_remediation_run_elsewhere_is_told_in_a_running_hubs_events_as_one(
    tmp_path: Path,
) -> None:
    from gpuconsole.actions.journal_events import JournalEvents
    from gpuconsole.hub import Hub
    from tests.waiting import until

    h100(tmp_path / "w", PODS_ONLY)
    Journal(tmp_path / "s" / "actions.db").close()  # there before the hub: all after is news
    hub = Hub()
    hub.add_source(JournalEvents("dgx-003", tmp_path / "s" / "actions.db", interval_s=0.1))
    await hub.start()
    try:
        await until(lambda: bool(hub.latest and any(s.ok for s in hub.latest.nodes[0].statuses)))
        child = multiprocessing.get_context("fork").Process(
            target=_remediate_elsewhere, args=(tmp_path,)
        )
        child.start()
        await until(lambda: child.exitcode is not None, timeout=60)
        child.join()
        assert child.exitcode == 0

        def told() -> list[str]:
            latest = hub.latest
            return [e.message for e in latest.events if e.source == "actions"] if latest else []

        await until(lambda: any(m.startswith("remediate reset_gpu by ops") for m in told()))
    finally:
        await hub.stop()
    messages = told()
    assert any(m.startswith("ops (operator) started remediate reset_gpu: ") for m in messages)
    steps = [m for m in messages if " step " in m]
    assert len(steps) == 5 and all(m.startswith("remediate reset_gpu (plan ") for m in steps)
    assert not any("assign" in m for m in messages)


async def test_a_power_cycle_step_goes_through_the_node_s_bmc_source() -> None:
    """The driver a real node gets ([[bmc]]): the BMC source is started for the request and
    closed after it; here over the simulator's IPMI session."""
    from gpuconsole.actions.drivers.repair import BmcPowerDriver
    from gpuconsole.sim.bmc import sim_link
    from gpuconsole.sim.node import SimNode
    from gpuconsole.sources.bmc import BmcSource

    node = SimNode("dgx-003", DGX_H100, scenarios=("xid79:5",))
    assert node.lost(5)
    driver = BmcPowerDriver(BmcSource("dgx-003", sim_link(node)), started=False)
    said = await driver.run(Step(StepKind.POWER_CYCLE, Layer.BMC, "power-cycle dgx-003"))
    assert said.startswith("power cycle requested through ") and said.endswith("(cycle)")
    assert node.power_cycles == 1 and not node.lost(5)
