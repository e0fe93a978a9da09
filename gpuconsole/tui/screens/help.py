"""Help (every key of the view beneath) and the too-small-terminal message."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

# What the console's own marks mean, wherever they show.
SYMBOLS = (
    (
        "\u25cf \u25b2 \u2716",
        "health: ok, warning, critical (a shape each, so it reads without colour)",
    ),
    ("\u25cc", "stale: a source stopped answering; its last readings are shown"),
    ("?", "unknown: nothing has said yet"),
    ("\u25c6", "a GPU a guest holds through vfio-pci: NVML on the host cannot read it"),
    ("\u00b7", "a GPU the host lists but NVML cannot see; in GBFT, a source not configured"),
)

ALWAYS = (
    ("Enter", "drill down (node \u203a GPU \u203a SM map)"),
    ("Esc", "back to the previous view"),
    (": or ctrl+p", "jump to any view, node or GPU by name"),
    ("mouse", "click a row to select it, again to open it; wheel scrolls"),
)


def _own_bindings(node: object) -> list[Binding]:
    """The bindings gpuconsole's own classes declare on `node` (not Textual's generic ones:
    focus, copy, ctrl+q, a widget's cursor keys)."""
    found: list[Binding] = []
    for cls in type(node).__mro__:
        if cls.__module__.startswith("gpuconsole."):
            found += [b for b in cls.__dict__.get("BINDINGS", ()) if isinstance(b, Binding)]
    return found


class HelpScreen(ModalScreen[None]):
    """The keys that work in the view it was opened from, and what its symbols and columns
    mean."""

    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss", "Close", key_display="Esc"),
    ]

    def __init__(
        self,
        title: str,
        keys: list[tuple[str, str]],
        legend: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__()
        self._view_title = title
        self._keys = keys
        self._legend = legend or []

    @classmethod
    def for_screen(cls, screen: Screen[object]) -> HelpScreen:
        """Collect the keys active on `screen` that gpuconsole gives (the screen's, its
        widgets' and the app's), and the screen's legend."""
        seen: dict[str, str] = {}
        for key, active in screen.active_bindings.items():
            binding = active.binding
            if not binding.description or binding not in _own_bindings(active.node):
                continue
            if not binding.show and active.node not in (screen, screen.app):
                continue  # a widget's own moves (cursor, scroll): HELP_EXTRA sums them up
            display = binding.key_display or screen.app.get_key_display(binding)
            seen.setdefault(display or key, binding.description)
        keys = sorted(seen.items(), key=lambda kv: (len(kv[0]) > 1, kv[0].lower()))
        keys += list(getattr(screen, "HELP_EXTRA", ()))
        keys += list(ALWAYS)
        crumbs = getattr(screen, "crumbs", None)
        title = " \u203a ".join(crumbs()) if callable(crumbs) else type(screen).__name__
        legend = list(getattr(screen, "HELP_LEGEND", ()))
        return cls(title or "gpuconsole", keys, [*legend, *SYMBOLS] if legend else [])

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for key, description in self._keys:
            table.add_row(key, description)
        if self._legend:
            table.add_row("", "")
            table.add_row(Text("what you see", style="bold underline"), "")
            for mark, meaning in self._legend:
                table.add_row(mark, meaning)
        with VerticalScroll(id="help-box") as box:
            box.border_title = f"keys: {self._view_title}"
            box.border_subtitle = "Esc closes"
            yield Static(table)


class TooSmallScreen(Screen[None]):
    """Shown instead of a broken layout when the terminal is below the minimum size."""

    def __init__(self, width: int, height: int) -> None:
        super().__init__()
        self._need = (width, height)

    def on_resize(self, event: events.Resize) -> None:
        check = getattr(self.app, "check_size", None)
        if check is not None:
            self.call_later(check)

    def compose(self) -> ComposeResult:
        width, height = self._need
        yield Static(
            Text.assemble(
                ("gpuconsole needs at least ", ""),
                (f"{width}\u00d7{height}", "bold"),
                (".\nMake the terminal larger.", ""),
            ),
            id="too-small",
        )
