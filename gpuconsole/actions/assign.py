"""`gpuconsole assign`: build the executor for this node (or a simulated one), recover what a
crash left, propose GPUs when asked to, show the plan, ask for the confirmation, and print
each step as it ticks.

A console builds the same executors (`node_executor`, `demo_executor`) with its hub's
`post_event` as `emit`, so that every step and outcome lands in its Events view.

On a head, `--node` naming another node of the fleet runs the command there, over ssh
(gpuconsole.actions.remote); the node runs it with `--json-progress` and reports in JSON.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gpuconsole import paths
from gpuconsole.actions.drivers import Drivers
from gpuconsole.actions.executor import (
    ActionRefused,
    CannotRecover,
    Executor,
    Reader,
    StepUpdate,
)
from gpuconsole.actions.locks import holders
from gpuconsole.actions.placement import Placement, placements
from gpuconsole.actions.plan import Plan, PlanContext, Target
from gpuconsole.actions.progress import JsonReport, Report, TextReport, plan_digest
from gpuconsole.actions.roles import Actor
from gpuconsole.actions.store import ActionStore, action_store, demo_store
from gpuconsole.config import Config
from gpuconsole.model import NodeSnapshot
from gpuconsole.sources.base import EmitEvent

__all__ = [
    "AssignRequest",
    "console_executor",
    "demo_executor",
    "demo_root",
    "node_executor",
    "propose_demo",
    "propose_with",
    "run_assign",
]

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


def demo_root(node: str) -> Path:
    """Where a simulated node's world lives between `assign --demo` runs."""
    return paths.state_dir() / "demo" / node


async def _read_here(cfg: Config) -> NodeSnapshot:
    from gpuconsole.hubs import node_hub

    fleet = await node_hub(cfg, one_shot=True).poll_once()
    found = fleet.node(cfg.host.node_name)
    assert found is not None
    return found


def node_executor(
    cfg: Config,
    on_step: Callable[[StepUpdate], None] | None = None,
    *,
    emit: EmitEvent | None = None,
    store: ActionStore | None = None,
) -> Executor:
    """The executor for this machine's GPUs, with the drivers the config enables, journaling
    and auditing in the machine's shared store."""
    from gpuconsole.actions.drivers.vfio import VfioDriver

    node = cfg.host.node_name
    guests = None
    if cfg.tenancy.libvirt_uri:
        from gpuconsole.actions.drivers.libvirt import LibvirtDriver

        guests = LibvirtDriver(cfg.tenancy.libvirt_uri)
    kube = None
    if cfg.actions.kubernetes:
        from gpuconsole.actions.drivers.kubernetes import KubernetesDriver, api_client

        kube = KubernetesDriver(
            cfg.actions.kubernetes_node or node,
            api_client(cfg.actions.kubeconfig),
            evict_timeout_s=cfg.actions.evict_timeout_s,
        )
    drivers = Drivers(
        pci=VfioDriver(cfg.actions.sysfs_root or cfg.host.sysfs_root, cfg.host.proc_root),
        guests=guests,
        kubernetes=kube,
    )

    async def read() -> NodeSnapshot:
        return await _read_here(cfg)

    where = store or action_store(cfg.actions)
    return Executor(
        node,
        drivers,
        where.journal(),
        where.audit(),
        reader=read,
        emit=emit,
        on_step=on_step,
    )


def demo_executor(
    node: str,
    on_step: Callable[[StepUpdate], None] | None = None,
    *,
    emit: EmitEvent | None = None,
) -> Executor:
    """The executor for a node of the simulated demo cluster (its world, journal and audit
    log under the user's own state folder)."""
    from gpuconsole.actions.drivers.sim import SimWorld, sim_drivers

    world = SimWorld.demo(node, demo_root(node))
    reader: Reader = world.snapshot
    store = demo_store()
    return Executor(
        node,
        sim_drivers(world),
        store.journal(),
        store.audit(),
        reader=reader,
        emit=emit,
        on_step=on_step,
    )


def console_executor(
    cfg: Config,
    node: str,
    emit: EmitEvent,
    *,
    demo: bool = False,
    on_step: Callable[[StepUpdate], None] | None = None,
) -> Executor:
    """The executor a console (local, or one ssh session) runs a node's plans with, its
    events posted to the console's hub (`emit`: the hub's thread-safe `post_event`).

    Only this machine's GPUs, or with `demo` a simulated node's; a GPU of another node is
    moved on that node (ssh NODE gpuconsole assign ...), which its agent's hub reports.
    """
    if demo:
        return demo_executor(node, on_step, emit=emit)
    if node != cfg.host.node_name:
        raise ValueError(
            f"{node} is not this machine ({cfg.host.node_name}): run the plan there "
            f"(ssh {node} gpuconsole assign ...)"
        )
    return node_executor(cfg, on_step, emit=emit)


async def propose_with(
    executor: Executor, count: int, model: str | None = None, target: Target | None = None
) -> Placement:
    """Placement help on the executor's node, from a fresh reading (this machine's includes
    the fabric, for the NIC rails) and the executor's cordons."""
    if executor.reader is None:
        raise RuntimeError("this executor has no reader to propose from")
    node = await executor.reader()
    return placements([node], count, model, target, {node.node: await executor.context()})


async def propose_demo(
    count: int,
    model: str | None = None,
    target: Target | None = None,
    nodes: Sequence[str] | None = None,
) -> Placement:
    """Placement help over the simulated demo cluster's worlds (or the nodes named)."""
    from gpuconsole.actions.drivers.sim import SimWorld
    from gpuconsole.sim.cluster import demo_cluster

    names = list(nodes) if nodes else [s.name for s in demo_cluster()]
    snapshots, contexts = [], {}
    for name in names:
        world = SimWorld.demo(name, demo_root(name))
        snapshots.append(await world.snapshot(fabric=True))
        contexts[name] = PlanContext(kubernetes=True, cordoned=frozenset(world.cordoned))
    return placements(snapshots, count, model, target, contexts)


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
        from gpuconsole.actions.remote import run_remote_assign

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
