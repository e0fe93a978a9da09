"""What the node's action journal says: plans running now, and each GPU's last repair.

A repair is a remediation's GPU reset or power cycle; the verdict reads how the last one of
each GPU went, since what follows a reset that failed is the node's power cycle, and what
follows a power cycle that did not bring the GPU back is service.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from gpuconsole.readings.base import Key, RawCounter
from gpuconsole.readings.verdict import Action

__all__ = ["JournalReading", "RepairAttempt"]


class RepairAttempt(msgspec.Struct, frozen=True):
    """A GPU's last repair in the journal: its reset (`Action.RESET_GPU`) or its node's power
    cycle (`Action.REBOOT_NODE`), when the step began, and whether the plan made it fit."""

    bus_id: str  # sysfs form
    action: Action
    at: float
    ok: bool
    # a reboot seen only by the node's new boot id (done outside gpuconsole): when the
    # reset that failed before it was tried
    reset_failed_at: float | None = None


class JournalReading(msgspec.Struct, frozen=True):
    """How the journal stood at the last read: plans running now, on any node, the last
    repair of each GPU that a finished plan tried within the health window, and the plans
    of this node a reboot cut off."""

    at: float
    running: int = 0
    repairs: tuple[RepairAttempt, ...] = ()
    # plans of this node its reboot cut off (their process went down with it), still
    # running in the journal until a run on the node ends them
    cut_off: tuple[str, ...] = ()

    def repair(self, bus_id: str) -> RepairAttempt | None:
        """The GPU's last repair, by its bus id (sysfs form); None where it had none."""
        for attempt in self.repairs:
            if attempt.bus_id == bus_id:
                return attempt
        return None

    def counters(self) -> Iterator[RawCounter]:
        return iter(())

    def series(self) -> Iterator[tuple[Key, float]]:
        return iter(())
