"""A node's journal reader (JournalEvents), which the agent's hub polls every 2 s and a demo
hub polls for each simulated node (up to 64): the cost of a poll while nothing was written
since the last (two stat calls on the event loop), beside a poll that reads the journal (a
worker thread and the queries: what every poll cost before), on a journal of PLANS finished
remediations, each of whose resets failed. Medians of ROUNDS rounds of POLLS polls, the two
taking turns, and their ratio from this one run.

Target: an unchanged journal's poll costs at most a tenth of a read.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.timing import record
from gpuconsole.actions.journal import Journal, PlanState, StepState
from gpuconsole.actions.journal_events import RACY_S, JournalEvents
from gpuconsole.actions.plan import Layer, Plan, Step, StepKind, Target, TargetKind

NODE = "dgx-001"
PLANS = 200
POLLS = 200
ROUNDS = 5
RATIO_TARGET = 0.1


def _journal(path: Path) -> None:
    store = Journal(path)
    for k in range(PLANS):
        bus = f"0000:{k % 8 + 0x18:02x}:00.0"
        step = Step(StepKind.GPU_RESET, Layer.GPU, f"reset GPU {k % 8} ({bus})")
        plan = Plan(NODE, Target(TargetKind.DRAINED), (bus,), (bus,), (k % 8,), ("free",), (),
                    (step,), remedy="reset_gpu")  # fmt: skip
        with store.transaction() as db:
            plan_id = store.start_plan(db, plan, "ops", "operator", None)
        row = store.intent(plan_id, 0, StepKind.GPU_RESET.value)
        store.result(row, StepState.FAILED, "nvidia-smi -r: unable to reset the GPU")
        store.finish_plan(plan_id, PlanState.FAILED, "the reset failed")
    store.close()


async def _polls(events: JournalEvents, read: bool) -> float:
    """Seconds per poll: read each time, or look only."""
    began = time.perf_counter()
    for _ in range(POLLS):
        if read:
            await asyncio.to_thread(events._read)
        else:
            await events.poll()
    return (time.perf_counter() - began) / POLLS


async def _measure(path: Path) -> tuple[float, float]:
    events = JournalEvents(NODE, path)
    try:
        reading = await events.poll()
        assert len(reading.repairs) == 8, reading
        # a stamp this recent may hide a write (the reader's own connection made the
        # write-ahead log just now): polls read until it is older, as an agent's do
        await asyncio.sleep(RACY_S + 0.1)
        await events.poll()
        looks, reads = [], []
        for _ in range(ROUNDS):
            looks.append(await _polls(events, read=False))
            reads.append(await _polls(events, read=True))
        return statistics.median(looks), statistics.median(reads)
    finally:
        await events.close()


def main() -> None:
    print(f"Journal reader poll, {PLANS} finished plans (medians of {ROUNDS} x {POLLS} polls)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "actions.db"
        _journal(path)
        look, read = asyncio.run(_measure(path))
    print(f"  unchanged (stat only): {look * 1e6:8.1f} us per poll")
    print(f"  read (thread, queries): {read * 1e6:7.1f} us per poll")
    ratio = look / read
    met = "met" if ratio <= RATIO_TARGET else "MISSED"
    print(f"  target: unchanged <= {RATIO_TARGET:g}x a read: {ratio:.3f}x, {met}")
    record("journal poll, unchanged", look * 1e6, "us", peer="a read", peer_value=read * 1e6,
           ratio_at_most=RATIO_TARGET)  # fmt: skip


if __name__ == "__main__":
    main()
