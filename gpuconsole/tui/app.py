"""The console app: subscribes to the hub, keeps the latest snapshot, owns navigation."""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import ClassVar

from textual.app import App
from textual.await_complete import AwaitComplete
from textual.binding import Binding, BindingType
from textual.driver import Driver
from textual.screen import Screen
from textual.worker import Worker, WorkerCancelled, WorkerFailed

from gpuconsole.actions.roles import Actor, local_actor
from gpuconsole.facts.verdict import judge_fleet
from gpuconsole.hub import Hub
from gpuconsole.paths import user_themes_dir
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.actions import ActionAccess, demo_access
from gpuconsole.tui.commands import ConsoleCommands, ConsolePalette, JumpCommands
from gpuconsole.tui.driver import terminal_driver
from gpuconsole.tui.feed import HubFeed, SnapshotFeed
from gpuconsole.tui.messages import SnapshotArrived
from gpuconsole.tui.screens.assign import AssignScreen, ProposeScreen
from gpuconsole.tui.screens.base import BaseView
from gpuconsole.tui.screens.fleet import FleetScreen
from gpuconsole.tui.screens.help import HelpScreen, TooSmallScreen
from gpuconsole.tui.themes import Palette, load_themes, resolve_theme_name

log = logging.getLogger(__name__)

MIN_WIDTH, MIN_HEIGHT = 80, 24
# Once a tick the view draws the newest snapshot, or else moves the status bar's data age on.
TICK_S = 1.0
# For this long after a node is opened each snapshot is drawn as it lands: what the view
# opened comes with its sources' next reads (a fleet's node: its agent's every detail).
OPENING_S = 2.0
# New objects (less those freed) before the collector's youngest pass, in a console whose
# heap is its own (`freeze_heap`): a few frames' worth of the node view's.
YOUNG_OBJECTS = 10_000


def _about(screen: Screen[object]) -> tuple[str | None, str | None]:
    """The node and the GPU (by bus id) `screen` is about: a view's, a dialog's node; None
    for every node or GPU, and for the screens that are about none (help, the palette)."""
    if isinstance(screen, BaseView):
        return screen.node_name, screen.bus_id
    if isinstance(screen, AssignScreen | ProposeScreen):
        return screen.node_name, None
    return None, None


class ConsoleApp(App[None]):
    """gpuconsole's full-screen console over one Hub."""

    CSS_PATH = "console.tcss"
    TITLE = "gpuconsole"
    COMMANDS: ClassVar = {JumpCommands, ConsoleCommands}  # not Textual's own: see ConsoleCommands
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("colon", "command_palette", "Jump", key_display=":"),
        Binding("e", "events", "Events"),
        Binding("exclamation_mark", "alerts", "Alerts", key_display="!"),
        Binding("t", "cycle_theme", "Theme"),
        Binding("p", "propose", "Propose"),  # only for those who may act (check_action)
        Binding("p", "refuse('propose')", "", show=False),  # why not, to the others
        Binding("escape", "back", "Back"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        hub: Hub | None,
        *,
        feed: SnapshotFeed | None = None,
        theme: str | None = None,
        read_only: bool = False,
        start_hub: bool = True,
        snapshot: FleetSnapshot | None = None,
        clock: Callable[[], float] | None = None,
        theme_dirs: list[Path] | None = None,
        cursor_blink: bool = True,
        actor: Actor | None = None,
        actions: ActionAccess | None = None,
        freeze_heap: bool = False,
        replay: bool = False,
    ) -> None:
        """`hub`: the hub this console reads (None: only `snapshot`), its snapshots
        through `feed` where given (an ssh session's, paced), else from the hub itself.

        `replay`: `snapshot` is a capture (`snapshot --json`), shown as of its time: marked
        REPLAY with the time it was made, its ages at `clock`, the capture's time unless given.

        `freeze_heap`: the process is this console's alone (not an ssh server's, whose
        sessions come and go): what it built to start is left out of the collector's full
        passes, process-wide, until it ends."""
        super().__init__()
        # Who is at this console: actions check this actor's role where they execute,
        # whatever the UI shows (the ssh server passes read_only for viewers too).
        self.actor = actor if actor is not None else local_actor()
        # How it moves GPUs: given, or the simulator a demo hub reads; None: it cannot.
        self.actions = actions if actions is not None else demo_access(hub)
        demo = actor is None and self.actions is not None and self.actions.demo
        if demo:
            self.actor = self.actor.for_demo()  # a local demo, as with assign --demo
        self.cursor_blink = cursor_blink
        self.hub = hub
        self.read_only = read_only
        self.replay = replay and snapshot is not None
        if clock is None:
            captured = snapshot.at if snapshot is not None and self.replay else None
            clock = time.time if captured is None else (lambda: captured)
        self.clock: Callable[[], float] = clock
        self.snapshot: FleetSnapshot | None = snapshot
        self._snapshot_shown: FleetSnapshot | None = None  # the latest drawn
        self._snapshot_shown_at = 0.0  # time.monotonic() of that drawing
        self._heard_all = False  # whether a snapshot has come with every source heard from
        self._freeze_heap = freeze_heap
        self._heap_frozen = False
        self._thresholds = gc.get_threshold()  # the collector's, as found: put back at the end
        self._feed = HubFeed(hub, feed=feed, start=start_hub)
        self._attaching: Worker[None] | None = None
        self._drilled: str | None = None  # the node this console drilled into (a fleet's)
        self._drilled_at = 0.0  # time.monotonic() of that
        dirs = [user_themes_dir()] if theme_dirs is None else theme_dirs
        self._loaded_themes = load_themes(dirs)
        for loaded in self._loaded_themes.values():
            self.register_theme(loaded)
        self.theme_names = list(self._loaded_themes)
        self.theme = resolve_theme_name(theme, self.theme_names)
        # Textual's own themes have no heat scale or health colours to draw with: none of
        # them may be chosen, here or by anything that offers the app's themes
        for name in set(self.available_themes) - set(self.theme_names):
            self.unregister_theme(name)
        self.palette = Palette.from_variables(dict(self.current_theme.variables))

    # --- lifecycle -----------------------------------------------------------------

    def get_default_screen(self) -> Screen[None]:
        return FleetScreen()

    def get_driver_class(self) -> type[Driver]:
        return terminal_driver(super().get_driver_class())

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self.screen_change_signal.subscribe(self, self._screen_changed)
        # The hub starts beside the first frame, not before it: the layout is drawn at once,
        # and each source's readings show as they land, whatever the slowest start takes.
        self._attaching = self.run_worker(self._feed.attach(self), name="hub start")
        self.set_interval(TICK_S, self._tick)
        if self._freeze_heap:
            self.call_after_refresh(self._freeze_start_heap)
        self.check_size()

    async def on_unmount(self) -> None:
        if self._heap_frozen:
            gc.unfreeze()
            gc.set_threshold(*self._thresholds)
        self._drill_into(None)
        self.show_rows(None)
        if self._attaching is not None and not self._attaching.is_finished:
            self._attaching.cancel()  # the console ends while its hub still starts
            with contextlib.suppress(WorkerCancelled, WorkerFailed):
                await self._attaching.wait()
        await self._feed.detach()

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        # Sources on timers of their own publish apart (NVML, then the actions journal a
        # fraction of a second later): drawing each would draw twice a second. One that comes
        # within TICK_S of the last drawn waits for the tick, which draws the newest. Until
        # every source has been heard from once, each is drawn as it comes: the first
        # readings of a console that has just started show the moment they land.
        snapshot = self.snapshot = message.snapshot
        now = time.monotonic()
        if not self._heard_all:
            self._heard_all = all(s.polls for n in snapshot.nodes for s in n.statuses)
            self.show_snapshot(snapshot)
        elif now - self._snapshot_shown_at >= TICK_S or now - self._drilled_at < OPENING_S:
            self.show_snapshot(snapshot)

    def show_snapshot(self, snapshot: FleetSnapshot) -> None:
        """Make `snapshot` the latest and render it in the visible view only."""
        judge_fleet(snapshot)  # once, as far as it changed: each view then looks verdicts up
        self.snapshot = snapshot
        self._snapshot_shown = snapshot
        self._snapshot_shown_at = time.monotonic()
        screen = self._top_view()
        if screen is not None:
            screen.render_latest()

    def action_help_quit(self) -> None:
        """Ctrl+C: ends a console still starting (nothing drawn yet, so no key to read); once
        it shows data, says which key quits, as Textual does (in a text field it copies)."""
        if self.snapshot is None:
            self.exit()
            return
        super().action_help_quit()

    def _top_view(self) -> BaseView | None:
        """The visible view; None under a dialog, or once the console is ending and its
        screens are gone (a tick or a snapshot may still come then)."""
        screen = self.screen_stack[-1] if self.screen_stack else None
        return screen if isinstance(screen, BaseView) else None

    def _tick(self) -> None:
        """Draw the snapshot that came since the last drawn, or else move the data's age on:
        never both, so that a second costs one redraw. Keys and new views draw at once."""
        if self.snapshot is not None and self.snapshot is not self._snapshot_shown:
            self.show_snapshot(self.snapshot)
            return
        screen = self._top_view()
        if screen is not None:
            screen.update_status()

    def _freeze_start_heap(self) -> None:
        """Leave what the console built to start (modules, styles, the first view: nearly all
        its objects, kept for its whole life) out of the collector's full passes. Each walked
        all of them, ~60 ms of CPU every half minute or so: more than drawing the node view.

        And let the collector's youngest pass wait for more new objects than Python's 700.
        A frame makes thousands that live until the next one replaces them (segments, strips
        and their caches): at 700 the collector ran twenty times a second, and each time
        moved the frame it caught alive into the older generations, whose growth then set
        off a full pass (10-20 ms) every half minute or so. With room for a few frames those
        die young, freed by their count as they always were."""
        gc.freeze()  # no collection first: on_unmount unfreezes, and then any garbage goes
        self._thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_OBJECTS, *self._thresholds[1:])
        self._heap_frozen = True

    # --- size ----------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Below the minimum size only quitting works: a key must not uncover the layout
        the message stands in for (Esc would pop it, `e` or `?` would push a view over it)."""
        if isinstance(self.screen, TooSmallScreen) and action not in ("quit", "help_quit"):
            return False
        if action == "propose":  # absent, not greyed, where it may not be used
            return self.may_act and isinstance(self.screen, BaseView)
        if action == "refuse":
            return not self.may_act and isinstance(self.screen, BaseView)
        return True

    def refusal(self, what: str) -> str:
        """Why this console does not `what` (assign, remediate, power, propose)."""
        if not self.actor.role.may_act:
            return f"viewers cannot {what}: {self.actor.user} is a {self.actor.role.value}"
        if self.read_only:
            return f"this console is read-only: it cannot {what}"
        return f"this console cannot {what}: it has no way to act here (a replay?)"

    def action_refuse(self, what: str) -> None:
        self.notify(self.refusal(what), severity="warning")

    @property
    def may_act(self) -> bool:
        """Whether to offer actions: a way to act, not read-only, and a role that may."""
        return self.actions is not None and not self.read_only and self.actor.role.may_act

    def check_size(self) -> None:
        """Cover the view with a message below the minimum size; uncover it above."""
        if not self.screen_stack:
            return  # the console is ending
        width, height = self.size
        small = width < MIN_WIDTH or height < MIN_HEIGHT
        on_top = isinstance(self.screen, TooSmallScreen)
        if small and not on_top:
            self.push_screen(TooSmallScreen(MIN_WIDTH, MIN_HEIGHT))
        elif not small and on_top:
            self.pop_screen()

    # --- themes --------------------------------------------------------------------

    def _theme_changed(self, _theme: object) -> None:
        self.palette = Palette.from_variables(dict(self.current_theme.variables))
        screen = self._top_view()
        if screen is not None:
            screen.render_latest(force=True)

    def action_cycle_theme(self) -> None:
        names = self.theme_names
        index = names.index(self.theme) if self.theme in names else -1
        self.set_theme(names[(index + 1) % len(names)])

    def set_theme(self, name: str) -> None:
        """Draw with theme `name` (one of `theme_names`) and say so."""
        self.theme = name
        self.notify(f"theme: {self.theme}", timeout=2)

    # --- navigation ----------------------------------------------------------------

    def _screen_changed(self, _screen: Screen[object]) -> None:
        # the node under whatever is on top (help, the palette, a dialog over a node view)
        node = next((n for s in reversed(self.screen_stack) if (n := _about(s)[0])), None)
        self._drill_into(node)

    def _drill_into(self, node: str | None) -> None:
        """A fleet's hub reads this node's agent in full while this console shows it."""
        if self.hub is not None and node != self._drilled:
            self._drilled = node
            self._drilled_at = time.monotonic() if node is not None else 0.0
            self.hub.focus(node, viewer=self)

    def show_rows(self, rows: Collection[str] | None) -> None:
        """A fleet's hub reads these nodes' GPUs each round while this console shows their
        rows (a Prometheus overview: the rest less often); None: this console shows none."""
        if self.hub is not None:
            self.hub.show(rows, viewer=self)

    def _to_fleet(self) -> None:
        while len(self.screen_stack) > 1 and not isinstance(self.screen, FleetScreen):
            self.pop_screen()

    def action_command_palette(self) -> None:
        """Open the jump list, unless one is open already: on top, under another screen, or
        still being removed (textual's own palette has a fixed id: DuplicateIds)."""
        if self.use_command_palette and not any(
            isinstance(screen, ConsolePalette) for screen in self.screen_stack
        ):
            self.push_screen(ConsolePalette())

    def pop_screen(self) -> AwaitComplete:
        """Pop the top screen; the base view stays, whatever asks (textual raises)."""
        if len(self.screen_stack) <= 1:
            log.debug("not popping the last screen (%r)", self.screen_stack)
            return AwaitComplete()  # done already: nothing to wait for
        return super().pop_screen()

    async def action_back(self) -> None:  # async: it overrides App's async action_back
        if len(self.screen_stack) > 1:
            self.pop_screen()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen.for_screen(self.screen))

    def action_events(self) -> None:
        from gpuconsole.tui.screens.events import EventsScreen, pick_gpu

        screen = self.screen
        if isinstance(screen, EventsScreen):
            return
        node, bus = _about(screen)
        gpu = pick_gpu(bus, node, self.snapshot) if bus is not None else None
        self.push_screen(EventsScreen(node=node, gpu=gpu))

    def action_alerts(self) -> None:
        from gpuconsole.tui.screens.alerts import AlertsScreen

        if not isinstance(self.screen, AlertsScreen):
            self.push_screen(AlertsScreen())

    def action_propose(self) -> None:
        self.push_screen(ProposeScreen(_about(self.screen)[0]))

    def open_node(self, name: str) -> None:
        from gpuconsole.tui.screens.node import NodeScreen

        self.push_screen(NodeScreen(name))

    def open_gpu(self, name: str, index: int | None = None, *, bus_id: str | None = None) -> None:
        """A GPU by the number the console shows it by now, or by bus id."""
        from gpuconsole.tui.screens.gpu import GpuScreen

        self.push_screen(GpuScreen(name, index, bus_id=bus_id))

    def open_topology(self, name: str) -> None:
        from gpuconsole.tui.screens.topology import TopologyScreen

        self.push_screen(TopologyScreen(name))

    def open_sm_map(
        self, name: str, index: int | None = None, *, bus_id: str | None = None
    ) -> None:
        """A GPU's SM map, by the number the console shows it by now, or by bus id."""
        from gpuconsole.tui.screens.smmap import SmMapScreen

        self.push_screen(SmMapScreen(name, index, bus_id=bus_id))

    def jump(self, view: str, node: str | None = None, gpu: int | None = None) -> None:
        """Go to a view from anywhere, leaving Esc to walk back up: fleet > node > GPU."""
        self._to_fleet()
        if view == "fleet":
            return
        if view == "events":
            self.action_events()
            return
        assert node is not None
        self.open_node(node)
        if view == "topology":
            self.open_topology(node)
        elif view in ("gpu", "smmap") and gpu is not None:
            self.open_gpu(node, gpu)
            if view == "smmap":
                self.open_sm_map(node, gpu)
