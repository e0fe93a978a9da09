"""A receiver that answers 500 for as long as it likes, while the GPU it is told about
comes and goes: what it was told firing it is told resolved once it is back, whatever the
alert did meanwhile; and what is kept for it stays one alert per label set."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpuconsole.alerts.delivery import ALERTMANAGER, WEBHOOK, Receiver
from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.alerts.rules import DEFAULT_RULES
from gpuconsole.alerts.state import FIRING, Alert
from gpuconsole.readings.base import Severity
from tests.alert_fixtures import fleet, free_port, served

LOST = tuple(dataclasses.replace(r, for_s=10.0) for r in DEFAULT_RULES if r.name == "GpuLost")


@dataclasses.dataclass
class Hook:
    url: str
    up: list[bool]
    told: list[tuple[str, str]]  # (status, alertname) as received, in order


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    up = [True]
    told: list[tuple[str, str]] = []

    async def take(request: web.Request) -> web.Response:
        if not up[0]:
            return web.Response(status=500, text="down")
        # past 1 MiB (aiohttp's client_max_size, as nginx's client_max_body_size): 413
        body: Any = json.loads(await request.read())
        told.extend((a["status"], a["labels"]["alertname"]) for a in body["alerts"])
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", take)
    async with served(app) as url:
        yield Hook(f"{url}/hook", up, told)


async def test_what_a_receiver_was_told_firing_it_is_told_resolved_after_its_outage(
    hook: Hook,
) -> None:
    receiver = Receiver(WEBHOOK, hook.url, resend_s=60, max_backoff_s=1)
    engine = AlertEngine(LOST, [receiver], timeout_s=2)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:

        async def at(t: float, lost: bool) -> None:
            await engine.step(fleet(t, lost=lost))
            receiver.next_try_at = 0.0  # no backoff in between: each step is minutes
            await engine.deliver(session)

        await at(1000, True)  # pending
        await at(1010, True)  # firing, and told so
        assert hook.told == [("firing", "GpuLost")]
        hook.up[0] = False  # 500 from here on
        await at(1020, False)  # resolved; not told
        await at(1030, True)  # lost again: pending, for less than for_s
        await at(1035, False)  # back before it fired again
        for t in range(1040, 1100, 10):  # the outage goes on
            await at(t, t % 20 == 0)
        assert len(engine.alerts) <= 1  # one label set, one alert kept, however it flaps
        hook.up[0] = True
        await at(1100, False)
        await at(1110, False)
    assert hook.told == [("firing", "GpuLost"), ("resolved", "GpuLost")]
    assert engine.alerts == {} and receiver.told == {}


@pytest.fixture
async def blackhole() -> AsyncIterator[str]:
    """An 'Alertmanager' that takes the connection and never answers."""

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text="late")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    async with served(app) as url:
        yield url


async def test_a_receiver_that_never_answers_does_not_hold_up_the_others(
    hook: Hook, blackhole: str
) -> None:
    timeout_s = 1.5
    stuck = Receiver(ALERTMANAGER, blackhole, resend_s=60, max_backoff_s=60)
    healthy = Receiver(WEBHOOK, hook.url, resend_s=60, max_backoff_s=60)
    engine = AlertEngine(LOST[:1], [stuck, healthy], timeout_s=timeout_s)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        await engine.step(fleet(time.time() - 20, lost=True))
        await engine.step(fleet(time.time(), lost=True))  # firing
        began = time.monotonic()
        delivering = asyncio.create_task(engine.deliver(session))
        while not hook.told and time.monotonic() - began < timeout_s:
            await asyncio.sleep(0.02)
        told_after = time.monotonic() - began
        assert await delivering
        assert hook.told == [("firing", "GpuLost")]
        assert told_after < timeout_s / 2, told_after
        assert stuck.failures == 1 and stuck.last_error == "TimeoutError"
        # its backoff counts from when it was found down, not from when it was asked
        assert stuck.next_try_at >= time.time() + 0.5
        # its silences are not asked for while it is down: its retry says when it is back
        began = time.monotonic()
        await engine.refresh_silences(session)
        assert time.monotonic() - began < timeout_s / 2


async def test_a_fleet_wide_fault_reaches_a_receiver_that_takes_bodies_of_a_size(
    hook: Hook,
) -> None:
    """Fabric Manager down on every NVSwitch node fires an alert per GPU at once: a webhook
    behind a proxy that takes bodies up to 1 MB (nginx's default) gets them all, in
    batches, not one body it refuses for good."""
    receiver = Receiver(WEBHOOK, hook.url, resend_s=60, max_backoff_s=1)
    engine = AlertEngine(LOST, [receiver], timeout_s=5)
    now = time.time()
    for n in range(4000):
        labels = {"alertname": "GpuLost", "node": f"dgx-{n // 8:04d}", "gpu": str(n % 8)}
        alert = Alert(
            "GpuLost", labels, {"summary": "x" * 200}, Severity.CRITICAL, FIRING, now, now
        )
        alert.fired_at = now
        engine.alerts[alert.fingerprint] = alert
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        assert await engine.deliver(session)
    assert len(hook.told) == 4000


async def test_a_receivers_token_and_password_stay_out_of_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A webhook keeps its token in its URL's path, an Alertmanager its password in its
    userinfo: the log says which receiver is down by its host."""
    port = free_port()  # nobody listens
    hook = Receiver(WEBHOOK, f"http://127.0.0.1:{port}/services/T0/B0/s3cr3tT0ken", resend_s=60,
                    max_backoff_s=1)  # fmt: skip
    am = Receiver(ALERTMANAGER, f"http://ops:hunter2@127.0.0.1:{port}", resend_s=60,
                  max_backoff_s=1)  # fmt: skip
    engine = AlertEngine(LOST, [hook, am], timeout_s=2)
    with caplog.at_level(logging.INFO, "gpuconsole.alerts"):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            await engine.step(fleet(time.time() - 20, lost=True))
            await engine.step(fleet(time.time(), lost=True))
            assert not await engine.deliver(session)
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert f"webhook http://127.0.0.1:{port}/… (#" in said
    assert f"alertmanager http://127.0.0.1:{port}/… (#" in said
    assert "s3cr3tT0ken" not in said and "hunter2" not in said
