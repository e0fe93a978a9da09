"""The terminal driver of an app on this machine's own terminal: Textual's, with an input
thread that sleeps while nobody types.

Textual's Linux driver reads keys in a thread that waits at most 0.1 s each time, so that an
Escape that may begin a sequence is told apart from a lone Escape key once that long has
passed with nothing after it. It waits that long every time, keys or not: ten wake-ups a
second, each taking the GIL from the thread that draws, while a console sits on a node view.
This one waits that short only while such an Escape waits to be told; otherwise until a key,
a reply from the terminal, or the app's end, which wakes it through a pipe of its own.
"""

from __future__ import annotations

import contextlib
import os
import selectors
from codecs import getincrementaldecoder

from textual._loop import loop_last
from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver

__all__ = ["QuietLinuxDriver", "terminal_driver"]

# As Textual's driver: how long a lone Escape (or a sequence cut short) waits for more.
ESCAPE_WAIT_S = 0.1


def terminal_driver(found: type[Driver]) -> type[Driver]:
    """The driver an app runs on, given the one Textual chose (`App.get_driver_class`):
    this one where Textual would use its Linux driver, any other (headless, web, one named
    by TEXTUAL_DRIVER) as it is."""
    return QuietLinuxDriver if found is LinuxDriver else found


class QuietLinuxDriver(LinuxDriver):
    """Textual's Linux driver; its input thread wakes for input and for the app's end only."""

    _pipe: tuple[int, int] | None = None  # (read, write): wakes the input thread to end
    _leaving = False

    def start_application_mode(self) -> None:
        self._pipe = os.pipe()  # before Textual starts the input thread, which waits on it
        super().start_application_mode()  # type: ignore[no-untyped-call]

    def disable_input(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            self._leaving = True
            with contextlib.suppress(OSError):
                os.write(pipe[1], b"\0")
        try:
            super().disable_input()  # joins the input thread, which the pipe has woken
        finally:
            self._leaving = False
            if pipe is not None:
                for fd in pipe:
                    os.close(fd)

    def run_input_thread(self) -> None:
        """Textual's loop, less the wake-ups: read keys and pass them on as events."""
        fileno = self.fileno
        selector = selectors.SelectSelector()
        selector.register(fileno, selectors.EVENT_READ)
        if self._pipe is not None:
            selector.register(self._pipe[0], selectors.EVENT_READ)
        parser = XTermParser(self._debug)
        feed, tick = parser.feed, parser.tick
        decode = getincrementaldecoder("utf-8")().decode

        def process(ready: list[tuple[selectors.SelectorKey, int]], final: bool = False) -> None:
            keys = [(key, mask) for key, mask in ready if key.fd == fileno]
            for last, (_key, mask) in loop_last(keys):
                if mask & selectors.EVENT_READ:
                    text = decode(os.read(fileno, 1024 * 4), final=final and last)
                    if not text:
                        break  # stdin is a pipe, and it has ended
                    for event in feed(text):
                        self.process_message(event)
            for event in tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set() and not self._leaving:
                # the parser holds a deadline only while an Escape waits to be told apart;
                # without the pipe (never, but) it looks at exit_event now and then
                waiting = parser._timeout_time is not None or self._pipe is None
                process(selector.select(ESCAPE_WAIT_S if waiting else None))
            selector.unregister(fileno)
            process([], final=True)
        finally:
            selector.close()
            with contextlib.suppress(EOFError, ParseError):
                for _event in feed(""):
                    pass
