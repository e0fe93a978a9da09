"""Where alerts go: Alertmanager through its v2 API, and generic JSON webhooks.

Each receiver remembers what it acknowledged of each alert, so it is told each change once
(Alertmanager is also told firing alerts again every `resend_s`, so that it never resolves
one on its own), and a receiver that is down is asked again with a growing backoff until it
takes what it missed.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gpuconsole.alerts.state import FIRING, RESOLVED, Alert
from gpuconsole.readings.base import safe_text

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

ALERTMANAGER, WEBHOOK = "alertmanager", "webhook"
FIRST_RETRY_S = 1.0
REASON_BYTES = 200  # of a failure's body: a line says why
# Alerts to one request, as Prometheus batches them (its notifier's maxBatchSize): a fault
# across the fleet fires thousands at once, more than a proxy in front of a webhook takes
# in one body (nginx: 1 MB), which it refuses for good (413).
MAX_BATCH = 256


def iso(at: float) -> str:
    """A time as Alertmanager's API writes them (RFC 3339, UTC)."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Receiver:
    """One place alerts are delivered to, with what it was told and its retry state."""

    def __init__(
        self,
        kind: str,
        url: str,
        *,
        resend_s: float,
        max_backoff_s: float,
        told: dict[str, tuple[str, float]] | None = None,
    ) -> None:
        self.kind = kind
        self.url = url.rstrip("/")
        self.resend_s = resend_s
        self.max_backoff_s = max_backoff_s
        self.told: dict[str, tuple[str, float]] = told if told is not None else {}
        self.failures = 0
        self.next_try_at = 0.0
        self.last_error: str | None = None

    @property
    def name(self) -> str:
        """How the state file names it (its whole URL: two receivers on one host differ)."""
        return f"{self.kind} {self.url}"

    @property
    def shown(self) -> str:
        """How the log names it: its host, not the rest of its URL, where a webhook keeps
        its token (hooks.example.com/services/T0/B0/TOKEN) and a user:password may sit;
        a digest of the whole tells two on one host apart."""
        try:
            parts = urlsplit(self.url)
            host = parts.hostname or "?"
            where = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
        except ValueError:
            where = "(an unreadable URL)"
        rest = self.url != where and self.url.rstrip("/") != where
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:6]
        return f"{self.kind} {safe_text(where)}" + (f"/… (#{digest})" if rest else "")

    @property
    def endpoint(self) -> str:
        return f"{self.url}/api/v2/alerts" if self.kind == ALERTMANAGER else self.url

    def due(self, alerts: Iterable[Alert], now: float) -> list[Alert]:
        """The alerts this receiver must be told now."""
        found = []
        for alert in alerts:
            said = self.told.get(alert.fingerprint)
            if alert.state == FIRING:
                if said is None or said[0] != FIRING:
                    found.append(alert)
                elif self.kind == ALERTMANAGER and now - said[1] >= self.resend_s:
                    found.append(alert)
            elif alert.state == RESOLVED and said is not None and said[0] == FIRING:
                found.append(alert)  # a firing it was never told needs no resolving
        return found

    def payload(self, alerts: Sequence[Alert], now: float) -> Any:
        if self.kind == ALERTMANAGER:
            return [self._am_alert(a, now) for a in alerts]
        firing = any(a.state == FIRING for a in alerts)
        return {
            "version": "1",
            "receiver": "gpuconsole",
            "status": FIRING if firing else RESOLVED,
            "alerts": [self._webhook_alert(a) for a in alerts],
        }

    def _am_alert(self, alert: Alert, now: float) -> dict[str, Any]:
        starts = alert.fired_at if alert.fired_at is not None else alert.active_at
        if alert.state == RESOLVED and alert.resolved_at is not None:
            ends = alert.resolved_at
        else:
            # as Prometheus does: a firing alert that is not sent again ends by itself
            ends = now + 4 * self.resend_s
        return {
            "labels": alert.labels,
            "annotations": alert.annotations,
            "startsAt": iso(starts),
            "endsAt": iso(ends),
        }

    @staticmethod
    def _webhook_alert(alert: Alert) -> dict[str, Any]:
        starts = alert.fired_at if alert.fired_at is not None else alert.active_at
        return {
            "status": RESOLVED if alert.state == RESOLVED else FIRING,
            "labels": alert.labels,
            "annotations": alert.annotations,
            "startsAt": iso(starts),
            "endsAt": iso(alert.resolved_at) if alert.resolved_at is not None else None,
            "fingerprint": alert.fingerprint,
        }

    async def deliver(
        self, session: aiohttp.ClientSession, alerts: Sequence[Alert], now: float
    ) -> bool:
        """Send `alerts`, MAX_BATCH to a request; True when the receiver took them (or
        refused them for good, which is logged: sending the same again would be refused
        again). A batch it did not take stops the round: it and the rest go at the retry."""
        for start in range(0, len(alerts), MAX_BATCH):
            if not await self._post(session, alerts[start : start + MAX_BATCH], now):
                return False
        return True

    async def _post(
        self, session: aiohttp.ClientSession, alerts: Sequence[Alert], now: float
    ) -> bool:
        import aiohttp

        began = time.monotonic()
        try:
            # not redirected: alerts name nodes, GPUs and tenants, and go only where the
            # config says. A body is read only to say why it failed, and then only what has
            # come: one that never ends (or drips) is no reason to wait, nor to hold it.
            async with session.post(
                self.endpoint, json=self.payload(alerts, now), allow_redirects=False
            ) as response:
                status = response.status
                moved_to = response.headers.get("Location", "")
                said = b"" if status < 300 else await response.content.read(REASON_BYTES)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            # the backoff counts from when it was found down (a timeout later), not asked
            return self._failed(now + (time.monotonic() - began), why)
        found = now + (time.monotonic() - began)
        if status < 300:
            self._took(alerts, now)
            return True
        body = said.decode("utf-8", "replace").strip()
        if status < 400:
            return self._failed(
                found,
                f"HTTP {status}: redirects to {safe_text(moved_to)[:200] or 'nowhere said'}, "
                "not followed (set the receiver's URL to where it answers)",
            )
        if 400 <= status < 500 and status not in (408, 429):
            log.error(
                "alerts: %s refused %d alert(s) with HTTP %d: %s; not sent again",
                self.shown,
                len(alerts),
                status,
                safe_text(body),
            )
            self._took(alerts, now)
            return True
        return self._failed(found, f"HTTP {status}: {safe_text(body)}")

    def _took(self, alerts: Sequence[Alert], now: float) -> None:
        for alert in alerts:
            self.told[alert.fingerprint] = (alert.state, now)
        if self.failures:
            log.info("alerts: %s takes alerts again", self.shown)
        self.failures = 0
        self.next_try_at = 0.0
        self.last_error = None

    def _failed(self, now: float, why: str) -> bool:
        self.failures += 1
        wait = min(self.max_backoff_s, FIRST_RETRY_S * math.pow(2, self.failures - 1))
        self.next_try_at = now + wait
        if self.failures == 1 or why != self.last_error:
            log.warning("alerts: %s is down (%s); retrying in %.0f s", self.shown, why, wait)
        self.last_error = why
        return False

    def forget(self, keep: Iterable[str]) -> None:
        """Drop what it was told of alerts that are gone."""
        kept = set(keep)
        for fp in [fp for fp in self.told if fp not in kept]:
            del self.told[fp]
