"""How an app is fed by the hub: subscribe on mount, start the hub if asked, undo on unmount."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from textual.message_pump import MessagePump

from gpuconsole.hub import Hub, Subscriber
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.messages import SnapshotArrived


class SnapshotFeed(Protocol):
    """Where an app's snapshots come from: the Hub itself, or something between it and the
    app that passes them on (an ssh session's PacedFeed)."""

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback` with the latest snapshot and the ones after; returns the
        unsubscribe function."""
        ...


class HubFeed:
    """One app's connection to the hub; stops the hub only if it started it.

    The app subscribes to `feed` (the hub itself unless given); `start` starts the hub."""

    def __init__(self, hub: Hub | None, *, feed: SnapshotFeed | None = None, start: bool) -> None:
        self.hub = hub
        self.feed: SnapshotFeed | None = feed if feed is not None else hub
        self._start = start
        self._started = False
        self._unsubscribe: Callable[[], None] | None = None

    async def attach(self, app: MessagePump) -> None:
        if self.feed is None:
            return

        def deliver(snapshot: FleetSnapshot) -> None:
            # Runs on the hub's loop: post and return; a newer snapshot replaces a queued one.
            app.post_message(SnapshotArrived(snapshot))

        self._unsubscribe = self.feed.subscribe(deliver)
        if self._start and self.hub is not None:
            self._started = True  # first: a console that ends while it starts stops it
            await self.hub.start()

    async def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._started and self.hub is not None:
            self._started = False
            await self.hub.stop()
