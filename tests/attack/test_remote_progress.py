"""A node's progress, as a head reads it over ssh, tried as a hostile or broken node's: escape
sequences in a login banner, a plan, a step or an outcome reach the operator's terminal
written out (\\x1b), never obeyed; lines nested past what a decoder follows, numbers past
what an int holds, and plans that do not hang together are refused with a plain message,
never a traceback."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuconsole.actions.executor import Outcome, StepUpdate
from gpuconsole.actions.journal import PlanState, StepProgress
from gpuconsole.actions.plan import Plan, Precondition, Step, StepKind, Target, TargetKind
from gpuconsole.actions.progress import JsonReport, Note, PlanShown, ProgressError, read_event
from gpuconsole.cli.main import main
from tests.ssh_node import NODE, ExecServer, Keys, head_config, make_keys, serve_node

GPU5 = "0000:c3:00.0"
OSC52 = "\x1b]52;c;aGk=\x07"  # writes the operator's clipboard
WIPE = "\x1b[2J"  # clears the operator's screen


def _plan(node: str = NODE, **changes: object) -> Plan:
    plan = Plan(
        node=node,
        target=Target(TargetKind.FREE),
        gpus=(GPU5,),
        labels=(f"GPU 5 ({GPU5})",),
        indexes=(5,),
        owners=(f"pod team-nlp/{WIPE}train",),
        preconditions=(Precondition("the verdict asks for it", True, f"reset_gpu {OSC52}"),),
        steps=(
            Step(StepKind.GPU_RESET, None, f"reset GPU 5 {OSC52}", gpus=(GPU5,)),
            Step(StepKind.VERIFY, None, "final check", gpus=(GPU5,)),
        ),
        notes=(f"{WIPE}all is well",),
        simulated=True,
        remedy="reset_gpu",
    )
    return dataclasses.replace(plan, **changes)  # type: ignore[arg-type]


def _lines(plan: Plan, *, run: bool) -> str:
    out = io.StringIO()
    out.write(f"{OSC52}Welcome to {NODE}{WIPE}\n")  # a login script's chatter
    report = JsonReport(out)
    report.plan(plan)
    if not run:
        report.dry_run()
        return out.getvalue()
    for seq, step in enumerate(plan.steps):
        report.step(StepUpdate("p1", seq, step, StepProgress.RUNNING))
        report.step(StepUpdate("p1", seq, step, StepProgress.DONE, f"done {OSC52}"))
    report.outcome(Outcome("p1", PlanState.DONE, f"GPU 5 fit {WIPE}"))
    return out.getvalue()


def _node_says(tmp_path: Path, planning: str, running: str) -> str:
    """A node command that says `planning` when asked for a dry run, else `running`."""
    (tmp_path / "planning").write_text(planning)
    (tmp_path / "running").write_text(running)
    script = tmp_path / "hostile.py"
    script.write_text(
        "import sys\n"
        f"name = 'planning' if '--dry-run' in sys.argv else 'running'\n"
        f"sys.stdout.write(open({str(tmp_path)!r} + '/' + name).read())\n"
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Keys:
    return make_keys(tmp_path, monkeypatch)


@pytest.fixture
def node(tmp_path: Path, keys: Keys) -> Iterator[ExecServer]:
    with serve_node(tmp_path, keys) as server:
        yield server


def _remediate(capsys: pytest.CaptureFixture[str], config: Path, *args: str) -> tuple[int, str]:
    status = main(["remediate", "-c", str(config), f"{NODE}:{GPU5}", *args])
    said = capsys.readouterr()
    text = said.out + said.err
    assert "Traceback" not in text
    assert not any(c in text for c in "\x1b\x07"), repr(text)
    return status, text


def test_escapes_in_a_node_s_progress_reach_the_head_s_terminal_written_out(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan()
    command = _node_says(tmp_path, _lines(plan, run=False), _lines(plan, run=True))
    config = head_config(tmp_path, keys, node.port, command=command)
    status, text = _remediate(capsys, config, "--dry-run")
    assert status == 0
    assert "reset GPU 5 \\x1b]52;c;aGk=\\x07" in text and "\\x1b[2Jall is well" in text
    assert "Welcome to dgx-003\\x1b[2J" in text
    status, text = _remediate(capsys, config, "--confirm", "5")
    assert status == 0
    assert "ok reset GPU 5 \\x1b]52;c;aGk=\\x07: done \\x1b]52" in text
    assert "done: GPU 5 fit \\x1b[2J (plan p1)" in text


@pytest.mark.parametrize(
    ("planning", "said"),
    [
        ("[" * 20_000 + "\n", "a line nested too deep to read"),
        (
            json.dumps({"v": 1, "event": "plan", "plan": {"node": NODE}, "digest": "x"}) + "\n",
            "malformed 'plan' event: KeyError('target')",
        ),
        (
            _lines(_plan(labels=("GPU 5", "GPU 6")), run=False),
            "a plan whose GPUs, labels, numbers and owners do not pair up",
        ),
        (_lines(_plan(remedy="format_disk"), run=False), "'format_disk' is not a valid Action"),
    ],
    ids=["nested", "no-target", "unpaired", "unknown-action"],
)
def test_a_node_that_answers_nonsense_while_planning_is_refused_plainly(
    tmp_path: Path,
    keys: Keys,
    node: ExecServer,
    capsys: pytest.CaptureFixture[str],
    planning: str,
    said: str,
) -> None:
    config = head_config(tmp_path, keys, node.port, command=_node_says(tmp_path, planning, ""))
    status, text = _remediate(capsys, config, "--dry-run")
    assert status == 1
    assert f"gpuconsole remediate: {NODE}: its gpuconsole reports in a way this head " in text
    assert said in text and f"check that [remote] command runs gpuconsole on {NODE}" in text


def test_a_plan_for_another_node_is_refused(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _lines(_plan(node="dgx-999"), run=False)
    config = head_config(tmp_path, keys, node.port, command=_node_says(tmp_path, lines, ""))
    status, text = _remediate(capsys, config, "--dry-run")
    assert status == 1
    assert f"{NODE} answered with a plan for dgx-999: it is not the node this head asked" in text


def test_a_step_number_past_any_int_mid_run_is_contact_lost_not_a_crash(
    tmp_path: Path, keys: Keys, node: ExecServer, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan()
    step = {"v": 1, "event": "step", "plan_id": "p1", "state": "done", "detail": ""}
    running = _lines(plan, run=False).replace('{"v": 1, "event": "dry_run"}\n', "")
    running += '{"v": 1, "event": "step", "plan_id": "p1", "seq": 1e400, "state": "done"}\n'
    running += json.dumps({**step, "seq": 0}) + "\n"
    command = _node_says(tmp_path, _lines(plan, run=False), running)
    config = head_config(tmp_path, keys, node.port, command=command)
    status, text = _remediate(capsys, config, "--confirm", "5")
    assert status == 4  # asked to run: the node may have started, and goes on without us
    assert "its progress is unreadable here: malformed 'step' event: OverflowError" in text
    assert "The node ends the plan by itself" in text


def test_each_line_a_node_may_send_reads_as_an_event_or_a_plain_refusal() -> None:
    with pytest.raises(ProgressError, match="nested too deep"):
        read_event("[" * 20_000)
    with pytest.raises(ProgressError, match="OverflowError"):
        read_event('{"v": 1, "event": "step", "plan_id": "p", "seq": 1e400, "state": "done"}')
    assert read_event(f"{OSC52}hi") == Note("\\x1b]52;c;aGk=\\x07hi")
    out = io.StringIO()
    JsonReport(out).plan(_plan())
    shown = read_event(out.getvalue())
    assert isinstance(shown, PlanShown)
    assert shown.plan.steps[0].title == "reset GPU 5 \\x1b]52;c;aGk=\\x07"
    assert shown.plan.preconditions[0].detail == "reset_gpu \\x1b]52;c;aGk=\\x07"
    assert shown.plan.owners == ("pod team-nlp/\\x1b[2Jtrain",)
