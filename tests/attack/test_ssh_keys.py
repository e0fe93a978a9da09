"""Who may log in, tried as an attacker would: every option of an authorized-keys line is
enforced or refused at start, a swapped keys file is read again whatever its times say,
and a password refusal does not tell whether the user exists."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import asyncssh
import pytest

from gpuconsole.ssh.keys import KeyFileError, hash_password
from gpuconsole.ssh.server import ConsoleServer
from tests.test_ssh_console import Keys, console_server, login, open_terminal


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


def public(key: asyncssh.SSHKey) -> str:
    return key.export_public_key().decode().strip()


def new_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


async def logs_in(server: ConsoleServer, key: asyncssh.SSHKey, user: str = "ops") -> bool:
    try:
        async with login(server, key, user):
            return True
    except asyncssh.PermissionDenied:
        return False


async def test_a_key_bound_to_another_address_does_not_log_in_from_here(
    tmp_path: Path, keys: Keys
) -> None:
    elsewhere = new_key()
    keys.file.write_text(
        f'role=operator,from="10.9.9.9" {public(elsewhere)} jump host only\n'
        f"role=operator {public(keys.operator)} ops\n"
    )
    async with console_server(tmp_path, keys) as server:
        assert not await logs_in(server, elsewhere)
        assert await logs_in(server, keys.operator)


async def test_from_takes_openssh_patterns_quoted_commas_negation_and_cidr(
    tmp_path: Path, keys: Keys
) -> None:
    listed, by_network, negated, by_wildcard = (new_key() for _ in range(4))
    keys.file.write_text(
        f'from="10.0.0.1,127.0.0.1",role=operator {public(listed)}\n'
        f'role="viewer",from="192.168.0.0/16,127.0.0.0/8" {public(by_network)}\n'
        f'from="!127.0.0.1,127.0.0.0/8" {public(negated)} all of loopback but this address\n'
        f'from="127.0.0.?" {public(by_wildcard)}\n'
    )
    async with console_server(tmp_path, keys) as server:
        assert await logs_in(server, listed)
        assert await logs_in(server, by_network)
        assert not await logs_in(server, negated)
        assert await logs_in(server, by_wildcard)


async def test_options_the_server_would_not_enforce_stop_the_start_naming_file_and_line(
    tmp_path: Path, keys: Keys
) -> None:
    where = str(keys.file)
    refused = {
        'command="/usr/bin/uptime"': "'command'",
        'permitopen="127.0.0.1:22"': "'permitopen'",
        'expiry-time="20300101"': "'expiry-time'",
        "port-forwarding": "'port-forwarding'",
        'from="jump.example.com"': "host name",  # names are never looked up here
        'from="10.0.0.1/8"': "not a network",
        "from=10.0.0.1,from=10.0.0.2": "twice",
        "role=operator,role=admin": "twice",
        'from="10.0.0.1': "quote",
        'from="10.0.0.1, !127.0.0.1"': "without blanks",  # sshd would read " !127.0.0.1" literally
    }
    for option, said in refused.items():
        keys.file.write_text(
            f"{public(keys.viewer)} wall\nrole=operator,{option} {public(new_key())}\n"
        )
        with pytest.raises(KeyFileError) as caught:
            async with console_server(tmp_path, keys):
                pass
        assert str(caught.value).startswith(f"{where}:2: "), (option, caught.value)
        assert said in str(caught.value), (option, caught.value)


async def test_a_key_restricted_from_a_terminal_gets_no_console(tmp_path: Path, keys: Keys) -> None:
    keys.file.write_text(
        f"restrict,role=operator {public(keys.operator)} ops\n"
        f"restrict,pty {public(keys.viewer)} wall\n"
    )
    async with console_server(tmp_path, keys) as server:
        async with login(server, keys.operator) as conn:
            with pytest.raises(asyncssh.ChannelOpenError, match="PTY request failed"):
                await open_terminal(conn, 80, 24)
            # a client that carries on without one (as OpenSSH's does) is told why
            result = await conn.run(encoding="utf-8")
            assert "may not have a terminal" in str(result.stdout)
            assert not server.sessions
        async with login(server, keys.viewer, "amy") as conn:
            console = await open_terminal(conn, 80, 24)
            await console.wait_for("Fleet", "read-only")
            console.send("q")
            assert await console.closed() == 0


async def test_a_key_swapped_with_its_times_kept_is_read_again(tmp_path: Path, keys: Keys) -> None:
    old, new = new_key(), new_key()
    keys.file.write_text(f"role=operator {public(old)} on-call\n")
    async with console_server(tmp_path, keys) as server:
        assert await logs_in(server, old)
        before = keys.file.stat()
        keys.file.write_text(f"role=operator {public(new)} on-call\n")
        # as `cp -p` and `rsync -a` leave it: same size, same modification time
        os.utime(keys.file, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (keys.file.stat().st_size, keys.file.stat().st_mtime_ns) == (
            before.st_size,
            before.st_mtime_ns,
        )
        assert not await logs_in(server, old)
        assert await logs_in(server, new)


class _OnePassword(asyncssh.SSHClient):
    """Offers one password and notes when it was asked for it."""

    def __init__(self, password: str) -> None:
        self.password = password
        self.asked: list[float] = []

    def password_auth_requested(self) -> str | None:
        self.asked.append(time.perf_counter())
        return self.password if len(self.asked) == 1 else None


async def _refusal_s(port: int, user: str) -> float:
    """Seconds from offering a wrong password to being refused (connection set-up excluded)."""
    client = _OnePassword("wrong horse")
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect(
            "127.0.0.1",
            port,
            username=user,
            client_factory=lambda: client,
            preferred_auth="password",
            client_keys=None,
            agent_path=None,
            known_hosts=None,
        )
    assert client.asked
    return time.perf_counter() - client.asked[0]


async def test_a_password_refusal_takes_as_long_for_an_unknown_user_as_for_a_known_one(
    tmp_path: Path, keys: Keys
) -> None:
    passwords = tmp_path / "passwords"
    passwords.write_text(f"ops:operator:{hash_password('correct horse')}\n")
    passwords.chmod(0o600)
    ratios: list[float] = []
    async with console_server(tmp_path, keys, password_file=passwords) as server:
        for attempt in range(11):
            # back to back, in turns, so that load on the machine weighs on both alike
            first, second = ("ops", "nobody") if attempt % 2 else ("nobody", "ops")
            took = {first: await _refusal_s(server.port, first)}
            took[second] = await _refusal_s(server.port, second)
            ratios.append(took["ops"] / took["nobody"])
    # a known user's refusal costs one scrypt (~50 ms); an unknown one's must cost the same,
    # not the few ms of a dictionary miss (a ratio of 10 and more)
    assert 0.5 < statistics.median(ratios) < 2, sorted(ratios)
