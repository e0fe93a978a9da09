"""A Textual driver over one SSH channel, on the server's event loop.

Input bytes go through Textual's own XTerm parser, so keys, mouse and paste behave as in a
local terminal. Output leaves a frame at a time (one `flush()`); when the client reads
slower than frames come, whole frames are dropped instead of buffered, and once the channel
drains the next frame repaints the screen in full. The parser and the driver hooks are
private Textual API: textual is pinned exactly, and a test drives a session end to end.
"""

from __future__ import annotations

import asyncio
import re
from codecs import getincrementaldecoder
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from textual import constants, events
from textual._xterm_parser import XTermParser
from textual.app import App
from textual.driver import Driver
from textual.geometry import Size
from textual.message import Message

# Alternate screen, hidden cursor, clicks and wheel (SGR encoding; no motion reports, which
# would cost a repaint per mouse move on a thin line), bracketed paste, and the question
# whether the terminal does synchronized output (Textual reads the answer).
ENTER = "\x1b[?1049h\x1b[?25l\x1b[?1000h\x1b[?1006h\x1b[?2004h\x1b[?7l\x1b[?2026$p"
LEAVE = "\x1b[?2004l\x1b[?1006l\x1b[?1000l\x1b[?7h\x1b[?1049l\x1b[?25h"


_SGR_OR_MOVE = re.compile(r"\x1b\[([0-9;]*)([mH])")


def collapse_sgr(frame: str) -> str:
    """The same frame in fewer bytes: Textual closes every segment with a reset and opens
    the next with its full style; where the next style is the one just reset, both go.

    Cursor moves do not touch the style, so a reset waits past them; anything else that
    reaches the screen (text, a newline) first gets the reset it was due.
    """
    out: list[str] = []
    current = ""  # the style in force: "" after a reset
    pending = False  # a reset not yet written
    last = 0
    for match in _SGR_OR_MOVE.finditer(frame):
        start = match.start()
        if start > last:
            if pending:
                out.append("\x1b[0m")
                pending, current = False, ""
            out.append(frame[last:start])
        last = match.end()
        params, kind = match.group(1), match.group(2)
        if kind == "H":
            out.append(match.group(0))
        elif params in ("", "0"):
            if current:
                pending = True
        elif pending and params == current:
            pending = False  # reset then the same style again: neither is needed
        else:
            out.append(f"\x1b[0;{params}m" if pending else match.group(0))
            pending, current = False, params
    if pending:
        out.append("\x1b[0m")
    out.append(frame[last:])
    return "".join(out)


class Channel(Protocol):
    """What the driver needs of an SSH channel (asyncssh's SSHServerChannel)."""

    def write(self, data: bytes) -> None: ...

    def get_write_buffer_size(self) -> int: ...


@dataclass
class OutputStats:
    """What one session has sent: bytes, frames, and frames dropped for a slow client."""

    bytes_sent: int = 0
    frames_sent: int = 0
    frames_dropped: int = 0


class BoundedOutput:
    """Frames to a channel; above `limit_bytes` unsent, a frame is dropped whole."""

    def __init__(self, channel: Channel, limit_bytes: int) -> None:
        self.channel = channel
        self.limit_bytes = limit_bytes
        self.stats = OutputStats()
        self.stale = False  # a frame was dropped: the client's screen is out of date
        self.closed = False  # the channel is gone: drop everything quietly

    @property
    def congested(self) -> bool:
        return self.channel.get_write_buffer_size() > self.limit_bytes

    def send_frame(self, data: bytes) -> bool:
        """Send one frame, or drop it (and mark the screen stale) when the client lags."""
        if self.congested:
            self.stats.frames_dropped += 1
            self.stale = True
            return False
        self.send_always(data)
        self.stats.frames_sent += 1
        return True

    def send_always(self, data: bytes) -> None:
        """Mode switches and messages: never dropped (they are small and rare)."""
        if self.closed:
            return
        try:
            self.channel.write(data)
        except (BrokenPipeError, ConnectionError):  # the client went away mid-frame
            self.closed = True
            return
        self.stats.bytes_sent += len(data)


@dataclass(frozen=True)
class DriverLink:
    """What a session hands its driver: the output, the first size, a ready callback."""

    output: BoundedOutput
    initial_size: tuple[int, int]
    on_ready: Callable[[SshDriver], None]


class SshDriver(Driver):
    """Drives one App over one SSH session; `bind()` makes the class for a session."""

    link: ClassVar[DriverLink]

    @classmethod
    def bind(
        cls,
        output: BoundedOutput,
        size: tuple[int, int],
        on_ready: Callable[[SshDriver], None],
    ) -> type[SshDriver]:
        """A driver class for one session (Textual builds the driver from a class);
        `on_ready` gets the driver once it takes input."""
        link = DriverLink(output, size, on_ready)
        return type("SshSessionDriver", (cls,), {"link": link})

    def __init__(
        self,
        app: App[Any],
        *,
        debug: bool = False,
        mouse: bool = True,
        size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size or self.link.initial_size)
        self.output = self.link.output
        self._parser = XTermParser()
        self._decode = getincrementaldecoder("utf-8")(errors="replace").decode
        self._frame: list[str] = []
        self._input = False
        self._tick: asyncio.TimerHandle | None = None
        self._repaint_pending = False

    # --- output ------------------------------------------------------------------------

    def write(self, data: str) -> None:
        self._frame.append(data)

    def flush(self) -> None:
        if not self._frame:
            return
        data = collapse_sgr("".join(self._frame)).encode("utf-8")
        self._frame.clear()
        self.output.send_frame(data)

    def writable(self) -> None:
        """The channel drained: if frames were dropped, repaint everything once."""
        if self.output.stale and not self._repaint_pending and not self.output.congested:
            self._repaint_pending = True
            self._app.call_later(self._repaint)

    def _repaint(self) -> None:
        self._repaint_pending = False
        if self.output.congested:
            return
        self.output.stale = False
        self._app.refresh(repaint=True, layout=True)

    # --- modes -------------------------------------------------------------------------

    def start_application_mode(self) -> None:
        self.output.send_always(ENTER.encode())
        self._input = True
        size = Size(*(self._size or self.link.initial_size))
        self._app.post_message(events.Resize(size, size))
        self.link.on_ready(self)

    def stop_application_mode(self) -> None:
        self.disable_input()
        self._frame.clear()
        self.output.send_always(LEAVE.encode())

    def disable_input(self) -> None:
        self._input = False
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    # --- input -------------------------------------------------------------------------

    def send_message(self, message: Message) -> None:
        # Input arrives on the app's own loop: no thread hop needed.
        self._app.post_message(message)

    def feed(self, data: bytes) -> None:
        """Bytes the client typed (keys, mouse reports, paste, terminal answers)."""
        if not self._input:
            return
        for event in self._parser.feed(self._decode(data)):
            self.process_message(event)
        self._schedule_tick()

    def _schedule_tick(self) -> None:
        # A lone ESC is a key only once no sequence follows within ESCDELAY.
        if self._tick is None and self._parser._timeout_time is not None:
            self._tick = self._loop.call_later(constants.ESCAPE_DELAY + 0.005, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        if not self._input:
            return
        for event in self._parser.tick():
            self.process_message(event)
        self._schedule_tick()

    def resize(self, width: int, height: int) -> None:
        """The client's window changed size (SSH window-change)."""
        self._size = (width, height)
        size = Size(width, height)
        self._app.post_message(events.Resize(size, size))
