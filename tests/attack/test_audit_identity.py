"""The audit log as someone who wants to be recorded as someone else, or to unrecord it.

Who asked came from USER, LOGNAME, SSH_CONNECTION and SSH_USER_AUTH, which whoever runs
the command sets; the ssh server recorded the user name its client typed; and the shared
log was one file that every member of the operators' group could write, so truncate.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from gpuconsole import config
from gpuconsole.actions.audit import AuditLog, AuditRecord
from gpuconsole.actions.power import PowerRequest, power
from gpuconsole.actions.roles import ActionRefused
from gpuconsole.actions.store import action_store
from gpuconsole.sources.bmc import PowerAction
from tests.test_ssh_console import Keys, console_server, login, open_terminal, session_of

ME = pwd.getpwuid(os.getuid()).pw_name  # who runs the tests, by the kernel's word
OTHER_UID = 65534  # nobody: another member of the operators' group
GROUP_GID = 4242  # the operators' group, by number: no group database entry needed


def test_a_local_user_is_recorded_by_uid_whatever_the_environment_says(tmp_path: Path) -> None:
    someone = asyncssh.generate_private_key("ssh-ed25519")
    auth = tmp_path / "sshauth"
    auth.write_text(f"publickey {someone.export_public_key().decode()}")
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "USER": "alice",
        "LOGNAME": "alice",
        "SSH_CONNECTION": "10.9.9.9 40000 10.0.0.1 22",
        "SSH_USER_AUTH": str(auth),
    }
    assign = ["assign", "--demo", "--node", "dgx-003", "2", "--to", "drained", "--yes"]
    done = subprocess.run(
        [sys.executable, "-m", "gpuconsole", *assign],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    records = AuditLog(tmp_path / "state" / "gpuconsole" / "demo" / "audit.jsonl").records()
    assert [r["outcome"] for r in records] == ["started", "ok"]
    for record in records:
        assert record["user"] == ME != "alice"
        # the key the environment names is its word, not the key that asked
        assert record["key_fingerprint"] is None
        fingerprint = someone.get_fingerprint("sha256")
        assert record["args"]["ssh_login"] == (
            f"from 10.9.9.9 port 40000, key {fingerprint}, as the login's environment says"
        )


async def test_an_ssh_session_is_recorded_as_its_key_not_the_name_it_logged_in_as(
    tmp_path: Path,
) -> None:
    keys = Keys(tmp_path)  # the operator's key is named "ops" in the keys file

    class Bmc:
        label = "fake bmc"

        async def set_power(self, action: PowerAction) -> str:
            return "ok"

    audit = AuditLog(tmp_path / "audit.jsonl")
    async with (
        console_server(tmp_path, keys) as server,
        login(server, keys.viewer, "ops") as conn,  # a viewer's key, the operator's name
    ):
        term = await open_terminal(conn, 120, 40)
        await term.wait_for("Fleet", "read-only")
        actor = session_of(server, "ops").app.actor
        with pytest.raises(ActionRefused, match="viewer may not act"):
            await power(PowerRequest("dgx-001", PowerAction.OFF, actor, "dgx-001"), Bmc(), audit)
        term.send("q")
        await term.closed()
    [record] = audit.records()
    assert record["user"] == "a viewer (no role named)" != "ops"
    assert record["key_fingerprint"] == keys.viewer.get_fingerprint("sha256")
    assert (record["role"], record["args"]["via"]) == ("viewer", "ssh")


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """The machine's state folder as the install line makes it, group GROUP_GID, somewhere
    the other uid can reach (a test's own folder is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="gpuconsole-audit-"))
    try:
        base.chmod(0o755)
        folder = base / "gpuconsole"
        folder.mkdir()
        os.chown(folder, -1, GROUP_GID)
        folder.chmod(0o3770)
        (tmp_path / "config.toml").write_text(f'[actions]\nstate_dir = "{folder}"\n')
        yield folder
    finally:
        shutil.rmtree(base)


def _record(user: str, outcome: str) -> AuditRecord:
    return AuditRecord(1_800_000_000.0, user, "operator", "assign drained", "n: 1", outcome)


def _as_the_other_operator(folder: Path, job: str, results: Any) -> None:
    """In a forked child, as OTHER_UID in GROUP_GID: squat and forge, or erase."""
    try:
        os.setgroups([GROUP_GID])
        os.setgid(GROUP_GID)
        os.setuid(OTHER_UID)
        done = []
        if job == "squat":
            # the file root's records would go to, made first; and a record in root's name
            (folder / "audit.root.jsonl").touch()
            AuditLog(folder / "audit.jsonl", shared=True).append(_record("root", "ok"))
            done.append("forged")
        else:
            for path in sorted(folder.glob("audit*.jsonl")):
                if path.stat().st_uid == OTHER_UID:
                    continue
                for how, attempt in (
                    ("truncated", lambda p: p.open("r+").truncate(0)),
                    ("deleted", lambda p: p.unlink()),
                ):
                    try:
                        attempt(path)
                        done.append(f"{how} {path.name}")
                    except PermissionError:
                        pass
        results.put(done)
    except BaseException as exc:
        results.put([repr(exc)])


def _other(folder: Path, job: str) -> list[str]:
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_as_the_other_operator, args=(folder, job, results))
    child.start()
    done: list[str] = results.get(timeout=30)
    child.join(10)
    return done


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second uid needs root")
def test_no_operator_can_erase_or_write_anothers_audit_records(
    tmp_path: Path, shared: Path
) -> None:
    legacy = shared / "audit.jsonl"  # the one log every operator wrote before: still read
    legacy.write_text(json.dumps({"at": 1.0, "user": "old", "outcome": "ok"}) + "\n")
    legacy.chmod(0o660)
    # another operator squats the name this user's file would have, and forges a record
    assert _other(shared, "squat") == ["forged"]
    store = action_store(config.load(tmp_path / "config.toml").actions)
    assert store.shared
    store.audit().append(_record(ME, "started"))
    # and tries to erase it: the file is this user's own, 0640, in a sticky folder
    assert _other(shared, "erase") == []
    records = store.audit().records()
    assert [(r["user"], r.get("writer")) for r in records] == [
        ("old", None),
        ("root", "nobody"),  # a forged record says who wrote it
        (ME, ME),
    ]
    # this user's files, the old log among them, the group reads and only reads
    mine = [p for p in shared.glob("audit*.jsonl") if p.stat().st_uid == os.getuid()]
    assert legacy in mine and len(mine) == 2
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o640 for p in mine)
