"""The top line of every view: where you are, how fresh the data is, SIMULATED."""

from __future__ import annotations

from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from gpuconsole import format as fmt
from gpuconsole.actions.roles import Actor
from gpuconsole.readings.base import Health, safe_text
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.themes import Palette
from gpuconsole.tui.widgets.rich_lines import text_strip

_NAME = " gpuconsole \u203a"
# Older than this many seconds and the whole view is marked stale.
STALE_AFTER_S = 5.0


def status_text(
    crumbs: list[str],
    snapshot: FleetSnapshot | None,
    now: float,
    palette: Palette,
    *,
    read_only: bool = False,
    actor: Actor | None = None,
    replay: bool = False,
) -> tuple[Text, Text]:
    """The bar's content: breadcrumbs left; SIMULATED, who is at the console with their
    role, read-only and data age right; for a `replay`, REPLAY and when the capture was
    made (its age is no news)."""
    left = Text(" gpuconsole", style="bold")
    for crumb in crumbs:
        left.append(" \u203a ")
        left.append(crumb, style="bold")

    right = Text()
    if actor is not None:
        right.append(safe_text(actor.user), style="bold")
        right.append(f" {actor.role.value}  ", style=palette.dim)
    if snapshot is None:
        right.append("waiting for data ", style=palette.health[Health.STALE])
    else:
        if replay:
            right.append(" REPLAY ", style=palette.simulated)
            right.append(" ")
        if snapshot.simulated:
            right.append(" SIMULATED ", style=palette.simulated)
            right.append(" ")
        if read_only:
            right.append("read-only ", style=palette.health[Health.UNKNOWN])
        if replay:
            right.append(f"captured {fmt.date_time(snapshot.at)} ")
            return left, right
        age_s = now - snapshot.at
        if age_s > STALE_AFTER_S:
            right.append(f"STALE {fmt.age(snapshot.at, now)} ", style=palette.health[Health.STALE])
        right.append(f"{fmt.clock_time(snapshot.at)} ({fmt.age(snapshot.at, now)} ago) ")
    return left, right


class StatusBar(Widget):
    """Breadcrumbs, data age and the SIMULATED marker, on one line."""

    DEFAULT_CSS = """
    StatusBar { dock: top; height: 1; background: $panel; color: $foreground; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._left = Text(" gpuconsole")
        self._right = Text()

    def show(
        self,
        crumbs: list[str],
        snapshot: FleetSnapshot | None,
        now: float,
        palette: Palette,
        *,
        read_only: bool = False,
        actor: Actor | None = None,
        replay: bool = False,
    ) -> None:
        left, right = status_text(
            crumbs, snapshot, now, palette, read_only=read_only, actor=actor, replay=replay
        )
        if left != self._left or right != self._right:
            self._left, self._right = left, right
            self.refresh()

    def line(self, width: int) -> Text:
        """Breadcrumbs left and the rest right, in `width` cells; the crumbs give way, the
        app's name first."""
        left, right = self._left.copy(), self._right
        room = width - right.cell_len
        if left.cell_len > room and left.plain.startswith(_NAME):
            left = left[len(_NAME) :]  # the app's name goes first: the crumbs say where
        if left.cell_len > room:
            left.truncate(max(0, room - 1), overflow="ellipsis")
        return Text.assemble(left, " " * max(0, room - left.cell_len), right, no_wrap=True)

    def render(self) -> Text:
        return self.line(self.size.width)

    def render_line(self, y: int) -> Strip:
        # drawn each second: straight from the Text, not through Textual's Content
        width, style = self.size.width, self.visual_style.rich_style
        if y:
            return Strip.blank(width, style)
        return text_strip(self.line(width), width, self.app.console, style)
