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

ALWAYS = (
    ("Enter", "drill down (node \u203a GPU \u203a SM map)"),
    ("Esc", "back to the previous view"),
    (": or ctrl+p", "jump to any view, node or GPU by name"),
    ("mouse", "click a row to select it, again to open it; wheel scrolls"),
)


class HelpScreen(ModalScreen[None]):
    """Every key that works in the view it was opened from."""

    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss", "Close", key_display="Esc"),
    ]

    def __init__(self, title: str, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self._view_title = title
        self._keys = keys

    @classmethod
    def for_screen(cls, screen: Screen[object]) -> HelpScreen:
        """Collect the keys active on `screen` (its own, its widgets' and the app's)."""
        seen: dict[str, str] = {}
        for key, active in screen.active_bindings.items():
            binding = active.binding
            if not binding.description:
                continue
            display = binding.key_display or screen.app.get_key_display(binding)
            seen.setdefault(display or key, binding.description)
        keys = sorted(seen.items(), key=lambda kv: (len(kv[0]) > 1, kv[0].lower()))
        keys += list(getattr(screen, "HELP_EXTRA", ()))
        keys += list(ALWAYS)
        crumbs = getattr(screen, "crumbs", None)
        title = " \u203a ".join(crumbs()) if callable(crumbs) else type(screen).__name__
        return cls(title or "gpuconsole", keys)

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for key, description in self._keys:
            table.add_row(key, description)
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
