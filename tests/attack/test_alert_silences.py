"""Silences as Alertmanager holds them, against the real one on 127.0.0.1: a silence's
regular expression is Alertmanager's (RE2, linear time) to evaluate. Python's backtracking
`re` takes exponential time on some patterns RE2 takes in its stride, and the consoles ask
which silence covers each alert on the hub's loop: one such silence froze every console."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuconsole.alerts.delivery import ALERTMANAGER
from tests.alert_fixtures import alertmanager
from tests.test_alerts_delivery import LOST, engine_for, settle


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail the block past `seconds` (Python's regular expressions see signals)."""

    def late(_signum: int, _frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    before = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def _silence(matchers: list[dict[str, Any]], by: str, why: str) -> dict[str, Any]:
    return {
        "matchers": matchers,
        "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60)),
        "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600)),
        "createdBy": by,
        "comment": why,
    }


async def test_a_silence_whose_pattern_backtracks_for_ever_here_is_alertmanagers_to_judge(
    tmp_path: Path,
) -> None:
    with alertmanager(tmp_path / "am") as am:
        # RE2 answers at once that no uuid ends in "="; Python's re would take for ever
        am.post(
            "/api/v2/silences",
            _silence([{"name": "uuid", "value": "(.*.*)*=", "isRegex": True}], "mallory", "x"),
        )
        # Go's RE2 syntax, which Python's re reads otherwise: [[:alnum:]] is a POSIX class
        am.post(
            "/api/v2/silences",
            _silence(
                [{"name": "node", "value": "dgx-[[:digit:]]+", "isRegex": True}],
                "alice",
                "reseating GPU 5",
            ),
        )
        engine = engine_for(ALERTMANAGER, am.url)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            await settle(engine, session, lost=True)
            await engine.refresh_silences(session)
        with within(2.0):
            [alert] = engine.active()
        assert alert.silenced_by is not None
        assert alert.silenced_by.startswith("alice (reseating GPU 5) until ")
        [held] = am.alerts("GpuLost")
        assert held["status"]["state"] == "suppressed"


@pytest.mark.parametrize("silenced", [False, True])
async def test_an_alert_is_silenced_as_alertmanager_says_not_as_a_pattern_reads_here(
    tmp_path: Path, silenced: bool
) -> None:
    """An anchored RE2 pattern: "dgx" covers no node "dgx-007" in Alertmanager (it must
    match the whole value), "dgx.*" does."""
    with alertmanager(tmp_path / "am") as am:
        value = "dgx.*" if silenced else "dgx"
        am.post(
            "/api/v2/silences",
            _silence([{"name": "node", "value": value, "isRegex": True}], "bob", "rack 4"),
        )
        engine = engine_for(ALERTMANAGER, am.url)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            await settle(engine, session, lost=True)
            await engine.refresh_silences(session)
        [alert] = engine.active()
        assert (alert.silenced_by is not None) is silenced


@pytest.mark.parametrize(("value", "silenced"), [("5", True), ("\u0665", False)])
async def test_a_digit_class_covers_what_alertmanager_says_it_covers(
    tmp_path: Path, value: str, silenced: bool
) -> None:
    """RE2's \\d is ASCII: U+0665 (an Arabic-Indic five) is no digit to Alertmanager, though
    Python's re calls it one. Alertmanager's word is what the console shows."""
    rule = dataclasses.replace(LOST[0], labels=(("slot", value),))
    with alertmanager(tmp_path / "am") as am:
        am.post(
            "/api/v2/silences",
            _silence([{"name": "slot", "value": "\\d", "isRegex": True}], "carol", "slot"),
        )
        engine = engine_for(ALERTMANAGER, am.url, rules=(rule,))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            await settle(engine, session, lost=True)
            await engine.refresh_silences(session)
        [alert] = engine.active()
        assert (alert.silenced_by is not None) is silenced
