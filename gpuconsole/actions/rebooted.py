"""The node ends, by itself, the remediations its reboot cut off.

A remediation runs on the node it repairs, so a reboot of that node (its own power cycle, a
hand, lost power) takes the plan's process down with it, and the journal holds the plan
running. Once the node is back its agent reads the journal (JournalEvents: the plan is in
its reading's `cut_off`) and, through this watch, ends each such plan at once rather than at
the node's next `remediate` or `assign`: one whose power cycle the reboot was, with its
final check read from the agent's own fresh readings as the GPUs return; any other,
interrupted, none of its steps run again (gpuconsole.actions.executor). Neither changes
anything on the node, so no operator need be there; each is journaled, audited and posted
as an event. Reassignments cut off by a reboot are left to a run on the node (`gpuconsole
assign --recover`): putting one back writes sysfs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpuconsole.actions.executor import CannotRecover, Executor, Reader
from gpuconsole.hub import Hub
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot

__all__ = ["CutOffWatch"]

log = logging.getLogger(__name__)


class CutOffWatch:
    """Ends the remediations of `node` a reboot cut off, with an executor `make` builds
    over a reader of the node (the hub's latest snapshot, once attached)."""

    def __init__(self, node: str, make: Callable[[Reader], Executor]) -> None:
        self.node = node
        self.make = make
        self.reader: Reader | None = None
        self.tried: set[str] = set()  # plans already taken (or failed to): once each
        self.task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def attach(self, hub: Hub) -> None:
        """Watch `hub`'s snapshots; read the node from its latest as the plans end."""

        async def read() -> NodeSnapshot:
            latest = hub.latest
            found = latest.node(self.node) if latest is not None else None
            if found is None:
                raise LookupError(f"{self.node} has no reading yet")
            return found

        self.reader = read

        def offer(snapshot: FleetSnapshot) -> None:
            found = snapshot.node(self.node)
            if found is not None:
                self.offer(found)

        self._unsubscribe = hub.subscribe(offer)

    def offer(self, node: NodeSnapshot) -> None:
        """A new reading of the node: end what its journal reading says a reboot cut off,
        unless that is under way or was tried. Runs on the event loop."""
        journal = node.actions
        new = set(journal.cut_off) - self.tried if journal is not None else set()
        if not new or (self.task is not None and not self.task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # before the hub runs: its first publish offers it again
        self.tried |= new
        self.task = loop.create_task(self.end(), name=f"end cut-off plans of {self.node}")

    async def end(self) -> None:
        """End the plans; what cannot be ended stays for a run on the node, and is said."""
        assert self.reader is not None
        try:
            executor = self.make(self.reader)
        except Exception as exc:  # a journal it cannot open: the event said what to run
            log.warning("%s: cannot end the plans its reboot cut off: %s", self.node, exc)
            return
        try:
            for outcome in await executor.recover(cut_off=True):
                log.warning("%s: plan %s %s", self.node, outcome.plan_id, outcome.message)
        except CannotRecover as exc:
            log.warning("%s: %s", self.node, exc)
        except Exception:  # the agent serves on; a run on the node recovers the plan
            log.exception("%s: ending the plans its reboot cut off", self.node)
        finally:
            await executor.close()

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.task is not None:
            self.task.cancel()
