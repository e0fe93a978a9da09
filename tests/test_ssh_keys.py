"""Who may log in to the ssh console: authorized keys with roles, passwords, the host key."""

from __future__ import annotations

import stat
from pathlib import Path

import asyncssh
import pytest

from gpuconsole.actions.roles import Role
from gpuconsole.ssh.keys import (
    KeyFileError,
    fingerprint,
    hash_password,
    load_or_create_host_key,
    load_passwords,
    parse_authorized_keys,
    verify_password,
)


def public(key: asyncssh.SSHKey) -> str:
    return key.export_public_key().decode().strip()


def test_each_line_names_its_role_and_a_line_without_one_is_a_viewer() -> None:
    ops, admin, plain, stranger = (asyncssh.generate_private_key("ssh-ed25519") for _ in range(4))
    keys = parse_authorized_keys(
        "# the on-call team\n"
        f"role=operator {public(ops)} alice@laptop\n"
        f'role="admin" {public(admin)}\n'
        "\n"
        f"{public(plain)} noc-wall\n"
    )
    assert len(keys) == 3
    client = "10.0.0.1"
    found = keys.find(ops, client)
    assert found is not None and found.role is Role.OPERATOR and found.comment == "alice@laptop"
    assert found.fingerprint == fingerprint(ops) and found.fingerprint.startswith("SHA256:")
    assert keys.find(admin, client) is not None and keys.find(admin, client).role is Role.ADMIN  # type: ignore[union-attr]
    assert keys.find(plain, client) is not None and keys.find(plain, client).role is Role.VIEWER  # type: ignore[union-attr]
    assert keys.find(stranger, client) is None


def test_options_this_server_would_not_enforce_are_refused_with_their_line() -> None:
    key = public(asyncssh.generate_private_key("ssh-ed25519"))
    with pytest.raises(KeyFileError, match=r"keys:2: option 'command' is not supported"):
        parse_authorized_keys(f'{key}\ncommand="uptime" {key}\n', "keys")
    with pytest.raises(KeyFileError, match=r"keys:1: role 'root' is not one of"):
        parse_authorized_keys(f"role=root {key}\n", "keys")
    with pytest.raises(KeyFileError, match=r"keys:1: not a public key"):
        parse_authorized_keys("ssh-ed25519 bm90IGEga2V5\n", "keys")


def test_the_host_key_is_made_once_with_mode_0600_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ssh_host_ed25519_key"
    first = load_or_create_host_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_host_key(path)
    assert fingerprint(again) == fingerprint(first)


def test_a_host_key_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "key"
    load_or_create_host_key(path)
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="readable by others"):
        load_or_create_host_key(path)


def test_passwords_are_scrypt_hashes_with_a_role(tmp_path: Path) -> None:
    hashed = hash_password("correct horse")
    assert verify_password("correct horse", hashed)
    assert not verify_password("wrong", hashed)
    path = tmp_path / "passwords"
    path.write_text(f"# user:role:hash\nops:operator:{hashed}\nvisitor::{hashed}\n")
    path.chmod(0o600)
    entries = load_passwords(path)
    assert entries["ops"].role is Role.OPERATOR and entries["ops"].check("correct horse")
    assert entries["visitor"].role is Role.VIEWER
    path.write_text("ops:operator:plaintext\n")
    with pytest.raises(KeyFileError, match="passwords:1"):
        load_passwords(path)
