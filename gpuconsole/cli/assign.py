"""`gpuconsole assign`: take the executor for this node (or a simulated one) from wiring,
recover what a crash left, propose GPUs when asked to, show the plan, ask for the
confirmation, and print each step as it ticks.

On a head, `--node` naming another node of the fleet runs the command there, over ssh
(gpuconsole.actions.over_ssh); the node runs it with `--json-progress` and reports in JSON.
Either way one flow (`carry_out`) shows the plan, confirms and executes it; what stops it
is raised (ActionRefused, UsageError, ...) and only `reported` makes it an exit status.
`gpuconsole remediate` (gpuconsole.cli.remediate) runs the same flow, here or over ssh.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TextIO

from gpuconsole.actions.executor import CannotRecover, Executor, PlanExecutor
from gpuconsole.actions.locks import holders
from gpuconsole.actions.placement import propose_with
from gpuconsole.actions.plan import Plan, Target
from gpuconsole.actions.progress import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNKNOWN,
    EXIT_USAGE,
    JsonReport,
    Report,
    TextReport,
    plan_digest,
)
from gpuconsole.actions.roles import ActionRefused, Actor
from gpuconsole.config import Config
from gpuconsole.wiring import (
    demo_executor,
    node_executor,
    propose_demo,
    remote_executor,
)

if TYPE_CHECKING:
    from gpuconsole.actions.over_ssh import RemoteExecutor

__all__ = [
    "AssignRequest",
    "Confirming",
    "NotConfirmed",
    "UsageError",
    "carry_out",
    "gpu_args",
    "on_other_node",
    "recovered_first",
    "reported",
    "run_assign",
]

Ask = Callable[[str], str]


class Confirming(Protocol):
    """What a command line said about running a plan: GPUs named, a dry run, a confirmation
    given before the plan was seen, and (from a head) the digest of the plan shown."""

    @property
    def gpus(self) -> tuple[str, ...]: ...
    @property
    def dry_run(self) -> bool: ...
    @property
    def yes(self) -> bool: ...
    @property
    def confirm(self) -> str | None: ...
    @property
    def expect_plan(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class AssignRequest:
    """What the command line asked for: GPUs to move, or a number of GPUs to propose."""

    gpus: tuple[str, ...]
    target: str | None
    node: str | None = None
    dry_run: bool = False
    yes: bool = False
    demo: bool = False
    propose: int | None = None  # propose this many free GPUs instead of naming them
    model: str | None = None  # with propose: only GPUs whose name contains this
    confirm: str | None = None  # typed already (a head asked its operator): the node checks it
    json_progress: bool = False  # report in JSON lines, for a head that runs this over ssh
    expect_plan: str | None = None  # run only the plan with this digest (what a head showed)
    recover: bool = False  # only recover unfinished plans, then list the GPU locks left


# --- what stops the command, and its exit status ------------------------------------------


class UsageError(Exception):
    """The command line asks for what cannot be done; said on stderr, after `command`."""

    def __init__(self, message: str, command: str = "gpuconsole assign") -> None:
        super().__init__(message)
        self.command = command


class NotConfirmed(ActionRefused):
    """Nobody could confirm the plan (no terminal to ask on): said as a note, not refused."""


# over_ssh's RemoteError and ContactLost, as the command says them: asyncssh is imported only
# when a command goes over ssh
class NotAsked(Exception):
    """Another node could not be asked, or did not answer as gpuconsole does."""


class Unseen(Exception):
    """Another node's plan lost its ssh connection: the node ends it, unseen from here."""


async def run_assign(
    cfg: Config,
    request: AssignRequest,
    actor: Actor,
    *,
    ask: Ask | None = None,
    out: TextIO | None = None,
) -> int:
    """The whole command; returns its exit status (0 done, 1 failed, 2 usage, 3 refused;
    on another node, 4: contact lost, outcome unknown)."""
    out = out or sys.stdout  # looked up now: a test's capture replaces it after import
    report: Report = JsonReport(out) if request.json_progress else TextReport(out)
    return await reported(_assign(cfg, request, actor, ask, report), report)


async def reported(
    work: Awaitable[bool], report: Report, command: str = "gpuconsole assign"
) -> int:
    """Run a command's work and make what it did, or what stopped it, its exit status."""
    try:
        done = await work
    except UsageError as exc:
        print(f"{exc.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NotConfirmed as exc:
        report.note(str(exc))
        return EXIT_REFUSED
    except ActionRefused as exc:
        report.refused(str(exc))
        return EXIT_REFUSED
    except NotAsked as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Unseen as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN
    return EXIT_OK if done else EXIT_FAILED


async def _assign(
    cfg: Config, request: AssignRequest, actor: Actor, ask: Ask | None, report: Report
) -> bool:
    """Whether the command did what was asked; raises what stops it."""
    wrong = _usage(request)
    if wrong is not None:
        raise UsageError(wrong)
    try:
        target = Target.parse(request.target) if request.target is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if request.demo or request.node in (None, cfg.host.node_name):
        return await _here(cfg, request, target, actor, ask, report)
    if request.json_progress:
        # a head sent this here for another node: its destination is wrong, and passing it
        # on could loop
        raise UsageError(f"this is {cfg.host.node_name}, not {request.node}")
    if request.recover:
        raise UsageError(
            f"--recover acts on this machine: run `ssh {request.node} gpuconsole assign --recover`"
        )
    return await _over_ssh(cfg, request, target, actor, ask, report)


def _usage(request: AssignRequest) -> str | None:
    """What is wrong with the request's shape, if anything."""
    if request.recover:
        if request.gpus or request.target or request.propose is not None:
            return "--recover takes no GPUs, --to or --propose: it ends what is unfinished"
        if request.dry_run:
            return "--recover has no dry run: it writes the journal as it ends each plan"
        return None
    if request.propose is not None:
        if request.gpus:
            return "name GPUs or ask for --propose N, not both"
        if request.propose < 1:
            return "--propose takes a number of GPUs, 1 or more"
        return None
    if request.model:
        return "--model goes with --propose"
    if not request.gpus:
        return "name the GPUs to move (index, bus id or UUID), or ask for --propose N"
    if request.target is None:
        return "say where the GPUs go: --to free, drained, k8s or vm:NAME"
    return None


async def _proposal(
    request: AssignRequest, target: Target | None, here: Executor | None, report: Report
) -> tuple[str, tuple[str, ...]] | None:
    """Propose GPUs (on this machine through `here`, or on the demo's nodes) and print the
    proposal; (node, GPU keys) of the best, None if none."""
    assert request.propose is not None
    if here is not None:
        found = await propose_with(here, request.propose, request.model, target)
    else:
        nodes = [request.node] if request.node else None
        found = await propose_demo(request.propose, request.model, target, nodes)
    best = found.best
    if best is None:
        report.note(f"No proposal: {found.why_not()}")
        return None
    report.note(f"Proposed: {best.describe()}")
    for other in found.proposals[1:]:
        report.note(f"Or: {other.describe()}")
    return best.node, best.keys


# --- on this machine, or a node of the demo ---------------------------------------------


async def _here(
    cfg: Config,
    request: AssignRequest,
    target: Target | None,
    actor: Actor,
    ask: Ask | None,
    report: Report,
) -> bool:
    """This machine's GPUs, or with --demo a simulated node's."""
    node, keys = request.node, request.gpus
    if request.demo and request.node is not None:
        from gpuconsole.sim.cluster import demo_cluster

        names = [s.name for s in demo_cluster()]
        if request.node not in names:
            raise UsageError(f"no simulated node {request.node!r} (known: {', '.join(names)})")
    # this machine's executor is built once: proposing reads through it too
    try:
        executor = (
            None if request.demo else node_executor(cfg, report.step, dry_run=request.dry_run)
        )
    except sqlite3.Error as exc:  # its journal cannot be opened: nothing was done
        raise ActionRefused(f"{exc}; nothing was changed") from None
    try:
        if request.recover:
            executor = executor or _demo_node_executor(node, "--demo --recover", report, False)
            return await _recover_only(executor, report)
        if request.propose is not None:
            chosen = await _proposal(request, target, executor, report)
            if chosen is None:
                return False
            if target is None:
                return True  # asked only where: nothing to plan
            node, keys = chosen
        assert target is not None
        executor = executor or _demo_node_executor(node, "--demo", report, request.dry_run)
        ask = None if request.json_progress else ask  # a head asks its own operator
        return await _run(executor, request, keys, target, actor, ask, report)
    finally:
        if executor is not None:
            await executor.close()


def _demo_node_executor(node: str | None, flags: str, report: Report, dry_run: bool) -> Executor:
    """The executor of simulated `node`; UsageError when none is named."""
    if node is None:
        from gpuconsole.sim.cluster import demo_cluster

        known = ", ".join(s.name for s in demo_cluster())
        raise UsageError(f"name a node with --node ({known})", f"gpuconsole assign {flags}")
    try:
        return demo_executor(node, report.step, dry_run=dry_run)
    except sqlite3.Error as exc:
        raise ActionRefused(f"{exc}; nothing was changed") from None


async def _recover_only(executor: Executor, report: Report) -> bool:
    """`assign --recover`: end the plans left unfinished (a dead process's, or one a full
    journal stopped), then list the GPU locks still held and by whom."""
    try:
        recovered = await executor.recover()
    except CannotRecover as exc:
        report.refused(str(exc))
        return False
    for outcome in recovered:
        report.recovered(outcome)
    held = holders(executor.journal)
    for holder in held:
        report.note(f"Locked: {holder}")
    if not held:
        report.note("No GPU is locked.")
    return True


async def _run(
    executor: PlanExecutor,
    request: AssignRequest,
    keys: Sequence[str],
    target: Target,
    actor: Actor,
    ask: Ask | None,
    report: Report,
) -> bool:
    """Recover what a crash left, plan, and carry the plan out (a dry run only plans, and
    says what recovery would do)."""
    await recovered_first(executor, request.dry_run, report)
    return await carry_out(executor, await executor.plan(keys, target), request, actor, ask, report)


async def recovered_first(executor: PlanExecutor, dry_run: bool, report: Report) -> None:
    """What a run on a node does before it plans: end the plans a stopped process left
    there (finished, rolled back, or interrupted by a reboot) and say how; a dry run, which
    writes nothing, says what the real run would do with each, and which a running plan
    holds (its GPUs locked: a plan for them is refused)."""
    if dry_run:
        if isinstance(executor, Executor):  # another node's dry run says it there
            for note in executor.recovery_preview():
                report.note(note)
        return
    try:
        recovered = await executor.recover()
    except CannotRecover as exc:  # its GPUs stay locked; the rest may go on (or be refused)
        report.note(f"journal: {exc}")
        recovered = []
    for outcome in recovered:
        report.recovered(outcome)


# --- the one flow, from a plan on ---------------------------------------------------------


async def carry_out(
    executor: PlanExecutor,
    plan: Plan,
    request: Confirming,
    actor: Actor,
    ask: Ask | None,
    report: Report,
) -> bool:
    """Show the plan, stop there (blocked, or a dry run) or confirm it, execute it and say how
    it ended; on this machine or, over ssh, on another node. ActionRefused: nothing ran."""
    report.plan(plan)
    if plan.blocked:
        raise ActionRefused("a precondition failed; nothing was changed.")
    if request.dry_run:
        report.dry_run()
        return True
    if request.expect_plan is not None and plan_digest(plan) != request.expect_plan:
        # the operator confirmed the plan a head showed them a while ago, not this one
        raise ActionRefused(
            f"{plan.node} changed since the plan was shown (it would now run plan "
            f"{plan_digest(plan)}, not {request.expect_plan}); nothing was changed: plan again"
        )
    confirm = _given(request, plan.node)
    if confirm is not None and request.expect_plan is None:
        _not_blind_by_number(request, plan)
    if confirm is None:
        confirm = _asked(plan, ask)
    outcome = await executor.execute(plan, actor, confirm)
    report.outcome(outcome)
    return outcome.ok


def _not_blind_by_number(request: Confirming, plan: Plan) -> None:
    """ActionRefused for a GPU named by a number and confirmed before its plan was seen, on a
    node whose GPUs NVML has numbered again: the number may be another GPU's now."""
    numbers = [k for k in request.gpus if k.strip().isdigit()]
    if numbers and plan.renumbered:
        raise ActionRefused(
            f"GPU {', '.join(numbers)} is a number NVML gives, and NVML has numbered "
            f"{plan.node}'s GPUs again since some left its driver; confirmed before the plan "
            f"was seen, name the GPU by bus id or UUID ({', '.join(plan.labels)} now), or "
            "leave out --yes to read the plan and confirm it. Nothing was changed."
        )


def _given(request: Confirming, node: str) -> str | None:
    """The confirmation the command line gave (--confirm, or --yes: the node's name)."""
    if request.confirm is not None:
        return request.confirm
    return node if request.yes else None


def _asked(plan: Plan, ask: Ask | None) -> str:
    """What the operator typed to confirm `plan`; NotConfirmed with no terminal to ask on."""
    if ask is None:
        raise NotConfirmed("Not confirmed: no terminal to ask on (pass --yes or --confirm).")
    # Asked here, blocking: in a thread, Ctrl-C would leave it waiting for Enter.
    return ask(f"Type {plan.confirmation_words()} to confirm: ")


# --- another node of the fleet, over ssh --------------------------------------------------


async def _over_ssh(
    cfg: Config,
    request: AssignRequest,
    target: Target | None,
    actor: Actor,
    ask: Ask | None,
    report: Report,
) -> bool:
    """`--node` names another node of the fleet: its own gpuconsole plans and runs there, the
    plan shown and the confirmation typed here."""
    assert request.node is not None

    async def work(remote: RemoteExecutor) -> bool:
        return await _on_node(remote, request, target, actor, ask, report)

    return await on_other_node(cfg, request.node, report, work)


async def on_other_node(
    cfg: Config,
    node: str,
    report: Report,
    work: Callable[[RemoteExecutor], Awaitable[bool]],
    command: str = "gpuconsole assign",
) -> bool:
    """`work` on another node of the fleet through its own gpuconsole over ssh, the node's
    progress told to `report`; what stops it raised as the command says it."""
    from gpuconsole.actions.over_ssh import ContactLost, RemoteError

    try:
        remote = remote_executor(
            cfg, node, on_step=report.step, on_note=report.note, on_recovered=report.recovered
        )
    except RemoteError as exc:
        raise UsageError(str(exc), command) from None
    try:
        async with remote:
            return await work(remote)
    except ContactLost as exc:
        raise Unseen(str(exc)) from None
    except RemoteError as exc:
        raise NotAsked(str(exc)) from None


async def _on_node(
    remote: RemoteExecutor,
    request: AssignRequest,
    target: Target | None,
    actor: Actor,
    ask: Ask | None,
    report: Report,
) -> bool:
    """The node recovers as it plans, and proposes the GPUs when asked to: one command each."""
    if target is None:  # asked only where: the node's notes say it
        assert request.propose is not None
        return await remote.propose(request.propose, request.model)
    given = _given(request, remote.node)
    if given is not None and not request.dry_run:
        # confirmed before the plan was seen: one command, as a local `assign --yes`
        outcome = await remote.run(
            request.gpus,
            target,
            actor,
            given.strip(),
            propose=request.propose,
            model=request.model,
            on_plan=report.plan,
        )
        report.outcome(outcome)
        return outcome.ok
    plan = await remote.plan(request.gpus, target, propose=request.propose, model=request.model)
    return await carry_out(remote, plan, request, actor, ask, report)


def gpu_args(values: Sequence[str]) -> tuple[str, ...]:
    """GPU arguments, also comma-separated: `0,1 2` is three GPUs."""
    return tuple(v for value in values for v in value.split(",") if v)
