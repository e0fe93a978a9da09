"""Runs plans: checks who asks where the action executes, locks the GPUs, audits the start
(or refuses, when it cannot), journals each step before and after it runs, audits the
outcome, posts events, and recovers after a crash.

Events go to `emit`: a hub's `post_event` (safe from any thread) puts every refusal, start,
step and outcome in the Events view of the process that runs the plan.

Recovery is deterministic. A plan left running by a dead process is rolled back when no
step that changes anything had completed (or when it was already rolling back, or a step
before the final check had failed, so that it was about to), and finished otherwise: every step is idempotent, so the interrupted one simply runs again, and a check that found the GPUs idle before the crash runs again before a step that acts on them.
A step that fails puts back what the plan changed, in reverse, except an evicted pod; a
failed final check leaves the GPUs where they are and says what to look at. A remediation
(gpuconsole.actions.remediation) puts nothing back, so a GPU under repair stays drained,
audits each step, and says what to do next; recovery never sends a power cycle twice.

Nothing runs unjournaled. A journal write that fails half-way (a full disk) stops the plan
there, as a crash would: no rollback, which recovery could not tell from the journal, and
which would need the journal too. Its GPUs stay locked, handed over to recovery, and the
outcome says what was done, what recovery will do, and to run `gpuconsole assign --recover`
once there is space; any process's recovery then finishes or rolls back the plan.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuconsole import format as fmt
from gpuconsole.actions.audit import AuditLog, AuditRecord
from gpuconsole.actions.drivers import Drivers, StepFailed
from gpuconsole.actions.journal import (
    Journal,
    JournalCorrupt,
    Phase,
    PlanRecord,
    PlanState,
    StepProgress,
    StepRecord,
    StepState,
)
from gpuconsole.actions.locks import GpuBusy, lock_and_start
from gpuconsole.actions.plan import (
    Plan,
    PlanContext,
    Step,
    StepKind,
    Target,
    make_plan,
    owners_of,
)
from gpuconsole.actions.remediation import (
    busy_owners,
    escalation,
    guest_owner,
    make_remediation_plan,
    remedy_words,
    verdict_action,
)
from gpuconsole.actions.roles import ActionRefused, Actor, Role
from gpuconsole.facts.verdict import Action
from gpuconsole.readings.base import Event, Severity, safe_text
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.base import EmitEvent
from gpuconsole.sources.boot import boot as boot_of
from gpuconsole.sources.boot import boot_id

__all__ = [
    "ACTION_EVENT",
    "STEP_EVENT",
    "CannotRecover",
    "Executor",
    "Outcome",
    "PlanExecutor",
    "StepUpdate",
    "action_event",
    "outcome_severity",
    "recovery_words",
    "step_message",
    "stopped_where",
]

log = logging.getLogger(__name__)

# Events an executor posts: source "actions", kind "action" for a refusal, start, outcome or
# recovery (each also an audit record), "action_step" for each step done, failed or undone.
EVENT_SOURCE = "actions"
ACTION_EVENT = "action"
STEP_EVENT = "action_step"

Reader = Callable[[], Awaitable[NodeSnapshot]]


def action_event(
    plan: Plan, at: float, severity: Severity, message: str, kind: str = ACTION_EVENT
) -> Event:
    """An event about a plan, tied to its GPU when it moves one, and to each of its GPUs
    (by bus id and UUID) when it moves several: each GPU's events show what touched it."""
    if len(plan.gpus) > 1:
        uuids = plan.uuids if len(plan.uuids) == len(plan.gpus) else ("",) * len(plan.gpus)
        return Event(
            at,
            plan.node,
            EVENT_SOURCE,
            kind,
            severity,
            message,
            gpu_bus_ids=plan.gpus,
            gpu_uuids=uuids,
        )
    index = plan.indexes[0] if len(plan.indexes) == 1 else None
    uuid = next((s.uuids[0] for s in plan.steps if s.uuids and s.uuids[0]), None)
    return Event(
        at,
        plan.node,
        EVENT_SOURCE,
        kind,
        severity,
        message,
        gpu_index=index,
        gpu_uuid=uuid if len(plan.gpus) == 1 else None,
        gpu_bus_id=plan.gpus[0] if len(plan.gpus) == 1 else None,
    )


def step_message(
    plan: Plan, plan_id: str, seq: int, state: StepProgress, detail: str = ""
) -> tuple[Severity, str]:
    """How the Events view tells that a step is done, failed or undone."""
    bad = state in (StepProgress.FAILED, StepProgress.UNDONE)
    severity = Severity.WARNING if bad else Severity.INFO
    title = plan.steps[seq].title if seq < len(plan.steps) else f"step {seq + 1}"
    text = f"{plan.action} (plan {plan_id}) step {seq + 1}/{len(plan.steps)} "
    return severity, text + f"{state}: {title}" + (f": {detail}" if detail else "")


def outcome_severity(state: PlanState) -> Severity:
    """done: info; rolled back, refused or interrupted (the node rebooted under it): a
    warning; failed or stopped (half-way): critical."""
    if state is PlanState.DONE:
        return Severity.INFO
    return Severity.CRITICAL if state in (PlanState.FAILED, PlanState.STOPPED) else Severity.WARNING


class CannotRecover(Exception):
    """Recovery could not take the plans a stopped process left: the journal cannot be
    written. Their GPUs stay locked; nothing else is affected."""


class _Unjournaled(Exception):
    """The journal could not record step `seq` of `phase` (do, undo; before or after it ran)
    or, with neither, the plan's `end`: the plan stops there."""

    def __init__(
        self, cause: sqlite3.Error, seq: int | None, phase: Phase | None, ran: bool, end: str = ""
    ) -> None:
        super().__init__(str(cause))
        self.cause, self.seq, self.phase, self.ran, self.end = cause, seq, phase, ran, end


async def _said(words: Awaitable[str]) -> str:
    """What a step's driver says (its words, or StepFailed's), written out: it comes from
    outside (a Kubernetes API server or its admission webhooks, libvirt, a BMC, a tool's
    output) and goes to the journal, the audit log, the events and the operator's
    terminal."""
    try:
        return safe_text(await words)
    except StepFailed as exc:
        raise StepFailed(safe_text(str(exc))) from None


def _recovery_course(record: PlanRecord) -> tuple[bool, int]:
    """What recovery does with a plan the journal left running: (roll it back?, the last
    step attempted, -1 for none). Back when it was rolling back, or about to (a step other
    than the final check had failed), or had changed nothing."""
    plan = record.plan
    done = _done(record.steps, Phase.DO)
    last = max((s.seq for s in record.steps), default=-1)
    rolling_back = any(
        s.phase is Phase.UNDO
        or (s.state is StepState.FAILED and plan.steps[s.seq].kind is not StepKind.VERIFY)
        for s in record.steps
    )
    return rolling_back or not any(plan.steps[s].kind.mutates for s in done), last


def _checks_to_repeat(
    plan: Plan, done: frozenset[int], attempted: frozenset[int]
) -> frozenset[int]:
    """The checks done before a crash (idle, nothing left on the GPUs) that a step recovery
    will run relies on: they vouched for the node then, not now, so recovery runs them
    again before that step changes anything (a tenant may have come since). A power cycle
    under way at the crash is not sent again, so nothing waits for it (its node may well
    run again after it)."""
    todo = [
        s
        for s, step in enumerate(plan.steps)
        if s not in done and step.kind.mutates and (s not in attempted or step.kind.repeatable)
    ]
    return frozenset(
        s
        for s in done
        if plan.steps[s].kind in (StepKind.CHECK_IDLE, StepKind.WAIT_IDLE)
        and any(t > s for t in todo)
    )


@dataclass(slots=True)
class _Boot:
    """The node's boot a running plan's last step ran in (its boot id; '' where unknown), and
    whether the plan has sent its own power cycle since: the reboot that follows is the
    plan's, any other one happened under it."""

    id: str
    cycled: bool = False
    rebooted: str = ""  # the reboot its power cycle made, in words, once seen


def _boot_of(record: PlanRecord) -> _Boot:
    """Where a plan the journal left running stood: the boot of its last step attempt, and
    whether it had attempted its power cycle by then."""
    cycled = any(s.phase is Phase.DO and s.kind == StepKind.POWER_CYCLE.value for s in record.steps)
    return _Boot(record.steps[-1].boot_id if record.steps else "", cycled)


def _reboot_words(node: str, old: str, new: str, booted_at: float | None, since: float) -> str:
    """'dgx-003 rebooted (boot id 5f0c1d2e… → 9a7b3c4d…, up since 04:12:09)': when it booted
    where the kernel's boot time is one after `since` (the plan's start)."""
    shown = booted_at is not None and booted_at >= since
    at = f", up since {fmt.clock_time(booted_at)}" if shown else ""
    # the old one is the journal's word: a hand may have put anything there
    return f"{node} rebooted (boot id {safe_text(old[:8])}… → {safe_text(new[:8])}…{at})"


def stopped_where(record: PlanRecord) -> str:
    """Where a plan the journal left running stopped: 'at step 4 (reset GPU 5 ...)'."""
    last = max((s.seq for s in record.steps), default=-1)
    if last < 0:
        return "before its first step"
    return f"at step {last + 1} ({record.plan.steps[last].title})"


def recovery_words(record: PlanRecord, boot_now: str) -> str:
    """What recovery does with a plan a stopped process left running, in words ('finishes
    it from step 4 (...)'), the node now in boot `boot_now` ('' where not known)."""
    plan = record.plan
    back, _last = _recovery_course(record)
    boot = _boot_of(record)
    rebooted = bool(boot.id and boot_now and boot.id != boot_now)
    if back:
        if plan.remedy:
            return "ends it, keeping what it did (a remediation puts nothing back)"
        return "rolls it back"
    if rebooted and boot.cycled:
        return (
            f"finishes it: its power cycle went through ({plan.node} rebooted since, "
            "and is not power-cycled again), and its final check reads the GPUs afresh"
        )
    if rebooted and plan.remedy:
        return (
            f"ends it interrupted: {plan.node} rebooted under it, so none of its steps "
            "runs again; its GPUs are read afresh"
        )
    if rebooted:
        return f"rolls it back: {plan.node} rebooted under it"
    done = frozenset(_done(record.steps, Phase.DO))
    todo = next((k for k in range(len(plan.steps)) if k not in done), None)
    if todo is None:
        return "finishes it: every step is done"
    attempted = frozenset(s.seq for s in record.steps) - done
    again = " (its checks that the GPUs are idle run again first)" * bool(
        _checks_to_repeat(plan, done, attempted)
    )
    return f"finishes it from step {todo + 1} ({plan.steps[todo].title}){again}"


def _done(steps: Sequence[StepRecord], phase: Phase) -> set[int]:
    """The steps whose attempts in `phase` the journal holds as done."""
    return {s.seq for s in steps if s.phase is phase and s.state is StepState.DONE}


@dataclass(frozen=True, slots=True)
class StepUpdate:
    """A step changed state: running, done, failed, undoing, undone. `total`: the steps of
    its plan (a plan recovered from the journal is one its report never showed)."""

    plan_id: str
    seq: int
    step: Step
    state: StepProgress
    detail: str = ""
    total: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a plan ended: done, failed, rolled back; and what to tell the person."""

    plan_id: str
    state: PlanState
    message: str
    recovered: bool = False

    @property
    def ok(self) -> bool:
        return self.state is PlanState.DONE


class PlanExecutor(Protocol):
    """What moves one node's GPUs: this machine's `Executor`, or a `RemoteExecutor` that asks
    the node's own gpuconsole over ssh (gpuconsole.actions.over_ssh)."""

    node: str

    async def recover(self) -> list[Outcome]:
        """Plans a crash left unfinished, finished or rolled back (over ssh: by the node, as
        it last planned or ran); what became of each."""

    async def plan(self, keys: Sequence[str], target: Target) -> Plan:
        """A plan from a fresh reading of the node; nothing changes."""

    async def plan_remedy(self, key: str, action: Action | None = None) -> Plan:
        """A remediation plan for one GPU from a fresh reading: `action`, or the one the
        node's verdict calls for; nothing changes."""

    async def execute(self, plan: Plan, actor: Actor, confirm: str) -> Outcome:
        """Run `plan` for `actor`, who typed `confirm`; ActionRefused when nothing ran."""

    async def close(self) -> None:
        """Let go of what the executor holds open (a journal, an ssh connection)."""


class Executor:
    """Executes plans for one node through its drivers."""

    def __init__(
        self,
        node: str,
        drivers: Drivers,
        journal: Journal,
        audit: AuditLog,
        *,
        reader: Reader | None = None,
        emit: EmitEvent | None = None,
        on_step: Callable[[StepUpdate], None] | None = None,
        clock: Callable[[], float] = time.time,
        idle_timeout_s: float = 600.0,
        settle_s: float = 300.0,
        poll_s: float = 2.0,
    ) -> None:
        """`idle_timeout_s`: how long a remediation waits for a GPU's owners to go;
        `settle_s`: for a reset or power-cycled GPU to answer again; `poll_s`: between reads."""
        self.node = node
        self.drivers = drivers
        self.journal = journal
        self.audit = audit
        self.reader = reader
        self.emit = emit
        self.on_step = on_step
        self.clock = clock
        self.idle_timeout_s = idle_timeout_s
        self.settle_s = settle_s
        self.poll_s = poll_s
        self._actors: dict[str, Actor] = {}  # who runs each plan: a remediation audits each step
        self._since: dict[str, float] = {}  # when each plan began: XIDs after it count against it
        self._boots: dict[str, _Boot] = {}  # the node's boot each running plan is in

    async def close(self) -> None:
        self.journal.close()

    # --- planning --------------------------------------------------------------------

    async def context(self) -> PlanContext:
        drivers = self.drivers
        kube = drivers.kubernetes
        cordoned = await kube.cordoned() if kube is not None else frozenset()
        return PlanContext(
            kubernetes=kube is not None,
            cordoned=cordoned,
            slurm=drivers.slurm is not None,
            gpu_reset=drivers.gpu is not None,
            bmc=drivers.bmc is not None,
        )

    async def plan_remedy(self, key: str, action: Action | None = None) -> Plan:
        """A remediation plan for one GPU from a fresh reading: `action`, or the one its
        verdict now calls for."""
        if self.reader is None:
            raise RuntimeError("this executor has no reader to plan from")
        node = await self.reader()
        if action is None:
            action = verdict_action(node, key)
        return make_remediation_plan(node, key, action, await self.context())

    async def _replan(self, plan: Plan) -> Plan:
        assert self.reader is not None
        node, ctx = await self.reader(), await self.context()
        if plan.remedy:
            return make_remediation_plan(node, plan.gpus[0], Action(plan.remedy), ctx)
        return make_plan(node, plan.gpus, plan.target, ctx)

    async def plan(self, keys: Sequence[str], target: Target) -> Plan:
        """A plan from a fresh reading of the node."""
        if self.reader is None:
            raise RuntimeError("this executor has no reader to plan from")
        return make_plan(await self.reader(), keys, target, await self.context())

    # --- records -------------------------------------------------------------------

    def _audit(
        self, plan: Plan, actor: Actor, outcome: str, detail: str, plan_id: str = ""
    ) -> None:
        self.audit.append(
            AuditRecord(
                at=self.clock(),
                user=actor.user,
                role=actor.role.value,
                action=plan.action,
                target=f"{plan.node}: {', '.join(plan.labels) or ', '.join(plan.gpus)}",
                outcome=outcome,
                detail=detail,
                args={
                    "plan_id": plan_id,
                    "node": plan.node,
                    "gpus": list(plan.gpus),
                    "uuids": list(plan.uuids),
                    "target": str(plan.target),
                    **({"remedy": plan.remedy} if plan.remedy else {}),
                    **actor.audit_args(),
                    "steps": [s.title for s in plan.steps],
                    "preconditions": [str(p) for p in plan.preconditions],
                },
                key_fingerprint=actor.key_fingerprint,
            )
        )

    def _event(
        self, plan: Plan, severity: Severity, message: str, kind: str = ACTION_EVENT
    ) -> None:
        if self.emit is not None:
            self.emit(action_event(plan, self.clock(), severity, message, kind))

    def _notify(
        self,
        plan: Plan,
        plan_id: str,
        seq: int,
        step: Step,
        state: StepProgress,
        detail: str = "",
    ) -> None:
        if self.on_step is not None:
            self.on_step(StepUpdate(plan_id, seq, step, state, detail, len(plan.steps)))
        if state.started:
            return  # its outcome follows; one event per step is enough in the Events view
        severity, text = step_message(plan, plan_id, seq, state, detail)
        self._event(plan, severity, text, STEP_EVENT)
        actor = self._actors.get(plan_id)
        if plan.remedy and actor is not None:
            # a repair is looked back on step by step: each in the audit log, with the GPU's
            # bus id and UUID (its args)
            title = f"step {seq + 1}/{len(plan.steps)} {state}: {step.title}"
            self._audit_after(plan, actor, f"step {state}", f"{title}: {detail}", plan_id)

    def _audit_after(
        self, plan: Plan, actor: Actor, outcome: str, detail: str, plan_id: str
    ) -> str:
        """Audit what already happened; a note for the person when the log cannot take it."""
        try:
            self._audit(plan, actor, outcome, detail, plan_id)
        except OSError as exc:
            log.error("%s (plan %s) %s, not audited: %s", plan.action, plan_id, outcome, exc)
            return f" (not audited: {self.audit.cannot_write(exc)}; the journal holds it)"
        return ""

    def _refuse(self, plan: Plan, actor: Actor, why: str, *, audit: bool = True) -> ActionRefused:
        """A refusal, audited unless the audit log is why; nothing was done either way."""
        if audit:
            try:
                self._audit(plan, actor, "refused", why)
            except OSError as exc:  # the refusal stands, unaudited
                log.error("%s refused (%s), not audited: %s", plan.action, why, exc)
        self._event(plan, Severity.WARNING, f"{actor.who} was refused {plan.action}: {why}")
        return ActionRefused(why)

    def _release(self, plan_id: str, why: str) -> str:
        """Mark a plan that never ran refused, which frees its GPUs; a note when it cannot."""
        try:
            self.journal.finish_plan(plan_id, PlanState.REFUSED, why)
        except sqlite3.Error as exc:
            log.error("plan %s, refused (%s), not journaled: %s", plan_id, why, exc)
            self.journal.hand_over(plan_id)
            return (
                f"; {self.journal.cannot_write(exc)} either: plan {plan_id} keeps its GPUs "
                f"locked (none of its steps ran) until `gpuconsole assign --recover` on "
                f"{self.node} releases them, once there is space"
            )
        return ""

    # --- journaling steps: a failed write stops the plan ----------------------------

    def _intent(self, plan_id: str, seq: int, step: Step, phase: Phase = Phase.DO) -> int:
        try:
            return self.journal.intent(plan_id, seq, step.kind.value, phase)
        except sqlite3.Error as exc:
            raise _Unjournaled(exc, seq, phase, ran=False) from exc

    def _result(self, row: int, seq: int, phase: Phase, state: StepState, detail: str) -> None:
        try:
            self.journal.result(row, state, detail)
        except sqlite3.Error as exc:
            raise _Unjournaled(exc, seq, phase, ran=True) from exc

    def _finish(self, plan_id: str, state: PlanState, message: str) -> None:
        try:
            self.journal.finish_plan(plan_id, state, message)
        except sqlite3.Error as exc:
            raise _Unjournaled(exc, None, None, True, f"{state}: {message}") from exc

    def _stopped(
        self, plan_id: str, plan: Plan, actor: Actor, stop: _Unjournaled, recovered: bool
    ) -> Outcome:
        """Hand a plan the journal failed half-way over to recovery, and say so."""
        marked = self.journal.hand_over(plan_id)
        message = self._stop_message(plan_id, plan, stop, marked)
        log.error("%s (plan %s) stopped: %s", plan.action, plan_id, stop)
        message += self._audit_after(plan, actor, "stopped", message, plan_id)
        self._event(plan, Severity.CRITICAL, f"{plan.action} (plan {plan_id}) {message}")
        return Outcome(plan_id, PlanState.STOPPED, message, recovered)

    def _stop_message(self, plan_id: str, plan: Plan, stop: _Unjournaled, marked: bool) -> str:
        """Where the plan stopped, what it changed, what stays locked, and what to run."""
        cannot = self.journal.cannot_write(stop.cause)
        try:
            record = self.journal.plan(plan_id)  # reading needs no space
        except sqlite3.Error:
            record = None
        steps = record.steps if record is not None else ()
        done, undone = _done(steps, Phase.DO), _done(steps, Phase.UNDO)
        if stop.seq is None:
            text = f"stopped after its end ({stop.end}): {cannot} to record it"
        else:
            title = plan.steps[stop.seq].title
            if stop.phase is Phase.UNDO:
                title = f"undoing {title}"
                if stop.ran:
                    undone.add(stop.seq)
            elif stop.ran:
                done.add(stop.seq)
            where = f"stopped at step {stop.seq + 1}/{len(plan.steps)} ({title})"
            ran = f"it ran, but {cannot} to record it" if stop.ran else f"before it ran: {cannot}"
            text = f"{where}: {ran}; nothing runs unjournaled"
        changed = [plan.steps[s].title for s in sorted(done - undone) if plan.steps[s].kind.mutates]
        text += ". " + (
            f"Done and not undone: {'; '.join(changed)}" if changed else "Nothing was changed"
        )
        labels = ", ".join(plan.labels) or ", ".join(plan.gpus)
        verb = "stays" if len(plan.gpus) == 1 else "stay"
        text += f". {labels} {verb} locked for plan {plan_id}, so that nothing else moves "
        text += "them half-way" if len(plan.gpus) > 1 else "it half-way"
        if record is None:
            course = "finish the plan or roll it back"
        elif _recovery_course(record)[0]:
            course = "roll the plan back"
        else:
            course = f"finish the plan ({labels} to {plan.target})"
        text += f". Free space on the disk of {self.journal.path}, then run `gpuconsole assign "
        text += "--recover` "
        if marked:
            return text + f"on {self.node} (or open its assign view again): it will {course}"
        # unmarked, the plan is this live process's to every other process
        return text + (
            f"on {self.node} after this process ends, or open the assign view of {self.node} "
            f"again in this console: either will {course}"
        )

    # --- executing -------------------------------------------------------------------

    async def execute(self, plan: Plan, actor: Actor, confirm: str) -> Outcome:
        """Run a plan for `actor`, who confirmed it by typing `confirm`.

        Raises ActionRefused, with nothing changed, for a viewer, a wrong confirmation, a
        failed precondition, a GPU another action holds, a node that changed since, or a
        journal or audit log that cannot be written. A journal that fails once steps run
        stops the plan there: the outcome is "stopped", its GPUs left locked to recovery.
        """
        if not actor.role.may_act:
            raise self._refuse(
                plan, actor, f"role {actor.role.value} may not act; operators and admins may"
            )
        if confirm.strip() not in plan.confirmations():
            why = f"confirmation {confirm!r} does not match {plan.confirmation_words(quoted=True)}"
            raise self._refuse(plan, actor, why)
        if plan.blocked:
            raise self._refuse(plan, actor, "; ".join(str(p) for p in plan.failed))
        try:
            plan_id = lock_and_start(
                self.journal, plan, actor.user, actor.role.value, actor.key_fingerprint
            )
        except GpuBusy as exc:
            raise self._refuse(plan, actor, str(exc)) from None
        except sqlite3.Error as exc:  # the transaction rolled back: no plan, no lock
            why = f"{self.journal.cannot_write(exc)}, so {plan.action} was not started"
            raise self._refuse(plan, actor, why) from None
        if self.reader is not None:
            # under the lock: the node may have changed since the plan was shown
            fresh = await self._replan(plan)
            if fresh.blocked or fresh.steps != plan.steps:
                why = "; ".join(str(p) for p in fresh.failed) or "the steps it needs changed"
                kept = self._release(plan_id, why)
                raise self._refuse(plan, actor, f"the node changed since the plan: {why}{kept}")
        try:  # nothing acts unaudited
            self._audit(plan, actor, "started", "", plan_id)
        except OSError as exc:
            why = f"{self.audit.cannot_write(exc)}, so {plan.action} was not started"
            why += self._release(plan_id, why)
            raise self._refuse(plan, actor, why, audit=False) from None
        self._event(plan, Severity.INFO, f"{actor.who} started {plan.action}: {plan_id}")
        self._actors[plan_id], self._since[plan_id] = actor, self.clock()
        self._boots[plan_id] = _Boot(boot_id(self.journal.proc_root))
        try:
            state, message = await self._run(plan_id, plan, frozenset())
            self._finish(plan_id, state, message)
        except _Unjournaled as stop:
            return self._stopped(plan_id, plan, actor, stop, recovered=False)
        except Exception:
            self.journal.hand_over(plan_id)  # not running here any more: recovery's to end
            raise
        finally:
            self._actors.pop(plan_id, None)
            self._since.pop(plan_id, None)
            self._boots.pop(plan_id, None)
        outcome = {PlanState.DONE: "ok", PlanState.FAILED: "failed"}.get(state, str(state))
        message += self._audit_after(plan, actor, outcome, message, plan_id)
        self._event(plan, outcome_severity(state), f"{plan.action} by {actor.user}: {message}")
        return Outcome(plan_id, state, message)

    async def _do(self, plan_id: str, plan: Plan, step: Step) -> str:
        if step.kind is StepKind.VERIFY:
            if plan.remedy:
                return await self._verify_remedy(plan, step, self._since.get(plan_id, 0.0))
            return await self._verify(step)
        if step.kind is StepKind.WAIT_IDLE:
            return await self._wait_idle(step)
        if step.kind in (StepKind.NOTIFY, StepKind.MARK_SERVICE):
            return self._tell(plan, step)
        assert step.layer is not None
        return await self.drivers.for_layer(step.layer).run(step)

    def _tell(self, plan: Plan, step: Step) -> str:
        """A step that is a message: to a guest's tenant, or that a GPU goes for service.
        gpuconsole has no channel into a guest: the Events view and the audit log carry it."""
        self._event(plan, Severity.WARNING, f"{plan.action}: {step.title}")
        if step.kind is StepKind.NOTIFY:
            return f"told in the Events view and the audit log (guest {step.guest})"
        return "marked in the Events view and the audit log"

    async def _wait_idle(self, step: Step) -> str:
        """Until the GPUs have no busy owner left and the NVLink peers of their workload
        none of it, as a reading that knows who holds them says; StepFailed after
        idle_timeout_s, the drains kept."""
        assert self.reader is not None
        deadline = time.monotonic() + self.idle_timeout_s
        while True:
            node = await self.reader()
            ownership = owners_of(node)
            left = []
            # a guest or pod not seen because its source did not answer is not gone
            tenancy = node.status("tenancy")
            if node.tenancy is None or (tenancy is not None and not tenancy.ok):
                why = tenancy.error if tenancy is not None and tenancy.error else "no reading"
                left.append(f"who holds the GPUs is not known ({why})")
            for bus in step.gpus:
                gpu = ownership.gpu(bus)
                if gpu is not None:
                    left += [f"{o.label} on {bus}" for o in busy_owners(gpu)]
            for bus in step.functions:
                peer = ownership.gpu(bus)
                if peer is not None:
                    left += [
                        f"{o.label} on NVLink peer {bus}"
                        for o in busy_owners(peer)
                        if o.label in step.owners
                    ]
            # a guest the plan waits for that holds none of these GPUs (a power cycle's)
            for guest in node.tenancy.guests if node.tenancy is not None else ():
                label = guest_owner(guest).label
                held = any(x.startswith(f"{label} on ") for x in left)
                if guest.active and label in step.owners and not held:
                    left.append(f"{label} ({guest.state})")
            if not left:
                return "idle: " + (
                    f"{', '.join(step.owners)} gone" if step.owners else "nothing ran"
                )
            if time.monotonic() >= deadline:
                raise StepFailed(
                    f"still busy after {self.idle_timeout_s:g} s: {', '.join(left)}; the drains "
                    "stay, so nothing new starts: ask again once it is idle"
                )
            await asyncio.sleep(self.poll_s)

    async def _verify_remedy(self, plan: Plan, step: Step, since: float) -> str:
        """A fresh reading: the GPU answers NVML with nothing against it since the plan
        began (`_unfit`); for a GPU taken out of work, that it is unbound and nothing may
        bind it. Read again for settle_s: a reset or power-cycled GPU takes a while."""
        if step.driver is None:
            return await self.drivers.pci.run(step)
        assert self.reader is not None
        if step.driver != "nvidia":  # a guest's GPU: only the guest's driver can read it
            return await self.drivers.pci.run(step)
        deadline = time.monotonic() + self.settle_s
        while True:
            try:
                node = await self.reader()
                # every GPU the step names: those reset in one command with it too
                problem = next(
                    (p for bus in step.gpus if (p := _unfit(node, bus, since)) is not None), None
                )
            except Exception as exc:  # a node still booting answers nothing
                problem = f"no reading yet ({exc})"
            if problem is None:
                verb = "answers" if len(step.gpus) == 1 else "answer"
                return (
                    f"{', '.join(step.gpus)} {verb} NVML: no XID since, no recovery action, "
                    "no remap pending"
                )
            if time.monotonic() >= deadline:
                after = escalation(Action(plan.remedy))
                then = f"; next: {after.value} ({remedy_words(after)})" if after else ""
                raise StepFailed(f"{problem}{then}")
            await asyncio.sleep(self.poll_s)

    async def _verify(self, step: Step) -> str:
        words = [await self.drivers.pci.run(step)]
        if step.driver != "nvidia" or self.reader is None:
            return "; ".join(words)
        node = await self.reader()
        problems = []
        by_uuid = {g.uuid: g for g in node.gpus}
        by_bus = {g.pci_bus_id: g for g in node.gpus}
        for k, bus in enumerate(step.gpus):
            # a GPU planned from vfio-pci or unbound had no UUID yet: find it by its bus id
            uuid = step.uuids[k] if k < len(step.uuids) else ""
            gpu = by_uuid.get(uuid) if uuid else by_bus.get(bus)
            if gpu is None:
                problems.append(f"{uuid or bus} is not visible to NVML")
                continue
            uuid = gpu.uuid
            if gpu.fabric_state not in (None, "completed", "not_supported"):
                problems.append(f"{uuid}: fabric state {gpu.fabric_state}, not completed")
            before = step.xids[k] if k < len(step.xids) else -1
            xid = node.last_xid.get(uuid, -1)
            if xid != before:
                problems.append(f"{uuid}: new XID {xid}")
            if gpu.ecc.remap_pending:
                problems.append(f"{uuid}: a row remap is pending (reset the GPU again)")
        if problems:
            raise StepFailed("; ".join(problems))
        return "; ".join([*words, "NVML sees every UUID, fabric complete, no new XID"])

    async def _run(
        self,
        plan_id: str,
        plan: Plan,
        done: frozenset[int],
        attempted: frozenset[int] = frozenset(),
    ) -> tuple[PlanState, str]:
        notes = []
        for seq, step in enumerate(plan.steps):
            if seq in done:
                continue
            under = self._rebooted(plan_id, plan)
            if under:
                # what the steps before did in the last boot may be gone with it, and what
                # they checked no longer holds: the plan does not go on
                return await self._cut_short(plan_id, plan, seq, under)
            if seq in attempted and not step.kind.repeatable:
                # it may have gone through before the crash: never twice
                boot = self._boots.get(plan_id)
                seen = boot.rebooted if boot is not None else ""
                notes.append(
                    f"step {seq + 1} ({step.title}) was under way when the process stopped "
                    "and is not sent again: "
                    + (f"it went through: {seen}" if seen else "check that it happened")
                )
                self._notify(plan, plan_id, seq, step, StepProgress.DONE, notes[-1])
                continue
            self._notify(plan, plan_id, seq, step, StepProgress.RUNNING)
            row = self._intent(plan_id, seq, step)
            if step.kind is StepKind.POWER_CYCLE and plan_id in self._boots:
                self._boots[plan_id].cycled = True  # the reboot that follows is the plan's
            try:
                detail = await _said(self._do(plan_id, plan, step))
            except StepFailed as exc:
                self._result(row, seq, Phase.DO, StepState.FAILED, str(exc))
                self._notify(plan, plan_id, seq, step, StepProgress.FAILED, str(exc))
                if plan.remedy:
                    return PlanState.FAILED, _remedy_failed(plan, seq, step, str(exc))
                if step.kind is StepKind.VERIFY:
                    return PlanState.FAILED, (
                        f"the GPUs moved but the final check failed: {exc}; look at them "
                        "(nvidia-smi -q) and drain them if it stays so"
                    )
                rolled = await self._rollback(plan_id, plan, seq)
                return PlanState.FAILED, f"step {seq + 1} ({step.title}) failed: {exc}; {rolled}"
            self._result(row, seq, Phase.DO, StepState.DONE, detail)
            self._notify(plan, plan_id, seq, step, StepProgress.DONE, detail)
        if plan.remedy:
            text = f"{', '.join(plan.labels)}: {remedy_words(Action(plan.remedy))}: done"
        else:
            text = f"{', '.join(plan.labels)} now {plan.target}"
        return PlanState.DONE, "; ".join([text, *notes])

    def _rebooted(self, plan_id: str, plan: Plan) -> str:
        """How the node rebooted under the plan since its last step, in words; '' where it
        did not (or where a boot id is not known), or where the reboot is the plan's own
        power cycle, which is taken in (a later one would be under it)."""
        boot = self._boots.get(plan_id)
        if boot is None:
            return ""
        now, booted_at = boot_of(self.journal.proc_root)
        if not now or now == boot.id or not boot.id:
            boot.id = boot.id or now
            return ""
        words = _reboot_words(plan.node, boot.id, now, booted_at, self._since.get(plan_id, 0.0))
        boot.id = now
        if boot.cycled:
            boot.cycled, boot.rebooted = False, words
            return ""
        return words

    async def _cut_short(
        self, plan_id: str, plan: Plan, seq: int, rebooted: str
    ) -> tuple[PlanState, str]:
        """The node rebooted under the plan before step `seq`: a reassignment is rolled back
        (each undo puts back what was there before, which a reboot need not have); a
        remediation, which puts nothing back, is interrupted, and says how its GPUs read in
        the new boot and what to do."""
        try:  # what went through, as the journal holds it (reading needs no space)
            record = self.journal.plan(plan_id)
        except sqlite3.Error:
            record = None
        where = f"{rebooted} under it"
        if record is None or not record.recovered:  # recovery says where it had stopped
            where += f" before step {seq + 1}/{len(plan.steps)} ({plan.steps[seq].title})"
        steps = record.steps if record is not None else ()
        if not plan.remedy:
            upto = max([seq - 1, *(s.seq for s in steps)])
            rolled = await self._rollback(plan_id, plan, upto) if upto >= 0 else "nothing ran"
            return PlanState.ROLLED_BACK, (
                f"{where}: what its steps did in the last boot may be gone with it, so it is "
                f"not finished; {rolled}"
            )
        text = [f"{where}: nothing of it runs after a reboot"]
        ran = _done(steps, Phase.DO) if record is not None else set(range(seq))
        done = [plan.steps[k].title for k in sorted(ran) if plan.steps[k].kind.mutates]
        if done:
            text.append(f"done before it and kept: {'; '.join(done)}")
        verify = plan.steps[-1]
        if verify.kind is StepKind.VERIFY and verify.driver == "nvidia":
            text.append(await self._read_after_reboot(plan, verify, self._since.get(plan_id, 0.0)))
        gpu = plan.gpus[0]
        text.append(
            f"plan again from its verdict: on {plan.node}, gpuconsole remediate {gpu} (on a "
            f"head, gpuconsole remediate --node {plan.node} {gpu}), or r on the GPU"
        )
        return PlanState.INTERRUPTED, "; ".join(text)

    async def _read_after_reboot(self, plan: Plan, verify: Step, since: float) -> str:
        """How each GPU of a remediation reads in the node's new boot, by bus id and UUID:
        one fresh reading, not waited on (the verdict reads on)."""
        if self.reader is None:
            return "no reading of the GPUs in the new boot"
        try:
            node = await self.reader()
        except Exception as exc:  # a node still booting answers nothing
            return f"no reading of the GPUs in the new boot yet ({safe_text(str(exc))[:200]})"
        said = []
        for k, bus in enumerate(verify.gpus):
            uuid = verify.uuids[k] if k < len(verify.uuids) else ""
            name = f"{bus} ({uuid})" if uuid else bus
            problem = _unfit(node, bus, since)
            said.append(f"{name} reads fit" if problem is None else f"not fit: {problem}")
        return "in the new boot " + "; ".join(said)

    async def _rollback(self, plan_id: str, plan: Plan, upto: int) -> str:
        kept, failed = [], []
        for seq in range(upto, -1, -1):
            step = plan.steps[seq]
            if not step.kind.mutates:
                continue
            if not step.kind.reversible or plan.remedy:
                kept.append(step.title)
                continue
            assert step.layer is not None
            self._notify(plan, plan_id, seq, step, StepProgress.UNDOING)
            row = self._intent(plan_id, seq, step, Phase.UNDO)
            try:
                detail = await _said(self.drivers.for_layer(step.layer).undo(step))
            except StepFailed as exc:
                self._result(row, seq, Phase.UNDO, StepState.FAILED, str(exc))
                self._notify(plan, plan_id, seq, step, StepProgress.FAILED, str(exc))
                failed.append(f"{step.title}: {exc}")
                continue
            self._result(row, seq, Phase.UNDO, StepState.DONE, detail)
            self._notify(plan, plan_id, seq, step, StepProgress.UNDONE, detail)
        text = "rolled back"
        if kept:
            text += f" (kept: {'; '.join(kept)})"
        if failed:
            text += f"; could not undo: {'; '.join(failed)}"
        return text

    # --- recovery --------------------------------------------------------------------

    async def recover(self, *, cut_off: bool = False) -> list[Outcome]:
        """Finish or roll back every plan a dead process left running, or its process left
        to recovery; says what it did. Raises CannotRecover when the journal cannot take it.
        `cut_off`: only the remediations the node's reboot cut off, which run no step that
        changes anything (interrupted, or their power cycle's final check)."""
        boot = boot_id(self.journal.proc_root) if cut_off else ""
        if cut_off and not boot:
            return []
        try:
            records = self.journal.claim_orphans(self.node, cut_off_in=boot)
        except JournalCorrupt as exc:
            raise CannotRecover(
                f"could not recover unfinished plans: {exc}; their GPUs stay locked (see "
                f"`gpuconsole assign --recover` on {self.node})"
            ) from None
        except sqlite3.Error as exc:
            raise CannotRecover(
                f"could not recover unfinished plans: {self.journal.cannot_write(exc)}; their "
                f"GPUs stay locked until `gpuconsole assign --recover` on {self.node} runs "
                "with space there"
            ) from None
        return [await self._recover(record) for record in records]

    def recovery_preview(self) -> list[str]:
        """What `recover` would do, changing nothing (a dry run says it): each plan of this
        node the journal holds running, and what becomes of it: finished, rolled back,
        concluded interrupted (the node rebooted under it), or, its process still running,
        left to it with its GPUs locked, so that a plan for one of them is refused."""
        try:
            found = self.journal.unfinished(self.node)
        except JournalCorrupt as exc:
            return [f"journal: {exc}: the real run could not recover it, and its GPUs stay locked"]
        except sqlite3.Error as exc:
            return [
                f"journal: the action journal {self.journal.path} cannot be read ({exc}): the "
                "real run recovers what it left unfinished first, or is refused"
            ]
        said = []
        for record, orphan in found:
            plan = record.plan
            what = f"journal: plan {record.id} ({plan.action} of {', '.join(plan.labels)}"
            what += f", by {record.user})"
            if not orphan:
                said.append(
                    f"{what} is running now ({record.host}, pid {record.pid}): its GPUs stay "
                    "locked to it, so the real run is refused for any of them until it ends"
                )
                continue
            course = recovery_words(record, boot_id(self.journal.proc_root))
            said.append(
                f"{what} was left unfinished {stopped_where(record)}: the real run first {course}"
            )
        return [safe_text(text) for text in said]  # the journal's words: any hand's

    async def _recover(self, record: PlanRecord) -> Outcome:
        plan = record.plan
        done = frozenset(_done(record.steps, Phase.DO))
        back, last = _recovery_course(record)
        where = stopped_where(record)
        actor = Actor(record.user, Role(record.role), record.fingerprint)
        attempted = frozenset(s.seq for s in record.steps if s.phase is Phase.DO) - done
        self._actors[record.id], self._since[record.id] = actor, record.created_at
        self._boots[record.id] = _boot_of(record)
        try:
            if back:
                text = (
                    await self._rollback(record.id, plan, max(last, 0))
                    if last >= 0
                    else "nothing ran"
                )
                state = PlanState.ROLLED_BACK
                message = f"recovered: the process stopped {where}; {text}"
            else:
                checked = _checks_to_repeat(plan, done, attempted)
                state, text = await self._run(record.id, plan, done - checked, attempted)
                verb = {PlanState.DONE: "finished: ", PlanState.FAILED: "could not finish: "}
                message = f"recovered: the process stopped {where}; {verb.get(state, '')}{text}"
            self._finish(record.id, state, message)
        except _Unjournaled as stop:
            return self._stopped(record.id, plan, actor, stop, recovered=True)
        except Exception:
            self.journal.hand_over(record.id)
            raise
        finally:
            self._actors.pop(record.id, None)
            self._since.pop(record.id, None)
            self._boots.pop(record.id, None)
        message += self._audit_after(plan, actor, "recovered", message, record.id)
        # a crash is worth a look even when recovery finished the plan
        severity = Severity.WARNING if state is PlanState.DONE else outcome_severity(state)
        self._event(plan, severity, f"{plan.action} (plan {record.id}) {message}")
        return Outcome(record.id, state, message, recovered=True)


def _unfit(node: NodeSnapshot, bus: str, since: float) -> str | None:
    """Why a GPU a remediation acted on is not fit in `node`'s reading; None when it is.
    XIDs from before the plan began are what it repaired: only later ones count."""
    gpu = owners_of(node).gpu(bus)
    reading = node.nvml.gpu(gpu.index) if gpu and gpu.index is not None and node.nvml else None
    if reading is None:
        return f"{bus} is not visible to NVML"
    if reading.lost:
        return f"{bus} is still lost (XID 79: it fell off the bus)"
    problems = [f"XID {x.code} since" for x in reading.xids if x.last_at >= since]
    if reading.recovery_action:
        problems.append(f"the driver still asks for recovery action {reading.recovery_action}")
    if reading.ecc.remap_pending:
        problems.append("a row remap is pending")
    if reading.ecc.remap_failure:
        problems.append("row remapping failed")
    if reading.ecc.retired_pending:
        problems.append("a page retirement is still pending")
    if reading.fabric_state not in (None, "completed", "not_supported"):
        problems.append(f"fabric state {reading.fabric_state}, not completed")
    return f"{bus}: {', '.join(problems)}" if problems else None


def _remedy_failed(plan: Plan, seq: int, step: Step, why: str) -> str:
    """A remediation that stopped: what stays (drains are never undone on a GPU under
    repair), and what comes next."""
    kept = [s.title for s in plan.steps[:seq] if s.kind.mutates]
    text = f"step {seq + 1} ({step.title}) failed: {why}"
    if kept:
        text += f"; kept: {'; '.join(kept)}"
    after = escalation(Action(plan.remedy))
    if after is not None and "next:" not in why:
        text += f"; next: {after.value} ({remedy_words(after)})"
    return text
