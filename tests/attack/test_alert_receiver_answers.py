"""What a receiver answers, as a broken or hostile peer on 127.0.0.1 could: a body that is
not text in the charset it names, one that never ends, one that drips, a redirect to
another host. Each is the receiver's problem, said in plain words; alerting goes on."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpuconsole.alerts.delivery import ALERTMANAGER, WEBHOOK, Receiver
from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.alerts.rules import DEFAULT_RULES
from tests.alert_fixtures import fleet, served

LOST = tuple(r for r in DEFAULT_RULES if r.name == "GpuLost")
TIMEOUT_S = 2.0


@dataclasses.dataclass
class Peer:
    url: str
    posts: dict[str, list[Any]]
    sent: dict[str, int]  # bytes of body an endless answer got out before it was dropped


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    posts: dict[str, list[Any]] = {}
    sent: dict[str, int] = {}

    def took(name: str, body: bytes) -> None:
        posts.setdefault(name, []).append(body)

    # another host: whatever it is sent, it keeps
    async def elsewhere(request: web.Request) -> web.Response:
        took("elsewhere", await request.read())
        return web.Response(text="thanks")

    other = web.Application()
    other.router.add_route("*", "/{tail:.*}", elsewhere)

    def answer(status: int, body: bytes, content_type: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            took(request.path, await request.read())
            return web.Response(status=status, body=body, headers={"Content-Type": content_type})

        return handler

    def endless(status: int, chunk: bytes, pause_s: float) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            took(request.path, await request.read())
            response = web.StreamResponse(status=status)
            response.content_type = "text/plain"
            await response.prepare(request)
            count = 0
            try:
                while count < 1 << 31:
                    await response.write(chunk)
                    count += len(chunk)
                    sent[request.path] = count
                    await asyncio.sleep(pause_s)
            except (ConnectionError, RuntimeError):
                pass
            return response

        return handler

    def redirect(status: int) -> Any:
        async def handler(request: web.Request) -> web.Response:
            took(request.path, await request.read())
            return web.Response(status=status, headers={"Location": f"{other_url}/stolen"})

        return handler

    app = web.Application()
    for status in (200, 500):
        app.router.add_post(
            f"/latin{status}", answer(status, b"\xff\xfe\x1b[2J", "text/plain; charset=utf-8")
        )
        app.router.add_post(f"/nocharset{status}", answer(status, b"ok", "text/plain; charset=x"))
        app.router.add_post(f"/huge{status}", endless(status, b"x" * 65536, 0))
        app.router.add_post(f"/drip{status}", endless(status, b"x", 0.2))
    for status in (301, 302, 307, 308):
        app.router.add_post(f"/moved{status}", redirect(status))
        app.router.add_post(f"/moved{status}/api/v2/alerts", redirect(status))
    async with served(other) as other_url, served(app) as url:
        yield Peer(url, posts, sent)


async def _deliver(url: str, kind: str = WEBHOOK) -> tuple[Receiver, bool, float]:
    receiver = Receiver(kind, url, resend_s=60, max_backoff_s=1)
    engine = AlertEngine(LOST, [receiver], timeout_s=TIMEOUT_S)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await engine.step(fleet(time.time(), lost=True))
        began = time.monotonic()
        took = await engine.deliver(session)
        return receiver, took, time.monotonic() - began


@pytest.mark.parametrize("path", ["/latin200", "/nocharset200"])
async def test_a_receiver_that_takes_alerts_with_an_odd_body_has_taken_them(
    peer: Peer, path: str
) -> None:
    receiver, took, _ = await _deliver(peer.url + path)
    assert took and receiver.failures == 0 and receiver.told


@pytest.mark.parametrize("path", ["/latin500", "/nocharset500"])
async def test_a_receiver_failing_with_an_odd_body_is_down_said_escaped(
    peer: Peer, path: str
) -> None:
    receiver, took, _ = await _deliver(peer.url + path)
    assert not took and receiver.failures == 1
    assert receiver.last_error is not None and receiver.last_error.startswith("HTTP 500")
    assert "\x1b" not in receiver.last_error


@pytest.mark.parametrize("status", [200, 500])
@pytest.mark.parametrize("kind", ["huge", "drip"])
async def test_an_answer_that_never_ends_is_not_read_to_its_end(
    peer: Peer, status: int, kind: str
) -> None:
    """Only the status counts (and a few words of a failure): the head does not hold a body
    without end in memory, nor wait for it until the timeout."""
    receiver, took, seconds = await _deliver(f"{peer.url}/{kind}{status}")
    assert seconds < TIMEOUT_S / 2, seconds
    assert took is (status == 200)
    if status == 500:
        assert receiver.last_error is not None and receiver.last_error.startswith("HTTP 500")
    await asyncio.sleep(0.3)  # the peer notices the connection is gone
    assert peer.sent.get(f"/{kind}{status}", 0) < 64 << 20


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@pytest.mark.parametrize("kind", [WEBHOOK, ALERTMANAGER])
async def test_a_redirect_elsewhere_is_not_followed_and_the_receiver_is_down(
    peer: Peer, status: int, kind: str
) -> None:
    """Alerts name nodes, GPUs and tenants: a receiver's answer does not send them to a host
    nobody configured. The redirect is said, and the alerts are kept for the receiver."""
    receiver, took, _ = await _deliver(f"{peer.url}/moved{status}", kind)
    assert "elsewhere" not in peer.posts
    assert not took and receiver.failures == 1 and not receiver.told
    assert receiver.last_error is not None
    assert f"HTTP {status}" in receiver.last_error and "/stolen" in receiver.last_error
