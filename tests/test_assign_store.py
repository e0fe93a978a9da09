"""Where the journal, the GPU locks and the audit log live: one folder every operator of the
machine shares, or the user's own folder, said out loud, when that one cannot be used."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from gpuconsole import config
from gpuconsole.actions.audit import AuditRecord
from gpuconsole.actions.executor import Executor
from gpuconsole.actions.plan import Target
from gpuconsole.actions.roles import ActionRefused, Actor, Role, login_name
from gpuconsole.actions.store import action_store
from gpuconsole.config import ConfigError
from gpuconsole.sim.actions import sim_drivers
from tests.assign_fixtures import SlowPci, world


def _config(tmp_path: Path, body: str) -> config.Config:
    path = tmp_path / "config.toml"
    path.write_text(body)
    return config.load(path)


def test_the_example_config_documents_the_shared_state_folder() -> None:
    text = config.example()
    assert 'state_dir = "/var/lib/gpuconsole"' in text
    assert "install -d -m 3770 -g gpuconsole-operator" in text


def test_the_shared_folder_holds_the_journal_writable_by_the_group_and_the_audit_readable(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "lib" / "gpuconsole"
    cfg = _config(tmp_path, f'[actions]\nstate_dir = "{shared}"\n')
    store = action_store(cfg.actions)
    assert store.shared and not store.warning
    assert store.journal_path == shared / "actions.db"
    assert store.audit_path == shared / "audit.jsonl"
    # made as the install line would make it: setgid, so files take the operators' group, and
    # sticky, so that no operator can delete or rename another's files
    assert stat.S_IMODE(shared.stat().st_mode) == 0o3770
    journal = store.journal()
    journal.plans()
    with journal.transaction():  # writing makes SQLite create its -wal and -shm files
        pass
    for name in ("actions.db", "actions.db-wal", "actions.db-shm"):
        assert stat.S_IMODE((shared / name).stat().st_mode) == 0o660, name
    journal.close()
    # the audit: each user appends to a file of their own that the group reads, and only reads
    store.audit().append(AuditRecord(1.0, "?", "operator", "assign drained", "n: 1", "ok"))
    [record] = store.audit().records()
    assert record["writer"] == login_name()
    mine = shared / f"audit.{login_name()}.jsonl"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o640


def test_an_unusable_shared_folder_falls_back_to_the_users_own_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home-state"))
    (tmp_path / "a-file").write_text("")
    blocked = tmp_path / "a-file" / "gpuconsole"  # not even root can make a folder in a file
    cfg = _config(tmp_path, f'[actions]\nstate_dir = "{blocked}"\n')
    with caplog.at_level(logging.WARNING):
        store = action_store(cfg.actions)
    own = tmp_path / "home-state" / "gpuconsole"
    assert not store.shared and store.journal_path == own / "actions.db"
    assert f"{blocked} is unusable (cannot create it" in store.warning
    assert "other users and sessions do not see them" in store.warning
    assert f"install -d -m 3770 -g gpuconsole-operator {blocked}" in store.warning
    assert store.warning in caplog.text
    # a journal named outright is no guess to fall back from
    explicit = _config(tmp_path, f'[actions]\njournal = "{blocked}/actions.db"\n')
    with pytest.raises(ConfigError, match=r"\[actions\] journal .*a-file/gpuconsole/actions.db"):
        action_store(explicit.actions)


def _operator(tmp_path: Path, user: str, start: Any, results: Any) -> None:
    """One operator's process: their own home and state folder, the machine's config."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path / user)

    async def go() -> tuple[int, str]:
        cfg = config.load(tmp_path / "config.toml")
        store = action_store(cfg.actions)
        w = world(tmp_path / "world")
        drivers = sim_drivers(w)
        drivers.pci = SlowPci(drivers.pci)
        executor = Executor(w.name, drivers, store.journal(), store.audit(), reader=w.snapshot)
        plan = await executor.plan(["1"], Target.parse("drained"))
        start.wait()
        try:
            outcome = await executor.execute(plan, Actor(user, Role.OPERATOR), "1")
        except ActionRefused as exc:
            return 3, str(exc)
        return (0 if outcome.ok else 1), outcome.message

    try:
        results.put(asyncio.run(go()))
    except BaseException as exc:  # shown in the assertion instead of a 30 s wait on the queue
        results.put((9, repr(exc)))


def test_two_operators_with_their_own_state_folders_share_the_machines_locks(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "lib" / "gpuconsole"
    (tmp_path / "config.toml").write_text(f'[actions]\nstate_dir = "{shared}"\n')
    world(tmp_path / "world")  # laid out once, before either starts
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_operator, args=(tmp_path, user, start, results))
        for user in ("alice", "bob")
    ]
    for p in procs:
        p.start()
    start.set()
    answers = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    assert [code for code, _ in answers] == [0, 3], answers
    assert "is held by alice (operator)" in answers[1][1] or "is held by bob" in answers[1][1]
    assert world(tmp_path / "world").owners(1) == ["drained"]
    # both asked, both are in the one audit log; neither user's own folder has one
    audit = action_store(config.load(tmp_path / "config.toml").actions).audit().records()
    assert sorted(r["user"] for r in audit if r["outcome"] != "started") == ["alice", "bob"]
    assert not (tmp_path / "alice" / "gpuconsole" / "audit.jsonl").exists()
    assert not (tmp_path / "bob" / "gpuconsole" / "audit.jsonl").exists()


def test_the_machines_folder_made_by_another_operator_at_the_same_moment_is_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two operators start on a new machine at once: both find no folder, one makes it
    first. The other uses it too, not a folder of its own (where its locks would lock
    nothing the first one takes)."""
    shared = tmp_path / "lib" / "gpuconsole"
    cfg = _config(tmp_path, f'[actions]\nstate_dir = "{shared}"\n')
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home-state"))
    looked = Path.exists

    def raced(path: Path) -> bool:
        if path == shared and not looked(path):
            shared.mkdir(parents=True)  # the other operator's process, just now
            return False  # as this one found it a moment before
        return looked(path)

    monkeypatch.setattr(Path, "exists", raced)
    store = action_store(cfg.actions)
    assert store.shared and store.journal_path == shared / "actions.db", store.warning
