"""`gpuconsole assign`: build the executor for this node (or a simulated one), recover what a
crash left, show the plan, ask for the confirmation, and print each step as it ticks."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gpuconsole import paths
from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.drivers import Drivers
from gpuconsole.actions.executor import ActionRefused, Executor, Reader, StepUpdate
from gpuconsole.actions.journal import Journal
from gpuconsole.actions.plan import Target
from gpuconsole.actions.roles import Actor
from gpuconsole.config import Config
from gpuconsole.model import NodeSnapshot

__all__ = ["AssignRequest", "demo_root", "node_executor", "run_assign"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class AssignRequest:
    """What the command line asked for."""

    gpus: tuple[str, ...]
    target: str
    node: str | None = None
    dry_run: bool = False
    yes: bool = False
    demo: bool = False


def demo_root(node: str) -> Path:
    """Where a simulated node's world lives between `assign --demo` runs."""
    return paths.state_dir() / "demo" / node


def _journal(cfg: Config) -> Journal:
    return Journal(Path(cfg.actions.journal) if cfg.actions.journal else None)


def _audit(cfg: Config) -> AuditLog:
    return AuditLog(Path(cfg.actions.audit_log) if cfg.actions.audit_log else None)


def node_executor(cfg: Config, on_step: Callable[[StepUpdate], None] | None = None) -> Executor:
    """The executor for this machine's GPUs, with the drivers the config enables."""
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
        from gpuconsole.hubs import node_hub

        fleet = await node_hub(cfg).poll_once()
        found = fleet.node(node)
        assert found is not None
        return found

    return Executor(node, drivers, _journal(cfg), _audit(cfg), reader=read, on_step=on_step)


def demo_executor(
    cfg: Config, node: str, on_step: Callable[[StepUpdate], None] | None = None
) -> Executor:
    """The executor for a node of the simulated demo cluster (its world under the state folder)."""
    from gpuconsole.actions.drivers.sim import SimWorld, sim_drivers

    world = SimWorld.demo(node, demo_root(node))
    reader: Reader = world.snapshot
    return Executor(
        node, sim_drivers(world), _journal(cfg), _audit(cfg), reader=reader, on_step=on_step
    )


async def run_assign(
    cfg: Config,
    request: AssignRequest,
    actor: Actor,
    *,
    ask: Callable[[str], str] | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """The whole command; returns its exit status (0 done, 1 failed, 2 usage, 3 refused)."""
    try:
        target = Target.parse(request.target)
    except ValueError as exc:
        print(f"gpuconsole assign: {exc}", file=sys.stderr)
        return EXIT_USAGE
    total = [0]

    def tick(update: StepUpdate) -> None:
        mark = {
            "running": "..",
            "done": "ok",
            "failed": "FAILED",
            "undoing": "<-",
            "undone": "undone",
        }
        if update.state == "running":
            return
        detail = f": {update.detail}" if update.detail else ""
        print(
            f"  [{update.seq + 1}/{total[0]}] {mark.get(update.state, update.state)} "
            f"{update.step.title}{detail}",
            file=out,
            flush=True,
        )

    if request.demo:
        if request.node is None:
            from gpuconsole.sim.cluster import demo_cluster

            names = ", ".join(s.name for s in demo_cluster())
            print(f"gpuconsole assign --demo: name a node with --node ({names})", file=sys.stderr)
            return EXIT_USAGE
        try:
            executor = demo_executor(cfg, request.node, tick)
        except KeyError as exc:
            print(f"gpuconsole assign: {exc.args[0]}", file=sys.stderr)
            return EXIT_USAGE
    else:
        if request.node not in (None, cfg.host.node_name):
            print(
                f"gpuconsole assign: this is {cfg.host.node_name}; run it on {request.node} "
                "(ssh NODE gpuconsole assign ...)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        executor = node_executor(cfg, tick)
    try:
        for outcome in await executor.recover():
            print(f"journal: plan {outcome.plan_id} {outcome.message}", file=out)
        plan = await executor.plan(request.gpus, target)
        total[0] = len(plan.steps)
        print(plan.describe(), file=out, flush=True)
        if plan.blocked:
            print("Refused: a precondition failed; nothing was changed.", file=out)
            return EXIT_REFUSED
        if request.dry_run:
            print("Dry run: nothing was changed.", file=out)
            return EXIT_OK
        if request.yes:
            confirm = plan.node
        elif ask is not None:
            words = " or ".join(plan.confirmations())
            confirm = ask(f"Type {words} to confirm: ")
        else:
            print("Not confirmed: no terminal to ask on (pass --yes).", file=out)
            return EXIT_REFUSED
        try:
            outcome = await executor.execute(plan, actor, confirm)
        except ActionRefused as exc:
            print(f"Refused: {exc}", file=out)
            return EXIT_REFUSED
        print(f"{outcome.state}: {outcome.message} (plan {outcome.plan_id})", file=out)
        return EXIT_OK if outcome.ok else EXIT_FAILED
    finally:
        executor.journal.close()


def gpu_args(values: Sequence[str]) -> tuple[str, ...]:
    """GPU arguments, also comma-separated: `0,1 2` is three GPUs."""
    return tuple(v for value in values for v in value.split(",") if v)
