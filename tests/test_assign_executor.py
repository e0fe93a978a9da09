"""The executor end to end on the simulator: the CLI's --demo flow, who may act, the audit
log, a failing step rolled back, and two requests for one GPU."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.drivers.sim import SimWorld, sim_drivers
from gpuconsole.actions.executor import ActionRefused
from gpuconsole.actions.journal import PlanState
from gpuconsole.actions.plan import Step, StepKind, Target
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.cli import main
from tests.assign_fixtures import executor_for, tree_picture, world

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
    # the same request again is refused: already there, nothing changes
    assert main(argv) == 3
    assert "is already drained" in capsys.readouterr().out
    # a dry run of the way back changes nothing either
    assert main([*argv[:5], "--to", "k8s", "--dry-run"]) == 0
    assert "Dry run" in capsys.readouterr().out and demo.owners(2) == ["drained"]
    records = [json.loads(line) for line in (tmp_path / "gpuconsole" / "audit.jsonl").open()]
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


class _Slow:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def run(self, step: Step) -> str:
        await asyncio.sleep(0.4)
        return str(await self.inner.run(step))

    async def undo(self, step: Step) -> str:
        return str(await self.inner.undo(step))


def _race(root: Path, start: Any, results: Any) -> None:
    async def go() -> tuple[int, str]:
        w = world(root / "world")
        drivers = sim_drivers(w)
        drivers.pci = _Slow(drivers.pci)
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
