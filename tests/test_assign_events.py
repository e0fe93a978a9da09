"""Actions run by other processes reach a running hub's Events view through the journal."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

import pytest

from gpuconsole.actions.executor import ACTION_EVENT, STEP_EVENT
from gpuconsole.actions.journal_events import JournalEvents
from gpuconsole.actions.plan import Target
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.config import Config, HostConfig
from gpuconsole.hub import Hub
from gpuconsole.readings.base import Event, Severity
from gpuconsole.wiring import console_executor
from tests.assign_fixtures import executor_for, world
from tests.waiting import until

OPERATOR = Actor("ops", Role.OPERATOR, "SHA256:abc", "ssh")
GPU1 = "0000:25:00.0"  # NVML's GPU 1 while it is on nvidia; drained, it has no number


def _assign(root: Path, gpu: str, target: str) -> None:
    """`gpuconsole assign` in a process of its own: it knows nothing of the hub."""

    async def go() -> None:
        w = world(root / "world")
        executor = executor_for(w, root / "state")
        plan = await executor.plan([gpu], Target.parse(target))
        outcome = await executor.execute(plan, OPERATOR, plan.node)
        assert outcome.ok, outcome.message

    asyncio.run(go())


async def _run_elsewhere(root: Path, gpu: str, target: str) -> None:
    # forked from the loop's own thread: a child forked from a worker thread cannot exit
    # cleanly (the threads it would join at exit are the parent's)
    child = multiprocessing.get_context("fork").Process(target=_assign, args=(root, gpu, target))
    child.start()
    await until(lambda: child.exitcode is not None, timeout=60)
    child.join()
    assert child.exitcode == 0


async def test_a_plan_run_by_another_process_shows_in_a_running_hubs_events(
    tmp_path: Path,
) -> None:
    world(tmp_path / "world")
    # one plan before the hub starts: history, not news
    await _run_elsewhere(tmp_path, GPU1, "drained")
    hub = Hub()
    hub.add_source(JournalEvents("sim-01", tmp_path / "state" / "actions.db", interval_s=0.1))
    await hub.start()

    def shown() -> list[Event]:
        latest = hub.latest
        return [e for e in latest.events if e.source == "actions"] if latest else []

    try:
        await until(
            lambda: any(s.ok for s in hub.latest.nodes[0].statuses) if hub.latest else False
        )
        await _run_elsewhere(tmp_path, GPU1, "k8s")
        await until(lambda: any("now k8s" in e.message for e in shown()), timeout=30)
        # the same process runs one too, posting itself: the journal adds nothing twice
        w = world(tmp_path / "world")
        here = executor_for(w, tmp_path / "state", emit=hub.post_event)
        plan = await here.plan(["2"], Target.parse("drained"))
        assert (await here.execute(plan, Actor("val", Role.ADMIN), "2")).ok
        await asyncio.sleep(0.5)  # several reads of the journal after it
        await until(lambda: any("now drained" in e.message for e in shown()))
    finally:
        await hub.stop()
    events = shown()
    assert not any("now drained" in e.message and "ops" in e.message for e in events)
    theirs = [e for e in events if "k8s" in e.message]
    started, *steps, done = theirs
    assert started.kind == ACTION_EVENT and started.message.startswith(
        "ops (operator, ssh key SHA256:abc) started assign k8s"
    )
    assert steps and all(e.kind == STEP_EVENT and " done: " in e.message for e in steps)
    assert [e.message.split(" step ")[1].split("/")[0] for e in steps] == [
        str(k) for k in range(1, len(steps) + 1)
    ]
    assert done.severity is Severity.INFO
    assert done.message.startswith(f"assign k8s by ops: GPU {GPU1} now k8s")
    # drained, NVML numbered it no more: no number of another GPU is put on its events
    assert all(e.node == "sim-01" and e.gpu_index is None for e in theirs)
    ours = [e for e in events if "drained" in e.message]
    assert len([e for e in ours if e.kind == STEP_EVENT]) == len(plan.steps)


def test_a_console_runs_plans_only_for_this_machine_and_sends_the_rest_over_ssh() -> None:
    cfg = Config(host=HostConfig(name="head"))
    with pytest.raises(ValueError, match=r"dgx-009 is not this machine .*ssh dgx-009 gpuconsole"):
        console_executor(cfg, "dgx-009", lambda _event: None)
