"""What sshd's environment names for the login (SSH_USER_AUTH: a file the login user owns)
is the login's word: a file that is not text, goes on, or is a FIFO is no key, never a
traceback before the action starts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpuconsole.actions.roles import Actor, Role
from gpuconsole.actions.ssh_caller import over_ssh

KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.mark.parametrize(
    "body",
    [b"\xff\xfe publickey\n", b"x" * 5_000_000 + f"\npublickey ssh-ed25519 {KEY}".encode()],
    ids=["not-utf8", "endless"],
)
def test_an_auth_file_that_is_no_text_of_sshds_names_no_key(tmp_path: Path, body: bytes) -> None:
    auth = tmp_path / "sshauth"
    auth.write_bytes(body)
    actor = over_ssh(
        Actor("alice", Role.OPERATOR),
        {"SSH_CONNECTION": "10.9.9.9 40000 10.0.0.1 22", "SSH_USER_AUTH": str(auth)},
    )
    assert actor.ssh_login == "from 10.9.9.9 port 40000, as the login's environment says"


def test_an_auth_file_that_is_a_fifo_is_not_waited_on(tmp_path: Path) -> None:
    auth = tmp_path / "sshauth"
    os.mkfifo(auth)
    began = time.monotonic()
    actor = over_ssh(
        Actor("alice", Role.OPERATOR),
        {"SSH_CONNECTION": "10.9.9.9 40000 10.0.0.1 22", "SSH_USER_AUTH": str(auth)},
    )
    assert time.monotonic() - began < 2
    assert actor.ssh_login == "from 10.9.9.9 port 40000, as the login's environment says"
