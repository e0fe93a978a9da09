"""The action journal: SQLite in WAL mode, the intent of each step written before it runs.

One row per plan (who asked, the steps as JSON, where it stands) and one per step attempt
(intent, then done, failed or undone). A process killed mid-plan leaves its plan "running"
under a pid that is gone: `unfinished` finds such plans for recovery, and `claim` hands one
to the recovering process in a single IMMEDIATE transaction so two never recover one plan.
The GPU locks (locks.py) live in the same database so that taking them and starting a plan
are one transaction.

A journal write that fails half-way through a plan (a full disk) stops the plan there, as a
crash would, and `hand_over` leaves it to recovery in any process, this one included: a
small reserve file, deleted for the purpose, leaves room to mark it so on a full disk.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import socket
import sqlite3
import stat
import time
import uuid as uuid_mod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuconsole import paths
from gpuconsole.actions.plan import Plan, StepKind
from gpuconsole.readings.actions import RepairAttempt
from gpuconsole.readings.base import normal_bus_id, safe_text
from gpuconsole.readings.verdict import Action
from gpuconsole.sources.boot import boot, boot_id

log = logging.getLogger(__name__)

__all__ = [
    "Journal",
    "JournalCorrupt",
    "Phase",
    "PlanRecord",
    "PlanState",
    "StepProgress",
    "StepRecord",
    "StepState",
    "boot",
    "boot_id",
    "journal_text",
    "let_go",
    "process_alive",
    "process_tag",
    "repairs",
]

# The process tag of a plan its process stopped half-way and left to recovery (hand_over).
STOPPED_TAG = "stopped"
# Bytes kept in the reserve file: room for hand_over's mark (a few WAL pages) on a full disk.
RESERVE_BYTES = 64 * 1024
# Plans this process left to recovery: its own, even when the mark could not be written.
_LET_GO: set[str] = set()

SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    target TEXT NOT NULL,
    gpus TEXT NOT NULL,
    user TEXT NOT NULL,
    role TEXT NOT NULL,
    fingerprint TEXT,
    plan TEXT NOT NULL,
    state TEXT NOT NULL,
    outcome TEXT NOT NULL DEFAULT '',
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    proc_start TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    recovered INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS steps (
    plan_id TEXT NOT NULL REFERENCES plans(id),
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    phase TEXT NOT NULL,
    state TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    started_at REAL NOT NULL,
    finished_at REAL,
    boot_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS steps_plan ON steps(plan_id, seq);
CREATE TABLE IF NOT EXISTS locks (
    gpu TEXT PRIMARY KEY,
    plan_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    proc_start TEXT NOT NULL,
    acquired_at REAL NOT NULL
);
"""


_SIDES = ("-wal", "-shm")  # SQLite's files beside the journal, in WAL mode

# The step's column a journal made before it lacks (added on open; '' where not known).
_BOOT_COLUMN = "ALTER TABLE steps ADD COLUMN boot_id TEXT NOT NULL DEFAULT ''"


class JournalCorrupt(sqlite3.DatabaseError):
    """A row of the journal that is not what gpuconsole writes: which plan, and why."""


class PlanState(enum.StrEnum):
    """Where a plan stands (its value is what the journal stores)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # a step failed; what was reversible was put back
    ROLLED_BACK = "rolled back"
    REFUSED = "refused"
    # The node rebooted under a remediation (not by its own power cycle): nothing of it ran
    # again after the reboot, and its outcome says how the GPUs read in the new boot.
    INTERRUPTED = "interrupted"
    # Never stored: an outcome only. The journal could not record a step, so the plan
    # stopped there, half-way, still "running" in the journal until recovery ends it.
    STOPPED = "stopped"


class Phase(enum.StrEnum):
    """Which way a step attempt goes: doing the step, or putting back what it did."""

    DO = "do"
    UNDO = "undo"


class StepState(enum.StrEnum):
    """How a journaled step attempt stands: its intent, written before it runs, then done
    or failed."""

    INTENT = "intent"
    DONE = "done"
    FAILED = "failed"


class StepProgress(enum.StrEnum):
    """A step of a running plan as it is told (the executor's updates, the JSON progress
    lines, events): running, then done or failed; undoing, then undone or failed."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    UNDOING = "undoing"
    UNDONE = "undone"

    @classmethod
    def of(cls, phase: Phase, state: StepState) -> StepProgress:
        """How a finished attempt is told: an undo done is "undone"."""
        if phase is Phase.UNDO and state is StepState.DONE:
            return cls.UNDONE
        return cls(state.value)

    @property
    def started(self) -> bool:
        """Running or undoing: its outcome follows."""
        return self in (StepProgress.RUNNING, StepProgress.UNDOING)


def _proc_start(pid: int) -> str:
    """The process's start time in clock ticks since boot: a pid reused later differs here."""
    try:  # bytes: the name in it (comm) is whatever the process called itself, cut anywhere
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
    except OSError:
        return ""
    fields = data.rpartition(b")")[2].split()
    return fields[19].decode("ascii") if len(fields) > 19 and fields[19].isdigit() else ""


def process_tag() -> tuple[str, int, str]:
    """(host, pid, start time) of this process, stored with what it owns."""
    pid = os.getpid()
    return socket.gethostname(), pid, _proc_start(pid)


def process_alive(host: str, pid: int, proc_start: str) -> bool:
    """Whether the process that wrote a row still runs (other hosts: assumed alive)."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not proc_start or _proc_start(pid) == proc_start


def let_go(plan_id: str, host: str, pid: int, proc_start: str) -> bool:
    """Whether a running plan's process stopped it half-way and left it to recovery."""
    return proc_start == STOPPED_TAG or (
        plan_id in _LET_GO and (host, pid, proc_start) == process_tag()
    )


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One attempt at one step: its phase (do, undo) and how it went."""

    seq: int
    kind: str
    phase: Phase
    state: StepState
    detail: str
    started_at: float
    finished_at: float | None
    boot_id: str = ""  # the node's boot it ran in: a new one means the node rebooted since


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """A plan as the journal holds it."""

    id: str
    node: str
    target: str
    gpus: tuple[str, ...]
    user: str
    role: str
    fingerprint: str | None
    plan: Plan
    state: PlanState
    outcome: str
    host: str
    pid: int
    proc_start: str
    created_at: float
    finished_at: float | None
    recovered: bool
    steps: tuple[StepRecord, ...] = ()


_REPAIRS = {
    StepKind.GPU_RESET.value: Action.RESET_GPU,
    StepKind.POWER_CYCLE.value: Action.REBOOT_NODE,
}


def repairs(
    db: sqlite3.Connection,
    since: float,
    node: str,
    now: tuple[str, float | None] = ("", None),
) -> tuple[RepairAttempt, ...]:
    """Each GPU's last repair on `node` since `since`: the reset or power cycle step of a
    remediation that has finished, ok where the plan made the GPU fit (its final check
    passed), failed where the plan failed at that step or after it. A plan still running has
    no outcome yet; one that stopped before the step did not try it. Only `node`'s plans
    count: the simulated cluster's nodes share one journal, and their GPUs the same bus ids.

    `now`: the node's boot (`boot()`). A reset that failed in an earlier boot was followed
    by a reboot, by hand where the journal has no power cycle since: that reboot is the
    GPU's last repair, failed while the GPU is not fit (the verdict looks no further where
    it is), so what follows is service."""
    columns = {str(r[1]) for r in db.execute("PRAGMA table_info(steps)")}
    booted = "s.boot_id" if "boot_id" in columns else "''"  # a journal from before it
    rows = db.execute(
        f"SELECT s.kind, s.started_at, p.gpus, p.state, {booted} FROM steps s JOIN plans p"
        " ON p.id = s.plan_id WHERE s.phase = ? AND s.kind IN (?, ?) AND s.started_at >= ?"
        " AND p.state IN (?, ?) AND p.node = ? ORDER BY s.started_at, s.rowid",
        (Phase.DO, *_REPAIRS, since, PlanState.DONE, PlanState.FAILED, node),
    ).fetchall()
    this_boot, boot_at = now
    last: dict[str, RepairAttempt] = {}
    for kind, started, gpus, state, step_boot in rows:
        action, ok = _REPAIRS[str(kind)], state == PlanState.DONE
        rebooted = (
            action is Action.RESET_GPU
            and not ok
            and bool(this_boot)
            and step_boot not in ("", this_boot)
        )
        for bus_id in _bus_ids(gpus):
            if rebooted:
                at = boot_at if boot_at is not None and boot_at >= float(started) else started
                last[bus_id] = RepairAttempt(
                    bus_id, Action.REBOOT_NODE, float(at), False, reset_failed_at=float(started)
                )
            else:
                last[bus_id] = RepairAttempt(bus_id, action, float(started), ok)
    return tuple(last.values())


def _cut_off(db: sqlite3.Connection, plan_id: str, boot: str) -> bool:
    """Whether a plan is a remediation whose last step ran in a boot other than `boot`."""
    row = db.execute(
        "SELECT s.boot_id, p.plan FROM steps s JOIN plans p ON p.id = s.plan_id"
        " WHERE s.plan_id = ? ORDER BY s.rowid DESC LIMIT 1",
        (plan_id,),
    ).fetchone()
    if row is None or not row[0] or str(row[0]) == boot:
        return False
    try:
        body = json.loads(str(row[1]))
    except ValueError:
        return False  # recovery in a run on the node says what is wrong with it
    return isinstance(body, dict) and bool(body.get("remedy"))


def journal_text(data: bytes) -> str:
    """A TEXT value of the journal: what is not UTF-8 (a damaged row) is read with U+FFFD
    in its place, and refused where its plan is read, not where the row is fetched."""
    return data.decode("utf-8", "replace")


def _bus_ids(gpus: object) -> list[str]:
    """A plan's GPUs column as bus ids; none where it is not what gpuconsole writes."""
    try:
        found = json.loads(str(gpus))
        return [normal_bus_id(str(bus)) for bus in found] if isinstance(found, list) else []
    except ValueError:
        return []


class Journal:
    """The journal database at `path`, created with `mode` on first use (0660 where the
    operators of a machine share it: SQLite gives its -wal and -shm files the same mode)."""

    def __init__(
        self,
        path: Path,
        *,
        timeout_s: float = 10.0,
        mode: int = 0o600,
        in_memory: bool = False,
        proc_root: str = "/proc",
    ) -> None:
        """`in_memory`: an empty journal that never touches the disk (a dry run's: it plans
        and shows, and writes nothing); `path` is still the one a real run would write.
        `proc_root`: where the node's boot id is read, written with each step."""
        self.path = path
        self.mode = mode
        self.proc_root = proc_root
        self.in_memory = in_memory
        self.reserve = path.with_name(path.name + "-reserve")
        if not in_memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._refuse_links()
            paths.create_file(self.path, mode)
        self._db = sqlite3.connect(
            ":memory:" if in_memory else self.path,
            timeout=timeout_s,
            isolation_level=None,
            check_same_thread=False,
        )
        self._db.text_factory = journal_text
        try:
            if not in_memory:
                self._enable_wal(timeout_s)
                # an intent is on disk before its step runs
                self._db.execute("PRAGMA synchronous=FULL")
            with self.transaction():
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                columns = {str(r[1]) for r in self._db.execute("PRAGMA table_info(steps)")}
                if "boot_id" not in columns:
                    self._db.execute(_BOOT_COLUMN)
        except sqlite3.Error as exc:  # a full disk: "disk I/O error" making the -shm file
            self._db.close()
            raise sqlite3.OperationalError(
                f"the action journal {self.path} cannot be opened ({exc})"
            ) from exc
        if not in_memory:
            self._keep_reserve()

    def _refuse_links(self) -> None:
        """The journal and SQLite's -wal and -shm beside it are files of their own or none:
        SQLite follows a link (creating what a dangling one names), and in the machine's
        shared folder any operator could plant one for root's next action to write through.
        A FIFO would hold the open for ever."""
        for path in (self.path, *(self.path.with_name(self.path.name + s) for s in _SIDES)):
            try:
                found = os.lstat(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise sqlite3.OperationalError(
                    f"the action journal {self.path} cannot be opened ({path.name}: {exc.strerror})"
                ) from None
            if stat.S_ISLNK(found.st_mode):
                why = "is a symbolic link, which is not followed"
            elif not stat.S_ISREG(found.st_mode):
                why = "is not a regular file"
            else:
                continue
            raise sqlite3.OperationalError(
                f"the action journal {self.path} cannot be opened ({path.name} {why}; "
                "move it away if it is not gpuconsole's own)"
            )

    def _keep_reserve(self) -> None:
        """Make the reserve file where it is missing; none where the disk has no room."""
        try:
            fd = os.open(self.reserve, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.mode)
        except OSError:  # there already, or no room for even its name
            return
        try:
            os.fchmod(fd, self.mode)
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError:
            self.reserve.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def _enable_wal(self, timeout_s: float) -> None:
        # Switching a new database to WAL takes an exclusive lock, and SQLite answers "locked"
        # at once (no busy handler) when another process opens it at the same moment.
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def close(self) -> None:
        self._db.close()

    def cannot_write(self, exc: sqlite3.Error) -> str:
        """What to tell a person when a write raised `exc` ("database or disk is full")."""
        return f"the action journal {self.path} cannot be written ({exc})"

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT: one writer at a time across every process."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")  # where a full disk says so, in WAL mode
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled it back already
                self._db.execute("ROLLBACK")
            raise

    # --- plans -----------------------------------------------------------------------

    def start_plan(
        self,
        db: sqlite3.Connection,
        plan: Plan,
        user: str,
        role: str,
        fingerprint: str | None,
        *,
        state: PlanState = PlanState.RUNNING,
        outcome: str = "",
        clock: float | None = None,
    ) -> str:
        """A new plan row (inside the caller's transaction); returns its id."""
        plan_id = uuid_mod.uuid4().hex[:12]
        host, pid, start = process_tag()
        now = time.time() if clock is None else clock
        db.execute(
            "INSERT INTO plans (id, node, target, gpus, user, role, fingerprint, plan, state,"
            " outcome, host, pid, proc_start, created_at, finished_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                plan_id,
                plan.node,
                str(plan.target),
                json.dumps(list(plan.gpus)),
                user,
                role,
                fingerprint,
                json.dumps(plan.to_json()),
                state,
                outcome,
                host,
                pid,
                start,
                now,
                None if state is PlanState.RUNNING else now,
            ),
        )
        return plan_id

    def finish_plan(self, plan_id: str, state: PlanState, outcome: str) -> None:
        """Mark a plan finished and release its GPU locks, in one transaction."""
        with self.transaction() as db:
            db.execute(
                "UPDATE plans SET state = ?, outcome = ?, finished_at = ? WHERE id = ?",
                (state, outcome, time.time(), plan_id),
            )
            db.execute("DELETE FROM locks WHERE plan_id = ?", (plan_id,))

    def hand_over(self, plan_id: str) -> bool:
        """Leave a running plan this process stopped half-way to recovery, in any process.

        This process lets it go at once; other processes see it once its rows are marked,
        for which the reserve file makes room on a full disk. False: not marked, so only
        this process's recovery takes it (or any, once this process has ended).
        """
        _LET_GO.add(plan_id)
        for attempt in range(2):
            try:
                with self.transaction() as db:
                    tag = process_tag()
                    for table, key in (("plans", "id"), ("locks", "plan_id")):
                        db.execute(
                            f"UPDATE {table} SET proc_start = ? WHERE {key} = ? AND host = ?"
                            " AND pid = ? AND proc_start = ?",
                            (STOPPED_TAG, plan_id, *tag),
                        )
                return True
            except sqlite3.Error:
                if attempt or not self.reserve.exists():
                    return False
                self.reserve.unlink(missing_ok=True)  # its pages are what the mark needs
        return False

    def intent(self, plan_id: str, seq: int, kind: str, phase: Phase = Phase.DO) -> int:
        """Record that a step is about to run; returns the row to complete."""
        booted = boot_id(self.proc_root)  # read here: a node may reboot during a plan
        with self.transaction() as db:
            cursor = db.execute(
                "INSERT INTO steps (plan_id, seq, kind, phase, state, started_at, boot_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (plan_id, seq, kind, phase, StepState.INTENT, time.time(), booted),
            )
            return int(cursor.lastrowid or 0)

    def result(self, row: int, state: StepState, detail: str) -> None:
        """Record how a step went: done or failed."""
        with self.transaction() as db:
            db.execute(
                "UPDATE steps SET state = ?, detail = ?, finished_at = ? WHERE rowid = ?",
                (state, detail, time.time(), row),
            )

    # --- reading ---------------------------------------------------------------------

    def _record(self, row: tuple[object, ...], db: sqlite3.Connection | None = None) -> PlanRecord:
        """A plan's row and its steps (from `db`, this journal's own by default) as records;
        JournalCorrupt naming the plan where they are not what gpuconsole writes (a damaged
        disk, a hand, another program)."""
        try:
            return self._read_record(row, db or self._db)
        except (ValueError, TypeError, KeyError, IndexError, sqlite3.DataError) as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise JournalCorrupt(
                f"the action journal {self.path}: plan {safe_text(str(row[0]))} cannot be "
                f"read ({safe_text(why)[:200]}); it is left as it is"
            ) from None

    def _read_record(self, row: tuple[object, ...], db: sqlite3.Connection) -> PlanRecord:
        (pid_, node, target, gpus, user, role, fp, plan, state, outcome, host, pid, start,
         created, finished, recovered) = row  # fmt: skip
        steps = tuple(
            StepRecord(
                int(s[0]),
                str(s[1]),
                Phase(str(s[2])),
                StepState(str(s[3])),
                str(s[4]),
                float(s[5]),
                None if s[6] is None else float(s[6]),
                str(s[7]),
            )
            for s in db.execute(
                "SELECT seq, kind, phase, state, detail, started_at, finished_at, boot_id"
                " FROM steps WHERE plan_id = ? ORDER BY rowid",
                (pid_,),
            )
        )
        return PlanRecord(
            id=str(pid_),
            node=str(node),
            target=str(target),
            gpus=tuple(json.loads(str(gpus))),
            user=str(user),
            role=str(role),
            fingerprint=None if fp is None else str(fp),
            plan=Plan.from_json(json.loads(str(plan))),
            state=PlanState(str(state)),
            outcome=str(outcome),
            host=str(host),
            pid=int(str(pid)),
            proc_start=str(start),
            created_at=float(str(created)),
            finished_at=None if finished is None else float(str(finished)),
            recovered=bool(recovered),
            steps=steps,
        )

    _COLUMNS = (
        "id, node, target, gpus, user, role, fingerprint, plan, state, outcome, host, pid,"
        " proc_start, created_at, finished_at, recovered"
    )

    def plan(self, plan_id: str) -> PlanRecord | None:
        row = self._db.execute(
            f"SELECT {self._COLUMNS} FROM plans WHERE id = ?", (plan_id,)
        ).fetchone()
        return self._record(row) if row else None

    def plans(self, limit: int = 50) -> list[PlanRecord]:
        """The most recent plans, newest first; one that cannot be read is left out (and
        logged)."""
        rows = self._db.execute(
            f"SELECT {self._COLUMNS} FROM plans ORDER BY created_at DESC, rowid DESC LIMIT ?",
            (limit,),
        ).fetchall()
        found = []
        for row in rows:
            try:
                found.append(self._record(row))
            except JournalCorrupt as exc:
                log.warning("%s", exc)
        return found

    def unfinished(self, node: str) -> list[tuple[PlanRecord, bool]]:
        """The plans of `node` the journal holds running, oldest first, each with whether it
        is recovery's to end (its process is gone, or left it); nothing is claimed or
        written. A dry run's journal (in memory) reads the one a real run would write, where
        there is one. JournalCorrupt or sqlite3.Error where it cannot be read."""
        db = self._db
        if self.in_memory:
            if not self.path.exists():
                return []
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=2.0)
            db.text_factory = journal_text
        try:
            rows = db.execute(
                f"SELECT {self._COLUMNS} FROM plans WHERE state = ? AND node = ?"
                " ORDER BY created_at, rowid",
                (PlanState.RUNNING, node),
            ).fetchall()
            found = []
            for row in rows:
                record = self._record(row, db)
                tag = (record.id, record.host, record.pid, record.proc_start)
                found.append((record, not process_alive(*tag[1:]) or let_go(*tag)))
            return found
        finally:
            if db is not self._db:
                db.close()

    def claim_orphans(self, node: str, *, cut_off_in: str = "") -> list[PlanRecord]:
        """Running plans of `node` whose process is gone, handed to this process (in one
        transaction, so two recovering processes never take the same plan). `cut_off_in`: a
        boot id; only the remediations whose last step ran in another boot (the reboot cut
        them off) are taken."""
        host, pid, start = process_tag()
        claimed: list[str] = []
        with self.transaction() as db:
            rows = db.execute(
                "SELECT id, host, pid, proc_start FROM plans WHERE state = ? AND node = ?"
                " ORDER BY created_at",
                (PlanState.RUNNING, node),
            ).fetchall()
            for plan_id, row_host, row_pid, row_start in rows:
                tag = (str(plan_id), str(row_host), int(row_pid), str(row_start))
                if process_alive(*tag[1:]) and not let_go(*tag):
                    continue
                if cut_off_in and not _cut_off(db, str(plan_id), cut_off_in):
                    continue
                db.execute(
                    "UPDATE plans SET host = ?, pid = ?, proc_start = ?, recovered = 1"
                    " WHERE id = ?",
                    (host, pid, start, plan_id),
                )
                db.execute(
                    "UPDATE locks SET host = ?, pid = ?, proc_start = ? WHERE plan_id = ?",
                    (host, pid, start, plan_id),
                )
                claimed.append(str(plan_id))
        _LET_GO.difference_update(claimed)  # this process runs them again, and holds them
        self._keep_reserve()  # made again, where a stop took it and there is room now
        found = [self.plan(p) for p in claimed]
        return [p for p in found if p is not None]
