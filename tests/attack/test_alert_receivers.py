"""Alert receivers tried as a hostile or broken peer would: an "Alertmanager" that answers
silences with garbage, one that never answers, one that refuses every alert, and series
labels that carry terminal escapes. Alerting goes on and says each cause in plain words."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from gpuconsole.alerts.delivery import ALERTMANAGER, Receiver
from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.alerts.rules import DEFAULT_RULES
from gpuconsole.readings.snapshot import FleetSnapshot
from tests.alert_fixtures import fleet, served

LOST = tuple(r for r in DEFAULT_RULES if r.name == "GpuLost")


@dataclasses.dataclass
class Peer:
    url: str
    posts: list[Any]


@pytest.fixture
async def hostile() -> AsyncIterator[Peer]:
    """An 'Alertmanager' on 127.0.0.1: /slow never answers, /refuse answers 400, /garbage
    answers silences with what is not JSON, and a list of odd shapes after."""
    posts: list[Any] = []
    calls = {"silences": 0}

    async def slow(_request: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.Response(text="late")

    async def refuse(request: web.Request) -> web.Response:
        posts.append(await request.read())
        return web.Response(status=400, text="bad alert \x1b[2J\x1b]0;owned\x07")

    async def silences(_request: web.Request) -> web.Response:
        calls["silences"] += 1
        if calls["silences"] == 1:
            return web.Response(body=b"\xff\xfe not json", content_type="application/json")
        odd = [
            5,
            {"status": "active"},
            {"id": 7, "status": {"state": "active"}},
            {"id": "e", "status": {"state": "expired"}, "createdBy": "eve"},
            {
                "id": "m",
                "status": {"state": "active"},
                "createdBy": "\x1b[31mmallory",
                "matchers": [{"name": "alertname", "value": "GpuLost"}],
            },
        ]
        return web.json_response(odd)

    async def held(_request: web.Request) -> web.Response:
        """The alerts it was sent, held silenced by 'm' (and one by the expired 'e'),
        among odd shapes."""
        sent = [a for batch in posts if isinstance(batch, list) for a in batch]
        odd: list[Any] = [
            "x",
            {"labels": {"a": 1}, "status": {"silencedBy": ["m"]}},
            {"labels": {"alertname": "GpuLost"}, "status": {"silencedBy": "m"}},
            {"labels": {"alertname": "Other"}, "status": {"silencedBy": ["e"]}},
        ]
        odd += [{"labels": a["labels"], "status": {"silencedBy": [5, "m"]}} for a in sent]
        return web.json_response(odd)

    async def take(request: web.Request) -> web.Response:
        posts.append(await request.json())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/slow/api/v2/alerts", slow)
    app.router.add_post("/refuse/api/v2/alerts", refuse)
    app.router.add_post("/garbage/api/v2/alerts", take)
    app.router.add_get("/garbage/api/v2/silences", silences)
    app.router.add_get("/garbage/api/v2/alerts", held)
    async with served(app) as url:
        yield Peer(url, posts)


def engine_on(url: str) -> AlertEngine:
    return AlertEngine(
        LOST, [Receiver(ALERTMANAGER, url, resend_s=60, max_backoff_s=1)], timeout_s=0.5
    )


async def test_a_receiver_that_never_answers_is_down_and_alerting_goes_on(hostile: Peer) -> None:
    engine = engine_on(f"{hostile.url}/slow")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
        await engine.step(fleet(time.time(), lost=True))
        began = time.monotonic()
        assert await engine.deliver(session) is False
        assert time.monotonic() - began < 5
        [receiver] = engine.receivers
        assert receiver.failures == 1 and receiver.last_error == "TimeoutError"
        await engine.step(fleet(time.time() + 1, lost=False))  # evaluations go on
    # resolved before any receiver was told it fired: nothing is left to tell
    assert engine.alerts == {} and engine.active() == ()


async def test_a_refusal_is_logged_escaped_once_and_not_sent_again(
    hostile: Peer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = engine_on(f"{hostile.url}/refuse")
    async with aiohttp.ClientSession() as session:
        await engine.step(fleet(time.time(), lost=True))
        with caplog.at_level(logging.ERROR, "gpuconsole.alerts"):
            assert await engine.deliver(session) is True
            await engine.deliver(session)
    assert len(hostile.posts) == 1
    [said] = [r.getMessage() for r in caplog.records]
    assert "refused 1 alert(s) with HTTP 400" in said and "\x1b" not in said


async def test_silences_that_are_not_json_or_odd_shapes_never_break_the_engine(
    hostile: Peer,
) -> None:
    engine = engine_on(f"{hostile.url}/garbage")
    async with aiohttp.ClientSession() as session:
        await engine.step(fleet(time.time(), lost=True))
        await engine.refresh_silences(session)
        assert not engine.silences and not engine.silenced
        assert await engine.deliver(session)  # asks again at once which it silences
        await engine.refresh_silences(session)
    # of the odd shapes, the silence with a string id is kept, and the alerts held with
    # string labels that name it
    assert [s.id for s in engine.silences] == ["m"]
    [alert] = engine.active()
    assert alert.silenced_by is not None and "\x1b" not in alert.silenced_by
    assert "mallory" in alert.silenced_by


def test_labels_with_terminal_escapes_reach_consoles_escaped() -> None:
    snapshot = fleet(1.0, lost=True)
    node = msgspec.structs.replace(snapshot.nodes[0], node="dgx\x1b]0;owned\x07-7")
    engine = AlertEngine(LOST)
    engine.evaluate(FleetSnapshot(1, 1.0, (node,)))
    [alert] = engine.active()
    assert all("\x1b" not in v and "\x07" not in v for _, v in alert.labels)
    assert "\x1b" not in alert.summary
    # the node column of the alerts view and the wallboard show it too
    assert alert.node == "dgx\\x1b]0;owned\\x07-7"
