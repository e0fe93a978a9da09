"""A head's watch of an agent tried as a hostile agent would: a frame that never ends, a
frame too large to hold, a gzip frame that inflates beyond any body, bytes that are no
frame, escape sequences inside one, a stall mid-frame. Each is stale with a clear reason,
its connection dropped and opened again later; a neighbour's real agent stays fresh."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest
from aiohttp import web

from gpuconsole.export.agent import Agent, select, snapshot_body
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.agents import WATCH_TYPE, frame
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sources.agents import MAX_BODY_BYTES, AgentClient, AgentSource
from gpuconsole.wiring import AgentSettings
from tests.export_fixtures import HeldHub, frozen_fleet
from tests.test_agents_source import serve
from tests.waiting import until

HOSTILE = "dgx-002"
HANG_S = 4.0  # how long a hostile agent holds its connection (the head gives up after 1 s)
NEIGHBOUR = "dgx-003"


def good() -> bytes:
    return frame(snapshot_body(frozen_fleet(), HOSTILE, summary=True), packed=False)


def escaped() -> bytes:
    """A summary whose GPU name and a status error carry terminal escapes."""
    document = json.loads(snapshot_body(frozen_fleet(), HOSTILE, summary=True))
    node = document["nodes"][0]
    node["nvml"]["gpus"][0]["name"] = "\x1b]0;owned\x07\x1b[2JH100"
    return frame(json.dumps(document).encode(), packed=False)


async def never_ends(response: web.StreamResponse) -> None:
    await response.write(b"json %d\n" % MAX_BODY_BYTES)
    while True:  # a trickle that never makes the frame whole
        await response.write(b" ")
        await asyncio.sleep(0.05)


async def huge(response: web.StreamResponse) -> None:
    await response.write(b"json 99999999999999\n{")
    await asyncio.sleep(HANG_S)


async def bomb(response: web.StreamResponse) -> None:
    packed = gzip.compress(b"[" + b" " * (MAX_BODY_BYTES * 2) + b"]")
    await response.write(frame(packed, packed=True))
    await asyncio.sleep(HANG_S)


async def garbage(response: web.StreamResponse) -> None:
    await response.write(b"\x1b[2J\x1b]0;owned\x07" + b"A" * 64)
    await asyncio.sleep(HANG_S)


async def stall_mid_frame(response: web.StreamResponse) -> None:
    whole = good()
    await response.write(whole)  # one good frame: the node is fresh, then
    await response.write(whole[: len(whole) // 2])  # half of the next, and nothing more
    await asyncio.sleep(HANG_S)


CASES = {
    "never_ends": (never_ends, "agent's watch stalled: no whole frame within"),
    "huge": (huge, f"a frame of 99999999999999 bytes, more than the {MAX_BODY_BYTES}"),
    "bomb": (bomb, f"a frame that inflates to more than {MAX_BODY_BYTES} bytes"),
    "garbage": (garbage, "agent's watch sent something that is not a frame"),
    "stall_mid_frame": (stall_mid_frame, "agent's watch stalled: no whole frame within"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_hostile_watch_is_stale_with_a_reason_dropped_and_watched_again(
    case: str,
) -> None:
    write, reason = CASES[case]
    opened: list[asyncio.BaseTransport | None] = []  # each watch's connection

    async def hostile(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": WATCH_TYPE})
        await response.prepare(request)
        opened.append(request.transport)
        try:
            await write(response)
        except ConnectionError:
            pass
        return response

    runner, port = await serve(hostile)
    held = HeldHub(select(frozen_fleet(), NEIGHBOUR, summary=False))
    neighbour = Agent(held, AgentSettings(port=0))
    await neighbour.start()
    head = Hub(HubSettings(publish_gap_s=0.05, max_backoff_s=0.4))
    client = AgentClient(max_connections=2)
    for name, at in ((HOSTILE, port), (NEIGHBOUR, neighbour.port)):
        head.add_source(
            AgentSource(name, f"http://127.0.0.1:{at}", client, interval_s=0.2, timeout_s=1.0)
        )
    await head.start()
    try:

        def status(name: str) -> object:
            node = head.latest.node(name) if head.latest else None
            return node.status("remote") if node else None

        await until(lambda: reason in (getattr(status(HOSTILE), "error", None) or ""))
        error = status(HOSTILE).error  # type: ignore[attr-defined]
        assert "\x1b" not in error and "\x07" not in error
        # the connection is dropped, and the watch opened again after a pause
        await until(lambda: opened[0] is None or opened[0].is_closing())
        await until(lambda: len(opened) >= 2)
        neighbour_status = status(NEIGHBOUR)
        assert neighbour_status is not None and neighbour_status.ok  # type: ignore[attr-defined]
        assert head.latest is not None and _fresh(head.latest, NEIGHBOUR)
    finally:
        await head.stop()
        await neighbour.stop()
        await runner.cleanup()


def _fresh(snapshot: FleetSnapshot, name: str) -> bool:
    node = snapshot.node(name)
    return node is not None and bool(node.gpus)


async def test_escapes_inside_a_frame_reach_no_screen() -> None:
    """A frame whose strings carry escape sequences is read, every string made safe."""

    async def hostile(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": WATCH_TYPE})
        await response.prepare(request)
        await response.write(escaped())
        await asyncio.sleep(HANG_S)
        return response

    runner, port = await serve(hostile)
    source = AgentSource(HOSTILE, f"http://127.0.0.1:{port}", AgentClient(), timeout_s=2.0)
    try:
        reading = await source.poll()
    finally:
        await source.close()
        await runner.cleanup()
    name = reading.node.gpus[0].name
    assert "\x1b" not in name and "\x07" not in name and "H100" in name
