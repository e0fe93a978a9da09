"""`gpuconsole remediate`: one GPU repaired as its verdict asks, or as `--action` says: recover
what a crash left, show the plan, ask for the confirmation, print each step as it ticks. The
same executor, journal, audit log, report and flow (gpuconsole.cli.assign) as `assign`.

The GPU is of this machine, of a simulated node (`--demo`), or, on a head, of another node
of the fleet, named `--node NODE GPU` or `NODE:GPU` (`dgx-003:0000:c3:00.0`): that node's own
`gpuconsole remediate` plans and runs it over ssh from the node's verdict, the plan shown and
the confirmation typed here, its progress read back as JSON lines.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from gpuconsole.actions.executor import Executor
from gpuconsole.actions.progress import JsonReport, Report, TextReport
from gpuconsole.actions.roles import ActionRefused, Actor
from gpuconsole.cli.assign import (
    Ask,
    UsageError,
    carry_out,
    on_other_node,
    recovered_first,
    reported,
)
from gpuconsole.config import Config, ConfigError
from gpuconsole.facts.verdict import Action
from gpuconsole.wiring import demo_executor, node_executor

if TYPE_CHECKING:
    from gpuconsole.actions.over_ssh import RemoteExecutor

__all__ = ["RemediateRequest", "run_remediate", "split_node"]

COMMAND = "gpuconsole remediate"

# a PCI bus id as sysfs, NVML or the console write it: [domain:]bus:device.function
_BUS_ID = re.compile(r"(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RemediateRequest:
    """What the command line asked for: one GPU, and the action if not the verdict's."""

    gpu: str
    action: str | None = None
    node: str | None = None
    dry_run: bool = False
    demo: bool = False
    confirm: str | None = None  # typed already (a head asked its operator): the node checks it
    json_progress: bool = False  # report in JSON lines, for a head that runs this over ssh
    expect_plan: str | None = None  # run only the plan with this digest (what a head showed)

    @property
    def gpus(self) -> tuple[str, ...]:
        return (self.gpu,)

    @property
    def yes(self) -> bool:
        return False  # a repair is confirmed by typing, or --confirm


def split_node(gpu: str) -> tuple[str | None, str]:
    """'dgx-003:0000:c3:00.0' -> ('dgx-003', '0000:c3:00.0'); a GPU of no named node (a bus
    id, a UUID, a number) -> (None, it)."""
    text = gpu.strip()
    if _BUS_ID.fullmatch(text) or ":" not in text:
        return None, text
    node, _, rest = text.partition(":")
    return (node, rest) if node and rest else (None, text)


async def run_remediate(
    cfg: Config,
    request: RemediateRequest,
    actor: Actor,
    *,
    ask: Ask | None = None,
    out: TextIO | None = None,
) -> int:
    """The whole command; returns its exit status (0 done, 1 failed, 2 usage, 3 refused;
    on another node, 4: contact lost, outcome unknown)."""
    out = out or sys.stdout  # looked up now: a test's capture replaces it after import
    report: Report = JsonReport(out) if request.json_progress else TextReport(out)
    return await reported(_remediate(cfg, request, actor, ask, report), report, COMMAND)


async def _remediate(
    cfg: Config, request: RemediateRequest, actor: Actor, ask: Ask | None, report: Report
) -> bool:
    named, gpu = split_node(request.gpu)
    if named is not None and request.node not in (None, named):
        raise UsageError(f"{request.gpu} is of {named}, not --node {request.node}", COMMAND)
    node = request.node or named
    try:
        action = Action(request.action) if request.action else None
    except ValueError:
        raise UsageError(f"no action {request.action!r}", COMMAND) from None
    if request.demo:
        if node is None:
            raise UsageError("--demo needs a node: --node NAME, or NAME:GPU", COMMAND)
        return await _here(cfg, request, node, gpu, action, actor, ask, report)
    if node in (None, cfg.host.node_name):
        return await _here(cfg, request, None, gpu, action, actor, ask, report)
    if request.json_progress:
        # a head sent this here for another node: its destination is wrong, and passing it
        # on could loop
        raise UsageError(f"this is {cfg.host.node_name}, not {node}", COMMAND)

    async def work(remote: RemoteExecutor) -> bool:
        plan = await remote.plan_remedy(gpu, action)
        return await carry_out(remote, plan, request, actor, ask, report)

    return await on_other_node(cfg, node, report, work, COMMAND)


async def _here(
    cfg: Config,
    request: RemediateRequest,
    demo_node: str | None,
    gpu: str,
    action: Action | None,
    actor: Actor,
    ask: Ask | None,
    report: Report,
) -> bool:
    """This machine's GPU, or with `demo_node` a simulated node's."""
    executor = _executor(cfg, demo_node, request.dry_run, report)
    try:
        await recovered_first(executor, request.dry_run, report)
        plan = await executor.plan_remedy(gpu, action)
        ask = None if request.json_progress else ask  # a head asks its own operator
        return await carry_out(executor, plan, request, actor, ask, report)
    finally:
        await executor.close()


def _executor(cfg: Config, demo_node: str | None, dry_run: bool, report: Report) -> Executor:
    try:
        if demo_node is not None:
            return demo_executor(demo_node, report.step, dry_run=dry_run)
        return node_executor(cfg, report.step, dry_run=dry_run)
    except sqlite3.Error as exc:  # its journal cannot be opened: nothing was done
        raise ActionRefused(f"{exc}; nothing was changed") from None
    except KeyError as exc:  # no such simulated node
        raise UsageError(str(exc.args[0] if exc.args else exc), COMMAND) from None
    except (ValueError, ConfigError, OSError) as exc:
        raise UsageError(str(exc), COMMAND) from None
