"""Acting on GPUs of another node of the fleet: that node's own `gpuconsole assign` or
`gpuconsole remediate`, run over ssh as the operator's own ssh identity, its progress read
back as JSON lines.

Keys, authorization and audit ride on ssh: the node's sshd decides who logs in, the
node's executor checks that user's role and writes the journal and the audit log; the head
audits that it asked. Host keys must be in known_hosts: an unknown or changed one is
refused. The head never changes a GPU itself, so a plan whose connection drops is ended by
the node (done, rolled back or, for a repair, stopped at a step; journaled), and the head
says it lost contact.

`RemoteExecutor` is a PlanExecutor, as the local `Executor` is: the console and the command
line (gpuconsole.cli.assign, gpuconsole.cli.remediate) run one flow on either.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import shlex
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import asyncssh

from gpuconsole.actions.audit import AuditLog, AuditRecord
from gpuconsole.actions.executor import (
    ACTION_EVENT,
    EVENT_SOURCE,
    STEP_EVENT,
    Outcome,
    StepUpdate,
    action_event,
    outcome_severity,
    step_message,
)
from gpuconsole.actions.journal import StepProgress
from gpuconsole.actions.plan import Plan, Target
from gpuconsole.actions.progress import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    DryRun,
    Finished,
    Note,
    PlanShown,
    ProgressError,
    ProgressEvent,
    Recovered,
    Refused,
    StepChanged,
    plan_digest,
    read_event,
)
from gpuconsole.actions.roles import ActionRefused, Actor
from gpuconsole.config import DEFAULTS
from gpuconsole.facts.verdict import Action
from gpuconsole.readings.base import Event, Severity, safe_text
from gpuconsole.sources.base import EmitEvent

__all__ = [
    "ContactLost",
    "RemoteError",
    "RemoteExecutor",
    "SshTarget",
    "connect",
    "parse_destination",
]

log = logging.getLogger(__name__)

STDERR_LINES = 20  # of the node's stderr, kept to explain a failure
ASSIGN, REMEDIATE = "assign", "remediate"  # the node's commands a head runs
EXIT_NOT_FOUND = 127  # the login shell found no such command


class RemoteError(Exception):
    """The node could not be asked, or did not answer as gpuconsole does; nothing was
    started there (ContactLost says when something may have been)."""


class ContactLost(RemoteError):
    """The connection dropped after the node was asked to run a plan: the node ends the plan
    by itself (done or rolled back), and the head cannot see how."""

    def __init__(self, message: str, plan_id: str | None = None) -> None:
        super().__init__(message)
        self.plan_id = plan_id


# --- where a node is -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SshTarget:
    """How to reach one node's gpuconsole over ssh; None and empty follow OpenSSH."""

    node: str
    host: str
    port: int | None = None  # None: ~/.ssh/config's Port, else 22
    user: str | None = None  # None: ~/.ssh/config's User, else the local user
    identity_files: tuple[str, ...] = ()  # (): ~/.ssh/id_* and the ssh agent
    known_hosts: str = ""  # "": ~/.ssh/known_hosts
    command: str = DEFAULTS.remote.command
    connect_timeout_s: float = DEFAULTS.remote.connect_timeout_s
    keepalive_s: float = DEFAULTS.remote.keepalive_s

    @property
    def known_hosts_path(self) -> Path:
        return Path(self.known_hosts or "~/.ssh/known_hosts").expanduser()

    @property
    def address(self) -> str:
        """host, or [host]:port as known_hosts writes a port other than 22."""
        if self.port in (None, 22):
            return self.host
        return f"[{self.host}]:{self.port}"

    @property
    def destination(self) -> str:
        """user@host:port, as far as it is known, for messages and the audit log."""
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{user}{host}" + (f":{self.port}" if self.port else "")


def parse_destination(text: str) -> tuple[str | None, str, int | None]:
    """'[user@]host[:port]' (an IPv6 host in brackets when a port follows) to its parts."""
    text = text.strip().removeprefix("ssh://")
    if text.count(":") > 1 and "[" not in text:
        user, _, host = text.rpartition("@")
        return user or None, host, None  # a bare IPv6 address
    try:
        parts = urlsplit(f"ssh://{text}")
        port = parts.port
    except ValueError:
        raise ValueError(f"ssh destination {text!r}: expected [user@]host[:port]") from None
    if not parts.hostname or parts.path:
        raise ValueError(f"ssh destination {text!r}: expected [user@]host[:port]")
    return parts.username or None, parts.hostname, port


# --- the ssh connection ----------------------------------------------------------------------


class _HostKeyWitness(asyncssh.SSHClient):
    """Keeps the host key a server offered that known_hosts did not vouch for, to name it
    in the refusal; never trusts it."""

    def __init__(self) -> None:
        self.offered: asyncssh.SSHKey | None = None

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self.offered = key
        return False


def _known_entries(target: SshTarget, known: Path) -> bool:
    """Whether known_hosts holds any key for the node (then an unverified key is a change,
    not a stranger)."""
    try:
        keys = asyncssh.match_known_hosts(str(known), target.host, target.host, target.port)
    except (OSError, ValueError):
        return False
    return bool(keys[0] or keys[1])


def _host_key_refused(target: SshTarget, offered: asyncssh.SSHKey | None, known: Path) -> str:
    fp = f" ({offered.get_fingerprint('sha256')})" if offered is not None else ""
    where = f"{target.node} ({target.address})"
    if known.is_file() and _known_entries(target, known):
        return (
            f"the host key of {where}{fp} does not match the one in {known}: refused. If the "
            f"node was reinstalled, check its new key with its owner and replace the old line "
            f"(ssh-keygen -R '{target.address}' -f {known}); otherwise someone may be "
            "between you and it"
        )
    port = f"-p {target.port} " if target.port else ""
    return (
        f"the host key of {where}{fp} is unknown: it is not in {known}; refused. Check the "
        f"fingerprint on the node (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then "
        f"add it: ssh-keyscan {port}{target.host} >> {known}"
    )


async def connect(target: SshTarget) -> asyncssh.SSHClientConnection:
    """An ssh connection to the node with its host key checked; RemoteError says why not."""
    known = target.known_hosts_path
    keys = [Path(k).expanduser() for k in target.identity_files]
    for key in keys:
        if not key.is_file():
            raise RemoteError(f"[remote] identity_files: {key} does not exist")
    witness = _HostKeyWitness()
    where = f"{target.node} at {target.destination}"
    try:
        conn = await asyncssh.connect(
            target.host,
            target.port or (),
            client_factory=lambda: witness,
            # a missing file trusts nothing: every host is then unknown, and refused
            known_hosts=str(known) if known.is_file() else b"",
            # the node needs nothing of the operator's agent: never hand it over
            agent_forwarding=False,
            connect_timeout=target.connect_timeout_s,
            keepalive_interval=target.keepalive_s,
            keepalive_count_max=3,
            **({"client_keys": [str(k) for k in keys]} if keys else {}),
            **({"username": target.user} if target.user else {}),
        )
    except asyncssh.HostKeyNotVerifiable:
        raise RemoteError(_host_key_refused(target, witness.offered, known)) from None
    except asyncssh.KeyExchangeFailed as exc:
        if known.is_file() and _known_entries(target, known):
            raise RemoteError(_host_key_refused(target, witness.offered, known)) from None
        why = safe_text(str(exc.reason))
        raise RemoteError(f"{where}: the ssh key exchange failed: {why}") from None
    except asyncssh.PermissionDenied:
        user = target.user or getpass.getuser()
        offered = ", ".join(str(k) for k in keys) or "~/.ssh/id_* and the ssh agent's"
        raise RemoteError(
            f"{where} refused the ssh login of {user}: none of the keys offered ({offered}) "
            "is authorized there"
        ) from None
    except asyncssh.DisconnectError as exc:
        raise RemoteError(
            f"{where} closed the ssh connection: {safe_text(str(exc.reason))}"
        ) from None
    except TimeoutError:
        raise RemoteError(
            f"cannot reach {where}: no ssh answer in {target.connect_timeout_s:g} s"
        ) from None
    except ConnectionRefusedError:
        raise RemoteError(
            f"cannot reach {where}: connection refused (no ssh server listens there)"
        ) from None
    except OSError as exc:
        raise RemoteError(f"cannot reach {where}: {exc.strerror or exc}") from None
    return conn


# --- one command on the node ---------------------------------------------------------------


@dataclass
class _Told:
    """What one remote command said, as it said it."""

    plan: Plan | None = None
    digest: str = ""
    refused: str | None = None
    outcome: Outcome | None = None
    dry_run: bool = False
    steps: list[StepUpdate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_LINES))
    exit_status: int | None = None
    lost: str | None = None  # why the connection ended without an exit status


class RemoteExecutor:
    """Plans and runs assigns and remediations on one other node, through its own gpuconsole
    over ssh.

    A PlanExecutor, as the local Executor is: `plan` and `plan_remedy` show the node's plan
    (nothing changes), and `execute` runs it there once confirmed, calling `on_step` with a
    StepUpdate as each step ticks and posting the executor's events to `emit`. What the node recovers first
    goes to `on_recovered` as it comes, or waits for `recover`. One connection serves all;
    `close` (or `async with`) ends it.

    It logs in with this process's ssh identity, so the node's roles and audit see that
    user: right for an operator's own console or shell, wrong for the ssh-in console's
    sessions, which would all act as the server's user.
    """

    def __init__(
        self,
        target: SshTarget,
        *,
        on_step: Callable[[StepUpdate], None] | None = None,
        on_note: Callable[[str], None] | None = None,
        on_recovered: Callable[[Outcome], None] | None = None,
        emit: EmitEvent | None = None,
        audit: AuditLog | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.node = target.node
        self.on_step = on_step
        self.on_note = on_note
        self.on_recovered = on_recovered
        self.emit = emit
        self.audit = audit
        self.clock = clock
        self.recovered: list[Outcome] = []  # plans the node recovered, not yet handed over
        self._conn: asyncssh.SSHClientConnection | None = None
        self._shown: tuple[Plan, str] | None = None  # the last plan shown, and its digest

    async def __aenter__(self) -> RemoteExecutor:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(Exception):
                await self._conn.wait_closed()
            self._conn = None

    async def recover(self) -> list[Outcome]:
        """What the node's last commands recovered from their journal (each recovers first,
        on the node), unless `on_recovered` took it as it came."""
        found, self.recovered = self.recovered, []
        return found

    # --- asking ---------------------------------------------------------------------

    async def plan(
        self,
        keys: Sequence[str],
        target: Target,
        *,
        propose: int | None = None,
        model: str | None = None,
    ) -> Plan:
        """The node's plan from its fresh reading (or for `propose` GPUs it picks); nothing
        changes. A blocked plan is returned too: its preconditions say why."""
        args = self._gpu_args(keys, propose, model)
        told = await self._command([*args, "--to", str(target), "--dry-run"], executing=False)
        return self._planned(told, ASSIGN)

    async def plan_remedy(self, key: str, action: Action | None = None) -> Plan:
        """The node's remediation plan for one GPU from its fresh reading: `action`, or the
        one the node's verdict calls for; nothing changes."""
        args = ["--node", self.node, key, *(["--action", action.value] if action else [])]
        told = await self._command([*args, "--dry-run"], executing=False, command=REMEDIATE)
        return self._planned(told, REMEDIATE)

    def _planned(self, told: _Told, command: str) -> Plan:
        if told.plan is None:
            raise RemoteError(self._failure(told, "did not show a plan", command))
        if told.plan.node != self.node:
            raise RemoteError(
                f"{self.node} answered with a plan for {told.plan.node}: it is not the node "
                "this head asked (check [remote] destinations)"
            )
        self._shown = (told.plan, told.digest)
        return told.plan

    async def propose(
        self, count: int, model: str | None = None, target: Target | None = None
    ) -> bool:
        """Placement help from the node; what it proposes comes as notes. Whether it found
        GPUs to propose."""
        args = self._gpu_args((), count, model)
        if target is not None:
            args += ["--to", str(target), "--dry-run"]
        told = await self._command(args, executing=False)
        if told.exit_status not in (EXIT_OK, EXIT_FAILED, EXIT_REFUSED):
            raise RemoteError(self._failure(told, "could not propose"))
        return told.exit_status == EXIT_OK or told.plan is not None

    async def execute(self, plan: Plan, actor: Actor, confirm: str) -> Outcome:
        """Run a plan `plan` showed, confirmed by what the operator typed; the node checks
        the confirmation and its user's role, and refuses a plan that is no longer the one
        shown. Raises ActionRefused (nothing changed), ContactLost (the node ends the plan
        unseen) or RemoteError (nothing started)."""
        digest = self._shown[1] if self._shown and self._shown[0] is plan else plan_digest(plan)
        if plan.blocked:  # the node would refuse it: nothing to ask
            raise ActionRefused("; ".join(str(p) for p in plan.failed))
        self._audit(plan, actor, "asked", "", digest=digest, required=True)
        if plan.remedy:
            # the action the plan shown carries out, whatever the verdict says by now: the
            # digest refuses anything else
            command, args = REMEDIATE, ["--node", self.node, plan.gpus[0]]
            args += ["--action", plan.remedy]
        else:
            command = ASSIGN
            args = [*self._gpu_args(plan.gpus, None, None), "--to", str(plan.target)]
        args += ["--confirm", confirm, "--expect-plan", digest]
        return await self._execute(args, actor, (plan, digest), None, command=command)

    async def run(
        self,
        keys: Sequence[str],
        target: Target,
        actor: Actor,
        confirm: str,
        *,
        propose: int | None = None,
        model: str | None = None,
        on_plan: Callable[[Plan], None] | None = None,
    ) -> Outcome:
        """Plan and run in one command, for a confirmation given before the plan was seen
        (--yes, --confirm): the node shows its plan (`on_plan`) and runs it at once, as a
        local `assign --yes` does. Raises as `execute`."""
        args = [*self._gpu_args(keys, propose, model), "--to", str(target), "--confirm", confirm]
        # the node acts as soon as it has planned: the head's record comes first, unplanned
        self._audit(None, actor, "asked", "", args=args, required=True)
        return await self._execute(args, actor, None, on_plan, audited=True)

    async def _execute(
        self,
        args: list[str],
        actor: Actor,
        shown: tuple[Plan, str] | None,
        on_plan: Callable[[Plan], None] | None,
        *,
        audited: bool = False,
        command: str = ASSIGN,
    ) -> Outcome:
        """Run the command that executes a plan, with the head's events and audit records."""
        planned: list[tuple[Plan, str]] = [shown] if shown is not None else []

        def saw(plan: Plan, digest: str) -> None:
            if planned:
                return  # the plan shown before: audited when asked
            planned.append((plan, digest))
            if not audited:
                self._audit(plan, actor, "asked", "", digest=digest)
            if on_plan is not None:
                on_plan(plan)

        def tick(update: StepUpdate, plan: Plan) -> None:
            if update.seq == 0 and update.state is StepProgress.RUNNING:
                self._event(
                    plan,
                    Severity.INFO,
                    f"{actor.who} started {plan.action} on {self.node} over ssh: {update.plan_id}",
                )
            if not update.state.started:
                severity, text = step_message(
                    plan, update.plan_id, update.seq, update.state, update.detail
                )
                self._event(plan, severity, text, STEP_EVENT)

        try:
            told = await self._command(args, executing=True, tick=tick, saw=saw, command=command)
        except ContactLost as exc:
            plan, digest = planned[0] if planned else (None, "")
            self._audit(
                plan,
                actor,
                "unknown",
                str(exc),
                exc.plan_id or "",
                digest,
                args=args,
                command=command,
            )
            self._event(plan, Severity.WARNING, str(exc))
            raise
        plan, digest = planned[0] if planned else (told.plan, told.digest)
        if told.outcome is not None and plan is not None:
            outcome = told.outcome
            state = "ok" if outcome.ok else "failed"
            self._audit(plan, actor, state, outcome.message, outcome.plan_id, digest)
            self._event(
                plan,
                outcome_severity(outcome.state),
                f"{plan.action} by {actor.user}: {outcome.message}",
            )
            return outcome
        if told.refused is not None:
            self._audit(
                plan, actor, "refused", told.refused, digest=digest, args=args, command=command
            )
            self._event(
                plan,
                Severity.WARNING,
                f"{actor.who} was refused {command} on {self.node}: {told.refused}",
            )
            raise ActionRefused(told.refused)
        why = self._failure(told, "ended without an outcome", command)
        self._audit(plan, actor, "failed", why, digest=digest, args=args, command=command)
        raise RemoteError(why)

    # --- plumbing ---------------------------------------------------------------------

    def _gpu_args(self, keys: Sequence[str], propose: int | None, model: str | None) -> list[str]:
        args = ["--node", self.node, *keys]
        if propose is not None:
            args += ["--propose", str(propose)]
        if model:
            args += ["--model", model]
        return args

    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self._conn is None or self._conn.is_closed():
            # (again, when the node's sshd dropped it while the operator read the plan)
            self._conn = await connect(self.target)
        return self._conn

    async def _command(
        self,
        args: list[str],
        *,
        executing: bool,
        tick: Callable[[StepUpdate, Plan], None] | None = None,
        saw: Callable[[Plan, str], None] | None = None,
        command: str = ASSIGN,
    ) -> _Told:
        """Run `gpuconsole COMMAND --json-progress ARGS` on the node (assign or remediate),
        following what it says."""
        conn = await self._connection()
        line = f"{self.target.command} {command} --json-progress {shlex.join(args)}"
        told = _Told()
        try:
            process = await conn.create_process(line, encoding="utf-8")
        except (asyncssh.Error, OSError) as exc:
            self._conn = None
            raise RemoteError(
                f"{self.node}: could not start {self.target.command}: {safe_text(str(exc))}"
            ) from None
        process.stdin.write_eof()
        errors = asyncio.create_task(self._stderr(process, told))
        try:
            async for raw in process.stdout:
                if not raw:
                    break  # asyncssh's iteration ends with an empty string at EOF
                event = read_event(raw)
                if event is not None:
                    self._follow(event, told, tick, saw)
            result = await process.wait()
            told.exit_status = result.exit_status
            if result.exit_status is None or result.exit_status < 0:
                signal = result.exit_signal[0] if result.exit_signal else None
                told.lost = (
                    f"its gpuconsole was killed by SIG{signal}"
                    if signal
                    else "the ssh channel closed without an exit status"
                )
        except ProgressError as exc:
            process.close()
            remedy = (
                "upgrade the head"
                if exc.newer
                else f"check that [remote] command runs gpuconsole on {self.node}"
            )
            if not executing:
                raise RemoteError(
                    f"{self.node}: its gpuconsole reports in a way this head cannot read "
                    f"({exc}): {remedy}"
                ) from None
            # asked to run already: the node goes on without us
            told.lost = f"its progress is unreadable here: {exc}; {remedy}"
        except (asyncssh.Error, OSError) as exc:
            why = str(getattr(exc, "reason", "") or exc) or type(exc).__name__
            told.lost = safe_text(why)  # a reason the node's sshd may have given
            self._conn = None  # dead: the next command reconnects
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(errors, 1.0)
        said_all = told.outcome is not None or told.refused is not None or told.dry_run
        if told.lost is not None and not said_all:
            raise self._lost(told, executing, command)
        return told

    async def _stderr(self, process: asyncssh.SSHClientProcess[str], told: _Told) -> None:
        with contextlib.suppress(asyncssh.Error, OSError):
            async for raw in process.stderr:
                told.stderr.append(safe_text(raw.rstrip("\n")))

    def _follow(
        self,
        event: ProgressEvent,
        told: _Told,
        tick: Callable[[StepUpdate, Plan], None] | None,
        saw: Callable[[Plan, str], None] | None,
    ) -> None:
        """One line of the node's progress: notes and steps passed on as they come."""
        if isinstance(event, Note):
            told.notes.append(event.text)
            if self.on_note is not None:
                self.on_note(event.text)
        elif isinstance(event, Recovered):
            if self.on_recovered is not None:
                self.on_recovered(event.outcome)
            else:
                self.recovered.append(event.outcome)
        elif isinstance(event, PlanShown):
            told.plan, told.digest = event.plan, event.digest
            if saw is not None:
                saw(event.plan, event.digest)
        elif isinstance(event, DryRun):
            told.dry_run = True
        elif isinstance(event, Refused):
            told.refused = event.message
        elif isinstance(event, Finished):
            told.outcome = event.outcome
        elif isinstance(event, StepChanged):
            if told.plan is None or not 0 <= event.seq < len(told.plan.steps):
                log.warning("%s: a step %s of no plan shown", self.node, event.seq)
                return
            step = told.plan.steps[event.seq]
            update = StepUpdate(
                event.plan_id, event.seq, step, event.state, event.detail, len(told.plan.steps)
            )
            told.steps.append(update)
            if tick is not None:
                tick(update, told.plan)
            if self.on_step is not None:
                self.on_step(update)

    def _lost(self, told: _Told, executing: bool, command: str) -> RemoteError:
        why = told.lost or "the connection dropped"
        if not executing:
            return RemoteError(
                f"lost contact with {self.node} ({why}) while planning; nothing was changed"
            )
        plan_id = told.steps[-1].plan_id if told.steps else None
        if told.steps:
            last = told.steps[-1]
            total = len(told.plan.steps) if told.plan else "?"
            seen = (
                f"during plan {last.plan_id}, last seen at step {last.seq + 1}/{total} "
                f"({last.step.title}: {last.state})"
            )
        else:
            seen = "before the plan's first step was seen; it may have started"
        # a repair puts nothing back when a step fails: the GPU stays out of work
        ends = "done or rolled back" if command == ASSIGN else "done, or stopped at a step"
        # a repair's reboot (its power cycle, or one under it) takes its process down with
        # the node: the node's agent ends it as it comes back (gpuconsole.actions.rebooted)
        rebooted = (
            ""
            if command == ASSIGN
            else "; if the node rebooted (as its power cycle does), its agent ends the plan "
            "once the node is back, the GPU read afresh"
        )
        return ContactLost(
            f"lost contact with {self.node} ({why}) {seen}. The node ends the plan by itself, "
            f"{ends} (its journal says where; if its gpuconsole died too, the next "
            f"`gpuconsole {command}` there recovers it{rebooted}). See how it ended in "
            f"{self.node}'s events in the console, or its audit log (audit*.jsonl in its "
            "[actions] state_dir)",
            plan_id,
        )

    def _failure(self, told: _Told, what: str, command: str = ASSIGN) -> str:
        """Why a command said nothing useful: missing, too old, refused usage, or failing."""
        status, errors = told.exit_status, list(told.stderr)
        text = "; ".join(e for e in errors[-3:] if e.strip())
        if status == EXIT_NOT_FOUND:
            return (
                f"{self.node} has no `{self.target.command}` for its ssh user's shell "
                f"({text or 'command not found'}): install gpuconsole there, or set [remote] "
                "command to its path"
            )
        if status == EXIT_USAGE and "--json-progress" in text:
            return (
                f"{self.node}'s gpuconsole is too old for remote actions (no --json-progress): "
                "upgrade it"
            )
        if status == EXIT_USAGE:
            return f"{self.node} refused the request: {text or 'usage error'}"
        said = text or (told.notes[-1] if told.notes else "no message")
        return f"{self.node}: `{self.target.command} {command}` {what} (exit {status}): {said}"

    def _event(
        self, plan: Plan | None, severity: Severity, message: str, kind: str = ACTION_EVENT
    ) -> None:
        if self.emit is None:
            return
        if plan is None:  # the node never showed its plan: about the node, not a GPU
            self.emit(Event(self.clock(), self.node, EVENT_SOURCE, kind, severity, message))
        else:
            self.emit(action_event(plan, self.clock(), severity, message, kind))

    def _audit(
        self,
        plan: Plan | None,
        actor: Actor,
        outcome: str,
        detail: str,
        plan_id: str = "",
        digest: str = "",
        *,
        args: Sequence[str] = (),
        required: bool = False,
        command: str = ASSIGN,
    ) -> None:
        """The head's own record: who asked which node for what, over ssh, and what came
        back ("asked", then ok, failed, refused, or unknown when contact was lost).

        `required`: a record that must be written before the node is asked (ActionRefused
        if it cannot be); others, of what already happened, are logged when they fail.
        """
        if self.audit is None:
            return
        try:
            self._append(plan, actor, outcome, detail, plan_id, digest, args, command)
        except OSError as exc:
            why = self.audit.cannot_write(exc)
            if required:
                raise ActionRefused(f"{why}, so nothing was asked of {self.node}") from None
            log.error("%s: %s record of %s not written", why, outcome, self.node)

    def _append(
        self,
        plan: Plan | None,
        actor: Actor,
        outcome: str,
        detail: str,
        plan_id: str,
        digest: str,
        args: Sequence[str],
        command: str,
    ) -> None:
        assert self.audit is not None
        if plan is None:  # refused or lost before the node showed a plan: what was asked
            what, target, body = command, f"{self.node}: {shlex.join(args)}", {}
        else:
            what = plan.action
            target = f"{plan.node}: {', '.join(plan.labels) or ', '.join(plan.gpus)}"
            body = {
                "gpus": list(plan.gpus),
                "uuids": list(plan.uuids),
                "target": str(plan.target),
                **({"remedy": plan.remedy} if plan.remedy else {}),
                "steps": [s.title for s in plan.steps],
            }
        self.audit.append(
            AuditRecord(
                at=self.clock(),
                user=actor.user,
                role=actor.role.value,
                action=what,
                target=target,
                outcome=outcome,
                detail=detail,
                args={
                    "plan_id": plan_id,
                    "node": self.node,
                    **actor.audit_args(),
                    "remote": f"ssh {self.target.destination}",
                    "digest": digest,
                    **body,
                },
                key_fingerprint=actor.key_fingerprint,
            )
        )
