"""A bound on bracketed paste from an ssh client.

Textual's input parser keeps every character of a paste until the paste ends: a client
that starts one and never ends it (garbage, a large file cat into the terminal, a hostile
peer) grows the server's memory without end. PasteLimit sits in front of the parser: past
`max_chars` it ends the paste itself (the app gets what came so far, once) and drops the
rest of it, up to and including the client's own end.
"""

from __future__ import annotations

from typing import Final

START: Final = "\x1b[200~"
END: Final = "\x1b[201~"
MAX_CHARS = 64 * 1024
"""Longest paste handed on: far more than any field of the console takes."""


class PasteLimit:
    """Text on its way to the parser, with every paste cut at `max_chars`."""

    def __init__(self, max_chars: int = MAX_CHARS) -> None:
        self.max_chars = max_chars
        self.cut = 0  # pastes cut short so far
        self._pasted: int | None = None  # characters of the paste so far; None: not in one
        self._dropping = False  # past the bound: the rest of the paste is dropped
        self._tail = ""  # the end of the text before, for a marker split between reads

    def feed(self, text: str) -> str:
        """The text to hand the parser in place of `text`."""
        out: list[str] = []
        pos = 0
        while pos < len(text):
            if self._pasted is None:  # outside a paste: everything goes on
                after = self._find(START, text, pos)[1]
                if after < 0:
                    out.append(text[pos:])
                    break
                out.append(text[pos:after])
                pos, self._pasted = after, 0
                continue
            end, after = self._find(END, text, pos)
            found = after >= 0
            content = (max(end, pos) if found else len(text)) - pos
            if self._dropping:
                if found:  # the client's own end, not handed on: the paste ended already
                    self._dropping, self._pasted = False, None
                pos = after if found else len(text)
                continue
            room = self.max_chars - self._pasted
            if content <= room:
                self._pasted += content
                if not found:
                    out.append(text[pos:])
                    break
                out.append(text[pos:after])
                pos, self._pasted = after, None
                continue
            kept = text[pos : pos + room]
            escape = kept.rfind("\x1b", max(len(kept) - len(END), 0))
            if escape >= 0:  # no escape sequence cut in two before the end we add
                kept = kept[:escape]
            out.append(kept + END)
            self.cut += 1
            self._dropping = True
            pos += room
        self._tail = (self._tail + text)[-(len(START) - 1) :]
        return "".join(out)

    def _find(self, marker: str, text: str, pos: int) -> tuple[int, int]:
        """The next `marker` in text[pos:]: (where it starts, where it ends), or (-1, -1).
        At pos 0 one begun in the text before counts too: it starts at a negative index, so
        only the end tells whether one was found."""
        if pos == 0 and self._tail:
            joined = self._tail + text[: len(marker) - 1]
            split = joined.find(marker)
            if 0 <= split < len(self._tail):
                start = split - len(self._tail)
                return start, start + len(marker)
        at = text.find(marker, pos)
        return (at, at + len(marker)) if at >= 0 else (-1, -1)
