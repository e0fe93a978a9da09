"""How a run of `gpuconsole assign` or `gpuconsole remediate` tells its progress: as text for
a person, or, with `--json-progress`, as one JSON object a line for a head that ran it over ssh.

The lines (every one carries "v", the format version, and "event"):

    {"event": "note", "text": ...}                         a line for the person (proposals)
    {"event": "recovered", "plan_id", "state", "message"}  a crash's plan finished or undone
    {"event": "plan", "plan": {...}, "digest": ...}        the plan, preconditions included
    {"event": "dry_run"}                                   nothing was changed, as asked
    {"event": "refused", "message": ...}                   nothing was changed, and why
    {"event": "step", "plan_id", "seq", "state", "detail"} running, done, failed, undoing, undone
    {"event": "outcome", "plan_id", "state", "message"}    how the plan ended

`read_event` turns a line back into a typed event, its text made safe to show (the node's
word is untrusted: a hostile or broken node may send escape sequences or nonsense, which
the head writes out or refuses, never obeys); `plan_digest` names a plan's content,
so that a node can refuse to run anything but the plan its operator was shown. The command's
exit statuses are here too: the node's travels back over ssh, and the head reads it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from gpuconsole.actions.executor import Outcome, StepUpdate
from gpuconsole.actions.journal import PlanState, StepProgress
from gpuconsole.actions.plan import Plan, Precondition
from gpuconsole.facts.verdict import Action
from gpuconsole.readings.base import safe_strings, safe_text

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNKNOWN",
    "EXIT_USAGE",
    "FORMAT",
    "DryRun",
    "Finished",
    "JsonReport",
    "Note",
    "PlanShown",
    "ProgressError",
    "ProgressEvent",
    "Recovered",
    "Refused",
    "Report",
    "StepChanged",
    "TextReport",
    "plan_digest",
    "read_event",
]

FORMAT = 1

# How `gpuconsole assign` exits: done, failed, a usage error, refused (nothing changed)
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
EXIT_UNKNOWN = 4  # a remote plan lost its ssh connection: the node ends it, unseen


class Report(Protocol):
    """Where a run of assign or remediate tells what happens."""

    def note(self, text: str) -> None: ...
    def recovered(self, outcome: Outcome) -> None: ...
    def plan(self, plan: Plan) -> None: ...
    def dry_run(self) -> None: ...
    def refused(self, why: str) -> None: ...
    def step(self, update: StepUpdate) -> None: ...
    def outcome(self, outcome: Outcome) -> None: ...


def plan_digest(plan: Plan) -> str:
    """A short name for what a plan would do, equal on both ends of a JSON round trip."""
    body = json.dumps(plan.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


# --- for a person ---------------------------------------------------------------------

_MARKS = {
    StepProgress.DONE: "ok",
    StepProgress.FAILED: "FAILED",
    StepProgress.UNDOING: "<-",
    StepProgress.UNDONE: "undone",
}


class TextReport:
    """The plan, a line per step as it ticks, the outcome; on a terminal (or any stream)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout  # looked up now: a test's capture replaces it

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def note(self, text: str) -> None:
        self._say(text)

    def recovered(self, outcome: Outcome) -> None:
        self._say(f"journal: plan {outcome.plan_id} {outcome.message}")

    def plan(self, plan: Plan) -> None:
        self._say(plan.describe())

    def dry_run(self) -> None:
        self._say("Dry run: nothing was changed.")

    def refused(self, why: str) -> None:
        self._say(f"Refused: {why}")

    def step(self, update: StepUpdate) -> None:
        if update.state is StepProgress.RUNNING:
            return
        detail = f": {update.detail}" if update.detail else ""
        mark = _MARKS.get(update.state, str(update.state))
        of = f"/{update.total}" if update.total else ""
        self._say(f"  [{update.seq + 1}{of}] {mark} {update.step.title}{detail}")

    def outcome(self, outcome: Outcome) -> None:
        self._say(f"{outcome.state}: {outcome.message} (plan {outcome.plan_id})")


# --- for a head, over ssh ---------------------------------------------------------------


class JsonReport:
    """One JSON object a line on `out`, flushed at once so the head sees each step live."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.gone = False  # the head hung up

    def _write(self, event: str, **body: Any) -> None:
        if self.gone:
            return
        try:
            self.out.write(json.dumps({"v": FORMAT, "event": event, **body}) + "\n")
            self.out.flush()
        except (OSError, ValueError):
            # The head lost its ssh connection: the plan must still run to its end (or roll
            # back) and journal it, so a broken pipe is no reason to stop half-way.
            self.gone = True

    def note(self, text: str) -> None:
        self._write("note", text=text)

    def recovered(self, outcome: Outcome) -> None:
        self._write(
            "recovered", plan_id=outcome.plan_id, state=outcome.state, message=outcome.message
        )

    def plan(self, plan: Plan) -> None:
        body = plan.to_json()
        body["preconditions"] = [
            {"name": p.name, "ok": p.ok, "detail": p.detail, "remedy": p.remedy}
            for p in plan.preconditions
        ]
        self._write("plan", plan=body, digest=plan_digest(plan))

    def dry_run(self) -> None:
        self._write("dry_run")

    def refused(self, why: str) -> None:
        self._write("refused", message=why)

    def step(self, update: StepUpdate) -> None:
        self._write(
            "step",
            plan_id=update.plan_id,
            seq=update.seq,
            state=update.state,
            detail=update.detail,
        )

    def outcome(self, outcome: Outcome) -> None:
        self._write(
            "outcome", plan_id=outcome.plan_id, state=outcome.state, message=outcome.message
        )


# --- reading it back ---------------------------------------------------------------------


class ProgressError(ValueError):
    """A line the head cannot use: a newer format (`newer`), or a malformed event."""

    def __init__(self, message: str, *, newer: bool = False) -> None:
        super().__init__(message)
        self.newer = newer


@dataclass(frozen=True, slots=True)
class Note:
    """A line for the person (also any line that is not JSON: a login script's chatter)."""

    text: str


@dataclass(frozen=True, slots=True)
class Recovered:
    """The node finished or rolled back a plan a crash had left in its journal."""

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class PlanShown:
    """The node's plan, with its preconditions, and the digest that names it."""

    plan: Plan
    digest: str


@dataclass(frozen=True, slots=True)
class DryRun:
    """Nothing was changed, as asked."""


@dataclass(frozen=True, slots=True)
class Refused:
    """Nothing was changed: a precondition failed, the confirmation was wrong, ..."""

    message: str


@dataclass(frozen=True, slots=True)
class StepChanged:
    """A step of the running plan changed state."""

    plan_id: str
    seq: int
    state: StepProgress
    detail: str


@dataclass(frozen=True, slots=True)
class Finished:
    """How the plan ended on the node."""

    outcome: Outcome


ProgressEvent = Note | Recovered | PlanShown | DryRun | Refused | StepChanged | Finished


def _plan(body: dict[str, Any]) -> Plan:
    plan = Plan.from_json(body)
    conditions = tuple(
        Precondition(str(p["name"]), bool(p["ok"]), str(p["detail"]), str(p.get("remedy", "")))
        for p in body.get("preconditions", ())
    )
    # from_json drops preconditions (the journal keeps only what ran): put them back
    plan = dataclasses.replace(plan, preconditions=conditions)
    per_gpu = (plan.labels, plan.indexes, plan.owners)
    if any(len(values) != len(plan.gpus) for values in per_gpu) or len(plan.uuids) not in (
        0,
        len(plan.gpus),
    ):
        raise ValueError("a plan whose GPUs, labels, numbers and owners do not pair up")
    if plan.remedy:
        Action(plan.remedy)  # ValueError for an action this version does not know
    return plan


def read_event(line: str) -> ProgressEvent | None:
    """The event a line carries; None for an event this version does not know (a newer
    node may say more). ProgressError for a newer format or a malformed event, one with a
    step or plan state this version does not know among them."""
    text = line.rstrip("\r\n")
    if not text.strip():
        return None
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return Note(safe_text(text))
    except RecursionError:  # nested past what the decoder follows: no event is
        raise ProgressError("a line nested too deep to read") from None
    if not isinstance(body, dict) or "event" not in body:
        return Note(safe_text(text))
    version = body.get("v")
    if not isinstance(version, int) or version > FORMAT:
        shown = safe_text(repr(version)[:40])
        raise ProgressError(
            f"progress format {shown}; this gpuconsole reads {FORMAT}",
            newer=isinstance(version, int),
        )
    try:
        event = _event(body)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        what = safe_text(repr(body.get("event"))[:40])
        raise ProgressError(f"malformed {what} event: {safe_text(repr(exc)[:200])}") from None
    return safe_strings(event)


def _event(body: dict[str, Any]) -> ProgressEvent | None:
    kind = body["event"]
    if kind == "note":
        return Note(str(body["text"]))
    if kind == "recovered":
        return Recovered(_outcome(body, recovered=True))
    if kind == "plan":
        return PlanShown(_plan(body["plan"]), str(body["digest"]))
    if kind == "dry_run":
        return DryRun()
    if kind == "refused":
        return Refused(str(body["message"]))
    if kind == "step":
        return StepChanged(
            str(body["plan_id"]),
            int(body["seq"]),
            StepProgress(body["state"]),
            str(body["detail"]),
        )
    if kind == "outcome":
        return Finished(_outcome(body))
    return None


def _outcome(body: dict[str, Any], *, recovered: bool = False) -> Outcome:
    state = PlanState(body["state"])
    return Outcome(str(body["plan_id"]), state, str(body["message"]), recovered)
