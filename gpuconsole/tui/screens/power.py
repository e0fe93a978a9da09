"""Powering a node from the console, as `gpuconsole power` does: choose on, off, soft off,
reset or power cycle; read what it will do (the BMC, the power now, who runs there and so
stops); confirm by typing the node's name; the request is checked and audited where it
executes (gpuconsole.actions.power)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from gpuconsole.actions.power import PowerRequest, power
from gpuconsole.actions.remediation import power_stops
from gpuconsole.actions.roles import ActionRefused
from gpuconsole.readings.base import Health
from gpuconsole.sources.bmc.link import BmcError, PowerAction
from gpuconsole.tui.widgets.footer import Footer

if TYPE_CHECKING:
    from gpuconsole.tui.app import ConsoleApp

__all__ = ["POWER_CHOICES", "PowerScreen"]

log = logging.getLogger(__name__)

POWER_CHOICES: tuple[tuple[PowerAction, str], ...] = (
    (PowerAction.ON, "power on"),
    (PowerAction.OFF, "power off at once (no shutdown)"),
    (PowerAction.SOFT, "soft off: ask the OS to shut down"),
    (PowerAction.RESET, "reset: restart at once"),
    (PowerAction.CYCLE, "power cycle: off, then on again"),
)
# What takes the node's work down with it
_STOPS = (PowerAction.OFF, PowerAction.SOFT, PowerAction.RESET, PowerAction.CYCLE)


class PowerScreen(ModalScreen[None]):
    """Power one node through its BMC: choose, read, type its name, Enter."""

    DEFAULT_CSS = """
    PowerScreen { align: center middle; }
    #power-box {
        width: 96; max-width: 96%; height: auto; max-height: 90%;
        border: round $accent; border-title-color: $accent; border-subtitle-color: $text-muted;
        background: $surface; padding: 0 1;
    }
    #power-choices { height: auto; border: round $primary 50%; }
    #power-plan { height: auto; }
    #power-confirm { display: none; }
    """
    BINDINGS: ClassVar = [Binding("escape", "back", "Back")]

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node_name = node
        self.choice: PowerAction | None = None
        self.answer = ""  # what the BMC said, or why nothing was sent
        self.running = False

    @property
    def console(self) -> ConsoleApp:
        return cast("ConsoleApp", self.app)

    def crumbs(self) -> list[str]:
        return ["Fleet", self.node_name, "power"]

    def compose(self) -> ComposeResult:
        with Vertical(id="power-box") as box:
            box.border_title = f"power {self.node_name}"
            choices = OptionList(
                *(
                    Option(Text.assemble((f"{a.value:<6}", "bold"), f" {why}"), id=a.value)
                    for a, why in POWER_CHOICES
                ),
                id="power-choices",
            )
            choices.border_title = "Enter chooses"
            yield choices
            yield Static(id="power-plan")
            confirm = Input(id="power-confirm")
            confirm.cursor_blink = self.console.cursor_blink
            yield confirm
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#power-choices", OptionList).focus()
        self._show()

    def _plan(self, action: PowerAction) -> Text:
        """What the request will do: through which BMC, the power now, who it stops."""
        palette = self.console.palette
        text = Text()
        text.append(f"power {action.value} {self.node_name}", style="bold")
        snapshot = self.console.snapshot
        node = snapshot.node(self.node_name) if snapshot is not None else None
        if node is not None and node.simulated:
            text.append("  ")
            text.append(" SIMULATED ", style=palette.simulated)
        access = self.console.actions
        try:
            control, _audit = access.power(self.node_name) if access else (None, None)
        except ValueError as exc:
            text.append(f"\n  ✗ {exc}", style=palette.health[Health.CRITICAL])
            return text
        if control is not None:
            text.append(f"\n  through its BMC {control.label}")
        if node is not None and node.bmc is not None:
            text.append(f"\n  power now: {node.bmc.power_state}")
        known = node is not None and node.tenancy is not None
        running = [o.label for o in power_stops(node)] if node is not None and known else []
        warn = palette.health[Health.WARNING]
        if action in _STOPS and running:
            text.append(f"\n  • it stops what runs there: {', '.join(running)}", style=warn)
        elif action in _STOPS and not known:
            # no tenancy reading: what runs there is not known, which is not nothing
            text.append("\n  • who runs there is not known (no tenancy reading of it)", style=warn)
        elif action in _STOPS:
            text.append("\n  nothing runs on its GPUs", style=palette.dim)
        text.append(f"\n  type {self.node_name} to confirm; the audit log records it", style="")
        return text

    def _show(self) -> None:
        plan = self.query_one("#power-plan", Static)
        confirm = self.query_one("#power-confirm", Input)
        box = self.query_one("#power-box")
        if self.choice is None:
            plan.update("")
            box.border_subtitle = "Enter chooses · Esc closes"
            return
        text = self._plan(self.choice)
        if self.answer:
            text.append(f"\n{self.answer}")
        plan.update(text)
        confirm.display = not self.answer.startswith(("requested", "failed"))
        confirm.placeholder = f"type {self.node_name} to confirm"
        box.border_subtitle = f"type {self.node_name}, then Enter · Esc back"

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is None or self.running:
            return
        event.stop()
        self.choice, self.answer = PowerAction(event.option.id), ""
        self.query_one("#power-choices").display = False
        self._show()
        confirm = self.query_one("#power-confirm", Input)
        confirm.value = ""
        confirm.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "power-confirm" or self.choice is None or self.running:
            return
        event.stop()
        self.running = True
        self.run_worker(self._request(self.choice, event.value.strip()), group="power")

    async def _request(self, action: PowerAction, typed: str) -> None:
        """Hand the request to the power action, which checks, audits and sends it."""
        access = self.console.actions
        try:
            if access is None:
                raise ActionRefused("this console has no way to act")
            control, audit = access.power(self.node_name)
            request = PowerRequest(self.node_name, action, self.console.actor, typed)
            said = await power(request, control, audit)
            self.answer = f"requested: power {action.value} sent through {control.label} ({said})"
        except (ActionRefused, ValueError) as exc:
            self.answer = f"refused, nothing sent: {exc}"
            self.query_one("#power-confirm", Input).value = ""
        except BmcError as exc:
            self.answer = f"failed: {exc}"
        finally:
            self.running = False
        self._show()

    def action_back(self) -> None:
        if self.running:
            self.notify("the request is on its way to the BMC")
        elif self.choice is not None and not self.answer.startswith("requested"):
            self.choice, self.answer = None, ""
            self.query_one("#power-choices").display = True
            self.query_one("#power-confirm").display = False
            self._show()
            self.query_one("#power-choices", OptionList).focus()
        else:
            self.dismiss()
