"""How a console acts on GPUs: on this machine (`MachineAccess`, from the config), on the
simulated demo cluster (`DemoAccess`), or not at all (a replay, a viewer)."""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

from gpuconsole.actions.executor import Executor, PlanExecutor, StepUpdate
from gpuconsole.actions.plan import PlanContext
from gpuconsole.config import Config, ConfigError
from gpuconsole.hub import Hub
from gpuconsole.sources.base import EmitEvent

if TYPE_CHECKING:  # the BMC's modules load when a power dialog opens, not with the console
    from gpuconsole.actions.audit import AuditLog
    from gpuconsole.actions.power import PowerControl

__all__ = ["ActionAccess", "DemoAccess", "MachineAccess", "OnNote", "OnStep", "demo_access"]

log = logging.getLogger(__name__)

OnStep = Callable[[StepUpdate], None]
OnNote = Callable[[str], None]


class ActionAccess(abc.ABC):
    """How a console moves GPUs: an executor per node, its events posted to the hub the
    console reads, so that every step and outcome lands in the Events view."""

    demo: ClassVar[bool] = False

    @abc.abstractmethod
    def executor(self, node: str, on_step: OnStep, on_note: OnNote | None = None) -> PlanExecutor:
        """The executor for `node`; ValueError says why this console cannot act there.
        `on_note`: what another node says as it plans (a plan of its journal running there,
        or left unfinished, and what the real run does with it first)."""

    def warning(self) -> str:
        """What the person should know before acting (a state folder nobody else sees)."""
        return ""

    async def contexts(self, nodes: Sequence[str]) -> dict[str, PlanContext]:
        """What each node's Kubernetes layer says, for placement help (none known: {})."""
        return {}

    def executed(self, node: str) -> None:  # noqa: B027 - most consoles need nothing here
        """A plan ran on `node` (done or not): GPUs may have changed drivers."""

    def power(self, node: str) -> tuple[PowerControl, AuditLog]:
        """The BMC that powers `node` (as this console's hub reads it) and the audit log its
        requests go to; ValueError says why this console cannot power it."""
        raise ValueError(f"this console cannot power {node}")


def _hub_bmc(hub: Hub | None, node: str) -> PowerControl:
    """The BMC source a hub reads for `node`: the one power requests go through."""
    from gpuconsole.sources.bmc import BmcSource

    for source in hub.sources if hub is not None else ():
        if isinstance(source, BmcSource) and source.node == node:
            return source
    raise ValueError(f"no BMC is configured for {node}: add a [[bmc]] for it")


def _rediscover(hub: Hub | None, node: str) -> None:
    # NVML numbers GPUs when it starts: one bound to or from nvidia (or reset) shows only
    # after the node's NVML source looks again.
    from gpuconsole.sources.nvml.source import NvmlSource

    for source in hub.sources if hub is not None else ():
        if isinstance(source, NvmlSource) and source.node == node:
            source.rediscover()


class MachineAccess(ActionAccess):
    """This machine's GPUs, with the drivers and the shared state folder the config names.

    Another node's GPUs move on that node: with `remote` (an operator's own console on a
    head) through its own gpuconsole over ssh, as `assign --node` does, with this process's
    ssh identity; without (the ssh-in console, whose sessions would all act as the server's
    user) the console tells the command to run there.
    """

    def __init__(
        self, cfg: Config, emit: EmitEvent, hub: Hub | None = None, *, remote: bool = False
    ) -> None:
        self.cfg = cfg
        self.emit = emit
        self.hub = hub
        self.remote = remote

    def executed(self, node: str) -> None:
        _rediscover(self.hub, node)

    def power(self, node: str) -> tuple[PowerControl, AuditLog]:
        from gpuconsole.actions.store import action_store

        return _hub_bmc(self.hub, node), action_store(self.cfg.actions).audit()

    def executor(self, node: str, on_step: OnStep, on_note: OnNote | None = None) -> PlanExecutor:
        from gpuconsole.wiring import console_executor, remote_executor

        if not self.remote or node == self.cfg.host.node_name:
            return console_executor(self.cfg, node, self.emit, on_step=on_step)
        from gpuconsole.actions.over_ssh import RemoteError

        try:
            return remote_executor(self.cfg, node, on_step=on_step, on_note=on_note, emit=self.emit)
        except RemoteError as exc:
            raise ValueError(str(exc)) from None

    def warning(self) -> str:
        from gpuconsole.actions.store import action_store

        try:
            return action_store(self.cfg.actions).warning
        except ConfigError as exc:
            return str(exc)

    async def contexts(self, nodes: Sequence[str]) -> dict[str, PlanContext]:
        here = self.cfg.host.node_name
        if here not in nodes:
            return {}
        from gpuconsole.wiring import console_executor

        executor = console_executor(self.cfg, here, self.emit)
        try:
            return {here: await executor.context()}
        finally:
            await executor.close()


class DemoAccess(ActionAccess):
    """The simulated cluster a demo hub reads: plans act on the very simulator the hub
    polls, so every console on that hub (every ssh session) sees the GPU change owner."""

    demo = True

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def executor(self, node: str, on_step: OnStep, on_note: OnNote | None = None) -> Executor:
        from gpuconsole.wiring import live_demo_executor

        return live_demo_executor(self.hub, node, on_step)

    async def contexts(self, nodes: Sequence[str]) -> dict[str, PlanContext]:
        from gpuconsole.wiring import live_demo_contexts

        return live_demo_contexts(self.hub, nodes)

    def executed(self, node: str) -> None:
        _rediscover(self.hub, node)

    def power(self, node: str) -> tuple[PowerControl, AuditLog]:
        from gpuconsole.wiring import live_demo_audit

        return _hub_bmc(self.hub, node), live_demo_audit(self.hub, node)


def demo_access(hub: Hub | None) -> DemoAccess | None:
    """Actions on the simulated tenants that a console's hub reads; None for a hub of real
    nodes (it needs the config: `MachineAccess`) or no hub at all (a replay)."""
    from gpuconsole.wiring import simulates_tenants

    if hub is not None and simulates_tenants(hub):
        return DemoAccess(hub)
    return None
