"""The demo cluster's own GPU trouble, repaired as an operator meets it: dgx-003's GPU 5 and
dgx-005's GPU 2 (story 1's XID 79 and story 8's XID 48 with a row remap pending) come back
fit from their reset; dgx-006's GPU 1 stays off the bus through its reset and its node's
power cycle, and goes back for service. Played through `gpuconsole remediate --demo`, and
through `r` in a console of a running demo whose other consoles see each outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.actions.remediation import escalation
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.actions.store import AUDIT_FILE
from gpuconsole.cli.table import render_table
from gpuconsole.facts.verdict import Action, gpu_verdict, verdicts_json
from gpuconsole.hub import Hub
from gpuconsole.readings.base import normal_bus_id
from gpuconsole.sim.actions import SimWorld, live_world
from gpuconsole.sim.cluster import DEMO_CLUSTER, demo_hub
from gpuconsole.sim.plans import SimJob, SimPlan
from gpuconsole.sim.profiles import get_profile
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.assign import Stage
from gpuconsole.tui.screens.gpu import GpuScreen
from gpuconsole.tui.screens.remediate import RemediateScreen
from gpuconsole.tui.wallboard import WallboardApp, alerts_page
from tests.waiting import until

OPS = Actor("ops", Role.OPERATOR, "SHA256:ops", "ssh")
VIEWER = Actor("val", Role.VIEWER, "SHA256:val", "ssh")
SIZE = (120, 40)


def _bus(node: str, index: int) -> str:
    (spec,) = [s for s in DEMO_CLUSTER if s.name == node]
    return normal_bus_id(get_profile(spec.profile).gpus[index].bus_id)


LOST_FOR_NOW = ("dgx-003", _bus("dgx-003", 5))  # story 1
DBE = ("dgx-005", _bus("dgx-005", 2))  # story 8
LOST_FOR_GOOD = ("dgx-006", _bus("dgx-006", 1))


def test_the_demo_cluster_has_each_repair_path_on_a_gpu_of_its_own() -> None:
    trouble = {
        (spec.name, normal_bus_id(get_profile(spec.profile).gpus[s.gpu].bus_id)): s.kind
        for spec in DEMO_CLUSTER
        for s in spec.scenarios
        if s.kind.startswith("xid")
    }
    assert trouble == {LOST_FOR_NOW: "xid79", DBE: "xid48", LOST_FOR_GOOD: "xid79hard"}


# --- gpuconsole remediate --demo ---------------------------------------------------------


def _remediate(env: dict[str, str], node: str, gpu: str, *more: str) -> tuple[int, str]:
    command = [sys.executable, "-m", "gpuconsole", "remediate", gpu, "--demo", "--node", node]
    ran = subprocess.run([*command, *more], capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in ran.stderr, ran.stderr
    return ran.returncode, ran.stdout


def test_remediate_demo_repairs_what_it_can_and_sends_the_rest_for_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each GPU as its verdict asks, no --action: the worlds are two minutes into the demo
    (every fault has happened), as a console open since the demo started finds them."""
    from gpuconsole.wiring import demo_root

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for node in ("dgx-003", "dgx-005", "dgx-006"):
        world = SimWorld.demo(node, demo_root(node))
        world.node.t0 = time.time() - 120
        world.save()
    env = dict(os.environ)  # the state and config folders above

    for node, bus in (LOST_FOR_NOW, DBE):
        rc, out = _remediate(env, node, bus, "--confirm", node)
        assert rc == 0, out
        assert f"{node}: GPU " in out and " -> reset_gpu  (simulated)" in out
        assert "drain it, reset the GPU, then verify: done" in out
        rc, out = _remediate(env, node, bus, "--dry-run")
        assert rc == 3 and "the verdict is fit (fit for work)" in out, out

    node, bus = LOST_FOR_GOOD
    said = []
    for _ in range(3):
        rc, out = _remediate(env, node, bus, "--confirm", node)
        said.append(out)
    reset, cycle, service = said
    assert " -> reset_gpu  " in reset and f"unable to reset {bus}: still lost" in reset
    assert "next: reboot_node" in reset
    assert " -> reboot_node  " in cycle and f"ok power-cycle {node} through its BMC" in cycle
    assert f"{bus} is still lost (XID 79: it fell off the bus); next: service" in cycle
    assert " -> service  " in service and rc == 0, service
    assert "drain it and return it for service: done" in service

    # what each step did is audited by the GPU's bus id, and the simulated world kept it
    records = [
        json.loads(line)
        for line in (tmp_path / "gpuconsole" / "demo" / AUDIT_FILE).read_text().splitlines()
    ]
    ours = [r for r in records if r["args"].get("gpus") == [bus]]
    assert {r["outcome"] for r in ours} >= {"started", "failed", "ok"}
    world = SimWorld.demo(node, demo_root(node))
    assert world.node.resets == {1: 1} and world.node.power_cycles == 1
    assert world.owners(1) == ["drained"]


def test_a_gpu_off_the_bus_under_a_slurm_job_drains_the_job_before_its_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dgx-006 runs a Slurm job on all 8 GPUs when GPU 1 falls off the bus: NVML lists no
    process on it, yet the job's rank still holds its /dev/nvidia1, so the job is its owner:
    the Slurm node is drained and the plan waits for the job to end before the reset (which
    the driver refuses while the job holds the GPU)."""
    from gpuconsole.wiring import demo_root

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    node, bus = LOST_FOR_GOOD
    (spec,) = [s for s in DEMO_CLUSTER if s.name == node]
    job = SimPlan(jobs=(SimJob("4801", "physics", 1001, tuple(range(8))),))
    world = SimWorld(node, get_profile(spec.profile), demo_root(node), job, spec.scenarios)
    world.node.t0 = time.time() - 120
    world.save()
    env = dict(os.environ)

    rc, plan = _remediate(env, node, bus, "--dry-run")
    assert rc == 0 and f"drain Slurm node {node} (scontrol update state=drain)" in plan, plan
    assert "job 4801 gone" in plan
    rc, out = _remediate(env, node, bus, "--confirm", node)
    assert rc != 0 and f"ok drain Slurm node {node}" in out and "idle: job 4801 gone" in out, out
    assert f"unable to reset {bus}: still lost" in out and "in use" not in out
    world = SimWorld.demo(node, demo_root(node))
    assert world.slurm_drained and world.plan.jobs == () and world.node.resets == {1: 1}


# --- r in a running demo, and the consoles beside it ---------------------------------------


@pytest.fixture
async def demo() -> AsyncIterator[Hub]:
    """The demo cluster's dgx-005 and dgx-006, running, two minutes in (GPU 2 of dgx-005
    has had its double-bit error, GPU 1 of dgx-006 is off the bus), polled often."""
    specs = [s for s in DEMO_CLUSTER if s.name in ("dgx-005", "dgx-006")]
    hub = demo_hub(specs=specs, interval_s=0.2, start=time.time() - 120,
                   fabric_interval_s=0.5, tenancy_interval_s=0.2)  # fmt: skip
    await hub.start()
    try:
        await until(
            lambda: (
                (s := hub.latest) is not None
                and len(s.nodes) == 2
                and all(n.tenancy is not None and n.bmc is not None for n in s.nodes)
                and _action(hub, *DBE) is Action.RESET_GPU
                and _action(hub, *LOST_FOR_GOOD) is Action.RESET_GPU
            ),
            timeout=20,
        )
        yield hub
    finally:
        await hub.stop()


def _action(hub: Hub, node: str, bus: str) -> Action | None:
    found = hub.latest.node(node) if hub.latest is not None else None
    return gpu_verdict(found, bus).action if found is not None else None


def _unbound(hub: Hub, node: str, bus: str) -> bool:
    found = hub.latest.node(node) if hub.latest is not None else None
    if found is None or found.nvml is None:
        return False
    return not any(g.lost for g in found.nvml.gpus) and bus not in {
        normal_bus_id(g.pci_bus_id) for g in found.nvml.gpus
    }


def screen_text(app: Any) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def _repair(app: ConsoleApp, pilot: Any, node: str, bus: str) -> list[str]:
    """r on the GPU, its node's name and Enter for each plan, n while one offers the next:
    the remedies in turn, and the last outcome's words."""
    app.open_gpu(node, bus_id=bus)
    await until(lambda: isinstance(app.screen, GpuScreen) and "r Repair" in screen_text(app))
    await pilot.press("r")
    await until(lambda: isinstance(app.screen, RemediateScreen))
    dialog = app.screen
    assert isinstance(dialog, RemediateScreen)
    remedies = []
    while True:
        await until(lambda: dialog.stage is Stage.PLAN and dialog.plan is not None, timeout=20)
        assert dialog.plan is not None
        assert not dialog.plan.blocked, dialog.plan.failed
        remedies.append(dialog.plan.remedy)
        await pilot.press(*node, "enter")
        await until(lambda: dialog.stage is Stage.DONE, timeout=40)
        assert dialog.outcome is not None
        if dialog.outcome.ok:
            remedies.append(dialog.outcome.message)
            break
        assert "n plans the next: " in screen_text(app), dialog.outcome.message
        await pilot.press("n")
    await pilot.press("escape")
    return remedies


def _words(hub: Hub, node: str, bus: str) -> str:
    found = hub.latest.node(node) if hub.latest is not None else None
    return "\n".join(f.text for f in gpu_verdict(found, bus).findings) if found else ""


async def test_the_demo_s_verdicts_give_each_fault_s_evidence(demo: Hub) -> None:
    """Story 8: the XID, the double-bit ECC count and NVIDIA's bucket; the GPU lost for
    good: the XID and the BMC's record of the bus error, at its own bus."""
    await until(lambda: "XID 48 double-bit ECC error" in _words(demo, *DBE), timeout=15)
    words = _words(demo, *DBE)
    assert "WORKFLOW_XID_48" in words and "1 uncorrectable" in words and "remap pending" in words
    await until(lambda: "Bus Fatal Error (bus 43 " in _words(demo, *LOST_FOR_GOOD), timeout=15)
    assert "fell off the bus (XID 79)" in _words(demo, *LOST_FOR_GOOD)


async def test_r_in_the_demo_makes_one_gpu_fit_and_sends_one_for_service_and_all_see_it(
    demo: Hub,
) -> None:
    app = ConsoleApp(demo, start_hub=False, actor=OPS, theme_dirs=[], cursor_blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await until(lambda: app.snapshot is not None)
        *remedies, said = await _repair(app, pilot, *DBE)
        assert remedies == ["reset_gpu"] and "drain it, reset the GPU, then verify" in said
        *remedies, said = await _repair(app, pilot, *LOST_FOR_GOOD)
        assert remedies == ["reset_gpu", "reboot_node", "service"], said
        assert "drain it and return it for service" in said
    await until(lambda: _action(demo, *DBE) is Action.FIT, timeout=15)
    (dbe_world, lost_world) = (live_world(demo, n) for n in ("dgx-005", "dgx-006"))
    assert dbe_world is not None and lost_world is not None
    assert dbe_world.node.resets == {2: 1} and dbe_world.node.power_cycles == 0
    assert lost_world.node.power_cycles == 1 and lost_world.owners(1) == ["drained"]

    # a viewer's console on the same demo: GPU 2 fit, GPU 1 out of service, both in Events
    beside = ConsoleApp(demo, start_hub=False, actor=VIEWER, theme_dirs=[], cursor_blink=False)
    async with beside.run_test(size=SIZE):
        await until(lambda: beside.snapshot is not None)
        beside.open_gpu(DBE[0], bus_id=DBE[1])
        await until(lambda: "fit for work" in screen_text(beside), timeout=15)
        beside.jump("events")
        await until(lambda: "remediate service by ops" in screen_text(beside), timeout=15)
        assert "remediate reset_gpu by ops" in screen_text(beside)
    snapshot = demo.latest
    assert snapshot is not None
    verdicts: dict[str, Any] = verdicts_json(snapshot)
    assert verdicts["dgx-005"]["action"] == "fit" and DBE[1] not in verdicts["dgx-005"]["gpus"]
    # out of service until it is given back: never shown fit for work again
    assert verdicts["dgx-006"]["gpus"][LOST_FOR_GOOD[1]]["action"] != "fit"
    board = alerts_page(snapshot, WallboardApp(None, theme_dirs=[]).palette, snapshot.at).body
    findings = [line for line in board.plain.splitlines() if line[:1] in ("✖", "▲")]  # type: ignore[union-attr]
    assert findings and not any("dgx-005" in line for line in findings), findings
    assert any(line.startswith("▲ dgx-006 GPU (43:00.0): no driver holds it") for line in findings)
    assert "unavailable (no driver bound)" in render_table(snapshot)  # what `snapshot` prints


async def test_a_gpu_sent_for_service_is_not_asked_to_be_reset_again(demo: Hub) -> None:
    """dgx-006's GPU 1: its reset failed, then its node's power cycle, and it was returned
    for service. The SEL's fatal PCIe error on its bus is the fault those repairs met: it
    must not ask for the reset again (the GPU's own verdict says it is out of service)."""
    from gpuconsole.wiring import live_demo_executor

    node, bus = LOST_FOR_GOOD
    asked: Action | None = _action(demo, node, bus)
    while asked is not None:
        executor = live_demo_executor(demo, node)
        try:
            outcome = await executor.execute(await executor.plan_remedy(bus, asked), OPS, node)
        finally:
            await executor.close()
        assert outcome.ok is (asked is Action.SERVICE), outcome.message
        asked = escalation(asked)
    world = live_world(demo, node)
    assert world is not None and world.owners(1) == ["drained"]
    # the hub has read it unbound: NVML no longer counts it, lost or not
    await until(lambda: _unbound(demo, node, bus), timeout=15)
    found = demo.latest.node(node) if demo.latest is not None else None
    assert found is not None
    assert gpu_verdict(found, bus).action is not Action.RESET_GPU, gpu_verdict(found, bus)
