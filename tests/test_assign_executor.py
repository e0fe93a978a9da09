"""The executor end to end on the simulator: the CLI's --demo flow, who may act, the audit
log, a failing step rolled back, and two requests for one GPU."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.drivers.vfio import VfioDriver
from gpuconsole.actions.executor import ACTION_EVENT, STEP_EVENT
from gpuconsole.actions.journal import PlanState
from gpuconsole.actions.locks import holders
from gpuconsole.actions.plan import Step, StepKind, Target
from gpuconsole.actions.roles import ActionRefused, Actor, Role
from gpuconsole.cli.main import main
from gpuconsole.hub import Hub
from gpuconsole.readings.base import Event, Severity
from gpuconsole.sim.actions import SimWorld, sim_drivers
from gpuconsole.sim.tenancy import SimGuest, SimJob, SimPlan
from tests.assign_fixtures import SlowPci, executor_for, tree_picture, world
from tests.waiting import until

OPERATOR = Actor("ops", Role.OPERATOR, "SHA256:abc", "ssh")


def test_assign_demo_yes_runs_the_whole_plan_on_the_simulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    argv = ["assign", "--demo", "--node", "dgx-003", "2", "--to", "drained", "--yes"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[2/6] ok evict pod team-nlp/notebook-alice" in out
    assert "done: GPU 2 (0000:52:00.0) now drained" in out
    demo = SimWorld.demo("dgx-003", tmp_path / "gpuconsole" / "demo" / "dgx-003")
    assert demo.owners(2) == ["drained"]
    # the same GPU again, by its bus id, is refused: already there, nothing changes
    again = [*argv[:4], "52:00.0", *argv[5:]]
    assert main(again) == 3
    assert "is already drained" in capsys.readouterr().out
    # NVML numbers the others again without it: GPU 2 is 61:00.0 now, so a number
    # confirmed unseen is refused rather than taken for another GPU
    assert main(argv) == 3
    out = capsys.readouterr().out
    assert "GPU 2 is a number NVML gives" in out and "GPU 2 (0000:61:00.0) now" in out
    assert demo.owners(3) != ["drained"]
    # a dry run of the way back changes nothing either
    assert main([*again[:5], "--to", "k8s", "--dry-run"]) == 0
    assert "Dry run" in capsys.readouterr().out and demo.owners(2) == ["drained"]
    # the demo keeps its journal and audit log beside its worlds, out of the machine's
    demo_audit = tmp_path / "gpuconsole" / "demo" / "audit.jsonl"
    records = [json.loads(line) for line in demo_audit.open()]
    assert [(r["action"], r["outcome"]) for r in records] == [
        ("assign drained", "started"),
        ("assign drained", "ok"),
    ]


async def test_a_viewer_is_refused_by_the_executor_and_the_audit_log_says_who(
    tmp_path: Path,
) -> None:
    w = world(tmp_path / "world")
    before = tree_picture(w.tree.sysfs_root)
    executor = executor_for(w, tmp_path / "state")
    plan = await executor.plan(["0"], Target.parse("drained"))
    viewer = Actor("val", Role.VIEWER, "SHA256:xyz", "ssh")
    with pytest.raises(ActionRefused, match="role viewer may not act"):
        await executor.execute(plan, viewer, "sim-01")
    assert tree_picture(w.tree.sysfs_root) == before and w.owners(0) == ["pod team-nlp/train-0"]
    outcome = await executor.execute(plan, OPERATOR, "0")  # the GPU's index confirms too
    assert outcome.ok and w.owners(0) == ["drained"]
    records = executor.audit.records()
    assert [(r["user"], r["role"], r["outcome"]) for r in records] == [
        ("val", "viewer", "refused"),
        ("ops", "operator", "started"),
        ("ops", "operator", "ok"),
    ]
    assert records[0]["key_fingerprint"] == "SHA256:xyz" and records[0]["time"]
    assert records[2]["target"] == "sim-01: GPU 0 (0000:21:00.0)"
    assert any("evict pod team-nlp/train-0" in s for s in records[2]["args"]["steps"])


async def test_refused_plans_leave_the_node_the_journal_and_the_locks_as_they_were(
    tmp_path: Path,
) -> None:
    w = world(tmp_path / "world")
    executor = executor_for(w, tmp_path / "state")
    before = tree_picture(w.tree.sysfs_root)
    blocked = await executor.plan(["3"], Target.parse("free"))  # Slurm job 4711 holds it
    with pytest.raises(ActionRefused, match="job 4711"):
        await executor.execute(blocked, OPERATOR, "sim-01")
    plan = await executor.plan(["1"], Target.parse("drained"))
    with pytest.raises(ActionRefused, match="does not match"):
        await executor.execute(plan, OPERATOR, "sim-02")
    # between the plan and its confirmation a Slurm job took the GPU
    w.plan = dataclasses.replace(w.plan, jobs=(*w.plan.jobs, SimJob("4800", "chem", 1002, (1,))))
    with pytest.raises(ActionRefused, match=r"the node changed since the plan: .*job 4800"):
        await executor.execute(plan, OPERATOR, "1")
    assert tree_picture(w.tree.sysfs_root) == before
    assert w.owners(1) == ["job 4800"] and w.cordoned == set()
    assert holders(executor.journal) == []  # the lock taken for the re-check went with it
    assert [r.state for r in executor.journal.plans()] == [PlanState.REFUSED]
    assert [r["outcome"] for r in executor.audit.records()] == ["refused"] * 3


async def test_an_assign_run_beside_a_hub_shows_its_steps_and_outcome_in_the_hubs_events(
    tmp_path: Path,
) -> None:
    hub = Hub()
    hub.add_node("sim-01", simulated=True)
    await hub.start()
    try:
        w = world(tmp_path / "world")
        executor = executor_for(w, tmp_path / "state", emit=hub.post_event)
        plan = await executor.plan(["1"], Target.parse("drained"))
        with pytest.raises(ActionRefused):
            await executor.execute(plan, Actor("val", Role.VIEWER), "1")
        # as a console runs it: in a worker thread with its own loop, not on the hub's
        outcome = await asyncio.to_thread(asyncio.run, executor.execute(plan, OPERATOR, "1"))
        assert outcome.ok

        def shown() -> list[Event]:
            latest = hub.latest
            return [e for e in latest.events if e.source == "actions"] if latest else []

        await until(lambda: any("now drained" in e.message for e in shown()))
    finally:
        await hub.stop()
    events = shown()
    assert all(e.node == "sim-01" and e.gpu_index == 1 for e in events)
    refused, started, *steps, done = events
    assert refused.severity is Severity.WARNING and "val (viewer) was refused" in refused.message
    assert started.kind == ACTION_EVENT and started.message.startswith(
        f"ops (operator, ssh key SHA256:abc) started assign drained: {outcome.plan_id}"
    )
    assert [e.kind for e in steps] == [STEP_EVENT] * len(plan.steps)
    assert [e.message.split(" done: ")[1].split(":")[0] for e in steps] == [
        s.title.split(":")[0] for s in plan.steps
    ]
    assert done.kind == ACTION_EVENT and done.severity is Severity.INFO
    assert done.message == f"assign drained by ops: {outcome.message}"


async def test_an_a100_pair_goes_to_a_guest_with_its_switch_and_comes_back_to_the_host(
    tmp_path: Path,
) -> None:
    plan = SimPlan(guests=(SimGuest("tenant-c-vm9", (), state=5),))
    w = world(tmp_path / "world", plan, "a100")
    executor = executor_for(w, tmp_path / "state")
    sysfs = VfioDriver(w.tree.sysfs_root)
    there = await executor.plan(["6", "7"], Target.parse("vm:tenant-c-vm9"))
    assert (await executor.execute(there, OPERATOR, "sim-01")).ok
    node = await w.snapshot()
    (guest,) = [g for g in node.tenancy.guests if g.name == "tenant-c-vm9"] if node.tenancy else []
    (switch,) = set(guest.bus_ids) - set(there.gpus)  # a pair takes one of the six
    assert sysfs.driver(switch) == "vfio-pci" and w.owners(6) == ["vm tenant-c-vm9"]
    # back to the host: both GPUs (planned without a UUID: NVML did not see them) and the
    # switch, which Fabric Manager needs on nvidia
    back = await executor.plan(list(there.gpus), Target.parse("free"))
    outcome = await executor.execute(back, OPERATOR, "sim-01")
    assert outcome.ok, outcome.message
    assert sysfs.driver(switch) == "nvidia" and w.switches == {}
    assert w.owners(6) == ["free"] and w.owners(7) == ["free"]
    verify = executor.journal.plans()[0].steps[-1]
    assert verify.kind == "verify" and "NVML sees every UUID" in verify.detail


class _Failing:
    """The simulated PCI driver, failing at one step kind."""

    def __init__(self, inner: Any, kind: StepKind) -> None:
        self.inner, self.kind = inner, kind

    async def run(self, step: Step) -> str:
        if step.kind is self.kind:
            raise StepFailed("the device did not answer")
        return str(await self.inner.run(step))

    async def undo(self, step: Step) -> str:
        return str(await self.inner.undo(step))


async def test_a_failing_step_puts_back_what_the_plan_changed(tmp_path: Path) -> None:
    w = world(tmp_path / "world", profile="h100")
    drivers = sim_drivers(w)
    drivers.pci = _Failing(drivers.pci, StepKind.PROBE)
    executor = executor_for(w, tmp_path / "state", drivers=drivers)
    before = tree_picture(w.tree.sysfs_root)
    plan = await executor.plan(["1"], Target.parse("vm:tenant-b-vm1"))
    outcome = await executor.execute(plan, OPERATOR, "sim-01")
    assert outcome.state == PlanState.FAILED
    assert "drivers_probe" in outcome.message and "rolled back" in outcome.message
    assert tree_picture(w.tree.sysfs_root) == before
    assert w.owners(1) == ["k8s"] and w.cordoned == set()
    assert executor.journal.plans()[0].state == PlanState.FAILED


class _Breaks:
    """The simulated PCI driver, broken off by an error no step expects at one step kind."""

    def __init__(self, inner: Any, kind: StepKind) -> None:
        self.inner, self.kind, self.broke = inner, kind, False

    async def run(self, step: Step) -> str:
        if step.kind is self.kind and not self.broke:
            self.broke = True
            raise RuntimeError("a bug")
        return str(await self.inner.run(step))

    async def undo(self, step: Step) -> str:
        return str(await self.inner.undo(step))


async def test_a_plan_broken_off_by_an_error_is_left_to_recovery_in_the_same_process(
    tmp_path: Path,
) -> None:
    w = world(tmp_path / "world")
    drivers = sim_drivers(w)
    drivers.pci = _Breaks(drivers.pci, StepKind.UNBIND)
    executor = executor_for(w, tmp_path / "state", drivers=drivers)
    plan = await executor.plan(["0"], Target.parse("drained"))
    with pytest.raises(RuntimeError, match="a bug"):
        await executor.execute(plan, OPERATOR, "0")
    (held,) = holders(executor.journal)
    assert held.stopped and "`gpuconsole assign --recover`" in str(held)
    # no restart: this process's recovery takes the plan it no longer runs, and ends it
    (outcome,) = await executor.recover()
    assert outcome.state == PlanState.DONE and "stopped at step 5 (unbind" in outcome.message
    assert w.owners(0) == ["drained"] and holders(executor.journal) == []


def _race(root: Path, start: Any, results: Any) -> None:
    async def go() -> tuple[int, str]:
        w = world(root / "world")
        drivers = sim_drivers(w)
        drivers.pci = SlowPci(drivers.pci)
        executor = executor_for(w, root / "state", drivers=drivers)
        plan = await executor.plan(["1"], Target.parse("drained"))
        start.wait()
        try:
            outcome = await executor.execute(plan, Actor(f"ops{os.getpid()}", Role.OPERATOR), "1")
        except ActionRefused as exc:
            return 3, str(exc)
        return (0 if outcome.ok else 1), outcome.message

    try:
        results.put(asyncio.run(go()))
    except BaseException as exc:  # shown in the assertion instead of a 30 s wait on the queue
        results.put((9, repr(exc)))


def test_two_processes_asking_for_one_gpu_exactly_one_runs(tmp_path: Path) -> None:
    world(tmp_path / "world")  # laid out once, before either starts
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(tmp_path, start, results)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    answers = sorted(results.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(10)
    assert [code for code, _ in answers] == [0, 3], answers
    assert "is held by ops" in answers[1][1] and "(operator)" in answers[1][1]
    assert world(tmp_path / "world").owners(1) == ["drained"]


def test_a_dry_run_shows_the_plan_and_writes_no_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    demo = ["assign", "--demo", "--node", "dgx-003", "3", "--to", "vm:tenant-b-vm8"]
    assert main([*demo, "--dry-run"]) == 0
    assert "Dry run: nothing was changed." in capsys.readouterr().out
    assert not (tmp_path / "state" / "gpuconsole" / "demo" / "actions.db").exists()
    # this machine's store too: the folder [actions] names gets no journal
    config = tmp_path / "node.toml"
    machine = tmp_path / "var"
    config.write_text(f'[actions]\nstate_dir = "{machine}"\n[host]\nsysfs_root = "{tmp_path}"\n')
    main(["assign", "-c", str(config), "0", "--to", "drained", "--dry-run"])
    capsys.readouterr()
    assert not list(machine.glob("actions.db*"))
    # recovering writes the journal: it has no dry run
    assert main(["assign", "--demo", "--node", "dgx-003", "--recover", "--dry-run"]) == 2
    assert "--recover has no dry run" in capsys.readouterr().err
