"""The files gpuconsole keeps its state in, as found at start-up: truncated, not what it
wrote, not UTF-8, a FIFO, a symbolic link (planted in a folder every operator may write, for
root to follow). Each is said in a clear message; none hangs the start, none is followed,
and none is overwritten: what the person had is kept aside, every time."""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.drivers import Drivers
from gpuconsole.actions.drivers.vfio import VfioDriver
from gpuconsole.actions.executor import CannotRecover, Executor
from gpuconsole.actions.journal import Journal, Phase
from gpuconsole.actions.journal_events import JournalEvents
from gpuconsole.actions.plan import Target, make_plan
from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.alerts.rules import DEFAULT_RULES
from gpuconsole.alerts.state import StateFile
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import TenancyReading
from gpuconsole.sources.bmc.sel import SelCursor
from gpuconsole.sources.tenancy.pci_binding import read_gpus
from tests.alert_fixtures import fleet
from tests.tenancy_fixtures import FakeHost

GPU = "0000:1b:00.0"

# --- the alert engine's state file ----------------------------------------------------------


def _engine(path: Path) -> AlertEngine:
    began = time.monotonic()
    engine = AlertEngine(DEFAULT_RULES, state_file=StateFile(path))
    assert time.monotonic() - began < 2, "the start waited on the state file"
    return engine


@pytest.mark.parametrize(
    "body", [b'{"version": 1, "alerts": [', b"\xff\xfe\x1b[2J", b"", b'{"version": 1}']
)
def test_a_state_file_not_gpuconsoles_is_kept_aside_and_said(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "alerts.json"
    path.write_bytes(body)
    engine = _engine(path)
    assert engine.problem is not None and "moved to alerts.json.corrupt" in engine.problem
    assert "\x1b" not in engine.problem
    assert (tmp_path / "alerts.json.corrupt").read_bytes() == body


def test_a_second_bad_state_file_does_not_overwrite_the_first_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "alerts.json"
    path.write_bytes(b"first")
    _engine(path)
    path.write_bytes(b"second")
    engine = _engine(path)
    assert engine.problem is not None and "alerts.json.corrupt.1" in engine.problem
    assert (tmp_path / "alerts.json.corrupt").read_bytes() == b"first"
    assert (tmp_path / "alerts.json.corrupt.1").read_bytes() == b"second"


def test_a_fifo_for_a_state_file_is_said_not_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "alerts.json"
    os.mkfifo(path)
    engine = _engine(path)
    assert engine.problem is not None and "not a regular file" in engine.problem
    assert (tmp_path / "alerts.json.corrupt").is_fifo()


@pytest.mark.parametrize("target", ["/dev/zero", "elsewhere.json"])
def test_a_state_file_that_is_a_link_is_not_followed(tmp_path: Path, target: str) -> None:
    """Not read (/dev/zero has no end), and the link kept aside, not what it points at;
    what fires next is written to a file of gpuconsole's own, in its place."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(b"someone's")
    path = tmp_path / "alerts.json"
    path.symlink_to(target if target.startswith("/") else elsewhere)
    engine = _engine(path)
    assert engine.problem is not None and "symbolic link" in engine.problem
    assert (tmp_path / "alerts.json.corrupt").is_symlink()
    engine.evaluate(fleet(1.0, lost=True))
    engine.save()
    assert not path.is_symlink() and elsewhere.read_bytes() == b"someone's"
    assert _engine(path).problem is None


def test_a_state_file_past_any_gpuconsole_writes_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "alerts.json"
    with open(path, "wb") as f:
        f.truncate(1 << 31)  # sparse: 2 GiB of zeros that take no room
    engine = _engine(path)
    assert engine.problem is not None and "larger than" in engine.problem
    assert (tmp_path / "alerts.json.corrupt").stat().st_size == 1 << 31


# --- the remediation journal ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["actions.db", "actions.db-wal", "actions.db-shm"])
def test_a_journal_file_that_is_a_link_is_refused_not_followed(tmp_path: Path, name: str) -> None:
    """In the machine's shared folder any operator may plant actions.db (or SQLite's -wal
    and -shm beside it) as a link; root's next remediation must not write where it points."""
    target = tmp_path / "not-yours" / "file"
    target.parent.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    (state / name).symlink_to(target)
    with pytest.raises(sqlite3.OperationalError, match=f"{re.escape(name)} is a symbolic link"):
        Journal(state / "actions.db")
    assert not target.exists()


def test_a_fifo_for_the_journal_is_said_by_name(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "actions.db")
    with pytest.raises(sqlite3.OperationalError, match=r"actions\.db is not a regular file"):
        Journal(tmp_path / "actions.db")


@pytest.mark.parametrize("body", [b"SQLite format 3\x00" + b"\x07" * 5000, b"\xff\xfe\x1b[2J"])
def test_a_journal_that_is_not_a_database_is_refused_and_left_as_it_was(
    tmp_path: Path, body: bytes
) -> None:
    """It may hold the plans a crash left half-done: refused, said, never started over."""
    path = tmp_path / "actions.db"
    path.write_bytes(body)
    with pytest.raises(sqlite3.OperationalError, match="cannot be opened"):
        Journal(path)
    assert path.read_bytes() == body


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE plans SET plan = '[]'",
        "UPDATE plans SET plan = '{\"node\": 5'",
        "UPDATE plans SET gpus = 'not json'",
        "UPDATE plans SET plan = CAST(X'FF7B' AS TEXT)",
        "UPDATE steps SET phase = 'sideways'",
        "UPDATE plans SET state = 'exploded'",
    ],
)
async def test_a_journal_row_that_is_not_gpuconsoles_is_said_by_plan_not_a_traceback(
    tmp_path: Path, damage: str
) -> None:
    """A plan a crash left running, its row damaged since: recovery names the plan and
    leaves its GPUs locked; listing the journal goes on without it; the events source
    (what the verdict reads of past repairs) reads on."""
    host = FakeHost(tmp_path)
    host.pci(GPU, driver="nvidia", group=40)
    node = NodeSnapshot(
        "n1", tenancy=TenancyReading(at=0.0, gpus=read_gpus(host.sysfs_root, host.proc_root))
    )
    path = tmp_path / "state" / "actions.db"
    journal = Journal(path)
    plan = make_plan(node, [GPU], Target.parse("drained"))
    with journal.transaction() as db:
        plan_id = journal.start_plan(db, plan, "ops", "operator", None)
    assert journal.intent(plan_id, 0, plan.steps[0].kind.value, Phase.DO)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE plans SET pid = ?", (_dead_pid(),))
        db.execute(damage)
    drivers = Drivers(pci=VfioDriver(host.sysfs_root, host.proc_root))
    executor = Executor("n1", drivers, journal, AuditLog(tmp_path / "state" / "audit.jsonl"))
    if "exploded" in damage:  # not running: nothing for recovery to take
        assert await executor.recover() == []
    else:
        with pytest.raises(CannotRecover, match=f"plan {plan_id} cannot be read") as caught:
            await executor.recover()
        assert "cannot be written" not in str(caught.value)
    assert journal.plans() == []
    events = JournalEvents("n1", path)
    assert events._read().running in (0, 1)


# --- a BMC's SEL cursor -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "elsewhere"])
def test_a_sel_cursor_that_is_no_file_of_gpuconsoles_is_started_over_not_waited_on(
    tmp_path: Path, kind: str
) -> None:
    cursor = SelCursor.for_bmc(tmp_path, "ipmi://10.0.0.17:623")
    assert cursor.path is not None
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"last_record_id": 7}')
    if kind == "fifo":
        os.mkfifo(cursor.path)
    else:
        cursor.path.symlink_to(elsewhere if kind == "elsewhere" else kind)
    began = time.monotonic()
    cursor.load()
    assert time.monotonic() - began < 2
    assert cursor.last_record_id is None
    cursor.last_record_id = 9
    cursor.save()
    assert not cursor.path.is_symlink() and elsewhere.read_text() == '{"last_record_id": 7}'


async def test_writing_the_alert_state_never_holds_up_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state file is synced to disk at each change: on a disk that is slow to sync
    (a busy one, NFS), the consoles and the hub on the same loop go on meanwhile."""
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.5)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    engine = AlertEngine(DEFAULT_RULES, state_file=StateFile(tmp_path / "alerts.json"))
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        await asyncio.sleep(0.05)
        changes = await engine.step(fleet(time.time(), lost=True))
        assert changes  # written: its alerts fired
        await asyncio.sleep(0.05)  # the ticker says how long it waited
    finally:
        ticker.cancel()
    assert (tmp_path / "alerts.json").exists()
    assert max(gaps) < 0.3, max(gaps)
