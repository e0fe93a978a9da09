"""The ssh driver's output: fewer bytes for the same screen, frames dropped whole for a
slow client, and snapshots paced per session."""

from __future__ import annotations

import asyncio
import random

import pyte

from gpuconsole.model import FleetSnapshot
from gpuconsole.ssh.driver import BoundedOutput, collapse_sgr
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


def painted(frame: str) -> list[list[tuple[str, str, str, bool, bool, bool]]]:
    screen = pyte.Screen(60, 12)
    pyte.Stream(screen).feed(frame)
    return [
        [(c.data, c.fg, c.bg, c.bold, c.reverse, c.underscore) for c in
         (screen.buffer[y][x] for x in range(60))]
        for y in range(12)
    ]  # fmt: skip


def test_collapsed_frames_paint_the_same_screen_in_fewer_bytes() -> None:
    rng = random.Random(7)
    for _ in range(50):
        frame = textual_frame(rng)
        small = collapse_sgr(frame)
        assert painted(small) == painted(frame)
        assert len(small) < len(frame)
        assert small.endswith("\x1b[0m") or not small.rstrip("\x1b[0m")


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
