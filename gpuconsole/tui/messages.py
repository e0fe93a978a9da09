"""Messages the console passes between the hub's callback, the app and its screens."""

from __future__ import annotations

from textual.message import Message

from gpuconsole.readings.snapshot import FleetSnapshot


class SnapshotArrived(Message):
    """A new FleetSnapshot from the hub; a newer one replaces it in the queue."""

    def __init__(self, snapshot: FleetSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotArrived)
