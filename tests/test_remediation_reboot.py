"""A node that reboots under a running plan (it power-cycles itself, someone reboots it, it
loses power): the plan does not go on as if nothing happened. A remediation ends
"interrupted", saying which boot it was cut off in and how its GPU (bus id and UUID) reads
in the new one; a reassignment is put back; a remediation's own power cycle is the reboot
it asked for, and its final check reads the GPU afresh. The simulated node takes a new boot
id at each power cycle, in its /proc, as a real kernel does."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

from gpuconsole.actions.drivers import StepDriver
from gpuconsole.actions.journal import Journal, PlanState
from gpuconsole.actions.locks import holders
from gpuconsole.actions.plan import Step, StepKind, Target
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.facts.verdict import Action
from gpuconsole.sim.actions import SimWorld, sim_drivers
from gpuconsole.sources.boot import boot_id
from tests.assign_fixtures import PassingDriver, executor_for, world
from tests.test_remediation import OPS, PODS_ONLY, audit, bus_of, h100, quick


class _RebootsAfter(PassingDriver):
    """The simulated driver of a layer; the node power-cycles by itself (its BMC, a hand,
    the mains) right after the step of `kind` went through."""

    def __init__(self, inner: StepDriver, world: SimWorld, kind: StepKind) -> None:
        super().__init__(inner)
        self.world, self.kind = world, kind

    async def run(self, step: Step) -> str:
        detail = await self.inner.run(step)
        if step.kind is self.kind:
            self.world.node.power_cycle()
            self.world.save()
        return detail


async def test_a_node_that_reboots_under_a_reset_plan_interrupts_it_and_says_how_the_gpu_reads(
    tmp_path: Path,
) -> None:
    """GPU 5 fell off the bus; its reset plan cordons and evicts, and the node reboots by
    itself while the plan would wait for the GPU to go idle. The reset is not sent in the
    new boot: the plan ends interrupted, in the journal, the audit log and its events,
    with GPU 5 by bus id and UUID read afresh (the reboot brought it back)."""
    world = h100(tmp_path / "w", PODS_ONLY)
    drivers = sim_drivers(world)
    assert drivers.kubernetes is not None
    drivers.kubernetes = _RebootsAfter(drivers.kubernetes, world, StepKind.EVICT)  # type: ignore[assignment]
    events: list[Any] = []
    executor = quick(world, tmp_path / "s", drivers)
    executor.emit = events.append
    before = boot_id(world.tree.proc_root)
    plan = await executor.plan_remedy("5", Action.RESET_GPU)
    outcome = await executor.execute(plan, OPS, "dgx-003")
    bus, uuid = bus_of(world, 5), world.node.uuids[5]
    assert world.node.resets == {}, outcome.message  # nothing of the plan ran in the new boot
    assert outcome.state is PlanState.INTERRUPTED, outcome.message
    after = boot_id(world.tree.proc_root)
    assert after and after != before
    message = outcome.message
    assert f"dgx-003 rebooted (boot id {before[:8]}… → {after[:8]}…)" in message, message
    assert "under it before step 3/5 (wait until" in message, message
    assert f"in the new boot {bus} ({uuid}) reads fit" in message, message
    assert "done before it and kept: cordon" in message, message
    assert uuid in world.cordoned  # a GPU under repair stays drained
    record = Journal(tmp_path / "s" / "actions.db").plans()[0]
    assert record.state is PlanState.INTERRUPTED and record.outcome == message
    assert holders(Journal(tmp_path / "s" / "actions.db")) == []
    last = audit(tmp_path / "s")[-1]
    assert last["outcome"] == "interrupted" and last["detail"] == message
    assert last["args"]["gpus"] == [bus] and last["args"]["uuids"] == [uuid]
    told = events[-1]
    assert told.gpu_bus_id == bus and told.gpu_uuid == uuid
    assert message in told.message


class _Dies:
    """A driver whose process dies as it is asked to run a step (the intent journaled)."""

    async def run(self, step: Step) -> str:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    async def undo(self, step: Step) -> str:
        return "nothing"


def _reset_killed(root: Path) -> None:
    """A reset plan of GPU 5 whose process dies as its reset is about to be sent: the
    journal holds the intent, in the boot the node ran then."""

    async def go() -> None:
        world = h100(root / "w", PODS_ONLY)
        drivers = sim_drivers(world)
        drivers.gpu = _Dies()
        executor = quick(world, root / "s", drivers)
        plan = await executor.plan_remedy("5", Action.RESET_GPU)
        await executor.execute(plan, OPS, "dgx-003")

    asyncio.run(go())


def _killed(root: Path, target: Any) -> None:
    child = multiprocessing.get_context("fork").Process(target=target, args=(root,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL


def test_a_plan_its_node_rebooted_under_is_concluded_not_carried_on_by_recovery(
    tmp_path: Path,
) -> None:
    """The node lost power as its reset was sent (the process went with it); it booted
    again. Recovery reads a new boot id since the plan's last step: it sends no reset in
    the new boot, and the plan ends interrupted, its GPU read afresh."""
    h100(tmp_path / "w", PODS_ONLY)
    _killed(tmp_path, _reset_killed)

    async def after_the_reboot() -> Any:
        world = h100(tmp_path / "w", PODS_ONLY)
        world.node.power_cycle()  # the mains came back
        world.save()
        return world, await quick(world, tmp_path / "s").recover()

    world, (outcome,) = asyncio.run(after_the_reboot())
    assert world.node.resets == {}, outcome.message
    assert outcome.recovered and outcome.state is PlanState.INTERRUPTED, outcome.message
    assert "recovered: the process stopped at step 4 (reset GPU 5" in outcome.message
    assert "dgx-003 rebooted (boot id" in outcome.message
    # where it stopped is said once: the step a recovery would have checked again is not it
    assert "under it: nothing of it runs after a reboot" in outcome.message, outcome.message
    assert f"{bus_of(world, 5)} ({world.node.uuids[5]}) reads fit" in outcome.message
    assert Journal(tmp_path / "s" / "actions.db").plans()[0].state is PlanState.INTERRUPTED
    assert audit(tmp_path / "s")[-1]["outcome"] == "recovered"
    # ended: the next command recovers nothing
    assert asyncio.run(quick(h100(tmp_path / "w", PODS_ONLY), tmp_path / "s").recover()) == []


def _assign_killed_after_probe(root: Path) -> None:
    from tests.test_assign_crash import TARGET, _Killer

    async def go() -> None:
        w = world(root / "world")
        drivers = sim_drivers(w)
        _Killer.calls = 0
        drivers.pci = _Killer(drivers.pci, 5, True)  # type: ignore[assignment]
        drivers.guests = _Killer(drivers.guests, 5, True)  # type: ignore[arg-type]
        drivers.kubernetes = _Killer(drivers.kubernetes, 5, True)  # type: ignore[arg-type]
        executor = executor_for(w, root / "state", drivers=drivers)
        plan = await executor.plan(["0"], Target.parse(TARGET))
        await executor.execute(plan, Actor("ops", Role.OPERATOR), "sim-01")

    asyncio.run(go())


def test_a_reassignment_its_node_rebooted_under_is_put_back_not_finished(tmp_path: Path) -> None:
    """GPU 0 was on its way to a guest (vfio-pci bound) when the node rebooted: what sysfs
    held went with the boot, so recovery does not attach it to the guest as if it had not;
    it puts back what the plan changed (the cordon; the pod stays evicted)."""
    world(tmp_path / "world")
    child = multiprocessing.get_context("fork").Process(
        target=_assign_killed_after_probe, args=(tmp_path,)
    )
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL

    async def restart() -> Any:
        w = world(tmp_path / "world")
        w.node.power_cycle()
        w.save()
        return w, await executor_for(w, tmp_path / "state").recover()

    w, (outcome,) = asyncio.run(restart())
    assert outcome.state is PlanState.ROLLED_BACK, outcome.message
    assert "sim-01 rebooted (boot id" in outcome.message
    assert w.owners(0) == ["k8s"] and w.cordoned == set()
    assert holders(Journal(tmp_path / "state" / "actions.db")) == []


# --- what `remediate --dry-run` says of an unfinished plan, and what the real run does ---------


def _demo_reset_killed(state: Path) -> None:
    """`remediate --demo` of dgx-003's GPU 5, its process killed as the reset is sent."""
    os.environ["XDG_STATE_HOME"] = str(state)

    async def go() -> None:
        from gpuconsole.wiring import demo_executor

        executor = demo_executor("dgx-003")
        executor.drivers.gpu = _Dies()
        plan = await executor.plan_remedy("5", Action.RESET_GPU)
        await executor.execute(plan, OPS, "dgx-003")

    asyncio.run(go())


def _gpuconsole(state: Path, *args: str) -> Any:
    import subprocess
    import sys

    env = {**os.environ, "XDG_STATE_HOME": str(state), "XDG_CONFIG_HOME": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "gpuconsole", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _remediate(state: Path, *args: str) -> Any:
    base = ["remediate", "5", "--demo", "--node", "dgx-003", "--action", "reset_gpu"]
    return _gpuconsole(state, *base, *args)


def test_a_dry_run_says_what_the_real_run_does_first_with_an_unfinished_plan(
    tmp_path: Path,
) -> None:
    """A plan a killed process left: `remediate --dry-run` says the real run finishes it
    first, and from where; once the node rebooted, that it ends it interrupted; the real
    run then does what the dry run said. A plan whose process still runs holds its GPU:
    the dry run says the real run is refused."""
    _killed(tmp_path, _demo_reset_killed)
    journal = tmp_path / "gpuconsole" / "demo" / "actions.db"
    (record,) = Journal(journal).plans()
    first = f"journal: plan {record.id} (remediate reset_gpu of GPU 5 (0000:c3:00.0), by ops)"
    first += " was left unfinished at step 4 (reset GPU 5 (0000:c3:00.0)"
    dry = _remediate(tmp_path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert first in dry.stdout, dry.stdout
    assert "the real run first finishes it from step 4 (reset GPU 5" in dry.stdout, dry.stdout
    assert Journal(journal).plans()[0].state is PlanState.RUNNING  # a dry run writes nothing
    # `assign` recovers the node's plans as it begins too, and its dry run says so as well
    moved = _gpuconsole(
        tmp_path, "assign", "0", "--demo", "--node", "dgx-003", "--to", "drained", "--dry-run"
    )
    assert first in moved.stdout and "Dry run: nothing was changed." in moved.stdout, moved

    # someone power-cycles the node through its BMC before anyone runs the plan again
    cycled = _gpuconsole(tmp_path, "power", "dgx-003", "cycle", "--demo", "--confirm", "dgx-003")
    assert cycled.returncode == 0, cycled.stderr
    world = SimWorld.demo("dgx-003", tmp_path / "gpuconsole" / "demo" / "dgx-003")
    assert world.node.power_cycles == 1
    dry = _remediate(tmp_path, "--dry-run")
    assert first in dry.stdout, dry.stdout
    assert (
        "the real run first ends it interrupted: dgx-003 rebooted under it, so none of its "
        "steps runs again" in dry.stdout
    ), dry.stdout
    ran = _remediate(tmp_path, "--confirm", "dgx-003")
    assert f"journal: plan {record.id} recovered: the process stopped at step 4" in ran.stdout
    assert "dgx-003 rebooted (boot id" in ran.stdout and "reads fit" in ran.stdout, ran.stdout
    assert Journal(journal).plan(record.id).state is PlanState.INTERRUPTED  # type: ignore[union-attr]

    # a plan whose process runs: its GPU is locked, and the dry run says the real run is
    # refused for it
    from gpuconsole.actions.locks import lock_and_start

    live = Journal(journal)
    plan = Journal(journal).plan(record.id).plan  # type: ignore[union-attr]
    running = lock_and_start(live, plan, "alice", "operator", None)
    dry = _remediate(tmp_path, "--dry-run")
    assert (
        f"journal: plan {running} (remediate reset_gpu of GPU 5 (0000:c3:00.0), by alice) is "
        f"running now ({os.uname().nodename}, pid {os.getpid()}): its GPUs stay locked to it, "
        "so the real run is refused for any of them until it ends" in dry.stdout
    ), dry.stdout
    refused = _remediate(tmp_path, "--confirm", "dgx-003")
    assert refused.returncode == 3 and "is held by alice (operator)" in refused.stdout


async def test_the_node_s_journal_reader_tells_a_plan_its_reboot_cut_off_once_by_bus_id_and_uuid(
    tmp_path: Path,
) -> None:
    """The node is back: its agent's journal reader (the Events view of the node and the
    head) says at once that the reset plan was cut off by the reboot, for GPU 5 by bus id
    and UUID, and what the next run there does with it; once, not at every read."""
    from gpuconsole.actions.journal_events import JournalEvents

    h100(tmp_path / "w", PODS_ONLY)
    _killed(tmp_path, _reset_killed)
    world = h100(tmp_path / "w", PODS_ONLY)
    journal = tmp_path / "s" / "actions.db"
    before = JournalEvents("dgx-003", journal, proc_root=world.tree.proc_root)
    quiet: list[Any] = []
    await before.start(quiet.append)
    await before.poll()  # the same boot: the process died, the node did not reboot
    await before.close()
    assert quiet == []
    world.node.power_cycle()
    world.save()
    told: list[Any] = []
    reader = JournalEvents("dgx-003", journal, proc_root=world.tree.proc_root)
    await reader.start(told.append)
    try:
        await reader.poll()
        reader._stamp = None  # read the journal again, as after any write
        await reader.poll()
    finally:
        await reader.close()
    (event,) = told
    assert event.gpu_bus_id == bus_of(world, 5) and event.gpu_uuid == world.node.uuids[5]
    assert event.severity == "warning"
    assert "was running when dgx-003 rebooted, at step 4 (reset GPU 5" in event.message
    assert "its GPUs locked" in event.message
    assert "ends it interrupted: dgx-003 rebooted under it" in event.message, event.message


# --- the node ends them itself, as it comes back ------------------------------------------


def _watch(world: SimWorld, state: Path) -> Any:
    """The node's agent's watch, over the world's fresh readings and its journal."""
    from gpuconsole.actions.rebooted import CutOffWatch

    def make(reader: Any) -> Any:
        executor = quick(world, state)
        executor.reader = reader
        return executor

    world.journal = state / "actions.db"  # read with the node, as its agent reads it
    watch = CutOffWatch(world.name, make)
    watch.reader = world.snapshot
    return watch


async def test_the_node_ends_a_remediation_its_reboot_cut_off_as_it_comes_back(
    tmp_path: Path,
) -> None:
    """No operator runs anything on the node: its agent sees the cut-off plan in its
    journal reading and ends it, interrupted, journaled and audited, GPU 5 read afresh;
    once, and nothing runs on the node."""
    await asyncio.to_thread(h100, tmp_path / "w", PODS_ONLY)
    await asyncio.to_thread(_killed, tmp_path, _reset_killed)
    world = h100(tmp_path / "w", PODS_ONLY)
    watch = _watch(world, tmp_path / "s")
    node = await world.snapshot()
    assert node.actions is not None and node.actions.cut_off == ()  # not rebooted yet
    watch.offer(node)
    assert watch.task is None
    world.node.power_cycle()
    world.save()
    node = await world.snapshot()
    assert node.actions is not None and len(node.actions.cut_off) == 1
    watch.offer(node)
    assert watch.task is not None
    await watch.task
    (record,) = Journal(tmp_path / "s" / "actions.db").plans()
    assert record.state is PlanState.INTERRUPTED, record.outcome
    assert f"{bus_of(world, 5)} ({world.node.uuids[5]}) reads fit" in record.outcome
    assert world.node.resets == {} and audit(tmp_path / "s")[-1]["outcome"] == "recovered"
    after = await world.snapshot()
    assert after.actions is not None and after.actions.cut_off == ()
    watch.offer(node)  # an older reading that still shows it: taken once
    assert watch.task.done()


def _power_cycled_then_killed(root: Path) -> None:
    """A power cycle plan run on the node itself: the BMC cycles it, and the process goes
    down with the node before the journal heard the step done."""

    class _CycleAndDie:
        def __init__(self, world: SimWorld) -> None:
            self.world = world

        async def run(self, step: Step) -> str:
            self.world.node.power_cycle()
            self.world.save()
            os.kill(os.getpid(), signal.SIGKILL)
            raise AssertionError("unreachable")

        async def undo(self, step: Step) -> str:
            return "a power cycle cannot be undone"

    async def go() -> None:
        world = h100(root / "w", PODS_ONLY)
        drivers = sim_drivers(world)
        drivers.bmc = _CycleAndDie(world)
        executor = quick(world, root / "s", drivers)
        plan = await executor.plan_remedy("5", Action.REBOOT_NODE)
        await executor.execute(plan, OPS, "dgx-003")

    asyncio.run(go())


async def test_a_power_cycle_plan_run_on_its_own_node_ends_done_once_the_node_is_back(
    tmp_path: Path,
) -> None:
    """The usual way a power cycle plan ends when the node runs it: the node goes down
    with the plan's process. Its agent, back, reads GPU 5 afresh and ends the plan done,
    without a second power cycle."""
    await asyncio.to_thread(h100, tmp_path / "w", PODS_ONLY)
    await asyncio.to_thread(_killed, tmp_path, _power_cycled_then_killed)
    world = h100(tmp_path / "w", PODS_ONLY)
    watch = _watch(world, tmp_path / "s")
    watch.offer(await world.snapshot())
    assert watch.task is not None
    await watch.task
    (record,) = Journal(tmp_path / "s" / "actions.db").plans()
    assert record.state is PlanState.DONE, record.outcome
    assert "it went through: dgx-003 rebooted (boot id" in record.outcome
    assert world.node.power_cycles == 1


async def test_a_reassignment_its_reboot_cut_off_is_left_to_a_run_on_the_node(
    tmp_path: Path,
) -> None:
    """Putting a reassignment back writes sysfs: the agent leaves it running, and the
    event says what `assign --recover` there will do."""
    await asyncio.to_thread(world, tmp_path / "world")
    child = multiprocessing.get_context("fork").Process(
        target=_assign_killed_after_probe, args=(tmp_path,)
    )
    child.start()
    await asyncio.to_thread(child.join, 60)
    w = world(tmp_path / "world")
    w.node.power_cycle()
    w.save()
    watch = _watch(w, tmp_path / "state")
    node = await w.snapshot()
    assert node.actions is not None and len(node.actions.cut_off) == 1
    watch.offer(node)
    assert watch.task is not None
    await watch.task
    assert Journal(tmp_path / "state" / "actions.db").plans()[0].state is PlanState.RUNNING


async def test_what_a_hand_wrote_in_the_journal_reaches_no_terminal_raw(tmp_path: Path) -> None:
    """The journal is a file operators share: a user name or boot id in it with escape
    sequences is written out in the dry run's words and the reader's event, never sent."""
    import sqlite3

    from gpuconsole.actions.journal_events import JournalEvents

    h100(tmp_path / "w", PODS_ONLY)
    _killed(tmp_path, _reset_killed)
    world = h100(tmp_path / "w", PODS_ONLY)
    journal = tmp_path / "s" / "actions.db"
    with sqlite3.connect(journal) as db:
        db.execute("UPDATE plans SET user = ?", ("\x1b]0;owned\x07ops",))
        db.execute("UPDATE steps SET boot_id = ?", ("\x1b[2J\x1b[31m",))
    said = quick(world, tmp_path / "s").recovery_preview()
    assert said and all("\x1b" not in text and "\x07" not in text for text in said), said
    assert "\\x1b]0;owned\\x07ops" in said[0]
    told: list[Any] = []
    reader = JournalEvents("dgx-003", journal, proc_root=world.tree.proc_root)
    await reader.start(told.append)
    try:
        await reader.poll()
    finally:
        await reader.close()
    (event,) = told
    assert "\x1b" not in event.message and "was running when dgx-003 rebooted" in event.message
