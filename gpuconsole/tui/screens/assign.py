"""Moving GPUs from the console: mark GPUs (by bus id: the number beside each is NVML's, only
a label), choose a target, read the plan, confirm by typing the node's name or the GPU's
number or bus id as shown, and watch each step tick; and placement help (N GPUs of a
model, with the NIC rails that go with them) that leads to such a plan.

The console offers these only to someone who may act, on a console that has a way to act
(`ActionAccess`) and is not read-only; the executor checks the role again where it runs.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import sqlite3
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.timer import Timer
from textual.widgets import Input, OptionList, SelectionList, Static
from textual.widgets.option_list import Option

from gpuconsole.actions.executor import (
    Executor,
    Outcome,
    PlanExecutor,
    StepUpdate,
)
from gpuconsole.actions.placement import Placement, Proposal, placements
from gpuconsole.actions.plan import Plan, Target
from gpuconsole.actions.roles import ActionRefused
from gpuconsole.config import ConfigError
from gpuconsole.facts import summaries
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.facts.summaries import PASSTHROUGH_GLYPH, UNSEEN_GLYPH
from gpuconsole.hardware import short_model
from gpuconsole.readings.base import Health
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.tui.widgets.footer import Footer
from gpuconsole.tui.widgets.plan_view import (
    hanging,
    plan_text,
    proposal_line,
    proposal_text,
    refusals_text,
)

if TYPE_CHECKING:
    from gpuconsole.tui.app import ConsoleApp

__all__ = ["AssignScreen", "ProposeScreen"]

log = logging.getLogger(__name__)

# Targets every node offers, with what each means; a node's guests follow as vm:NAME.
TARGETS: tuple[tuple[str, str], ...] = (
    ("free", "host pool: nvidia, out of Kubernetes"),
    ("k8s", "Kubernetes schedules it"),
    ("drained", "unbound: nothing may bind it"),
)


# --- the assign dialog -------------------------------------------------------------------


def _box_css(screen: str, name: str) -> str:
    """A dialog in a box over the view it came from, with news lines at its top."""
    return f"""
    {screen} {{ align: center middle; }}
    #{name}-box {{
        width: 112; max-width: 96%; height: 90%;
        border: round $accent; border-title-color: $accent; border-subtitle-color: $text-muted;
        background: $surface; padding: 0 1;
    }}
    #{name}-news {{ height: auto; max-height: 5; }}
    """


class Stage(enum.StrEnum):
    """Where the dialog is: what Esc and Enter do depend on it."""

    OPENING = "opening"  # building the executor, recovering what a crash left
    CLOSED = "closed"  # this console cannot act on the node: only Esc
    CHOOSE = "choose"  # marking GPUs, choosing a target
    PLANNING = "planning"
    PLAN = "plan"  # the plan shown, waiting for the confirmation
    RUNNING = "running"
    REFUSED = "refused"  # the executor refused for a reason typing cannot change
    DONE = "done"


class StepChanged(Message):
    """The executor reported a step running, done, failed or undone (from any thread)."""

    def __init__(self, update: StepUpdate) -> None:
        super().__init__()
        self.update = update


class GpuMarks(SelectionList[str]):
    """The GPUs to move: space marks one; Enter goes on to the targets, never marks (a GPU
    in use marked by a stray Enter would be planned for)."""

    BINDINGS: ClassVar = [Binding("enter", "to_targets", "Targets", show=False)]

    def action_to_targets(self) -> None:
        self.screen.query_one("#assign-targets", OptionList).focus()


class Targets(OptionList):
    """Where the marked GPUs go; the cursor is on one whenever the list has the keyboard.
    A letter goes to the targets that start with it: the only one is planned at once
    (`d` drains), else the cursor goes to the first (`v`: the first guest)."""

    def on_focus(self) -> None:
        if self.highlighted is None and self.option_count:
            self.highlighted = 0

    def on_key(self, event: events.Key) -> None:
        char = event.character
        if not (event.is_printable and char and char.isalpha()):
            return
        found = [
            k
            for k in range(self.option_count)
            if (self.get_option_at_index(k).id or "")[:1] == char
        ]
        if not found:
            return
        event.stop()
        self.highlighted = found[0]
        if len(found) == 1:
            self.action_select()


class AssignScreen(ModalScreen[None]):
    """Move GPUs of one node to a target: choose, plan, confirm by typing, watch the steps."""

    DEFAULT_CSS = (
        _box_css("AssignScreen", "assign")
        + """
    #assign-choose { height: 1fr; }
    #assign-gpus, #assign-targets { width: 1fr; height: 1fr; border: round $primary 50%; }
    #assign-plan-box { height: 1fr; display: none; }
    #assign-confirm { display: none; }
    """
    )
    BINDINGS: ClassVar = [
        Binding("escape", "back", "Back"),
        # the plan scrolls while the confirmation has the keyboard
        Binding("pageup", "scroll_plan(-1)", "Scroll plan", show=False, key_display="PgUp"),
        Binding("pagedown", "scroll_plan(1)", "Scroll plan", show=False, key_display="PgDn"),
    ]
    HELP_EXTRA = (
        ("space", "mark or unmark the GPU under the cursor"),
        ("Enter", "plan for the target under the cursor; run once the confirmation is typed"),
    )

    def __init__(self, node: str, gpus: Sequence[str] = (), target: Target | None = None) -> None:
        """`gpus`: bus ids marked to begin with; `target`: plan for it at once."""
        super().__init__()
        self.node_name = node
        self.marked = tuple(gpus)
        self.target = target
        self.stage = Stage.OPENING
        self.executor: PlanExecutor | None = None
        self.plan: Plan | None = None
        self.outcome: Outcome | None = None
        self.progress: dict[int, tuple[str, str]] = {}
        self.now: dict[str, str] = {}  # each GPU's owner once the plan ran, by bus id
        self._news: list[tuple[str, Health | None]] = []
        self._refusal = ""
        self._ended_at = 0.0  # when another node's plan ended: its agent's readings after count
        self._watching: Timer | None = None

    @property
    def console(self) -> ConsoleApp:
        return cast("ConsoleApp", self.app)

    def crumbs(self) -> list[str]:
        """Where help says it was opened."""
        return ["Fleet", self.node_name, "move GPUs"]

    # --- layout --------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Vertical(id="assign-box") as box:
            box.border_title = f"move GPUs of {self.node_name}"
            yield Static(id="assign-news")
            with Horizontal(id="assign-choose"):
                gpus = GpuMarks(id="assign-gpus")
                gpus.border_title = "GPUs (space marks)"
                yield gpus
                targets = Targets(id="assign-targets")
                targets.border_title = "to (Enter plans)"
                yield targets
            with VerticalScroll(id="assign-plan-box"):
                yield Static(id="assign-plan")
            confirm = Input(id="assign-confirm")
            confirm.cursor_blink = self.console.cursor_blink
            yield confirm
        yield Footer()

    def on_mount(self) -> None:
        self._fill_choices()
        self._show()
        self.run_worker(self._open(), group="assign")

    async def on_unmount(self) -> None:
        executor, self.executor = self.executor, None
        if executor is not None:
            await executor.close()  # its journal, or another node's ssh connection

    def _node(self) -> NodeSnapshot | None:
        snapshot = self.console.snapshot
        return snapshot.node(self.node_name) if snapshot is not None else None

    def _fill_choices(self) -> None:
        """The node's GPUs (owner and bus id beside each) and where they can go."""
        node = self._node()
        gpus: SelectionList[str] = self.query_one("#assign-gpus", SelectionList)
        targets = self.query_one("#assign-targets", OptionList)
        if node is None:
            return
        palette = self.console.palette
        for row in node_gpus(node):
            # a GPU NVML cannot see has no number: its bus id, once, is its name
            if row.index is not None:
                prompt = Text(f"{row.name:<8} ")
            else:
                word = f"{PASSTHROUGH_GLYPH} vfio" if row.passthrough else f"{UNSEEN_GLYPH} other"
                prompt = Text(f"{word:<8} ",
                              style=palette.passthrough_fg if row.passthrough else palette.dim)  # fmt: skip
            prompt.append(f"{row.short_bus:<9} ", style=self.console.palette.dim)
            prompt.append(row.label)
            gpus.add_option((prompt, row.bus_id, row.bus_id in self.marked))
        options = [
            Option(Text.assemble((f"{w:<8}", "bold"), f" {why}"), id=w) for w, why in TARGETS
        ]
        buses = {row.bus_id for row in node_gpus(node)}
        for guest in node.tenancy.guests if node.tenancy is not None else ():
            holds = len(buses.intersection(guest.bus_ids))
            word = f"vm:{guest.name}"
            why = f" guest, {guest.state}, holds {holds} GPU(s)"
            options.append(Option(Text.assemble((word, "bold"), why), id=word))
        targets.add_options(options)

    # --- what it says --------------------------------------------------------------

    def say(self, message: str, health: Health | None = None) -> None:
        """Add a line to the news above the plan (warnings, recovery, refusals, outcome)."""
        self._news.append((message, health))
        self._show()

    def _news_text(self) -> Text:
        palette = self.console.palette
        text = Text()
        lines = list(self._news)
        if self._refusal:
            lines.append((self._refusal, Health.WARNING))
        if self.outcome is not None:
            ok = self.outcome.ok
            lines.append(
                (
                    f"{self.outcome.state}: {self.outcome.message} (plan {self.outcome.plan_id})",
                    Health.OK if ok else Health.CRITICAL,
                )
            )
        for message, health in lines:
            text.append(message + "\n", style=palette.health[health] if health else "")
        if self.stage is Stage.OPENING:
            text.append("opening the action journal…", style=palette.dim)
        elif self.stage is Stage.PLANNING:
            text.append("planning from a fresh reading of the node…", style=palette.dim)
        text.rstrip()
        return text

    def _hint(self) -> str:
        if self.stage is Stage.CHOOSE:
            return "space marks GPUs · Enter on a target plans · Esc closes"
        if self.stage is Stage.PLAN and self.plan is not None and not self.plan.blocked:
            return f"type {self.plan.confirmation_words()}, then Enter, to run · Esc back"
        if self.stage is Stage.RUNNING:
            return "running: each step ticks as it completes"
        if self.stage in (Stage.PLAN, Stage.REFUSED):
            return "Esc back to the targets"
        return "Esc closes"

    def _show(self) -> None:
        """Lay the dialog out for its stage."""
        if not self.is_mounted:
            return
        planned = self.stage in (Stage.PLAN, Stage.RUNNING, Stage.REFUSED, Stage.DONE)
        self.query_one("#assign-choose").display = self.stage in (Stage.CHOOSE, Stage.PLANNING)
        self.query_one("#assign-plan-box").display = planned
        news = self._news_text()
        self.query_one("#assign-news", Static).update(news)
        self.query_one("#assign-news").display = bool(news.plain)
        box = self.query_one("#assign-box")
        box.border_subtitle = self._hint()
        confirm = self.query_one("#assign-confirm", Input)
        asking = self.stage in (Stage.PLAN, Stage.RUNNING) and not (self.plan and self.plan.blocked)
        confirm.display = asking
        confirm.disabled = self.stage is Stage.RUNNING
        if self.plan is not None:
            confirm.placeholder = f"type {self.plan.confirmation_words()} to confirm"
            self.query_one("#assign-plan", Static).update(
                hanging(plan_text(self.plan, self.console.palette, self.progress, self.now))
            )

    # --- the flow ------------------------------------------------------------------

    async def _open(self) -> None:
        """Build the node's executor and finish or roll back what a crash left."""
        access = self.console.actions
        if access is None:
            self.stage = Stage.CLOSED
            self.say("this console has no way to move GPUs", Health.WARNING)
            return
        try:
            self.executor = access.executor(self.node_name, self._on_step, self._on_note)
        except (ValueError, ConfigError, OSError, sqlite3.Error) as exc:
            self.stage = Stage.CLOSED
            self.say(f"cannot act on {self.node_name}: {exc}", Health.WARNING)
            return
        warning = access.warning()
        if warning:
            self.say(warning, Health.WARNING)
        try:
            recovered = await self.executor.recover()
        except Exception as exc:  # the console stays up; nothing can run until it is looked at
            log.exception("recovering %s", self.node_name)
            self.stage = Stage.CLOSED
            self.say(f"could not recover the journal's plans: {exc}", Health.CRITICAL)
            return
        self._said_recovered(recovered)
        if self._node() is None:
            self.stage = Stage.CLOSED
            self.say(f"{self.node_name} is not in the latest snapshot", Health.WARNING)
            return
        await self._opened()

    async def _opened(self) -> None:
        """The executor is ready: choose, or plan for the target given at once."""
        self.stage = Stage.CHOOSE
        self._show()
        if self.target is not None:
            await self._make_plan(self.target)
        else:
            self._focus_choice()

    def _focus_choice(self) -> None:
        """The targets when GPUs are marked (the node view marks the one under its cursor),
        else the GPUs to mark first."""
        marked = self.query_one("#assign-gpus", SelectionList).selected
        self.query_one("#assign-targets" if marked else "#assign-gpus").focus()

    def _said_recovered(self, recovered: list[Outcome]) -> None:
        for outcome in recovered:
            health = Health.OK if outcome.ok else Health.WARNING
            self.say(f"journal: plan {outcome.plan_id} {outcome.message}", health)

    def _on_note(self, text: str) -> None:
        """What another node said as it planned: a plan of its journal running there, or
        left unfinished, and what the real run does with it first."""
        self.say(text, Health.WARNING)

    def _on_step(self, update: StepUpdate) -> None:
        # the executor may call this from another thread: post_message is safe from any
        self.post_message(StepChanged(update))

    def on_step_changed(self, message: StepChanged) -> None:
        update = message.update
        self.progress[update.seq] = (update.state, update.detail)
        self._show()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option_list.id != "assign-targets" or event.option.id is None:
            return
        if self.stage is not Stage.CHOOSE:
            return
        event.stop()
        self.run_worker(self._make_plan(Target.parse(event.option.id)), group="assign")

    async def _ask_plan(self, target: Target) -> Plan | None:
        """The plan for the marked GPUs; None (said why) when there is none to ask for."""
        assert self.executor is not None
        keys = list(self.query_one("#assign-gpus", SelectionList).selected)
        if not keys:
            self.notify("mark the GPUs to move first (space)", severity="warning")
            return None
        return await self.executor.plan(keys, target)

    async def _make_plan(self, target: Target) -> None:
        assert self.executor is not None
        stage = self.stage
        self.stage = Stage.PLANNING
        self._refusal = ""
        self._show()
        try:
            asked = await self._ask_plan(target)
        except Exception as exc:  # a reading that failed: say so, let them try again
            log.exception("planning %s on %s", target, self.node_name)
            self.stage = Stage.CHOOSE
            self.say(f"could not plan: {exc}", Health.CRITICAL)
            return
        if asked is None:
            self.stage = stage
            self._show()
            return
        plan = asked
        if not isinstance(self.executor, Executor):  # another node recovers as it plans
            self._said_recovered(await self.executor.recover())
        self.plan, self.progress, self.now, self.outcome = plan, {}, {}, None
        if self._watching is not None:  # a new plan: the last one's report no longer matters
            self._watching.stop()
            self._watching = None
        self.stage = Stage.PLAN
        self._show()
        if not plan.blocked:
            confirm = self.query_one("#assign-confirm", Input)
            confirm.value = ""
            confirm.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "assign-confirm" or self.stage is not Stage.PLAN:
            return
        event.stop()
        self.run_worker(self._execute(event.value), group="assign")

    async def _execute(self, typed: str) -> None:
        """Hand the plan and what was typed to the executor, which decides."""
        from gpuconsole.actions.over_ssh import ContactLost, RemoteError

        assert self.executor is not None and self.plan is not None
        plan = self.plan
        self.stage = Stage.RUNNING
        self._refusal = ""
        self._show()
        try:
            self.outcome = await self.executor.execute(plan, self.console.actor, typed)
        except ActionRefused as exc:
            self._refusal = f"refused, nothing changed: {exc}"
            if typed.strip() in plan.confirmations():
                self.stage = Stage.REFUSED  # typing again would not change the answer
            else:
                self.stage = Stage.PLAN
                self.query_one("#assign-confirm", Input).value = ""
        except ContactLost as exc:  # another node's, mid-plan: it says how the node ends it
            self.stage = Stage.DONE
            self.say(str(exc), Health.CRITICAL)
        except RemoteError as exc:  # another node's, before anything started there
            self.stage = Stage.DONE
            self.say(f"nothing started on {self.node_name}: {exc}", Health.CRITICAL)
        except Exception as exc:  # the console stays up; the journal knows how far it got
            log.exception("executing %s on %s", plan.target, self.node_name)
            self.stage = Stage.DONE
            self.say(
                f"the plan stopped: {exc}. Its GPUs stay locked, left to recovery: opening "
                f"this view again, or `gpuconsole assign --recover` on {self.node_name}, "
                "finishes the plan or rolls it back",
                Health.CRITICAL,
            )
        else:
            self.stage = Stage.DONE
        if self.stage is Stage.DONE and self.console.actions is not None:
            self.console.actions.executed(self.node_name)  # it ran, so drivers may differ
        if self.stage is Stage.DONE:
            self.now = await self._owners_now(plan)
        self._show()
        if self.stage is Stage.PLAN:
            self.query_one("#assign-confirm", Input).focus()

    async def _owners_now(self, plan: Plan) -> dict[str, str]:
        """Each GPU's owner after the run, by bus id: from a fresh reading of the node where
        the executor reads it, else from the console's latest snapshot; for another node's
        plan, once its agent reports a reading taken after the plan ended (watched for until
        then: what the console had before is what the plan changed)."""
        from gpuconsole.actions.plan import owners_of

        if not isinstance(self.executor, Executor):
            self._ended_at = time.time()  # the node's clock, as its readings carry it
            if self._watching is None:
                self._watching = self.set_interval(1.0, self._watch_report)
            self.say(f"the GPUs show as {self.node_name}'s agent next reports them", None)
            return {}
        node = None
        reader = getattr(self.executor, "reader", None)
        if reader is not None:
            try:
                node = await reader()
            except Exception as exc:  # the run is over either way: the snapshot then
                log.warning("reading %s after the plan: %s", self.node_name, exc)
        node = node or self._node()
        if node is None:
            return {}
        ownership = owners_of(node)
        return {bus: gpu.label for bus in plan.gpus if (gpu := ownership.gpu(bus)) is not None}

    def _watch_report(self) -> None:
        """Another node's plan ended: show its GPUs' owners from the first reading its agent
        took after that."""
        from gpuconsole.actions.plan import owners_of

        node = self._node()
        if self.plan is None or node is None or node.nvml is None:
            return
        if node.nvml.at < self._ended_at:
            return
        if self._watching is not None:
            self._watching.stop()
            self._watching = None
        ownership = owners_of(node)
        self.now = {
            bus: gpu.label for bus in self.plan.gpus if (gpu := ownership.gpu(bus)) is not None
        }
        self._show()

    def action_scroll_plan(self, pages: int) -> None:
        box = self.query_one("#assign-plan-box", VerticalScroll)
        box.scroll_to(y=box.scroll_y + pages * max(1, box.size.height - 1), animate=False)

    def action_back(self) -> None:
        if self.stage is Stage.RUNNING:
            self.notify("the plan is running: it finishes, or rolls back, by itself")
        elif self.stage in (Stage.PLAN, Stage.REFUSED):
            self.plan, self.progress, self._refusal = None, {}, ""
            self.stage = Stage.CHOOSE
            self._show()
            self._focus_choice()
        elif self.stage is not Stage.PLANNING:
            self.dismiss()


# --- placement help ----------------------------------------------------------------------


class ProposeScreen(ModalScreen[None]):
    """Placement help: N free GPUs (of a model) for a target that share an NVLink domain,
    with their NIC rails, on one node or across the fleet; Enter on one plans it."""

    DEFAULT_CSS = (
        _box_css("ProposeScreen", "propose")
        + """
    #propose-ask { height: 3; }
    #propose-ask Input { width: 1fr; border: round $primary 50%; }
    #propose-count { max-width: 12; }
    #propose-list { height: auto; max-height: 6; border: round $primary 50%; }
    #propose-detail-box { height: 1fr; }
    """
    )
    BINDINGS: ClassVar = [Binding("escape", "close", "Close")]

    def __init__(self, node: str | None = None) -> None:
        """`node`: propose on that node only; None: on every node of the snapshot."""
        super().__init__()
        self.node_name = node
        self.placement: Placement | None = None
        self.target: Target | None = None
        self._asked: tuple[str, str, str] | None = None  # the fields the proposals are for

    @property
    def console(self) -> ConsoleApp:
        return cast("ConsoleApp", self.app)

    def crumbs(self) -> list[str]:
        return ["Fleet", *([self.node_name] if self.node_name else []), "propose GPUs"]

    def compose(self) -> ComposeResult:
        with Vertical(id="propose-box") as box:
            box.border_title = f"propose GPUs on {self.node_name or 'every node'}"
            box.border_subtitle = "Enter proposes · Enter on a proposal plans it · Esc closes"
            models, targets = self._choices()
            with Horizontal(id="propose-ask"):
                count = Input("1", type="integer", id="propose-count")
                count.border_title = "GPUs"
                yield count
                # a letter or two and → completes a model or a target from the fleet's own
                model = Input(placeholder="H100, A100… or any (→ completes)", id="propose-model",
                              suggester=SuggestFromList(models, case_sensitive=False))  # fmt: skip
                model.border_title = "model"
                yield model
                target = Input(placeholder="free, k8s, drained, vm:NAME (→ completes)",
                               id="propose-target",
                               suggester=SuggestFromList(targets, case_sensitive=False))  # fmt: skip
                target.border_title = "for"
                yield target
            yield Static(id="propose-news")
            proposals = OptionList(id="propose-list")
            proposals.border_title = "proposals, best first"
            yield proposals
            # not in the Tab order: Tab from the proposals goes back to the request
            with VerticalScroll(id="propose-detail-box", can_focus=False):
                yield Static(id="propose-detail")
        yield Footer()

    def _choices(self) -> tuple[list[str], list[str]]:
        """The GPU models of the nodes proposed on, and the targets (the guests by name)."""
        snapshot = self.console.snapshot
        nodes = [n for n in snapshot.nodes if self.node_name in (None, n.node)] if snapshot else []
        models = sorted({short_model(g.name) for n in nodes for g in n.gpus if g.name})
        # a guest that holds no GPU yet (waiting for one) first, then by its node's free GPUs
        ranked: dict[str, tuple[bool, int, str]] = {}
        for node in nodes:
            buses = {row.bus_id for row in node_gpus(node)}
            free = summaries.gpu_counts(node).free
            for guest in node.tenancy.guests if node.tenancy is not None else ():
                key = (bool(buses.intersection(guest.bus_ids)), -free, guest.name)
                ranked[guest.name] = min(key, ranked.get(guest.name, key))
        guests = sorted(ranked, key=ranked.__getitem__)
        return models, [w for w, _ in TARGETS] + [f"vm:{g}" for g in guests]

    def on_mount(self) -> None:
        blink = self.console.cursor_blink
        for field in self.query(Input):
            field.cursor_blink = blink
        self.query_one("#propose-count", Input).focus()

    def _ask(self) -> tuple[str, str, str]:
        count, model, target = (
            self.query_one(f"#propose-{k}", Input).value.strip()
            for k in ("count", "model", "target")
        )
        return count, model, target

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Propose; for the same request again, back to its proposals rather than a run
        that would change nothing on screen."""
        event.stop()
        proposals = self.query_one("#propose-list", OptionList)
        if self._ask() == self._asked and proposals.option_count:
            proposals.focus()
            self.notify("the same request: Enter on a proposal plans it", timeout=3)
            return
        self.run_worker(self._propose(), group="propose", exclusive=True)

    async def _propose(self) -> None:
        news = self.query_one("#propose-news", Static)
        bad = self.console.palette.health[Health.WARNING]
        count_text = self.query_one("#propose-count", Input).value.strip()
        model = self.query_one("#propose-model", Input).value.strip() or None
        wanted = self.query_one("#propose-target", Input).value.strip()
        try:
            count = int(count_text)
            target = Target.parse(wanted) if wanted else None
        except ValueError as exc:
            news.update(Text(str(exc) if wanted else "how many GPUs?", style=bad))
            return
        if count < 1:
            news.update(Text("ask for one GPU or more", style=bad))
            return
        snapshot = self.console.snapshot
        access = self.console.actions
        if snapshot is None or access is None:
            news.update(Text("no data to propose from yet", style=bad))
            return
        nodes = [n for n in snapshot.nodes if self.node_name in (None, n.node)]
        note = Text()
        try:
            contexts = await access.contexts([n.node for n in nodes])
        except Exception as exc:  # without cordons, GPUs already in Kubernetes look free
            log.warning("placement contexts: %s", exc)
            note = Text(f"Kubernetes cordons unknown: {exc}", style=bad)
            contexts = {}
        # pure but not cheap over a big fleet: off the event loop
        self.placement = await asyncio.to_thread(placements, nodes, count, model, target, contexts)
        self.target = target
        self._asked = (count_text, model or "", wanted)
        found = len(self.placement.proposals)
        if found:
            asked = f"{count} {model or 'GPU'}{'s' if count > 1 and not model else ''}"
            note.append("\n" if note.plain else "")
            note.append(f"{found} proposal{'s' if found > 1 else ''} for {asked}"
                        f"{f' for {target}' if target else ''}: Enter on one plans it")  # fmt: skip
        self._show_placement(note)

    def _show_placement(self, note: Text) -> None:
        placement = self.placement
        assert placement is not None
        palette = self.console.palette
        proposals = self.query_one("#propose-list", OptionList)
        proposals.clear_options()
        news = self.query_one("#propose-news", Static)
        if placement.best is None:
            note.append("\n" if note.plain else "")
            note.append("no node can serve this request", style=palette.health[Health.WARNING])
            news.update(note)
            self.query_one("#propose-detail", Static).update(refusals_text(placement, palette))
            return
        news.update(note)
        proposals.add_options(
            Option(proposal_line(p), id=str(k)) for k, p in enumerate(placement.proposals)
        )
        proposals.highlighted = 0
        proposals.focus()
        self._show_detail(placement.proposals[0])

    def _show_detail(self, proposal: Proposal) -> None:
        assert self.placement is not None
        palette = self.console.palette
        text = proposal_text(proposal, palette)
        if self.placement.refusals:
            text.append("\n\nnot on:\n", style=palette.dim)
            text.append_text(refusals_text(self.placement, palette))
        self.query_one("#propose-detail", Static).update(hanging(text))

    def _chosen(self, option_id: str | None) -> Proposal | None:
        if self.placement is None or option_id is None:
            return None
        return self.placement.proposals[int(option_id)]

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        proposal = self._chosen(event.option.id)
        if proposal is not None:
            self._show_detail(proposal)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Accept: the assign dialog with these GPUs marked, planned at once for a target."""
        proposal = self._chosen(event.option.id)
        if proposal is not None:
            self.app.switch_screen(AssignScreen(proposal.node, proposal.keys, self.target))

    def action_close(self) -> None:
        self.dismiss()
