"""A head polling an agent tried as a hostile agent would answer: a gzip body that
inflates beyond any body, one cut short or that is no gzip, a body in an encoding the head
did not ask for, and a part said kept with a time that is no
time. Each is stale with a clear reason, or read without that time; a neighbour's real
agent stays fresh."""

from __future__ import annotations

import gzip
import json

import pytest
from aiohttp import web

from gpuconsole.export.agent import Agent, select, snapshot_body
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.agents import STEADY_PARTS, have_query, held_parts, part_versions
from gpuconsole.sources.agents import MAX_BODY_BYTES, AgentClient, AgentSource
from gpuconsole.wiring import AgentSettings
from tests.export_fixtures import HeldHub, frozen_fleet
from tests.test_agents_source import serve
from tests.waiting import until

HOSTILE = "dgx-002"
NEIGHBOUR = "dgx-003"


def summary() -> bytes:
    return snapshot_body(frozen_fleet(), HOSTILE, summary=True)


CASES = {
    "bomb": (
        gzip.compress(b"[" + b" " * (MAX_BODY_BYTES * 2) + b"]"),
        "gzip",
        f"agent sent a body that inflates to more than {MAX_BODY_BYTES} bytes",
    ),
    "cut_short": (gzip.compress(summary())[:-40], "gzip", "agent sent a gzip body cut short"),
    "no_gzip": (b"\x1f\x8b" + b"\x1b[2J" * 64, "gzip", "agent sent a gzip body that does not"),
    "unasked": (summary(), "deflate", "agent sent its body as deflate, asked for gzip"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_hostile_body_is_stale_with_a_reason_and_the_neighbour_stays_fresh(
    case: str,
) -> None:
    body, encoding, reason = CASES[case]

    async def hostile(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Encoding": encoding})

    runner, port = await serve(hostile)
    neighbour = Agent(
        HeldHub(select(frozen_fleet(), NEIGHBOUR, summary=False)), AgentSettings(port=0)
    )
    await neighbour.start()
    head = Hub(HubSettings(publish_gap_s=0.05, max_backoff_s=0.4))
    client = AgentClient(max_connections=2)
    for name, at in ((HOSTILE, port), (NEIGHBOUR, neighbour.port)):
        url = f"http://127.0.0.1:{at}"
        # the hostile one polled, as a head reads an agent that does not stream
        source = AgentSource(name, url, client, interval_s=0.2, timeout_s=2.0, watch=at != port)
        head.add_source(source)
    await head.start()
    try:

        def status(name: str) -> object:
            node = head.latest.node(name) if head.latest else None
            return node.status("remote") if node else None

        await until(lambda: reason in (getattr(status(HOSTILE), "error", None) or ""))
        error = status(HOSTILE).error  # type: ignore[attr-defined]
        assert "\x1b" not in error and "Traceback" not in error, error
        await until(lambda: getattr(status(NEIGHBOUR), "ok", False))
        node = head.latest.node(NEIGHBOUR) if head.latest else None
        assert node is not None and node.gpus
    finally:
        await head.stop()
        await neighbour.stop()
        await runner.cleanup()


@pytest.mark.parametrize("said", ["yesterday", True, None, [1], 1e400, -1e400])
async def test_a_part_kept_with_a_time_that_is_no_time_keeps_the_time_it_had(said: object) -> None:
    """An agent says a part the head holds was read again at something that is no time: the
    head keeps the part as it holds it, and reads everything else."""
    fleet = select(frozen_fleet(), HOSTILE, summary=False)
    versions = part_versions(fleet.nodes[0], summary=True)
    asked: list[str] = []

    async def hostile(request: web.Request) -> web.Response:
        have = request.query.get("have", "")
        asked.append(have)
        body = snapshot_body(fleet, HOSTILE, summary=True, have=held_parts(have))
        if held_parts(have):
            document = json.loads(body)
            node = document["nodes"][0]
            node["kept_at"] = {part: said for part in node.get("kept", ())}
            # json writes 1e400 as Infinity, which no JSON reader takes: as a number
            body = json.dumps(document).replace("Infinity", "1e400").encode()
        return web.Response(body=body, content_type="application/json")

    runner, port = await serve(hostile)
    client = AgentClient()
    source = AgentSource(HOSTILE, f"http://127.0.0.1:{port}", client, watch=False)
    try:
        first = await source.poll()
        second = await source.poll()
        assert asked[1] == have_query(versions)  # it said what it held
        for part in STEADY_PARTS:
            assert getattr(second.node, part) is getattr(first.node, part), part
        assert second.node == first.node
    except ValueError as exc:  # a number past float's range: the body is refused whole
        assert said in (1e400, -1e400) and "not JSON" in str(exc), exc
    finally:
        await source.close()
        await runner.cleanup()
