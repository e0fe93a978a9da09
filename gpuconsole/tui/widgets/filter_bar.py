"""The `/` filter line: hidden until asked for, live as you type."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Input, Label


class FilterBar(Horizontal):
    """A one-line filter; posts Changed on every keystroke and Closed when done."""

    DEFAULT_CSS = """
    FilterBar { dock: bottom; height: 1; display: none; background: $panel; }
    FilterBar.-open { display: block; }
    FilterBar Label { width: 2; color: $accent; }
    FilterBar Input { border: none; height: 1; padding: 0; width: 1fr; background: $panel; }
    """
    BINDINGS = [Binding("escape", "cancel", "Clear filter", show=False)]

    @dataclass
    class Changed(Message):
        """The filter text changed."""

        value: str

    class Closed(Message):
        """The filter line was closed (Enter keeps the text, Esc clears it)."""

    def __init__(self, *, placeholder: str = "filter", id: str | None = None) -> None:
        super().__init__(id=id)
        self._hint = placeholder

    def compose(self) -> ComposeResult:
        yield Label("/")
        field = Input(placeholder=self._hint)
        field.cursor_blink = bool(getattr(self.app, "cursor_blink", True))
        yield field

    @property
    def input(self) -> Input:
        return self.query_one(Input)

    # For the view's `/` binding: priority, so that the line opens before the keys that came
    # in the same burst (a fast typist over ssh, a paste) go on to the widget that had the
    # keyboard; and not while the line has it, so that a `/` is typed into it.
    KEY = Binding("slash", "filter", "Filter", key_display="/", priority=True)

    @property
    def typing(self) -> bool:
        """Whether the line has the keyboard."""
        return self.screen.focused is self.input

    def open(self, value: str = "") -> None:
        """Show the line with the keyboard in it at once (Widget.focus() waits a turn)."""
        self.add_class("-open")
        self.input.value = value
        self.screen.set_focus(self.input)

    def close(self, *, clear: bool) -> None:
        if self.typing:  # at once too: the next key is the view's again
            self.screen.set_focus(None)
        if clear and self.input.value:
            self.input.value = ""  # posts Input.Changed, which becomes our Changed("")
            self.post_message(self.Changed(""))
        self.remove_class("-open")
        self.post_message(self.Closed())

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Changed(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.close(clear=False)

    def action_cancel(self) -> None:
        self.close(clear=True)
