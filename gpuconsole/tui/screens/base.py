"""What every view shares: the status bar, the footer, and rendering from the latest snapshot."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static

from gpuconsole.facts import summaries
from gpuconsole.facts.inventory import GpuRow
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.tui.themes import Palette
from gpuconsole.tui.widgets.cells import looks_same
from gpuconsole.tui.widgets.footer import Footer
from gpuconsole.tui.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from gpuconsole.tui.app import ConsoleApp


NARROW_BELOW = 110
# Actions only those who may act are offered; each key also binds `refuse('WORD')`, hidden,
# which tells anyone else why the key does nothing.
ACTING = ("assign", "remediate", "power")


def acting_keys(key: str, action: str, description: str) -> list[Binding]:
    """The binding of an acting key, and its stand-in for those who may not act."""
    return [
        Binding(key, action, description),
        # no description: neither help nor the footer offers what it refuses
        Binding(key, f"refuse('{action}')", "", show=False),
    ]


def update_text(static: Static, content: Text | str) -> None:
    """Show `content` in a Static that does not wrap (or has a fixed height): nothing to do
    if it shows that already, and a layout only if its count of lines changes."""
    shown = static.content
    if isinstance(shown, Text | str) and looks_same(shown, content):
        return
    lines = content.plain if isinstance(content, Text) else content
    before = shown.plain if isinstance(shown, Text) else str(shown)
    static.update(content, layout=lines.count("\n") != before.count("\n"))


class BaseView(Screen[None]):
    """A view that renders from the app's latest FleetSnapshot and never fetches data."""

    # Its widgets cover it: Textual draws every line of each widget a changed line crosses
    # (its own, and the screen's), so a second's few changed rows would otherwise pass each
    # of the view's lines through its styles. Blank, they are one line of its background.
    BLANK = True

    # Extra help lines for keys that belong to a focused widget rather than the screen.
    HELP_EXTRA: tuple[tuple[str, str], ...] = ()

    # What the view is about, for the views opened from it (events, placement help) and for
    # a fleet's hub (whose agent to read in full): None for every node, or every GPU. A GPU
    # by bus id: NVML's number for it changes when another GPU leaves the nvidia driver.
    node_name: str | None = None
    bus_id: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self._applied: FleetSnapshot | None = None
        self._palette_seen: Palette | None = None
        self._status_bar = StatusBar()  # kept: a query for it each second walks the DOM

    @property
    def console(self) -> ConsoleApp:
        return cast("ConsoleApp", self.app)

    @property
    def palette(self) -> Palette:
        return self.console.palette

    def crumbs(self) -> list[str]:
        return []

    def compose(self) -> ComposeResult:
        yield self._status_bar
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()

    def on_mount(self) -> None:
        self.render_latest()

    def on_resize(self, event: events.Resize) -> None:
        self.call_later(self.console.check_size)
        # Two-column panels need room; below this they stack.
        narrow = event.size.width < NARROW_BELOW
        if narrow != self.has_class("-narrow"):
            self.set_class(narrow, "-narrow")
            self.render_latest(force=True)

    def on_screen_resume(self) -> None:
        self.render_latest()

    def render_latest(self, *, force: bool = False) -> None:
        """Render the app's latest snapshot if this view has not shown it yet."""
        if not self.is_mounted:
            return  # on_mount renders once the widgets exist
        if self._pruning or self._closing or self._closed:
            return  # being removed (popped, or the console ending): its widgets may be gone
        snapshot = self.console.snapshot
        palette = self.palette
        if palette is not self._palette_seen:
            force = True
            self._palette_seen = palette
        if snapshot is not None and (force or snapshot is not self._applied):
            self.apply(snapshot, force=force)
            self._applied = snapshot
        self.update_status()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ACTING:  # absent, not greyed, for viewers and read-only consoles
            return self.console.may_act
        if action == "refuse":  # its stand-in there: says why, where a key did nothing
            return not self.console.may_act
        return True

    def action_refuse(self, what: str) -> None:
        """An operator's key pressed where it may not act: say why, not nothing."""
        self.notify(self.console.refusal(what), severity="warning")

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        """Show `snapshot`; `force` means the palette or a view setting changed."""

    def update_status(self) -> None:
        self._status_bar.show(
            self.crumbs(),
            self.console.snapshot,
            self.console.clock(),
            self.palette,
            read_only=self.console.read_only,
            actor=self.console.actor,
            replay=self.console.replay,
        )


class GpuView(BaseView):
    """A view of one GPU, opened by the number the console showed it by or by bus id, and
    followed by bus id once found, however NVML numbers the GPUs after."""

    node_name: str

    def __init__(
        self, node_name: str, gpu_index: int | None = None, *, bus_id: str | None = None
    ) -> None:
        """A GPU by NVML's index, or by bus id (for one NVML cannot see: a guest's)."""
        super().__init__()
        self.node_name = node_name
        self.gpu_index = gpu_index
        self.bus_id = bus_id

    def gpu_crumb(self) -> str:
        return f"GPU {self.gpu_index}" if self.gpu_index is not None else f"GPU {self.bus_id}"

    def find_row(self, node: NodeSnapshot) -> GpuRow | None:
        """This GPU's row; its number kept as the console shows it now."""
        rows = summaries.gpu_rows(node)
        if self.bus_id is None:
            found = next((r for r in rows if r.index is not None and r.index == self.gpu_index),
                         None)  # fmt: skip
            if found is not None and ":" in found.bus_id:
                self.bus_id = found.bus_id
            return found
        found = next((r for r in rows if r.bus_id == self.bus_id), None)
        if found is not None:
            self.gpu_index = found.index
        return found
