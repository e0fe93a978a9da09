"""A Textual driver over one SSH channel, on the server's event loop.

Input bytes go through Textual's own XTerm parser, so keys, mouse and paste behave as in a
local terminal. Output leaves a frame at a time (one `flush()`), without the writes the
client's screen already shows; when the client reads slower than frames come, whole frames
are dropped instead of buffered, and once the channel drains the screen is repainted (only
where it differs from what the client last got). The parser and the driver hooks are
private Textual API: textual is pinned exactly, and a test drives a session end to end.

All sessions share one event loop, and a Textual app handles every message it has queued
before it lets the loop go on: a packet of a few KB of keys, posted at once, held every
other session for seconds. So input is taken a few events per turn of the loop; what waits
is bounded, and above that bound the session stops reading its channel (the client's
writes wait, as they would on a slow link).
"""

from __future__ import annotations

import asyncio
import logging
import re
from codecs import getincrementaldecoder
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from rich.cells import cell_len
from textual import constants, events
from textual._xterm_parser import XTermParser
from textual.app import App
from textual.driver import Driver
from textual.geometry import Size
from textual.message import Message

from gpuconsole.ssh.paste import MAX_CHARS as MAX_PASTE_CHARS
from gpuconsole.ssh.paste import PasteLimit

log = logging.getLogger(__name__)

# Alternate screen, hidden cursor, clicks and wheel (SGR encoding; no motion reports, which
# would cost a repaint per mouse move on a thin line), bracketed paste, and the question
# whether the terminal does synchronized output (Textual reads the answer).
ENTER = "\x1b[?1049h\x1b[?25l\x1b[?1000h\x1b[?1006h\x1b[?2004h\x1b[?7l\x1b[?2026$p"
LEAVE = "\x1b[?2004l\x1b[?1006l\x1b[?1000l\x1b[?7h\x1b[?1049l\x1b[?25h"

# Per turn of the loop, a session's input is parsed a few KB at most and handed to the app a
# few events at most: plenty for any typist or mouse, and one session's burst costs the
# others milliseconds per turn instead of the whole burst at once.
PARSE_BYTES_PER_TURN = 4096
EVENTS_PER_TURN = 16
# Bytes received and not yet parsed: above the high mark the channel stops being read,
# below the low mark it is read again.
INPUT_BACKLOG_HIGH_BYTES = 64 * 1024
INPUT_BACKLOG_LOW_BYTES = 16 * 1024
# After telling the app a new size, the next waits this long: a window dragged sends dozens
# of window-changes, and each would cost every screen a relayout. (Once, under a flood of
# window-changes, a session relaid its screen for ever between two sizes; a replay at the
# screen could not repeat it, since textual lets a queued Resize replace the one before.)
RESIZE_SETTLE_S = 0.1


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


_CUP = re.compile(r"\x1b\[(\d+);(\d+)H")
_SGR = re.compile(r"\x1b\[([0-9;:]*)m")
# Escapes that change no cell: private modes (synchronized output, the cursor) and OSC
# strings other than hyperlinks (OSC 8 marks the cells it spans, so it stays with them).
_CONTROL = re.compile(r"\x1b\[\?[0-9;]*[hl]|\x1b\](?!8;)[^\x07\x1b]*(?:\x07|\x1b\\)")
_ZERO_WIDTH = re.compile(r"\x1b\[[0-9;:]*m|\x1b\[\?[0-9;]*[hl]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_C0_C1 = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _unstyled_after(text: str, before: bool) -> bool:
    """Whether no style is in force after `text`, given whether none was before it."""
    styles = _SGR.findall(text)
    return before if not styles else styles[-1] in ("", "0")


Cells = dict[int, tuple[int, str]]  # first column -> (column after the last, what was written)


class ScreenMemory:
    """What the client's screen shows, as the writes still intact on it, so that a frame can
    leave out a write that would paint exactly what is already there.

    Textual repaints a region whenever a widget refreshes, even when it draws the same
    cells: the node view at 1 Hz repeats about four bytes in five. Each write is a cursor
    move followed by styled text that ends unstyled; a write is remembered by row and
    column with the columns it covers, and forgotten as soon as a later one overlaps it. A
    write is left out only when the same text sits at the same place untouched since, so
    the client's screen ends up exactly as it would have.
    """

    def __init__(self) -> None:
        self._rows: dict[int, Cells] = {}

    def forget(self) -> None:
        """The client's screen is unknown (a new screen, a resize): leave nothing out."""
        self._rows.clear()

    def trim(self, frame: str) -> tuple[str, Callable[[], None]]:
        """The frame without writes the screen already shows, and a callback that records
        the frame as shown: call it only once the frame is sent (a dropped frame is not)."""
        parts = _CUP.split(frame)
        lead = parts[0]
        # Text before the first cursor move lands wherever the cursor happens to be.
        unknown = bool(_ZERO_WIDTH.sub("", lead))
        # Textual ends every styled run with a reset; checked here rather than assumed.
        unstyled = _unstyled_after(lead, True)
        touched: dict[int, Cells] = {}
        out = [lead]
        last = len(parts) - 3
        for i in range(1, len(parts), 3):
            row, col, text = int(parts[i]), int(parts[i + 1]), parts[i + 2]
            if i < last and text.endswith("\n"):
                text = text[:-1]  # a newline between rows: the next cursor move places it
            move = f"\x1b[{row};{col}H"
            controls = _CONTROL.findall(text)
            paint = _CONTROL.sub("", text) if controls else text
            plain = _ZERO_WIDTH.sub("", paint)
            if unknown or not plain:
                unstyled = _unstyled_after(paint, unstyled)
                out.append(move + text)
                continue
            if _C0_C1.search(plain):  # tabs, newlines, other escapes: cells we cannot place
                unknown = True
                out.append(move + text)
                continue
            cells = touched.get(row)
            if cells is None:
                cells = touched[row] = dict(self._rows.get(row, ()))
            held = cells.get(col)
            if unstyled and held is not None and held[1] == paint:
                out.extend(controls)  # the end of synchronized output and the like still go
                continue
            end = col + cell_len(plain)
            for start in [s for s, (e, _) in cells.items() if s < end and e > col]:
                del cells[start]
            ends_unstyled = _unstyled_after(paint, unstyled)
            if unstyled and ends_unstyled:
                # only a write that starts and ends unstyled paints the same cells again
                cells[col] = (end, paint)
            unstyled = ends_unstyled
            out.append(move + text)

        def shown() -> None:
            if unknown:
                self._rows.clear()
            else:
                self._rows.update(touched)

        return "".join(out), shown


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


def _keep_reading(_pause: bool) -> None:
    """A link without flow control: nothing to pause."""


@dataclass(frozen=True)
class DriverLink:
    """What a session hands its driver: the output, the first size, a ready callback, and
    how to pause (True) or resume (False) reading the channel's input."""

    output: BoundedOutput
    initial_size: tuple[int, int]
    on_ready: Callable[[SshDriver], None]
    pause_input: Callable[[bool], None] = _keep_reading


class SshDriver(Driver):
    """Drives one App over one SSH session; `bind()` makes the class for a session."""

    link: ClassVar[DriverLink]

    @classmethod
    def bind(
        cls,
        output: BoundedOutput,
        size: tuple[int, int],
        on_ready: Callable[[SshDriver], None],
        pause_input: Callable[[bool], None] = _keep_reading,
    ) -> type[SshDriver]:
        """A driver class for one session (Textual builds the driver from a class);
        `on_ready` gets the driver once it takes input; `pause_input(True)` asks the session
        to stop reading its channel while input waits, `pause_input(False)` to read again."""
        link = DriverLink(output, size, on_ready, pause_input)
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
        self._paste = PasteLimit()  # no paste grows the parser's buffer without end
        self._frame: list[str] = []
        self.screen = ScreenMemory()
        self._input = False
        self._tick: asyncio.TimerHandle | None = None
        self._size_posted: Size | None = None  # the size the app was last told
        self._resize_settle: asyncio.TimerHandle | None = None  # no new size before it ends
        self._repaint_pending = False
        self._backlog = bytearray()  # received, not yet parsed
        self._events: deque[Message] = deque()  # parsed, not yet handed to the app
        self._turn: asyncio.Handle | None = None  # the next turn of taking input
        self._paused = False  # whether the session was asked to stop reading

    # --- output ------------------------------------------------------------------------

    def write(self, data: str) -> None:
        self._frame.append(data)

    def flush(self) -> None:
        if not self._frame:
            return
        frame, shown = self.screen.trim("".join(self._frame))
        self._frame.clear()
        if not frame:
            return  # the client's screen already shows all of it
        if self.output.send_frame(collapse_sgr(frame).encode("utf-8")):
            shown()

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
        self.screen.forget()  # a fresh alternate screen
        self.output.send_always(ENTER.encode())
        self._input = True
        size = Size(*(self._size or self.link.initial_size))
        self._size_posted = size
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
        if self._turn is not None:
            self._turn.cancel()
            self._turn = None
        if self._resize_settle is not None:
            self._resize_settle.cancel()
            self._resize_settle = None
        self._backlog.clear()
        self._events.clear()

    # --- input -------------------------------------------------------------------------

    def send_message(self, message: Message) -> None:
        # Input arrives on the app's own loop: no thread hop needed.
        self._app.post_message(message)

    @property
    def input_backlog(self) -> int:
        """Bytes received and not yet parsed."""
        return len(self._backlog)

    @property
    def input_paused(self) -> bool:
        """Whether the driver asked its session to stop reading input."""
        return self._paused

    def feed(self, data: bytes) -> None:
        """Bytes the client typed (keys, mouse reports, paste, terminal answers)."""
        if not self._input or not data:
            return
        self._backlog += data
        if self._turn is None:
            self._take_input()  # at once: a keystroke waits for no turn of the loop
        if not self._paused and len(self._backlog) > INPUT_BACKLOG_HIGH_BYTES:
            self._paused = True
            self.link.pause_input(True)

    def _take_input(self) -> None:
        """Hand the app up to EVENTS_PER_TURN events, parsing as needed; the rest waits
        for the next turn of the loop, so that other sessions run in between."""
        self._turn = None
        if not self._input:
            return
        if len(self._events) < EVENTS_PER_TURN and self._backlog:
            self._parse(bytes(self._backlog[:PARSE_BYTES_PER_TURN]))
            del self._backlog[:PARSE_BYTES_PER_TURN]
        for _ in range(min(EVENTS_PER_TURN, len(self._events))):
            self.process_message(self._events.popleft())
        if self._events or self._backlog:
            self._turn = self._loop.call_soon(self._take_input)
        else:
            self._schedule_tick()
        if self._paused and len(self._backlog) < INPUT_BACKLOG_LOW_BYTES:
            self._paused = False
            self.link.pause_input(False)

    def _parse(self, data: bytes) -> None:
        cut = self._paste.cut
        text = self._paste.feed(self._decode(data))
        if self._paste.cut != cut:
            log.warning("a paste of over %d characters from an ssh client cut", MAX_PASTE_CHARS)
            self._app.notify(
                f"Paste cut at {MAX_PASTE_CHARS:,} characters; the rest was dropped.",
                severity="warning",
                timeout=4,
            )
        if not text:  # half a character: the parser takes "" as the end of input
            return
        try:
            self._events.extend(self._parser.feed(text))
        except Exception:
            # Nothing a client sends may end its session: start over with a fresh parser.
            log.warning("unreadable input from an ssh client dropped", exc_info=True)
            self._parser = XTermParser()
            self._app.notify(
                "Some input could not be read and was dropped.", severity="warning", timeout=4
            )

    def _schedule_tick(self) -> None:
        # A lone ESC is a key only once no sequence follows within ESCDELAY.
        if self._tick is None and self._parser._timeout_time is not None:
            self._tick = self._loop.call_later(constants.ESCAPE_DELAY + 0.005, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        if not self._input or self._turn is not None:
            return  # input still waiting: it may finish the sequence, and ticks again after
        for event in self._parser.tick():
            self.process_message(event)
        self._schedule_tick()

    def resize(self, width: int, height: int) -> None:
        """The client's window changed size (SSH window-change): the app gets the new size
        at once, then at most one more per RESIZE_SETTLE_S, the latest (a window dragged
        sends dozens)."""
        self._size = (width, height)
        self.screen.forget()  # a terminal may reflow or clear its screen on a resize
        if self._resize_settle is None:
            self._post_size()

    def _post_size(self) -> None:
        size = Size(*(self._size or self.link.initial_size))
        self._resize_settle = None
        if size == self._size_posted:
            return
        self._size_posted = size
        self._app.post_message(events.Resize(size, size))
        self._resize_settle = self._loop.call_later(RESIZE_SETTLE_S, self._post_size)
