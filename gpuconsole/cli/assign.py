"""`gpuconsole assign`: take the executor for this node (or a simulated one) from wiring,
recover what a crash left, propose GPUs when asked to, show the plan, ask for the
confirmation, and print each step as it ticks.

On a head, `--node` naming another node of the fleet runs the command there, over ssh
(gpuconsole.actions.over_ssh); the node runs it with `--json-progress` and reports in JSON.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from gpuconsole.actions.executor import (
    ActionRefused,
    CannotRecover,
    Executor,
)
from gpuconsole.actions.locks import holders
from gpuconsole.actions.plan import Plan, Target
from gpuconsole.actions.progress import JsonReport, Report, TextReport, plan_digest
from gpuconsole.actions.roles import Actor
from gpuconsole.config import Config
from gpuconsole.wiring import demo_executor, node_executor, propose_demo, propose_with

__all__ = ["AssignRequest", "run_assign"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
EXIT_UNKNOWN = 4  # a remote plan lost its ssh connection: the node ends it, unseen


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


def _usage(request: AssignRequest) -> str | None:
    """What is wrong with the request's shape, if anything."""
    if request.recover:
        if request.gpus or request.target or request.propose is not None:
            return "--recover takes no GPUs, --to or --propose: it ends what is unfinished"
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


async def run_assign(
    cfg: Config,
    request: AssignRequest,
    actor: Actor,
    *,
    ask: Callable[[str], str] | None = None,
    out: TextIO | None = None,
) -> int:
    """The whole command; returns its exit status (0 done, 1 failed, 2 usage, 3 refused;
    on another node, 4: contact lost, outcome unknown)."""
    out = out or sys.stdout  # looked up now: a test's capture replaces it after import
    report: Report = JsonReport(out) if request.json_progress else TextReport(out)
    wrong = _usage(request)
    if wrong is not None:
        print(f"gpuconsole assign: {wrong}", file=sys.stderr)
        return EXIT_USAGE
    try:
        target = Target.parse(request.target) if request.target is not None else None
    except ValueError as exc:
        print(f"gpuconsole assign: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not request.demo and request.node not in (None, cfg.host.node_name):
        if request.json_progress:
            # a head sent this here for another node: its destination is wrong, and passing
            # it on could loop
            print(
                f"gpuconsole assign: this is {cfg.host.node_name}, not {request.node}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        if request.recover:
            print(
                f"gpuconsole assign: --recover acts on this machine: run `ssh {request.node} "
                "gpuconsole assign --recover`",
                file=sys.stderr,
            )
            return EXIT_USAGE
        from gpuconsole.actions.over_ssh import run_remote_assign

        return await run_remote_assign(cfg, request, actor, ask=ask, out=out)
    node, keys = request.node, request.gpus
    if request.demo and request.node is not None:
        from gpuconsole.sim.cluster import demo_cluster

        names = [s.name for s in demo_cluster()]
        if request.node not in names:
            print(
                f"gpuconsole assign: no simulated node {request.node!r} "
                f"(known: {', '.join(names)})",
                file=sys.stderr,
            )
            return EXIT_USAGE
    # this machine's executor is built once: proposing reads through it too
    try:
        executor = None if request.demo else node_executor(cfg, report.step)
    except sqlite3.Error as exc:  # its journal cannot be opened: nothing was done
        report.refused(f"{exc}; nothing was changed")
        return EXIT_REFUSED
    try:
        if request.recover:
            if executor is None:
                built = _demo_node_executor(node, "--demo --recover", report)
                if isinstance(built, int):
                    return built
                executor = built
            return await _recover_only(executor, report)
        if request.propose is not None:
            chosen = await _proposal(request, target, executor, report)
            if chosen is None:
                return EXIT_FAILED
            if target is None:
                return EXIT_OK  # asked only where: nothing to plan
            node, keys = chosen
        assert target is not None
        if executor is None:
            built = _demo_node_executor(node, "--demo", report)
            if isinstance(built, int):
                return built
            executor = built
        ask = None if request.json_progress else ask  # a head asks its own operator
        return await _run(executor, request, keys, target, actor, ask, report)
    finally:
        if executor is not None:
            executor.journal.close()


def _demo_node_executor(node: str | None, flags: str, report: Report) -> Executor | int:
    """The executor of simulated `node`, or the exit status when there is none."""
    if node is None:
        from gpuconsole.sim.cluster import demo_cluster

        known = ", ".join(s.name for s in demo_cluster())
        print(f"gpuconsole assign {flags}: name a node with --node ({known})", file=sys.stderr)
        return EXIT_USAGE
    try:
        return demo_executor(node, report.step)
    except sqlite3.Error as exc:
        report.refused(f"{exc}; nothing was changed")
        return EXIT_REFUSED


def shown_plan_stops(plan: Plan, request: AssignRequest, report: Report) -> int | None:
    """Show the plan; the exit status when it goes no further (blocked, or a dry run)."""
    report.plan(plan)
    if plan.blocked:
        report.refused("a precondition failed; nothing was changed.")
        return EXIT_REFUSED
    if request.dry_run:
        report.dry_run()
        return EXIT_OK
    return None


def ask_confirmation(plan: Plan, ask: Callable[[str], str] | None, report: Report) -> str | None:
    """What the operator typed to confirm `plan`; None with no terminal to ask on."""
    if ask is None:
        report.note("Not confirmed: no terminal to ask on (pass --yes or --confirm).")
        return None
    # Asked here, blocking: in a thread, Ctrl-C would leave it waiting for Enter.
    return ask(f"Type {' or '.join(plan.confirmations())} to confirm: ")


async def _recover_only(executor: Executor, report: Report) -> int:
    """`assign --recover`: end the plans left unfinished (a dead process's, or one a full
    journal stopped), then list the GPU locks still held and by whom."""
    try:
        recovered = await executor.recover()
    except CannotRecover as exc:
        report.refused(str(exc))
        return EXIT_FAILED
    for outcome in recovered:
        report.recovered(outcome)
    held = holders(executor.journal)
    for holder in held:
        report.note(f"Locked: {holder}")
    if not held:
        report.note("No GPU is locked.")
    return EXIT_OK


async def _run(
    executor: Executor,
    request: AssignRequest,
    keys: Sequence[str],
    target: Target,
    actor: Actor,
    ask: Callable[[str], str] | None,
    report: Report,
) -> int:
    """Recover, plan, confirm and execute on one node; the exit status."""
    try:
        recovered = await executor.recover()
    except CannotRecover as exc:  # its GPUs stay locked; the rest may go on (or be refused)
        report.note(f"journal: {exc}")
        recovered = []
    for outcome in recovered:
        report.recovered(outcome)
    plan = await executor.plan(keys, target)
    stop = shown_plan_stops(plan, request, report)
    if stop is not None:
        return stop
    if request.expect_plan is not None and plan_digest(plan) != request.expect_plan:
        # the operator confirmed the plan a head showed them a while ago, not this one
        report.refused(
            f"{plan.node} changed since the plan was shown (it would now run plan "
            f"{plan_digest(plan)}, not {request.expect_plan}); nothing was changed: plan again"
        )
        return EXIT_REFUSED
    if request.confirm is not None:
        confirm = request.confirm
    elif request.yes:
        confirm = plan.node
    else:
        asked = ask_confirmation(plan, ask, report)
        if asked is None:
            return EXIT_REFUSED
        confirm = asked
    try:
        outcome = await executor.execute(plan, actor, confirm)
    except ActionRefused as exc:
        report.refused(str(exc))
        return EXIT_REFUSED
    report.outcome(outcome)
    return EXIT_OK if outcome.ok else EXIT_FAILED


def gpu_args(values: Sequence[str]) -> tuple[str, ...]:
    """GPU arguments, also comma-separated: `0,1 2` is three GPUs."""
    return tuple(v for value in values for v in value.split(",") if v)
