"""The command palette (`:` or ctrl+p): its jump list of every view, node and GPU by name,
and the palette screen itself, hardened against keys that outrun it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, cast

from textual import events, on
from textual.await_complete import AwaitComplete
from textual.command import (
    CommandInput,
    CommandList,
    CommandPalette,
    DiscoveryHit,
    Hit,
    Hits,
    Provider,
    SearchIcon,
)
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, LoadingIndicator, OptionList

from gpuconsole.tui.screens.base import BaseView

if TYPE_CHECKING:
    from textual.app import ComposeResult

    from gpuconsole.tui.app import ConsoleApp


class JumpCommands(Provider):
    """Views, nodes and GPUs of the latest snapshot as palette entries."""

    def _targets(self) -> Iterator[tuple[str, str, str, str | None, int | None]]:
        """(label, help, view, node, gpu) for every place the console can show."""
        app = cast("ConsoleApp", self.app)
        yield "fleet", "every node at a glance", "fleet", None, None
        yield "events", "XID, ECC, throttle and source events", "events", None, None
        snapshot = app.snapshot
        if snapshot is None:
            return
        for node in snapshot.nodes:
            yield node.node, "node view", "node", node.node, None
            yield (
                f"{node.node} topology",
                "topo -m matrix and PCIe tree",
                "topology",
                node.node,
                None,
            )
            for gpu in node.gpus:
                label = f"{node.node} gpu {gpu.index}"
                yield label, f"GPU detail ({gpu.name})", "gpu", node.node, gpu.index
                yield f"{label} sm map", "SM layout, MIG and GPM", "smmap", node.node, gpu.index

    def _go(self, view: str, node: str | None, gpu: int | None) -> None:
        cast("ConsoleApp", self.app).jump(view, node, gpu)

    async def discover(self) -> Hits:
        for label, help_text, view, node, gpu in self._targets():
            if view in ("fleet", "events", "node"):
                yield DiscoveryHit(label, partial(self._go, view, node, gpu), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, help_text, view, node, gpu in self._targets():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(self._go, view, node, gpu),
                          help=help_text)  # fmt: skip


class ConsoleCommands(Provider):
    """The console's own commands, for the role at it: help, a theme by name, quit, and for
    those who may act, proposing and moving GPUs. The palette offers these and the jump
    list only; Textual's own commands (screenshots written to the server's disk, themes
    without the console's colours) are not the console's to offer."""

    def _commands(self) -> Iterator[tuple[str, str, Callable[[], object]]]:
        """(label, help, what it does) for every command this person may use here."""
        app = cast("ConsoleApp", self.app)
        screen = self.screen  # the view the palette was opened over
        yield "help", "the keys of this view", app.action_help
        for name in app.theme_names:
            yield f"theme {name}", "the console's colours", partial(app.set_theme, name)
        if app.may_act and isinstance(screen, BaseView):  # as the `p` and `a` keys are
            yield "propose", "free GPUs of one NVLink domain for a request", app.action_propose
            if any(b.binding.action == "assign" for b in screen.active_bindings.values()):
                yield (
                    "assign",
                    "move the GPU under the cursor",
                    partial(screen.run_action, "assign"),
                )
        yield "quit", "leave the console", app.action_quit

    async def discover(self) -> Hits:
        for label, help_text, command in self._commands():
            yield DiscoveryHit(label, command, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, help_text, command in self._commands():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), command, help=help_text)


MAX_QUERY_CHARS = 80
"""Longest text the jump list takes: wider than any label it offers, far below a paste."""


class JumpInput(CommandInput):
    """The palette's input, at most MAX_QUERY_CHARS long; says once when it drops text."""

    def __init__(self) -> None:
        super().__init__(
            placeholder="Search for commands…", select_on_focus=False, max_length=MAX_QUERY_CHARS
        )
        self._told = False

    def restricted(self) -> None:
        # Input rings the bell for every refused key: a paste typed out is thousands of them.
        if not self._told:
            self._told = True
            self.app.bell()
            self.notify(
                f"the jump list takes at most {MAX_QUERY_CHARS} characters; the rest was dropped",
                severity="warning",
                timeout=4,
            )

    def _on_paste(self, event: events.Paste) -> None:
        # Input refuses a paste that does not fit whole; keep what fits instead.
        event.prevent_default()
        event.stop()
        lines = event.text.splitlines()
        if not lines:
            return
        start, end = sorted(self.selection)
        room = MAX_QUERY_CHARS - (len(self.value) - (end - start))
        text = lines[0][: max(room, 0)]
        if len(text) < len(lines[0]):
            self.restricted()
        if text:
            self.replace(text, start, end)


class ConsolePalette(CommandPalette):
    """Textual's command palette, made safe against keys and clicks that outrun it.

    Pressed quickly, two dismissals (Esc, Enter on a hit, a click beside the list) reached
    one palette: the second popped the view under it, or the last screen (ScreenStackError);
    an Esc before it mounted left it mounting off the stack. And each key searched every
    provider again at once, a burst of typing thousands of searches in a row. Here a
    palette off the stack does nothing, and a burst of keys searches once, for the latest
    text.
    """

    def __init__(self) -> None:
        super().__init__()
        self._query = ""
        self._search_queued = False

    def compose(self) -> ComposeResult:
        # CommandPalette.compose, with JumpInput for its input
        with Vertical(id="--container"):
            with Horizontal(id="--input"):
                yield SearchIcon()
                yield JumpInput()
            with Vertical(id="--results"):
                yield CommandList()
                yield LoadingIndicator()

    @property
    def on_stack(self) -> bool:
        return self in self.app.screen_stack

    def _on_mount(self, event: events.Mount) -> None:
        if not self.on_stack:  # dismissed before it mounted: nothing to search for
            event.prevent_default()

    def dismiss(self, result: None = None) -> AwaitComplete:
        """Close the palette; a no-op once it is no longer the top screen."""
        if not self.is_active:
            return AwaitComplete()  # done already: nothing to wait for
        return super().dismiss(result)

    @on(Input.Submitted)
    @on(OptionList.OptionSelected)
    def _ignore_when_closed(self, event: Message) -> None:
        if not self.is_active:  # a second Enter or click, after the first closed it
            event.stop()
            event.prevent_default()

    @on(Input.Changed)
    def _search_latest_later(self, event: Input.Changed) -> None:
        # Instead of CommandPalette._input, which searches on every change.
        event.stop()
        event.prevent_default()
        self._query = event.value.strip()
        if not self._search_queued:
            self._search_queued = True
            self.call_later(self._search_latest)

    def _search_latest(self) -> None:
        self._search_queued = False
        if not self.on_stack:  # closed since: its list may be gone already
            return
        self._cancel_gather_commands()
        self._stop_no_matches_countdown()
        self._gather_commands(self._query)
