"""The ssh driver's output: fewer bytes for the same screen, writes the client's screen
already shows left out, frames dropped whole for a slow client, and snapshots paced per
session."""

from __future__ import annotations

import asyncio
import random

import pyte

from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.ssh.driver import BoundedOutput, ScreenMemory, collapse_sgr
from gpuconsole.ssh.feed import PacedFeed

STYLES = ["1;38;2;216;222;233;48;2;30;40;50", "38;2;95;215;135;48;2;15;20;25", "48;2;15;20;25",
          "7", "1;4;38;5;196"]  # fmt: skip


def textual_frame(rng: random.Random, width: int = 60, height: int = 12) -> str:
    """A frame as Textual writes one: moves, then segments each closed by a reset."""
    out = []
    for row in range(1, height + 1):
        col = 1
        out.append(f"\x1b[{row};{col}H")
        while col <= width:
            n = min(rng.randint(1, 12), width - col + 1)
            out.append(f"\x1b[{rng.choice(STYLES)}m{rng.choice('ab █─') * n}\x1b[0m")
            col += n
            if rng.random() < 0.2 and col <= width:
                out.append(f"\x1b[{row};{col}H")
    return "".join(out)


Cell = tuple[str, str, str, bool, bool, bool]


def cells(screen: pyte.Screen) -> list[list[Cell]]:
    return [
        [(c.data, c.fg, c.bg, c.bold, c.reverse, c.underscore) for c in
         (screen.buffer[y][x] for x in range(screen.columns))]
        for y in range(screen.lines)
    ]  # fmt: skip


def painted(frame: str) -> list[list[Cell]]:
    screen = pyte.Screen(60, 12)
    pyte.Stream(screen).feed(frame)
    return cells(screen)


def partial_update(rng: random.Random, width: int = 60, height: int = 12) -> str:
    """A few regions redrawn, as Textual refreshes widgets: some the same, some not, one with
    a double-width character."""
    out = []
    for _ in range(rng.randint(1, 6)):
        row, col = rng.randint(1, height), rng.randint(1, width - 8)
        text = rng.choice(["ab", "ba", "─█", "漢x", "  "]) * rng.randint(1, 4)
        out.append(f"\x1b[{row};{col}H\x1b[{rng.choice(STYLES)}m{text}\x1b[0m")
    return "".join(out)


def test_collapsed_frames_paint_the_same_screen_in_fewer_bytes() -> None:
    rng = random.Random(7)
    for _ in range(50):
        frame = textual_frame(rng)
        small = collapse_sgr(frame)
        assert painted(small) == painted(frame)
        assert len(small) < len(frame)
        assert small.endswith("\x1b[0m") or not small.rstrip("\x1b[0m")


def test_writes_the_screen_already_shows_are_left_out_and_the_screen_is_the_same() -> None:
    rng = random.Random(11)
    memory = ScreenMemory()
    every, trimmed = pyte.Screen(60, 12), pyte.Screen(60, 12)
    sent_full = sent_trimmed = 0
    history: list[str] = []
    for _ in range(400):
        roll = rng.random()
        if history and roll < 0.4:
            frame = rng.choice(history[-5:])  # a widget refreshed with nothing new to show
        elif roll < 0.55:
            frame = textual_frame(rng)
        else:
            frame = partial_update(rng)
        history.append(frame)
        small, shown = memory.trim(frame)
        if rng.random() < 0.1:
            continue  # dropped for a slow client: neither screen gets it, and it is not shown()
        shown()
        pyte.Stream(every).feed(frame)
        pyte.Stream(trimmed).feed(collapse_sgr(small))
        assert cells(trimmed) == cells(every)
        sent_full += len(collapse_sgr(frame))
        sent_trimmed += len(collapse_sgr(small))
    assert sent_trimmed < 0.8 * sent_full  # seeded: the same frames every run


def test_a_repeated_frame_sends_only_what_is_not_drawing() -> None:
    memory = ScreenMemory()
    frame = "\x1b[?2026h\x1b[1;1H\x1b[1mtitle\x1b[0m\n\x1b[2;1Hrow two\x1b[3;5H\x1b[?2026l"
    first, shown = memory.trim(frame)
    assert first == frame.replace("\n", "")  # the newline before a cursor move goes
    shown()
    again, _ = memory.trim(frame)
    # synchronized output still opens and closes, and the cursor still lands where it did
    assert again == "\x1b[?2026h\x1b[3;5H\x1b[?2026l"
    # a write that overlaps a remembered one makes it be drawn again next time
    _, shown = memory.trim("\x1b[1;3Hxx")
    shown()
    assert "title" in memory.trim(frame)[0]
    memory.forget()  # a resize: nothing is known about the client's screen
    assert memory.trim(frame)[0] == first


def test_a_frame_that_is_not_sent_is_not_remembered() -> None:
    memory = ScreenMemory()
    frame = "\x1b[1;1Hhello"
    memory.trim(frame)  # dropped: shown() never called
    assert memory.trim(frame)[0] == frame


class SlowChannel:
    def __init__(self) -> None:
        self.buffered = 0
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)
        self.buffered += len(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered


def test_a_congested_channel_drops_whole_frames_and_marks_the_screen_stale() -> None:
    channel = SlowChannel()
    out = BoundedOutput(channel, limit_bytes=100)
    assert out.send_frame(b"x" * 150)  # under the limit when it left
    assert not out.send_frame(b"y" * 10)  # now 150 unsent: dropped
    assert out.stale and out.stats.frames_dropped == 1
    assert channel.written == [b"x" * 150]
    out.send_always(b"\x1b[?1049l")  # mode switches are never dropped
    assert channel.written[-1] == b"\x1b[?1049l"
    channel.buffered = 0
    assert out.send_frame(b"z")


class FakeHub:
    def __init__(self) -> None:
        self.callbacks: list = []  # type: ignore[type-arg]

    def subscribe(self, callback):  # type: ignore[no-untyped-def]
        self.callbacks.append(callback)
        return lambda: self.callbacks.remove(callback)

    def publish(self, snapshot: FleetSnapshot) -> None:
        for callback in list(self.callbacks):
            callback(snapshot)


async def test_a_session_gets_the_newest_snapshot_once_per_period() -> None:
    hub = FakeHub()
    feed = PacedFeed(hub, 0.1)  # type: ignore[arg-type]
    got: list[int] = []
    unsubscribe = feed.subscribe(lambda s: got.append(s.seq))
    for seq in range(1, 6):  # five publishes within one period
        hub.publish(FleetSnapshot(seq, 0.0, ()))
    await asyncio.sleep(0.15)
    assert got == [5]
    await asyncio.sleep(0.1)
    assert got == [5]  # nothing new: nothing sent
    unsubscribe()
    assert hub.callbacks == []
