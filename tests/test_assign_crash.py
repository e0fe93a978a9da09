"""A process killed with SIGKILL at each step in turn, then recovery on the next start: the
GPU ends with exactly one owner, and the journal says how it got there."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.actions.drivers import StepDriver, StepFailed
from gpuconsole.actions.executor import Outcome, StepUpdate
from gpuconsole.actions.journal import Journal, PlanState
from gpuconsole.actions.locks import holders
from gpuconsole.actions.plan import Step, StepKind, Target
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.sim.actions import sim_drivers
from tests.assign_fixtures import PassingDriver, executor_for, world

# GPU 0, held by pod team-nlp/train-0, to the shut-off guest: cordon, evict, check idle,
# override, unbind, probe, reset, attach, verify.
STEPS = 9
TARGET = "vm:tenant-b-vm1"


class _Killer(PassingDriver):
    """Passes steps to the real driver, and SIGKILLs this process at the n-th one."""

    calls = 0

    def __init__(self, inner: StepDriver, at: int, after: bool) -> None:
        super().__init__(inner)
        self.at, self.after = at, after

    async def run(self, step: Step) -> str:
        n = _Killer.calls
        _Killer.calls += 1
        if n == self.at and not self.after:
            os.kill(os.getpid(), signal.SIGKILL)  # the intent is journaled, nothing done
        detail = await self.inner.run(step)
        if n == self.at:
            os.kill(os.getpid(), signal.SIGKILL)  # done, but the result never journaled
        return detail


def _doomed(root: Path, at: int, after: bool) -> None:
    async def go() -> None:
        w = world(root / "world")
        drivers = sim_drivers(w)
        assert drivers.guests is not None and drivers.kubernetes is not None
        drivers.pci = _Killer(drivers.pci, at, after)
        drivers.guests = _Killer(drivers.guests, at, after)
        drivers.kubernetes = _Killer(drivers.kubernetes, at, after)
        executor = executor_for(w, root / "state", drivers=drivers)
        plan = await executor.plan(["0"], Target.parse(TARGET))
        assert len(plan.steps) == STEPS, plan.describe()
        await executor.execute(plan, Actor("ops", Role.OPERATOR), "sim-01")

    asyncio.run(go())


@pytest.mark.parametrize("after", [False, True], ids=["before-step", "after-step"])
@pytest.mark.parametrize("at", range(STEPS))
def test_sigkill_at_each_step_then_recovery_leaves_one_owner(
    tmp_path: Path, at: int, after: bool
) -> None:
    world(tmp_path / "world")
    child = multiprocessing.get_context("fork").Process(target=_doomed, args=(tmp_path, at, after))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL

    # the next start: a fresh process state reads the journal and the world from disk
    async def restart() -> Any:
        w = world(tmp_path / "world")
        outcomes = await executor_for(w, tmp_path / "state").recover()
        return w, outcomes

    w, outcomes = asyncio.run(restart())
    (outcome,) = outcomes
    record = Journal(tmp_path / "state" / "actions.db").plans()[0]
    assert record.recovered and record.state == outcome.state
    assert f"stopped at step {at + 1}" in record.outcome
    # nothing changed yet (or only the cordon, unrecorded): put back; else finished
    if at == 0:
        assert record.state == PlanState.ROLLED_BACK
        assert w.owners(0) == ["pod team-nlp/train-0"]
        assert w.cordoned == set()
    else:
        assert record.state == PlanState.DONE, record.outcome
        assert w.owners(0) == ["vm tenant-b-vm1"]
    assert len(w.owners(0)) == 1
    assert [o for o in asyncio.run(executor_for(w, tmp_path / "state").recover())] == []
    # the lock went with the plan: the GPU can be asked for again
    assert holders(Journal(tmp_path / "state" / "actions.db")) == []


class _FailThenDie:
    """The simulated PCI driver: binding vfio-pci fails, and the process dies right after
    putting the first thing back, before the journal hears of it."""

    def __init__(self, inner: StepDriver) -> None:
        self.inner = inner

    async def run(self, step: Step) -> str:
        if step.kind is StepKind.PROBE:
            raise StepFailed("the device did not answer")
        return await self.inner.run(step)

    async def undo(self, step: Step) -> str:
        await self.inner.undo(step)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


class _DiesOnFailure(list[StepUpdate]):
    """Step updates, kept; the process dies the moment a step is said to have failed: the
    failure is journaled, nothing is put back yet."""

    def append(self, update: StepUpdate) -> None:
        super().append(update)
        if update.state == "failed":
            os.kill(os.getpid(), signal.SIGKILL)


def _fails_probing(root: Path, die_on_failure: bool) -> None:
    """Run the plan with probing failing: the process dies in its first undo, or (with
    `die_on_failure`) the moment the failure is journaled, before any undo."""

    async def go() -> None:
        w = world(root / "world")
        drivers = sim_drivers(w)
        drivers.pci = _FailThenDie(drivers.pci)
        updates = _DiesOnFailure() if die_on_failure else None
        executor = executor_for(w, root / "state", drivers=drivers, updates=updates)
        plan = await executor.plan(["0"], Target.parse(TARGET))
        await executor.execute(plan, Actor("ops", Role.OPERATOR), "sim-01")

    asyncio.run(go())


def killed_then_recovered(root: Path, die_on_failure: bool) -> tuple[Any, Outcome]:
    """The world and recovery's one outcome, after _fails_probing's process was killed."""
    world(root / "world")
    child = multiprocessing.get_context("fork").Process(
        target=_fails_probing, args=(root, die_on_failure)
    )
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL

    async def restart() -> tuple[Any, Outcome]:
        w = world(root / "world")
        (outcome,) = await executor_for(w, root / "state").recover()
        return w, outcome

    return asyncio.run(restart())


def test_sigkill_while_rolling_back_then_recovery_finishes_the_rollback(tmp_path: Path) -> None:
    w, outcome = killed_then_recovered(tmp_path, die_on_failure=False)
    assert outcome.state == PlanState.ROLLED_BACK, outcome.message
    assert "stopped at step 6 (drivers_probe" in outcome.message
    assert "kept: evict pod team-nlp/train-0" in outcome.message  # no un-evicting a pod
    # the pod is gone, the rest put back: the GPU is Kubernetes' again, and only its
    assert w.owners(0) == ["k8s"] and w.cordoned == set()
    assert holders(Journal(tmp_path / "state" / "actions.db")) == []


def test_sigkill_after_a_step_failed_then_recovery_rolls_back_instead_of_going_on(
    tmp_path: Path,
) -> None:
    w, outcome = killed_then_recovered(tmp_path, die_on_failure=True)
    # what the dead process was about to do: put back what the plan changed, as it would
    # have had it lived, not try the failed step again and carry on to the guest
    assert outcome.state == PlanState.ROLLED_BACK, outcome.message
    assert "stopped at step 6 (drivers_probe" in outcome.message
    assert w.owners(0) == ["k8s"] and w.cordoned == set()
    assert holders(Journal(tmp_path / "state" / "actions.db")) == []
