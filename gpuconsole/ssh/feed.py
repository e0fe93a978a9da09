"""Snapshots for one ssh session: at most one per `period_s`, the newest, on the session's
own phase.

The hub publishes whenever any source of any node has news, several times a second on a
busy fleet. Twenty sessions repainting on every publish, all at the same instant, would
queue a keystroke behind twenty renders and send frames nobody can read. Each session
instead takes the newest snapshot once per period, at its own moment within the period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gpuconsole.hub import Hub, Subscriber
from gpuconsole.readings.snapshot import FleetSnapshot

log = logging.getLogger(__name__)


class PacedFeed:
    """A hub as one session sees it: `subscribe()` only, paced; starts and stops nothing."""

    def __init__(self, hub: Hub, period_s: float) -> None:
        self._hub = hub
        self.period_s = period_s
        self._subscribers: list[Subscriber] = []
        self._newest: FleetSnapshot | None = None
        self._sent: FleetSnapshot | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Like Hub.subscribe: the latest snapshot now, then at most one per period."""
        self._subscribers.append(callback)
        if self._unsubscribe is None:
            self._unsubscribe = self._hub.subscribe(self._on_publish)
            self._sent = self._newest  # Hub.subscribe delivered the latest just now
            self._timer = asyncio.get_running_loop().call_later(self.period_s, self._tick)
        if self._newest is not None:
            callback(self._newest)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(callback)
            if not self._subscribers:
                self.close()

        return unsubscribe

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _on_publish(self, snapshot: FleetSnapshot) -> None:
        self._newest = snapshot

    def _tick(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.period_s, self._tick)
        snapshot = self._newest
        if snapshot is None or snapshot is self._sent:
            return
        self._sent = snapshot
        for callback in list(self._subscribers):
            try:
                callback(snapshot)
            except Exception:
                log.exception("session snapshot subscriber failed")
