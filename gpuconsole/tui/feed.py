"""How an app is fed by the hub: subscribe on mount, start the hub if asked, undo on unmount."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import App

from gpuconsole.hub import Hub
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.tui.messages import SnapshotArrived


class HubFeed:
    """One app's connection to the hub; stops the hub only if it started it."""

    def __init__(self, hub: Hub | None, *, start: bool) -> None:
        self.hub = hub
        self._start = start and hub is not None
        self._started = False
        self._unsubscribe: Callable[[], None] | None = None

    async def attach(self, app: App[object]) -> None:
        if self.hub is None:
            return

        def deliver(snapshot: FleetSnapshot) -> None:
            # Runs on the hub's loop: post and return; a newer snapshot replaces a queued one.
            app.post_message(SnapshotArrived(snapshot))

        self._unsubscribe = self.hub.subscribe(deliver)
        if self._start:
            await self.hub.start()
            self._started = True

    async def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._started and self.hub is not None:
            self._started = False
            await self.hub.stop()
