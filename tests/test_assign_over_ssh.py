"""Assign over ssh: a head runs a node's own `gpuconsole assign` over ssh, as the operator's
ssh key, and follows its JSON progress.

The node is a minimal sshd on 127.0.0.1 (tests.ssh_node).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.executor import STEP_EVENT, Outcome, StepUpdate
from gpuconsole.actions.journal import Journal, PlanState
from gpuconsole.actions.over_ssh import (
    ContactLost,
    RemoteError,
    RemoteExecutor,
    SshTarget,
    parse_destination,
)
from gpuconsole.actions.plan import Layer, Plan, Step, StepKind, Target
from gpuconsole.actions.progress import (
    JsonReport,
    Note,
    PlanShown,
    ProgressError,
    StepChanged,
    plan_digest,
    read_event,
)
from gpuconsole.actions.roles import ActionRefused, Actor, Role, login_name
from gpuconsole.actions.ssh_caller import over_ssh
from gpuconsole.cli.assign import AssignRequest, run_assign
from gpuconsole.cli.main import main
from gpuconsole.config import Config, FleetConfig, HostConfig, RemoteConfig, load
from gpuconsole.readings.base import Event
from gpuconsole.sim.actions import SimWorld
from gpuconsole.wiring import ssh_target
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
from tests.waiting import until as wait_for

GPU = "3"  # of dgx-003: free, the others held by pods
OPS = Actor("ops", Role.OPERATOR)
_known_line, _config = known_line, head_config


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Keys:
    return make_keys(tmp_path, monkeypatch)


@pytest.fixture
def node(tmp_path: Path, keys: Keys) -> Iterator[ExecServer]:
    with serve_node(tmp_path, keys) as server:
        yield server


async def _plan_on(target: SshTarget) -> Plan:
    async with RemoteExecutor(target) as remote:
        return await remote.plan([GPU], Target.parse("drained"))


def _world(tmp_path: Path) -> SimWorld:
    return SimWorld.demo(NODE, tmp_path / "state" / "gpuconsole" / "demo" / NODE)


def _node_audit(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "gpuconsole" / "demo" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- over ssh, end to end ------------------------------------------------------------------


async def test_a_remote_plan_moves_the_gpu_on_the_node_and_the_head_ticks_each_step(
    tmp_path: Path, keys: Keys, node: ExecServer
) -> None:
    updates: list[StepUpdate] = []
    events: list[Event] = []
    head_audit = AuditLog(tmp_path / "head" / "audit.jsonl")
    remote = RemoteExecutor(
        node_target(keys, node.port), on_step=updates.append, emit=events.append, audit=head_audit
    )
    async with remote:
        plan = await remote.plan([GPU], Target.parse("drained"))
        assert plan.node == NODE and plan.simulated and not plan.blocked
        assert plan.preconditions and plan.confirmations() == (NODE, GPU, "61:00.0")
        assert _world(tmp_path).owners(3) == ["k8s"]  # planning changed nothing
        outcome = await remote.execute(plan, OPS, GPU)

    assert outcome.ok and outcome.state == PlanState.DONE, outcome.message
    assert _world(tmp_path).owners(3) == ["drained"]
    # the node ran its own command: once to plan, once to run what was shown
    assert len(node.commands) == 2 and "--dry-run" in node.commands[0]
    assert f"--expect-plan {plan_digest(plan)}" in node.commands[1]
    # every step reached the head as it ticked, as a local executor's on_step sees them
    steps = range(len(plan.steps))
    assert [(u.seq, u.state) for u in updates] == [
        (k, s) for k in steps for s in ("running", "done")
    ]
    assert all(u.plan_id == outcome.plan_id and u.step == plan.steps[u.seq] for u in updates)
    # and the same events: start, one per step, outcome, about the node's GPU 3
    told = [e for e in events if e.kind == STEP_EVENT]
    assert [e.message.split(" step ")[1].split(" ")[0] for e in told] == [
        f"{k + 1}/{len(plan.steps)}" for k in steps
    ]
    assert events[0].message == f"ops (operator) started assign drained on {NODE} over ssh: " + (
        outcome.plan_id
    )
    assert events[-1].message == f"assign drained by ops: {outcome.message}"
    assert all(e.node == NODE and e.gpu_index == 3 for e in events)
    # the node audited who logged in (its uid), and with which key as sshd's environment says
    # it (the login could have set that: not the key_fingerprint); the head that it asked
    (started,) = [r for r in _node_audit(tmp_path) if r["outcome"] == "started"]
    assert started["user"] == login_name() and started["args"]["via"] == "ssh"
    assert started["key_fingerprint"] is None
    said = started["args"]["ssh_login"]
    assert f"from 127.0.0.1 port 40000, key {keys.client_key.get_fingerprint('sha256')}" in said
    head = head_audit.records()
    assert [r["outcome"] for r in head] == ["asked", "ok"]
    assert head[1]["args"]["plan_id"] == outcome.plan_id
    assert head[1]["args"]["remote"] == f"ssh 127.0.0.1:{node.port}"


async def test_a_head_that_cannot_audit_asks_the_node_nothing(
    tmp_path: Path, keys: Keys, node: ExecServer
) -> None:
    (tmp_path / "full").write_text("")  # its audit log cannot be created: an OSError
    audit = AuditLog(tmp_path / "full" / "audit.jsonl")
    async with RemoteExecutor(node_target(keys, node.port), audit=audit) as remote:
        plan = await remote.plan([GPU], Target.parse("drained"))
        with pytest.raises(ActionRefused, match=r"cannot be written .*nothing was asked of"):
            await remote.execute(plan, OPS, GPU)
        with pytest.raises(ActionRefused, match="nothing was asked of dgx-003"):
            await remote.run([GPU], Target.parse("drained"), OPS, GPU)
    assert len(node.commands) == 1  # the plan only
    assert _world(tmp_path).owners(3) == ["k8s"]


def test_assign_with_a_fleet_node_shows_its_plan_here_and_runs_it_there(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["assign", "-c", str(_config(tmp_path, keys, node.port)), "--node", NODE, GPU]
    assert main([*args, "--to", "drained", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{NODE}: GPU 3 (0000:61:00.0) -> drained  (simulated)" in out
    assert "Preconditions:" in out and "Steps:" in out
    assert out.rstrip().endswith("Dry run: nothing was changed.")
    assert _world(tmp_path).owners(3) == ["k8s"]

    assert main([*args, "--to", "drained", "--confirm", NODE]) == 0
    out = capsys.readouterr().out
    assert "  [1/5] ok cordon GPU 3 (0000:61:00.0) out of Kubernetes scheduling" in out
    assert "  [5/5] ok final check: unbound" in out
    assert "done: GPU 3 (0000:61:00.0) now drained (plan " in out
    assert _world(tmp_path).owners(3) == ["drained"]


async def test_a_wrong_confirmation_typed_on_the_head_is_refused_by_the_node(
    tmp_path: Path, keys: Keys, node: ExecServer
) -> None:
    cfg = load(_config(tmp_path, keys, node.port))
    asked: list[str] = []

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return "4"

    out = io.StringIO()
    request = AssignRequest((GPU,), "drained", node=NODE)
    assert await run_assign(cfg, request, OPS, ask=ask, out=out) == 3
    assert asked == [f"Type {NODE}, {GPU} or 61:00.0 to confirm: "]
    words = f"'{NODE}', '{GPU}' or '61:00.0'"
    assert f"Refused: confirmation '4' does not match {words}" in out.getvalue()
    assert _world(tmp_path).owners(3) == ["k8s"]
    assert Journal(tmp_path / "state" / "gpuconsole" / "demo" / "actions.db").plans() == []
    (refused,) = _node_audit(tmp_path)
    assert refused["outcome"] == "refused" and refused["args"]["via"] == "ssh"
    head = AuditLog(tmp_path / "head" / "audit.jsonl").records()
    assert [r["outcome"] for r in head] == ["asked", "refused"]


async def test_contact_lost_mid_plan_is_said_and_the_node_ends_the_plan_by_itself(
    tmp_path: Path, keys: Keys, node: ExecServer
) -> None:
    node.drop_after_step = True
    shown: list[Plan] = []
    async with RemoteExecutor(node_target(keys, node.port)) as remote:
        with pytest.raises(ContactLost) as lost:
            await remote.run([GPU], Target.parse("drained"), OPS, NODE, on_plan=shown.append)
    text = str(lost.value)
    assert text.startswith(f"lost contact with {NODE} (")
    assert (
        f"last seen at step 1/{len(shown[0].steps)} (cordon GPU 3 (0000:61:00.0) out of "
        "Kubernetes scheduling: done)"
    ) in text
    assert "The node ends the plan by itself, done or rolled back" in text
    # the node's command outlived the connection and finished the plan in its journal
    node.wait_children()
    (record,) = Journal(tmp_path / "state" / "gpuconsole" / "demo" / "actions.db").plans()
    assert record.id == lost.value.plan_id and record.state == PlanState.DONE
    assert _world(tmp_path).owners(3) == ["drained"]


async def test_an_unknown_host_key_is_refused_before_anything_runs(
    keys: Keys, node: ExecServer
) -> None:
    keys.known_hosts.write_text("")
    with pytest.raises(RemoteError) as refused:
        await _plan_on(node_target(keys, node.port))
    fingerprint = keys.host_key.get_fingerprint("sha256")
    assert f"the host key of {NODE} ([127.0.0.1]:{node.port}) ({fingerprint}) is unknown" in str(
        refused.value
    )
    assert f"not in {keys.known_hosts}; refused" in str(refused.value)
    assert node.commands == []


async def test_a_changed_host_key_is_refused_as_a_mismatch(keys: Keys, node: ExecServer) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519")
    keys.known_hosts.write_text(_known_line(node.port, other))
    with pytest.raises(RemoteError, match=r"does not match the one in .*: refused") as refused:
        await _plan_on(node_target(keys, node.port))
    assert "ssh-keygen -R" in str(refused.value) and node.commands == []


async def test_a_key_the_node_does_not_authorize_is_told(
    tmp_path: Path, keys: Keys, node: ExecServer
) -> None:
    stranger = tmp_path / "stranger"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(stranger)
    target = SshTarget(NODE, "127.0.0.1", node.port, "ops", (str(stranger),), str(keys.known_hosts))
    with pytest.raises(RemoteError) as refused:
        await _plan_on(target)
    assert str(refused.value) == (
        f"{NODE} at ops@127.0.0.1:{node.port} refused the ssh login of ops: none of the keys "
        f"offered ({stranger}) is authorized there"
    )


async def test_an_unreachable_node_fails_fast_and_says_so(keys: Keys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    began = time.monotonic()
    with pytest.raises(RemoteError) as unreachable:
        await _plan_on(node_target(keys, port))
    assert time.monotonic() - began < 5.0  # refused at once, not the connect timeout
    assert str(unreachable.value) == (
        f"cannot reach {NODE} at 127.0.0.1:{port}: connection refused (no ssh server listens there)"
    )


async def test_a_node_without_gpuconsole_is_told(keys: Keys, node: ExecServer) -> None:
    missing = "/nonexistent/gpuconsole"
    with pytest.raises(RemoteError) as failed:
        await _plan_on(node_target(keys, node.port, missing))
    assert str(failed.value).startswith(f"{NODE} has no `{missing}` for its ssh user's shell")
    assert "set [remote] command to its path" in str(failed.value)


# --- the node's side, and the config, without ssh ---------------------------------------


async def test_the_node_runs_only_the_plan_its_operator_was_shown(
    tmp_path: Path, keys: Keys
) -> None:
    out = io.StringIO()
    request = AssignRequest(
        (GPU,),
        "drained",
        node=NODE,
        demo=True,
        json_progress=True,
        confirm=NODE,
        expect_plan="0" * 16,
    )
    assert await run_assign(Config(), request, OPS, out=out) == 3
    said = [read_event(line) for line in out.getvalue().splitlines()]
    shown, refused = said
    assert isinstance(shown, PlanShown) and shown.plan.preconditions
    # the plan survives its trip through JSON: the head names it as the node does
    assert plan_digest(shown.plan) == shown.digest
    assert "changed since the plan was shown" in getattr(refused, "message", "")
    assert _world(tmp_path).owners(3) == ["k8s"]


def test_the_json_report_keeps_the_plan_going_when_the_head_hangs_up() -> None:
    read, write = os.pipe()
    os.close(read)
    out = os.fdopen(write, "w")
    report = JsonReport(out)
    report.note("still there?")  # EPIPE: Python ignores SIGPIPE, so it is an OSError
    assert report.gone
    report.outcome(Outcome("p1", PlanState.DONE, "moved"))  # and nothing more is tried
    with contextlib.suppress(OSError):
        out.close()


def test_a_step_line_reads_back_as_the_step_it_was() -> None:
    out = io.StringIO()
    step = Step(StepKind.UNBIND, Layer.PCI, "unbind GPU 3 from nvidia")
    JsonReport(out).step(StepUpdate("p1", 3, step, "done", "unbound"))
    assert read_event(out.getvalue()) == StepChanged("p1", 3, "done", "unbound")
    assert read_event("Welcome to dgx-003\n") == Note("Welcome to dgx-003")  # login chatter
    assert read_event(json.dumps({"v": 1, "event": "from-the-future"})) is None
    with pytest.raises(ProgressError, match="progress format 2"):
        read_event(json.dumps({"v": 2, "event": "note", "text": "?"}))


def test_a_login_over_ssh_is_audited_with_what_sshd_says_of_its_key(tmp_path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    auth = tmp_path / "auth"
    auth.write_text(f"publickey {key.export_public_key().decode()}")
    env = {"SSH_CONNECTION": "10.0.0.1 5 10.0.0.2 22", "SSH_USER_AUTH": str(auth)}
    actor = over_ssh(OPS, env)
    assert actor.via == "ssh" and actor.key_fingerprint is None and actor.user == "ops"
    fingerprint = key.get_fingerprint("sha256")
    assert actor.ssh_login == (
        f"from 10.0.0.1 port 5, key {fingerprint}, as the login's environment says"
    )
    bare = over_ssh(OPS, {"SSH_CONNECTION": "10.0.0.1 5 10.0.0.2 22"})
    assert bare.ssh_login == "from 10.0.0.1 port 5, as the login's environment says"
    odd = over_ssh(OPS, {"SSH_CONNECTION": "\x1b]52;c;aGk=\x07 5 x 22"})
    assert odd.ssh_login == "SSH_CONNECTION unreadable, as the login's environment says"
    assert over_ssh(OPS, {}) is OPS  # not under sshd: the local user, as it was


def test_where_a_node_is_reached_comes_from_remote_then_fleet(tmp_path: Path) -> None:
    targets = tmp_path / "targets.json"
    targets.write_text(
        json.dumps(
            [
                {
                    "targets": ["10.0.0.7:9400"],
                    "labels": {"node": "dgx-007", "ssh": "admin@bmc7:2201"},
                }
            ]
        )
    )
    cfg = Config(
        host=HostConfig(name="head"),
        fleet=FleetConfig(
            agents=("dgx-001=http://10.0.0.1:9400", "dgx-002=http://10.0.0.2:9400"),
            targets_file=str(targets),
        ),
        remote=RemoteConfig(destinations={"dgx-002": "ops@[fd00::2]:2222"}, user="oncall"),
    )
    one, two, seven = (ssh_target(cfg, n) for n in ("dgx-001", "dgx-002", "dgx-007"))
    assert (one.user, one.host, one.port) == ("oncall", "10.0.0.1", None)  # the agent's host
    assert (two.user, two.host, two.port) == ("ops", "fd00::2", 2222)
    assert (seven.user, seven.host, seven.port) == ("admin", "bmc7", 2201)
    assert two.address == "[fd00::2]:2222" and two.destination == "ops@[fd00::2]:2222"
    assert parse_destination("fe80::1") == (None, "fe80::1", None)
    with pytest.raises(RemoteError, match=r"this is head, and dgx-009 is not in \[fleet\]"):
        ssh_target(cfg, "dgx-009")


def test_a_node_asked_about_another_node_refuses_instead_of_passing_it_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    here = Config().host.node_name
    assert main(["assign", "--json-progress", "--node", "elsewhere", GPU, "--to", "free"]) == 2
    assert f"this is {here}, not elsewhere" in capsys.readouterr().err
    assert main(["assign", "--node", "elsewhere", GPU, "--to", "free"]) == 2
    assert "elsewhere is not in [fleet]" in capsys.readouterr().err


# --- from a head's console ---------------------------------------------------------------


async def test_a_head_console_moves_a_fleet_nodes_gpu_over_ssh_and_ticks_each_step(
    tmp_path: Path, keys: Keys, node: ExecServer, console_app: Any
) -> None:
    from textual.widgets import OptionList

    from gpuconsole.tui.actions import MachineAccess
    from gpuconsole.tui.screens.assign import AssignScreen, Stage

    cfg = load(_config(tmp_path, keys, node.port))
    events: list[Event] = []
    app = console_app(actor=OPS, actions=MachineAccess(cfg, events.append, None, remote=True))
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = AssignScreen(NODE, ["0000:61:00.0"])
        app.push_screen(dialog)
        await wait_for(lambda: dialog.stage is Stage.CHOOSE)
        targets = dialog.query_one("#assign-targets", OptionList)
        targets.focus()
        targets.highlighted = targets.get_option_index("drained")
        await pilot.press("enter")
        await wait_for(lambda: dialog.stage is Stage.PLAN, timeout=60)
        assert dialog.plan is not None and dialog.plan.node == NODE
        assert _world(tmp_path).owners(3) == ["k8s"]  # the node planned; nothing changed
        await pilot.press("3", "enter")
        await wait_for(lambda: dialog.stage is Stage.DONE, timeout=60)
        assert dialog.outcome is not None and dialog.outcome.ok, dialog.outcome
        # every step ticked in the dialog as the node ran it
        assert [state for state, _ in dialog.progress.values()] == ["done"] * len(dialog.plan.steps)
        await pilot.press("escape")
        await wait_for(lambda: app.screen is not dialog)
    assert _world(tmp_path).owners(3) == ["drained"]
    assert events[-1].message.startswith("assign drained by ops: ")
    head = AuditLog(tmp_path / "head" / "audit.jsonl").records()
    assert [r["outcome"] for r in head] == ["asked", "ok"]


async def test_a_head_console_says_how_to_reach_a_node_it_has_no_way_to(
    tmp_path: Path, console_app: Any
) -> None:
    from gpuconsole.tui.actions import MachineAccess
    from gpuconsole.tui.screens.assign import AssignScreen, Stage

    cfg = Config(host=HostConfig(name="head"))
    app = console_app(actor=OPS, actions=MachineAccess(cfg, lambda _e: None, None, remote=True))
    async with app.run_test(size=(120, 40)):
        dialog = AssignScreen(NODE, ["0000:61:00.0"])
        app.push_screen(dialog)
        await wait_for(lambda: dialog.stage is Stage.CLOSED)
        shown = "\n".join(s.text for s in app.screen._compositor.render_strips())
        assert f"cannot act on {NODE}: this is head, and {NODE} is not in [fleet]" in shown
