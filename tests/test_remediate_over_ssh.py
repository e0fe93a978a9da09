"""Remediation from a head: `r` on another node's GPU (or `gpuconsole remediate NODE:GPU`)
runs that node's own `gpuconsole remediate` over ssh, as the operator's ssh key. The node
plans from its own verdict, the operator confirms on the head, the node runs the plan with
its journal, locks and audit, and each step ticks on the head as the node reports it.

The node is a minimal sshd on 127.0.0.1 (tests.ssh_node) whose commands act on the demo's
dgx-003, where GPU 5 fell off the bus (XID 79) while pod team-nlp/train-llm-7b-0 ran on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import msgspec
import pytest

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.executor import StepUpdate
from gpuconsole.actions.journal import Journal, PlanState
from gpuconsole.actions.over_ssh import ContactLost, RemoteExecutor
from gpuconsole.actions.plan import StepKind
from gpuconsole.actions.roles import ActionRefused, Actor, Role, local_actor
from gpuconsole.cli.main import main
from gpuconsole.cli.remediate import split_node
from gpuconsole.config import load
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.readings.base import Event, normal_bus_id
from gpuconsole.sim.actions import SimWorld
from gpuconsole.sim.fakenvml import _processes, driver_of, environment, write_profile
from gpuconsole.sim.profiles import DGX_H100
from tests.fakenvml_fixtures import FakeNvmlLibs
from tests.ssh_node import (
    NODE,
    ExecServer,
    Keys,
    head_config,
    known_line,
    make_keys,
    node_target,
    serve_node,
)
from tests.tenancy_fixtures import FakeHost
from tests.waiting import until

GPU5 = "0000:c3:00.0"
OPS = Actor("ops", Role.OPERATOR)


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Keys:
    return make_keys(tmp_path, monkeypatch)


@pytest.fixture
def node(tmp_path: Path, keys: Keys) -> Iterator[ExecServer]:
    """dgx-003 a minute after its world began: GPU 5 fell off the bus 45 s in."""
    world = _world(tmp_path)
    state = json.loads(world.state_file.read_text())
    state["started"] -= 60
    world.state_file.write_text(json.dumps(state))
    assert _world(tmp_path).node.lost(5)
    with serve_node(tmp_path, keys) as server:
        yield server


def _world(tmp_path: Path) -> SimWorld:
    return SimWorld.demo(NODE, tmp_path / "state" / "gpuconsole" / "demo" / NODE)


def _node_verdict(tmp_path: Path) -> Action:
    """What the node's own reading says of GPU 5 now (what its agent would report)."""
    node = asyncio.run(_world(tmp_path).snapshot())
    return gpu_verdict(node, GPU5).action


def _text(app: Any) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def _node_audit(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "gpuconsole" / "demo" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _node_journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state" / "gpuconsole" / "demo" / "actions.db")


# --- story 1, from a head ---------------------------------------------------------------


async def test_story_1_from_a_head_r_on_gpu_5_of_dgx_003_runs_there_and_the_gpu_ends_fit(
    tmp_path: Path, keys: Keys, node: ExecServer, console_app: Any
) -> None:
    """The 3 a.m. page on a head: the node view of dgx-003, Enter on GPU 5, r, the node's plan
    from its own verdict, 5 and Enter typed on the head, each step ticking as the node runs it."""
    from gpuconsole.tui.actions import MachineAccess
    from gpuconsole.tui.screens.assign import Stage
    from gpuconsole.tui.screens.gpu import GpuScreen
    from gpuconsole.tui.screens.node import NodeScreen
    from gpuconsole.tui.screens.remediate import RemediateScreen

    asked = await asyncio.to_thread(_node_verdict, tmp_path)
    assert asked in (Action.RESET_GPU, Action.REBOOT_NODE)  # whichever the verdict says
    cfg = load(head_config(tmp_path, keys, node.port))
    events: list[Event] = []
    app = console_app(actor=OPS, actions=MachineAccess(cfg, events.append, None, remote=True))
    async with app.run_test(size=(120, 40)) as pilot:
        app.jump("node", NODE)
        await until(lambda: isinstance(app.screen, NodeScreen) and app.screen.is_mounted)
        view = app.screen
        assert isinstance(view, NodeScreen)
        await until(lambda: GPU5 in view.table.row_keys)
        view.table.move_cursor(GPU5)
        await pilot.pause()
        await pilot.press("enter")
        await until(lambda: isinstance(app.screen, GpuScreen))
        await pilot.press("r")
        await until(lambda: isinstance(app.screen, RemediateScreen))
        dialog = app.screen
        assert isinstance(dialog, RemediateScreen)
        await until(lambda: dialog.stage is Stage.PLAN, timeout=60)
        plan = dialog.plan
        assert plan is not None and plan.node == NODE and plan.gpus == (GPU5,)
        assert plan.remedy == asked.value and not plan.blocked
        kinds = [s.kind for s in plan.steps]
        assert StepKind.EVICT in kinds and kinds[-1] is StepKind.VERIFY
        if asked is Action.REBOOT_NODE:  # a running tenant is named before the power cycle
            assert any("train-llm-7b-0" in n and "power cycle" in n for n in plan.notes)
        assert _world(tmp_path).node.lost(5)  # the node planned; nothing changed
        await pilot.press("5", "enter")
        await until(lambda: dialog.stage is Stage.DONE, timeout=120)
        assert dialog.outcome is not None and dialog.outcome.ok, dialog.outcome
        # every step ticked on the head as the node ran it
        assert [dialog.progress[k][0] for k in range(len(plan.steps))] == ["done"] * len(plan.steps)
        # what the head read before the plan is not what GPU 5 is now: the dialog waits for
        # the node's agent to report a reading taken after it, then says what it is
        await pilot.pause()
        assert dialog.now == {} and "now: unavailable" not in _text(app)
        assert f"the GPUs show as {NODE}'s agent next reports them" in _text(app)
        fresh = await _world(tmp_path).snapshot()
        before = app.snapshot
        app.snapshot = msgspec.structs.replace(
            before, nodes=tuple(fresh if n.node == NODE else n for n in before.nodes)
        )
        await until(lambda: GPU5 in dialog.now, timeout=5)
        await pilot.pause()
        assert f"GPU 5 ({GPU5}) now: free (was: pod team-nlp/train-llm-7b-0" in _text(app)
    # the node's own reading finds GPU 5 fit: what its agent reports to the fleet
    assert not _world(tmp_path).node.lost(5)
    assert await asyncio.to_thread(_node_verdict, tmp_path) is Action.FIT
    # the node journaled and audited its plan by bus id; the head audited that it asked
    (record,) = _node_journal(tmp_path).plans()
    assert record.state is PlanState.DONE and record.id == dialog.outcome.plan_id
    node_records = _node_audit(tmp_path)
    assert {r["outcome"] for r in node_records} >= {"started", "ok"}
    assert all(r["args"]["gpus"] == [GPU5] for r in node_records)
    assert all(r["args"]["via"] == "ssh" for r in node_records)
    head = AuditLog(tmp_path / "head" / "audit.jsonl").records()
    assert [(r["action"], r["outcome"]) for r in head] == [
        (f"remediate {asked.value}", "asked"),
        (f"remediate {asked.value}", "ok"),
    ]
    assert head[-1]["args"]["gpus"] == [GPU5] and head[-1]["args"]["remedy"] == asked.value
    assert events[-1].message.startswith(f"remediate {asked.value} by ops: ")


# --- the command line on a head -----------------------------------------------------------


def test_gpuconsole_remediate_on_a_head_takes_a_node_qualified_gpu_and_runs_it_there(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(head_config(tmp_path, keys, node.port))
    asked = _node_verdict(tmp_path)
    assert main(["remediate", "-c", config, f"{NODE}:{GPU5}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{NODE}: GPU 5 ({GPU5}) -> {asked.value}  (simulated)\n")
    assert "Steps:" in out and out.rstrip().endswith("Dry run: nothing was changed.")
    assert "--dry-run" in node.commands[0] and " remediate --json-progress " in node.commands[0]
    # the same GPU named with --node, as `assign --node` names it
    assert main(["remediate", "-c", config, "--node", NODE, "c3:00.0", "--dry-run"]) == 0
    assert capsys.readouterr().out == out
    assert _world(tmp_path).node.lost(5)

    assert main(["remediate", "-c", config, f"{NODE}:{GPU5}", "--confirm", "5"]) == 0
    out = capsys.readouterr().out
    steps = out.count(" ok ")
    assert steps >= 4 and f"  [{steps}/{steps}] ok final check: a fresh reading finds it fit" in out
    assert f"done: GPU 5 ({GPU5}): " in out
    # the node ran the action it showed, not one the head chose
    assert f"--action {asked.value} --confirm 5 --expect-plan " in node.commands[-1]
    assert _node_verdict(tmp_path) is Action.FIT


def test_a_power_cycle_planned_from_a_head_says_who_runs_on_the_node(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(head_config(tmp_path, keys, node.port))
    args = ["remediate", "-c", config, f"{NODE}:5", "--action", "reboot_node", "--dry-run"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"  {NODE} runs pod team-vision/resnet-ft-1, " in out
    # and its guest waiting for a GPU, which the power cycle stops too
    assert "pod team-nlp/train-llm-7b-0, vm tenant-b-vm8: the power cycle waits until" in out
    assert f"power-cycle {NODE} through its BMC" in out


def test_node_qualified_gpus_are_told_from_bus_ids() -> None:
    assert split_node("dgx-003:0000:c3:00.0") == ("dgx-003", "0000:c3:00.0")
    assert split_node("dgx-003:c3:00.0") == ("dgx-003", "c3:00.0")
    assert split_node("dgx-003:5") == ("dgx-003", "5")
    assert split_node("0000:c3:00.0") == (None, "0000:c3:00.0")
    assert split_node("00000000:C3:00.0") == (None, "00000000:C3:00.0")
    assert split_node("c3:00.0") == (None, "c3:00.0")
    assert split_node("GPU-e5f7441e-0fa6-bc3d-6341-e99117b964f4") == (
        None,
        "GPU-e5f7441e-0fa6-bc3d-6341-e99117b964f4",
    )


# --- refusals: each said plainly, nothing lost -------------------------------------------


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["remediate", *args])
    said = capsys.readouterr()
    text = said.out + said.err
    assert "Traceback" not in text and "\x1b" not in text
    return status, text


def test_an_unreachable_node_is_told_and_nothing_is_asked(
    tmp_path: Path, keys: Keys, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    config = str(head_config(tmp_path, keys, port))
    status, text = _refused(capsys, "-c", config, f"{NODE}:{GPU5}", "--confirm", "5")
    assert status == 1
    assert text == (
        f"gpuconsole remediate: cannot reach {NODE} at 127.0.0.1:{port}: connection refused "
        "(no ssh server listens there)\n"
    )


def test_a_changed_host_key_is_refused_before_the_node_is_asked(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    keys.known_hosts.write_text(known_line(node.port, asyncssh.generate_private_key("ssh-ed25519")))
    config = str(head_config(tmp_path, keys, node.port))
    status, text = _refused(capsys, "-c", config, f"{NODE}:{GPU5}", "--confirm", "5")
    assert status == 1 and "does not match the one in" in text and "ssh-keygen -R" in text
    assert node.commands == [] and _world(tmp_path).node.lost(5)


def test_a_node_without_gpuconsole_is_told(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = "/nonexistent/gpuconsole"
    config = str(head_config(tmp_path, keys, node.port, command=missing))
    status, text = _refused(capsys, "-c", config, f"{NODE}:{GPU5}", "--dry-run")
    assert status == 1
    assert f"{NODE} has no `{missing}` for its ssh user's shell" in text
    assert "set [remote] command to its path" in text


def test_a_wrong_confirmation_typed_on_the_head_is_refused_by_the_node(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(head_config(tmp_path, keys, node.port))
    status, text = _refused(capsys, "-c", config, f"{NODE}:{GPU5}", "--confirm", "dgx-004")
    assert status == 3
    assert f"Refused: confirmation 'dgx-004' does not match '{NODE}', '5' or 'c3:00.0'" in text
    assert _world(tmp_path).node.lost(5) and _node_journal(tmp_path).plans() == []
    (refused,) = _node_audit(tmp_path)
    assert refused["outcome"] == "refused" and refused["args"]["gpus"] == [GPU5]


async def test_contact_lost_mid_repair_leaves_the_node_to_end_it_and_its_journal_says_how(
    tmp_path: Path, keys: Keys, node: ExecServer
) -> None:
    node.drop_after_step = True
    seen: list[StepUpdate] = []
    async with RemoteExecutor(node_target(keys, node.port), on_step=seen.append) as remote:
        plan = await remote.plan_remedy(GPU5)
        with pytest.raises(ContactLost) as lost:
            await remote.execute(plan, OPS, NODE)
    text = str(lost.value)
    assert text.startswith(f"lost contact with {NODE} (")
    assert f"last seen at step 1/{len(plan.steps)} ({plan.steps[0].title}: done)" in text
    assert "The node ends the plan by itself, done, or stopped at a step (its journal says" in text
    assert "the next `gpuconsole remediate` there recovers it" in text
    assert "if the node rebooted (as its power cycle does), its agent ends the plan" in text
    # the node's command outlived the connection: its journal has the plan, ended
    await asyncio.to_thread(node.wait_children, 120.0)
    (record,) = _node_journal(tmp_path).plans()
    assert record.id == lost.value.plan_id and record.state is PlanState.DONE
    assert not _world(tmp_path).node.lost(5)


@pytest.fixture
def viewer_node(
    tmp_path: Path, keys: Keys, fake_nvml_libs: FakeNvmlLibs
) -> Iterator[tuple[ExecServer, Path]]:
    """dgx-003 as a real node, not the simulator: NVML from the fake library, sysfs and /proc
    a fake host's (GPU 3 runs Slurm job 4711), scontrol on its PATH; and the ssh login a
    viewer there (nobody, when the tests run as root; else this user, in no gpuconsole group).
    Its files in a folder of its own that the login can read; its state folder, where it
    journals and audits."""
    if os.geteuid() == 0:
        become = "setpriv --reuid=65534 --regid=65534 --clear-groups "
    elif local_actor().role.may_act:
        pytest.skip("this user is an operator or admin here: no viewer to log in as")
    else:
        become = ""
    root = Path(tempfile.mkdtemp(prefix="gpuconsole-viewer-node-"))
    try:
        root.chmod(0o755)
        lib = root / "lib"
        shutil.copytree(fake_nvml_libs(driver_of(DGX_H100)).parent, lib)
        profile = write_profile(DGX_H100, root / "dgx-h100.profile", driver=driver_of(DGX_H100))
        host = FakeHost(root / "host")
        for k, gpu in enumerate(DGX_H100.gpus):
            host.pci(normal_bus_id(gpu.bus_id), driver="nvidia", group=k)
        for pid, _share, _gi in _processes(DGX_H100, 0, 3, []):
            host.process(
                pid,
                cgroup="/system.slice/slurmstepd.scope/job_4711/step_0",
                environ={"SLURM_JOB_ID": "4711", "SLURM_JOB_ACCOUNT": "physics"},
                fds=("/dev/nvidiactl", "/dev/nvidia3"),
            )
        tools = root / "bin"
        tools.mkdir()
        # Slurm control the plan counts on; it must never run (the node refuses first)
        (tools / "scontrol").write_text(f"#!/bin/sh\ntouch {root / 'scontrol-ran'}\n")
        (tools / "scontrol").chmod(0o755)
        (root / "state").mkdir(mode=0o777)
        (root / "state").chmod(0o777)
        (root / "config" / "gpuconsole").mkdir(parents=True)
        (root / "config" / "gpuconsole" / "config.toml").write_text(
            f"""
[host]
name = "{NODE}"
sysfs_root = "{host.sysfs_root}"
proc_root = "{host.proc_root}"
[actions]
state_dir = "{root / "state"}"
"""
        )
        for path in root.rglob("*"):
            if not path.is_symlink():  # readable by the login (and folders enterable)
                path.chmod(path.stat().st_mode | 0o044 | (0o011 if path.is_dir() else 0))
        env = {
            **environment(lib, profile),
            "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
            "XDG_CONFIG_HOME": str(root / "config"),
        }
        wrap = "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + become
        with serve_node(tmp_path, keys, demo=False, wrap=wrap) as server:
            yield server, root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_node_that_refuses_the_login_s_role_is_told_and_audits_it(
    tmp_path: Path,
    keys: Keys,
    viewer_node: tuple[ExecServer, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    server, root = viewer_node
    config = str(head_config(tmp_path, keys, server.port))
    gpu3 = f"{NODE}:0000:61:00.0"
    status, text = _refused(capsys, "-c", config, gpu3, "--action", "drain", "--confirm", "3")
    assert status == 3, text
    # the head showed the node's plan, then the node's own refusal
    assert "  1. drain Slurm node dgx-003 (scontrol update state=drain)" in text
    assert text.rstrip().endswith("Refused: role viewer may not act; operators and admins may")
    assert not (root / "scontrol-ran").exists()  # nothing ran there
    # audited in the node's state folder, in the login's own file where it is not root's
    (audit,) = (root / "state").glob("audit*.jsonl")
    (refused,) = [json.loads(line) for line in audit.read_text().splitlines()]
    assert (refused["outcome"], refused["role"], refused["action"]) == (
        "refused",
        "viewer",
        "remediate drain",
    )
    assert refused["args"]["gpus"] == ["0000:61:00.0"] and refused["args"]["via"] == "ssh"
    head = AuditLog(tmp_path / "head" / "audit.jsonl").records()
    assert [r["outcome"] for r in head] == ["asked", "refused"]


async def test_a_fit_gpu_s_plan_is_shown_blocked_and_the_node_is_not_asked_to_run_it(
    tmp_path: Path, keys: Keys, node: ExecServer
) -> None:
    async with RemoteExecutor(node_target(keys, node.port)) as remote:
        plan = await remote.plan_remedy("0000:61:00.0")  # GPU 3: fit
        assert plan.blocked and plan.remedy == "fit"
        assert "the verdict is fit (fit for work): there is nothing to remediate" in str(
            plan.failed[0]
        )
        with pytest.raises(ActionRefused, match="there is nothing to remediate"):
            await remote.execute(plan, OPS, NODE)
    assert len(node.commands) == 1 and "--dry-run" in node.commands[0]


def test_a_node_asked_about_another_node_refuses_instead_of_passing_it_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpuconsole.config import Config

    here = Config().host.node_name
    assert main(["remediate", "--json-progress", "--node", "elsewhere", GPU5]) == 2
    assert f"gpuconsole remediate: this is {here}, not elsewhere" in capsys.readouterr().err
    assert main(["remediate", "elsewhere:5", "--dry-run"]) == 2
    assert "elsewhere is not in [fleet]" in capsys.readouterr().err
    assert main(["remediate", "--node", "dgx-004", f"{NODE}:5", "--dry-run"]) == 2
    assert f"{NODE}:5 is of {NODE}, not --node dgx-004" in capsys.readouterr().err


def test_a_head_s_dry_run_says_what_the_node_does_first_with_a_plan_running_there(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan of the node's journal holds GPU 5: the head's dry run, planned on the node,
    says the real run would be refused for it, as the node says it."""
    from gpuconsole.actions.locks import lock_and_start

    journal = _node_journal(tmp_path)
    plan = asyncio.run(_world_executor_plan(tmp_path))
    running = lock_and_start(journal, plan, "alice", "operator", None)
    config = str(head_config(tmp_path, keys, node.port))
    status, text = _refused(capsys, "-c", config, f"{NODE}:{GPU5}", "--dry-run")
    assert status == 0, text
    assert f"journal: plan {running} (remediate reset_gpu of GPU 5 ({GPU5}), by alice) is " in text
    assert "so the real run is refused for any of them until it ends" in text, text
    assert "Dry run: nothing was changed." in text


async def _world_executor_plan(tmp_path: Path) -> Any:
    from gpuconsole.actions.remediation import make_remediation_plan

    return make_remediation_plan(await _world(tmp_path).snapshot(), GPU5, Action.RESET_GPU)


async def test_a_head_s_repair_view_shows_what_the_node_says_of_a_plan_running_there(
    tmp_path: Path, keys: Keys, node: ExecServer, console_app: Any
) -> None:
    """r on GPU 5 from a head while a plan of the node's journal holds it: the node's plan
    comes with its word that the real run would be refused, shown above the plan."""
    from gpuconsole.actions.locks import lock_and_start
    from gpuconsole.tui.actions import MachineAccess
    from gpuconsole.tui.screens.assign import AssignScreen, Stage
    from gpuconsole.tui.screens.remediate import RemediateScreen

    plan = await _world_executor_plan(tmp_path)
    running = lock_and_start(_node_journal(tmp_path), plan, "alice", "operator", None)
    cfg = load(head_config(tmp_path, keys, node.port))
    app = console_app(actor=OPS, actions=MachineAccess(cfg, lambda _e: None, None, remote=True))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(lambda: app.snapshot is not None and app.snapshot.node(NODE) is not None)
        dialog = RemediateScreen(NODE, GPU5, Action.RESET_GPU)
        await app.push_screen(dialog)
        await until(lambda: dialog.stage is Stage.PLAN, timeout=60)
        await pilot.pause()
        said = [text for text, _health in dialog._news]
        assert isinstance(dialog, AssignScreen)
        assert any(
            f"journal: plan {running} (remediate reset_gpu of GPU 5 ({GPU5}), by alice) is "
            "running now" in text
            for text in said
        ), said
