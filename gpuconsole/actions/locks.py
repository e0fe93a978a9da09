"""One action per GPU at a time, across every session and process: rows in the journal DB.

Taking the locks and starting the plan happen in one BEGIN IMMEDIATE transaction, so two
requests for one GPU cannot both pass. A lock held by a process that is gone belongs to an
unfinished plan: recovery finishes or rolls that plan back and releases it; until then a
request for the GPU is refused, naming who held it. So is a plan whose process stopped it
half-way because the journal could not record a step (journal.hand_over): it waits for
recovery, which `gpuconsole assign --recover` runs without a restart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuconsole.actions.journal import Journal, let_go, process_alive, process_tag
from gpuconsole.actions.plan import Plan

__all__ = ["GpuBusy", "Holder", "lock_and_start"]


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a GPU's lock."""

    gpu: str
    plan_id: str
    holder: str  # "alice (operator) on head, pid 4242"
    acquired_at: float
    alive: bool  # its plan may still be running
    stopped: bool = False  # its process stopped the plan half-way, left to recovery

    def __str__(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.acquired_at))
        held = f"{self.gpu} is held by {self.holder} since {since}, plan {self.plan_id}"
        if self.stopped:
            return (
                f"{held}, stopped half-way by its process and left to recovery: "
                "`gpuconsole assign --recover` finishes it or rolls it back"
            )
        return held if self.alive else f"{held}, whose process is gone (recovery will finish it)"


def _holder(gpu: str, row: tuple[object, ...]) -> Holder:
    """A lock's holder from (plan_id, holder, host, pid, proc_start, acquired_at)."""
    plan_id, holder, host, pid, start, at = (str(v) for v in row)
    stopped = let_go(plan_id, host, int(pid), start)
    alive = not stopped and process_alive(host, int(pid), start)
    return Holder(gpu, plan_id, holder, float(at), alive, stopped)


class GpuBusy(Exception):
    """Another action holds one of the GPUs; `holders` says who."""

    def __init__(self, holders: list[Holder]) -> None:
        super().__init__("; ".join(str(h) for h in holders))
        self.holders = holders


def lock_key(node: str, bus_id: str) -> str:
    return f"{node}/{bus_id}"


def lock_and_start(
    journal: Journal, plan: Plan, user: str, role: str, fingerprint: str | None
) -> str:
    """Take every GPU of the plan and record the plan as running; or raise GpuBusy."""
    host, pid, start = process_tag()
    keys = [lock_key(plan.node, bus) for bus in plan.gpus]
    holder = f"{user} ({role}) on {host}, pid {pid}"
    now = time.time()
    with journal.transaction() as db:
        busy: list[Holder] = []
        for key in keys:
            row = db.execute(
                "SELECT plan_id, holder, host, pid, proc_start, acquired_at FROM locks"
                " WHERE gpu = ?",
                (key,),
            ).fetchone()
            if row is not None:
                busy.append(_holder(key, tuple(row)))
        if busy:
            raise GpuBusy(busy)
        plan_id = journal.start_plan(db, plan, user, role, fingerprint)
        for key in keys:
            db.execute(
                "INSERT INTO locks (gpu, plan_id, holder, host, pid, proc_start, acquired_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, plan_id, holder, host, pid, start, now),
            )
    return plan_id


def holders(journal: Journal) -> list[Holder]:
    """Every GPU lock held now."""
    rows = journal._db.execute(
        "SELECT gpu, plan_id, holder, host, pid, proc_start, acquired_at FROM locks ORDER BY gpu"
    ).fetchall()
    return [_holder(str(r[0]), tuple(r[1:])) for r in rows]
