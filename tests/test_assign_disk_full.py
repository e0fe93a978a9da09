"""A journal disk that fills up half-way through a plan, or before recovery: the
plan stops where it is, its GPU stays locked for recovery with a message that says what was
done and what to run, and recovery ends it once there is space, without a restart."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.drivers import ClusterDriver
from gpuconsole.actions.executor import CannotRecover, Executor
from gpuconsole.actions.journal import Journal, PlanState
from gpuconsole.actions.locks import holders, lock_and_start
from gpuconsole.actions.plan import Step, StepKind, Target
from gpuconsole.actions.roles import ActionRefused, Actor, Role
from gpuconsole.cli.main import main
from gpuconsole.sim.actions import SimWorld, sim_drivers
from tests.assign_fixtures import SmallDisk, small_disk, world

OPERATOR = Actor("ops", Role.OPERATOR, "SHA256:abc", "ssh")
GPU0 = "GPU 0 (0000:21:00.0)"
EVICT = "evict pod team-nlp/train-0"


class _FillsDisk:
    """The simulated Kubernetes layer: the disk fills up while the (first) eviction runs."""

    def __init__(self, inner: ClusterDriver, disk: SmallDisk) -> None:
        self.inner, self.disk, self.filled = inner, disk, False

    async def run(self, step: Step) -> str:
        detail = await self.inner.run(step)
        if step.kind is StepKind.EVICT and not self.filled:
            self.disk.fill()
            self.filled = True
        return detail

    async def undo(self, step: Step) -> str:
        return await self.inner.undo(step)

    async def cordoned(self) -> frozenset[str]:
        return frozenset(await self.inner.cordoned())


def _executor(w: SimWorld, disk: SmallDisk, audit: Path) -> Executor:
    """An executor whose journal is on the small disk, which fills during step 2 of 6."""
    drivers = sim_drivers(w)
    assert drivers.kubernetes is not None
    drivers.kubernetes = _FillsDisk(drivers.kubernetes, disk)
    journal = Journal(disk.path / "actions.db")
    return Executor(w.name, drivers, journal, AuditLog(audit), reader=w.snapshot)


@pytest.mark.parametrize("reserve", [True, False], ids=["marked", "reserve-gone"])
async def test_a_journal_that_fills_mid_plan_stops_it_there_and_recovery_ends_it_without_restart(
    tmp_path: Path, reserve: bool
) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        w = world(tmp_path / "world")
        executor = _executor(w, disk, tmp_path / "audit.jsonl")
        if not reserve:  # nothing to free for the mark: only this process knows it let go
            executor.journal.reserve.unlink()
        plan = await executor.plan(["0"], Target.parse("drained"))
        outcome = await executor.execute(plan, OPERATOR, "0")

        # stopped at once: the pod is evicted and its GPU cordoned, nothing else ran
        assert outcome.state == PlanState.STOPPED and not outcome.ok
        assert w.owners(0) == ["free"]  # cordoned, still on nvidia, the pod gone
        (record,) = executor.journal.plans()
        assert record.state == PlanState.RUNNING  # as recovery must find it
        assert [(s.seq, s.state) for s in record.steps] == [(0, "done"), (1, "intent")]
        # the person is told what happened, where the GPU stands and what to run
        message = outcome.message
        assert f"the action journal {disk.path / 'actions.db'} cannot be written" in message
        assert "database or disk is full" in message
        assert f"step 2/6 ({EVICT}" in message and "ran, but" in message
        assert f"Done and not undone: cordon {GPU0}" in message
        assert f"{GPU0} stays locked for plan {outcome.plan_id}" in message
        assert "`gpuconsole assign --recover`" in message and "finish the plan" in message
        assert ("(or open its assign view again)" in message) == reserve
        assert ("after this process ends, or open the assign view" in message) != reserve
        assert [r["outcome"] for r in executor.audit.records()] == ["started", "stopped"]

        # another plan for the GPU is refused, naming the stopped plan and how to end it
        again = await executor.plan(["0"], Target.parse("vm:tenant-b-vm1"))
        with pytest.raises(ActionRefused, match=rf"plan {outcome.plan_id}, stopped half-way"):
            await executor.execute(again, OPERATOR, "0")
        # recovery needs the journal too: a clear error while the disk is full (the pages
        # the journal's reserve gave back for marking the plan stopped taken as well)
        disk.fill()
        with pytest.raises(CannotRecover, match=r"cannot be written \(database or disk is full"):
            await executor.recover()
        assert [h.plan_id for h in holders(executor.journal)] == [outcome.plan_id]

        disk.free()
        (recovered,) = await executor.recover()  # this process: no restart
        assert recovered.plan_id == outcome.plan_id and recovered.state == PlanState.DONE
        assert w.owners(0) == ["drained"] and holders(executor.journal) == []
        # drained, NVML numbers it no more: its bus id names it
        later = await executor.plan(["21:00.0"], Target.parse("vm:tenant-b-vm1"))
        assert (await executor.execute(later, OPERATOR, "21:00.0")).ok
        assert w.owners(0) == ["vm tenant-b-vm1"]
        executor.journal.close()


def _recover_elsewhere(state: Path, world_root: Path, results: Any) -> None:
    """`gpuconsole assign --recover` in another shell, while the console that stopped the
    plan still runs."""

    async def go() -> list[tuple[str, str]]:
        w = world(world_root)
        executor = Executor(
            w.name, sim_drivers(w), Journal(state), AuditLog(state.parent / "x.jsonl")
        )
        return [(o.plan_id, o.state) for o in await executor.recover()]

    try:
        results.put(asyncio.run(go()))
    except BaseException as exc:  # shown in the assertion instead of a 30 s wait on the queue
        results.put(repr(exc))


async def test_a_plan_stopped_by_a_full_journal_is_recovered_by_another_process_while_it_lives(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        w = world(tmp_path / "world")
        executor = _executor(w, disk, tmp_path / "audit.jsonl")
        plan = await executor.plan(["0"], Target.parse("drained"))
        outcome = await executor.execute(plan, OPERATOR, "0")
        assert outcome.state == PlanState.STOPPED
        disk.free()
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        child = ctx.Process(
            target=_recover_elsewhere,
            args=(disk.path / "actions.db", tmp_path / "world", results),
        )
        child.start()
        answer = results.get(timeout=30)
        child.join(10)
        assert answer == [(outcome.plan_id, PlanState.DONE)]
        assert world(tmp_path / "world").owners(0) == ["drained"]
        assert holders(executor.journal) == []
        assert await executor.recover() == []  # the stopping process does not take it again
        executor.journal.close()


def _orphan(plan_node: str) -> None:
    """A process that took GPU 2's lock and died before its first step."""
    from gpuconsole.wiring import demo_executor

    async def go() -> None:
        executor = demo_executor(plan_node)
        plan = await executor.plan(["2"], Target.parse("drained"))
        lock_and_start(executor.journal, plan, "ops", "operator", None)
        executor.journal.close()

    asyncio.run(go())


def test_assign_with_a_full_journal_disk_says_so_in_one_line_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with small_disk(tmp_path / "state" / "gpuconsole", "4m") as disk:
        child = multiprocessing.get_context("fork").Process(target=_orphan, args=("dgx-003",))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        # a console beside holds the journal open, as a console on the machine does: its
        # -wal and -shm files stay, so that the journal opens on a full disk
        beside = Journal(disk.path / "demo" / "actions.db")
        disk.fill()
        demo = ["assign", "--demo", "--node", "dgx-003"]
        # the plan is still shown: recovery's failure is one line, not a traceback
        assert main([*demo, "2", "--to", "drained"]) == 3
        out, err = capsys.readouterr()
        (line,) = [x for x in (out + err).splitlines() if "could not recover" in x]
        assert "cannot be written (database or disk is full)" in line
        assert "Steps:" in out and "Not confirmed: no terminal to ask on" in out
        assert "Traceback" not in out + err
        assert main([*demo, "--recover"]) == 1
        out, err = capsys.readouterr()
        assert len((out + err).strip().splitlines()) == 1, out + err
        assert "database or disk is full" in out + err

        disk.free()
        assert main([*demo, "--recover"]) == 0
        out = capsys.readouterr().out
        assert "recovered: the process stopped before its first step; nothing ran" in out
        assert "No GPU is locked." in out
        assert main([*demo, "2", "--to", "drained", "--yes"]) == 0
        beside.close()
