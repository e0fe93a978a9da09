"""The audit log as someone who wants to be recorded as someone else, or to unrecord it.

Who asked came from USER, LOGNAME, SSH_CONNECTION and SSH_USER_AUTH, which whoever runs
the command sets; the ssh server recorded the user name its client typed; and the shared
log was one file that every member of the operators' group could write, so truncate.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import asyncssh
import pytest

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.power import PowerRequest, power
from gpuconsole.actions.roles import ActionRefused
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
