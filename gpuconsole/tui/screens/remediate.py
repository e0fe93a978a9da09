"""Repairing a GPU from the console: the plan its verdict's action implies (drain, reset,
power cycle, service), confirmed by typing, run by the same executor as a reassignment,
each step ticking; and when it did not make the GPU fit, the next action offered (`n`).
On a head, a GPU of another node is planned and repaired by that node's own gpuconsole
over ssh, as a reassignment there is (gpuconsole.actions.over_ssh)."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding

from gpuconsole.actions.journal import PlanState
from gpuconsole.actions.plan import Plan, Target, TargetKind
from gpuconsole.actions.remediation import escalation
from gpuconsole.facts.inventory import short_bus_id
from gpuconsole.facts.verdict import Action
from gpuconsole.tui.screens.assign import AssignScreen, Stage

__all__ = ["RemediateScreen"]


class RemediateScreen(AssignScreen):
    """Carry out what one GPU's verdict asks for (or `action`), as a plan."""

    BINDINGS: ClassVar = [
        *AssignScreen.BINDINGS,
        Binding("n", "next", "Next action"),  # offered once a plan did not make it fit
    ]
    HELP_EXTRA = (
        ("Enter", "run the plan once the confirmation is typed"),
        ("n", "plan the next action when this one did not make the GPU fit"),
    )

    def __init__(self, node: str, bus_id: str, action: Action | None = None) -> None:
        super().__init__(node, (bus_id,))
        self.bus_id = bus_id
        self.action = action

    def crumbs(self) -> list[str]:
        return ["Fleet", self.node_name, f"repair {short_bus_id(self.bus_id)}"]

    def on_mount(self) -> None:  # AssignScreen's runs too: Textual calls each class's
        box = self.query_one("#assign-box")
        box.border_title = f"repair GPU {short_bus_id(self.bus_id)} of {self.node_name}"

    def _show(self) -> None:
        super()._show()
        if self.is_mounted:
            self.query_one("#assign-choose").display = False  # one GPU, its verdict's plan

    def _hint(self) -> str:
        after = self._next()
        if self.stage is Stage.DONE and after is not None:
            return f"n plans the next: {after.value} · Esc closes"
        if self.stage in (Stage.CHOOSE, Stage.PLAN, Stage.REFUSED) and (
            self.plan is None or self.plan.blocked or self.stage is not Stage.PLAN
        ):
            return "Esc closes"
        return super()._hint()

    async def _opened(self) -> None:
        await self._make_plan(Target(TargetKind.FREE))  # the plan says where it ends

    async def _ask_plan(self, target: Target) -> Plan | None:
        """This machine's plan, or another node's from its own verdict (over ssh)."""
        assert self.executor is not None
        return await self.executor.plan_remedy(self.bus_id, self.action)

    def _next(self) -> Action | None:
        """The action after this plan's, when it ran and did not make the GPU fit; none
        after a plan the node's reboot interrupted (no repair of it failed: its outcome
        says how the GPU reads now, and `r` plans from the verdict again)."""
        if self.plan is None or self.outcome is None or self.outcome.state != PlanState.FAILED:
            return None
        return escalation(Action(self.plan.remedy))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next":
            return self._next() is not None
        return True

    def action_next(self) -> None:
        after = self._next()
        if after is None or self.stage is not Stage.DONE:
            return
        self.action = after
        self.refresh_bindings()
        self.run_worker(self._make_plan(Target(TargetKind.FREE)), group="assign")

    def action_back(self) -> None:
        if self.stage is Stage.RUNNING:
            self.notify("the plan is running: it finishes by itself")
        elif self.stage is not Stage.PLANNING:
            self.dismiss()
