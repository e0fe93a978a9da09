"""Plans other processes run, as hub events: a source that reads the action journal.

An executor posts its own events to the hub of its process. A plan run anywhere else
(`gpuconsole assign` in a shell, or over ssh from a head console, or another console)
writes only the journal; this source reads what was added since it started and posts the
same events, so that the agent's Events view, and through it the head's, show every
action on the node. Its reading says each GPU's last repair (a remediation's reset or power
cycle, and how it went), which the verdict escalates from. Rows of plans this very process runs are skipped: its executor has
posted them already. The journal is opened read-only and never created here. A node's
hub adds one: `hub.add_source(JournalEvents(node, cfg.actions.journal_path))`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import msgspec

from gpuconsole.actions.journal import (
    Journal,
    JournalCorrupt,
    Phase,
    PlanState,
    StepProgress,
    StepState,
    boot,
    journal_text,
    repairs,
)
from gpuconsole.actions.plan import Plan
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.readings.actions import JournalReading
from gpuconsole.readings.base import Event, Severity, safe_text
from gpuconsole.readings.nvml import XID_WINDOW_S
from gpuconsole.sources.base import DaemonThread, EmitEvent

__all__ = ["JournalEvents", "JournalReading"]

log = logging.getLogger(__name__)


@dataclass
class _Marks:
    """How far the journal has been read."""

    plan_rowid: int
    step_rowid: int  # every step row up to here is told (or was there before the start)
    finished_at: float
    told_steps: set[int]  # rows past step_rowid already told (an intent before them waits)
    told_plans: set[str]  # finished at exactly finished_at, already told


# A file's (mtime ns, size, inode), or None where it is absent.
_FileStamp = tuple[int, int, int] | None
# The journal's and its write-ahead log's: SQLite in WAL mode writes each commit to the log.
_Stamp = tuple[_FileStamp, _FileStamp]
# Seconds within which a file's mtime may not yet tell a later write apart (coarse
# timestamps: some file systems keep a second or two).
RACY_S = 2.0


def _file_stamp(path: Path) -> _FileStamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def _stamp(path: Path) -> _Stamp:
    return _file_stamp(path), _file_stamp(path.with_name(path.name + "-wal"))


def _recent(stamp: _Stamp, now: float) -> bool:
    return any(f is not None and f[0] / 1e9 > now - RACY_S for f in stamp)


class JournalEvents:
    """Looks at the journal at `path` every `interval_s` and, when it changed, reads it and
    posts what others did: a node that never acts, or not since, costs two stat calls."""

    kind: ClassVar[str] = "actions"

    def __init__(
        self,
        node: str,
        path: Path,
        *,
        interval_s: float = 2.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        proc_root: str = "/proc",
    ) -> None:
        """`proc_root`: where the node's boot id says whether it rebooted since a repair."""
        self.node = node
        self.path = path
        self.proc_root = proc_root
        self._boot: tuple[str, float | None] | None = None
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._emit: EmitEvent | None = None
        self._db: sqlite3.Connection | None = None
        self._marks: _Marks | None = None
        self._me = (socket.gethostname(), os.getpid())
        self._cut: set[str] = set()  # plans told cut off by a reboot
        # the files' stamps at the last read, and what it found: nothing is read again
        # (no thread, no query) until a plan writes to the journal
        self._stamp: _Stamp | None = None
        self._last: JournalReading | None = None
        self._thread: DaemonThread | None = None  # a one-shot's read (poll_blocking)

    async def start(self, emit: EmitEvent) -> None:
        self._emit = emit

    async def poll(self) -> JournalReading:
        stamp = _stamp(self.path)
        kept = self._kept(stamp)
        if kept is not None:
            return kept
        import asyncio  # here: a one-shot reads the journal with no event loop

        return self._took(stamp, await asyncio.to_thread(self._read))

    def _kept(self, stamp: _Stamp) -> JournalReading | None:
        """The last reading, brought up to now, where the journal has not changed since."""
        last = self._last
        if last is None or stamp != self._stamp:
            return None
        now = self.clock()
        since = now - XID_WINDOW_S
        kept = tuple(r for r in last.repairs if r.at >= since)
        return msgspec.structs.replace(last, at=now, repairs=kept)

    def _took(self, stamp: _Stamp, reading: JournalReading) -> JournalReading:
        # A write within the file system's timestamp granularity of the stamp may leave
        # it unchanged: a stamp that recent is not trusted, and the next poll reads again.
        self._stamp = None if _recent(stamp, time.time()) else stamp
        self._last = reading
        return reading

    # the same with no event loop (a one-shot reading: Hub.read_once)

    def start_blocking(self, emit: EmitEvent) -> Future[None]:
        self._emit = emit
        started: Future[None] = Future()
        started.set_result(None)
        return started

    def poll_blocking(self) -> Future[JournalReading]:
        def poll_now() -> JournalReading:
            stamp = _stamp(self.path)
            kept = self._kept(stamp)
            return kept if kept is not None else self._took(stamp, self._read())

        # on a thread, as poll() reads: a journal another process holds locked is waited for
        if self._thread is None:
            self._thread = DaemonThread(f"journal-{self.node}")
        return self._thread.submit(poll_now)

    def close_blocking(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            self._close_db()
            return
        closed = thread.submit(self._close_db)  # after a read still under way, if any
        with contextlib.suppress(TimeoutError):
            closed.result(self.timeout_s)
        thread.shutdown(wait=False)

    async def close(self) -> None:
        self._close_db()

    def _close_db(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None

    def _connect(self) -> sqlite3.Connection | None:
        if self._db is None:
            if not self.path.exists():
                return None  # no action has run on this machine yet
            self._db = sqlite3.connect(
                f"file:{self.path}?mode=ro",
                uri=True,
                timeout=self.timeout_s,
                check_same_thread=False,
            )
            self._db.text_factory = journal_text
        return self._db

    def _read(self) -> JournalReading:
        db = self._connect()
        now = self.clock()
        if db is None:
            return JournalReading(now)
        try:
            running = int(
                db.execute(
                    "SELECT COUNT(*) FROM plans WHERE state = ?", (PlanState.RUNNING,)
                ).fetchone()[0]
            )
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return JournalReading(now)  # created a moment ago, its schema not yet
            raise
        if self._boot is None:  # a reboot ends this process: read once
            self._boot = boot(self.proc_root)
        tried = repairs(db, now - XID_WINDOW_S, self.node, self._boot)
        # told from the first read on: a plan the node rebooted under is news after the boot
        cut_off = self._cut_off(running)
        if self._marks is None:
            # what happened before this process started is history, not news
            plan_rowid, finished = db.execute(
                "SELECT COALESCE(MAX(rowid), 0), COALESCE(MAX(finished_at), 0) FROM plans"
            ).fetchone()
            step_rowid = db.execute("SELECT COALESCE(MAX(rowid), 0) FROM steps").fetchone()[0]
            last = db.execute("SELECT id FROM plans WHERE finished_at = ?", (finished,))
            told = {str(r[0]) for r in last}
            self._marks = _Marks(int(plan_rowid), int(step_rowid), float(finished), set(), told)
            return JournalReading(now, running, tried, cut_off)
        for event in [*self._started(db), *self._steps(db), *self._finished(db)]:
            if self._emit is not None:
                self._emit(event)
        return JournalReading(now, running, tried, cut_off)

    def _cut_off(self, running: int) -> tuple[str, ...]:
        """The plans of this node left running by a process that went down with the node
        (their last step ran in an earlier boot), each told once as it is first seen: until
        a run on the node ends it (gpuconsole.actions.executor.recover), the journal holds
        it running, its GPUs locked. Said with what that run will do."""
        assert self._boot is not None
        now = self._boot[0]
        if not running or not now:
            return ()  # and nothing imported: a one-shot reading loads no event loop
        from gpuconsole.actions.executor import action_event, recovery_words, stopped_where

        # read-only, through the records the executor reads (a journal in memory, which
        # reads the one on disk)
        reading = Journal(self.path, in_memory=True, proc_root=self.proc_root)
        try:
            found = reading.unfinished(self.node)
        except (JournalCorrupt, sqlite3.Error) as exc:  # recovery will say it; events go on
            log.warning("%s", exc)
            return ()
        finally:
            reading.close()
        cut = []
        for record, orphan in found:
            last = record.steps[-1].boot_id if record.steps else ""
            if not orphan or not last or last == now:
                continue
            cut.append(record.id)
            if record.id in self._cut:
                continue
            self._cut.add(record.id)
            plan = record.plan
            text = (
                f"{plan.action} (plan {record.id}) was running when {plan.node} rebooted, "
                f"{stopped_where(record)}, and its process went with it: it stays unfinished, "
                f"its GPUs locked, until `gpuconsole remediate` or `assign` on {plan.node}, "
                f"its repair view, or `gpuconsole assign --recover` there, which "
                f"{recovery_words(record, now)}"
            )
            if self._emit is not None:
                warned = action_event(plan, self.clock(), Severity.WARNING, safe_text(text))
                self._emit(warned)
        return tuple(cut)

    def _mine(self, host: object, pid: object) -> bool:
        return (str(host), int(str(pid))) == self._me

    # The executor's words for events are imported by the methods that tell them: a single
    # reading (a one-shot snapshot) tells none, and goes without the executor's import.

    def _started(self, db: sqlite3.Connection) -> list[Event]:
        from gpuconsole.actions.executor import action_event

        assert self._marks is not None
        events = []
        rows = db.execute(
            "SELECT rowid, id, user, role, fingerprint, plan, host, pid, created_at FROM plans"
            " WHERE rowid > ? ORDER BY rowid",
            (self._marks.plan_rowid,),
        ).fetchall()
        for rowid, plan_id, user, role, fingerprint, body, host, pid, created in rows:
            self._marks.plan_rowid = int(rowid)
            if self._mine(host, pid):
                continue
            plan = Plan.from_json(json.loads(str(body)))
            fp = None if fingerprint is None else str(fingerprint)
            who = Actor(str(user), Role(str(role)), fp, "ssh" if fp else "local").who
            text = f"{who} started {plan.action}: {plan_id}"
            events.append(action_event(plan, float(created), Severity.INFO, text))
        return events

    def _steps(self, db: sqlite3.Connection) -> list[Event]:
        from gpuconsole.actions.executor import STEP_EVENT, action_event, step_message

        marks = self._marks
        assert marks is not None
        events = []
        rows = db.execute(
            "SELECT s.rowid, s.plan_id, s.seq, s.phase, s.state, s.detail, s.finished_at,"
            " p.plan, p.host, p.pid, p.state FROM steps s JOIN plans p ON p.id = s.plan_id"
            " WHERE s.rowid > ? ORDER BY s.rowid",
            (marks.step_rowid,),
        ).fetchall()
        waiting = False
        for row in rows:
            rowid, plan_id, seq, phase, state, detail, finished, body, host, pid, plan_state = row
            if state == StepState.INTENT:
                # running now, told once done or failed; a crash's intent is never done
                waiting = waiting or plan_state == PlanState.RUNNING
                continue
            if int(rowid) not in marks.told_steps and not self._mine(host, pid):
                plan = Plan.from_json(json.loads(str(body)))
                told = StepProgress.of(Phase(str(phase)), StepState(str(state)))
                severity, text = step_message(plan, str(plan_id), int(seq), told, str(detail))
                at = float(finished) if finished is not None else self.clock()
                events.append(action_event(plan, at, severity, text, STEP_EVENT))
            marks.told_steps.add(int(rowid))
            if not waiting:
                marks.step_rowid = int(rowid)
        marks.told_steps = {r for r in marks.told_steps if r > marks.step_rowid}
        return events

    def _finished(self, db: sqlite3.Connection) -> list[Event]:
        from gpuconsole.actions.executor import ACTION_EVENT, action_event, outcome_severity

        marks = self._marks
        assert marks is not None
        events = []
        rows = db.execute(
            "SELECT id, user, state, outcome, plan, host, pid, finished_at, recovered"
            " FROM plans WHERE finished_at >= ? ORDER BY finished_at",
            (marks.finished_at,),
        ).fetchall()
        for plan_id, user, state, outcome, body, host, pid, finished, recovered in rows:
            if str(plan_id) in marks.told_plans:
                continue
            if float(finished) > marks.finished_at:
                marks.finished_at, marks.told_plans = float(finished), set()
            marks.told_plans.add(str(plan_id))
            if self._mine(host, pid):
                continue
            plan = Plan.from_json(json.loads(str(body)))
            ended = PlanState(str(state))
            if recovered:
                text = f"{plan.action} (plan {plan_id}) {outcome}"
                severity = Severity.WARNING if ended is PlanState.DONE else outcome_severity(ended)
            else:
                text = f"{plan.action} by {user}: {outcome}"
                severity = outcome_severity(ended)
            events.append(action_event(plan, float(finished), severity, text, ACTION_EVENT))
        return events
