"""`gpuconsole remediate`: one GPU of this node (or a simulated one) repaired as its verdict
asks, or as `--action` says: recover what a crash left, show the plan, ask for the
confirmation, print each step as it ticks. The same executor, journal and audit log as
`gpuconsole assign`."""

from __future__ import annotations

import asyncio
import sqlite3
import sys

from gpuconsole.actions.executor import CannotRecover, Executor, StepUpdate
from gpuconsole.actions.progress import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from gpuconsole.actions.roles import ActionRefused, Actor
from gpuconsole.config import Config, ConfigError
from gpuconsole.facts.verdict import Action
from gpuconsole.wiring import demo_executor, node_executor

__all__ = ["run_remediate"]


def _print_step(update: StepUpdate) -> None:
    if not update.state.started:
        detail = f": {update.detail}" if update.detail else ""
        print(f"  {update.seq + 1}. {update.state}: {update.step.title}{detail}", flush=True)


def run_remediate(
    cfg: Config,
    actor: Actor,
    gpu: str,
    action: str | None,
    *,
    node: str | None,
    confirm: str | None,
    dry_run: bool,
    demo: bool,
) -> int:
    """The whole command; returns its exit status (0 done, 1 failed, 2 usage, 3 refused)."""
    try:
        wanted = Action(action) if action else None
        if demo:
            if node is None:
                print("gpuconsole remediate: --demo needs --node NAME", file=sys.stderr)
                return EXIT_USAGE
            executor = demo_executor(node, _print_step)
        else:
            if node not in (None, cfg.host.node_name):
                print(
                    f"gpuconsole remediate: {node} is not this machine: run it there "
                    f"(ssh {node} gpuconsole remediate {gpu})",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            executor = node_executor(cfg, _print_step)
    except (ValueError, KeyError, ConfigError, OSError, sqlite3.Error) as exc:
        print(f"gpuconsole remediate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_carry_out(executor, actor, gpu, wanted, confirm, dry_run))


async def _carry_out(
    executor: Executor,
    actor: Actor,
    gpu: str,
    action: Action | None,
    confirm: str | None,
    dry_run: bool,
) -> int:
    try:
        for outcome in await executor.recover():
            print(f"journal: plan {outcome.plan_id} {outcome.message}")
        plan = await executor.plan_remedy(gpu, action)
        print(plan.describe())
        if plan.blocked:
            return EXIT_REFUSED
        if dry_run:
            return EXIT_OK
        if confirm is None and sys.stdin.isatty():
            confirm = input(f"type {plan.confirmation_words()} to confirm: ")
        outcome = await executor.execute(plan, actor, (confirm or "").strip())
    except ActionRefused as exc:
        print(f"gpuconsole remediate: refused, nothing changed: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except CannotRecover as exc:
        print(f"gpuconsole remediate: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        await executor.close()
    print(f"{outcome.state}: {outcome.message} (plan {outcome.plan_id})")
    return EXIT_OK if outcome.ok else EXIT_FAILED
