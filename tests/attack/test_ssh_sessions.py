"""Sessions and connections, tried as an attacker (or a crowded NOC) would: one key cannot
take every session, wallboards leave the on-call operator a way in, and stalled handshakes
cannot hold the door shut."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncssh
import pytest

from gpuconsole import config
from gpuconsole.config import ConfigError
from gpuconsole.wiring import ssh_settings
from tests.test_ssh_console import Keys, Terminal, console_server, login, open_terminal
from tests.waiting import until


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


def settled(term: Terminal) -> bool:
    """The session drew its first screen, or was refused."""
    return "Fleet" in term.text or term.raw.startswith(b"gpuconsole:")


async def test_three_wallboards_on_one_viewer_key_leave_the_operator_a_session(
    tmp_path: Path, keys: Keys
) -> None:
    async with (
        console_server(tmp_path, keys, max_sessions=3) as server,
        login(server, keys.viewer, "wallboard") as wall,
    ):
        boards = [await open_terminal(wall, 100, 30) for _ in range(3)]
        await until(lambda: all(settled(b) for b in boards), timeout=20)
        async with login(server, keys.operator, "ops") as ops:
            console = await open_terminal(ops, 100, 30)
            await console.wait_for("Fleet", "dgx-002", timeout=20)
            assert "full" not in console.raw.decode()
            console.send("q")
            assert await console.closed() == 0
        # the wallboard the operator's session was kept from was told so
        refused = [b for b in boards if b.raw.startswith(b"gpuconsole:")]
        assert len(refused) == 1 and "kept for operators" in refused[0].raw.decode()
        for board in boards:
            if board not in refused:
                board.send("q")
                await board.closed()


async def test_one_key_holds_at_most_its_share_of_sessions(tmp_path: Path, keys: Keys) -> None:
    async with (
        console_server(tmp_path, keys, max_sessions=8, max_sessions_per_key=2) as server,
        login(server, keys.viewer, "amy") as amy,
    ):
        terms = [await open_terminal(amy, 80, 24) for _ in range(3)]
        await until(lambda: all(settled(t) for t in terms), timeout=20)
        [refused] = [t for t in terms if t.raw.startswith(b"gpuconsole:")]
        assert "this key already holds 2 sessions" in refused.raw.decode()
        assert await refused.closed() == 1
        async with login(server, keys.operator, "ops") as ops:  # another key is let in
            console = await open_terminal(ops, 80, 24)
            await console.wait_for("Fleet", timeout=20)
            console.send("q")
            assert await console.closed() == 0
        for term in terms:
            if term is not refused:
                term.send("q")
                assert await term.closed() == 0


def test_kept_operator_sessions_must_leave_viewers_some() -> None:
    cfg = config.parse("[ssh]\nmax_sessions = 3\noperator_sessions = 3\n")
    with pytest.raises(ConfigError, match=r"\[ssh\] operator_sessions = 3 leaves viewers no"):
        ssh_settings(cfg)
    assert ssh_settings(config.parse("[ssh]\nmax_sessions = 3\n")).operator_sessions == 1


# --- stalled handshakes ---------------------------------------------------------------

SYSTEMD_NOFILE = 1024  # the descriptors a systemd service gets unless its unit says otherwise
STALLED = 1100


@contextlib.asynccontextmanager
async def ssh_server_process(
    tmp_path: Path, keys: Keys
) -> AsyncIterator[tuple[int, subprocess.Popen[bytes]]]:
    """`gpuconsole ssh-server --demo` in a process of its own, with a systemd service's
    descriptor limit and default settings; yields its port and the process."""
    config = tmp_path / "gpuconsole.toml"
    config.write_text(
        f'[ssh]\nlisten = "127.0.0.1:0"\nauthorized_keys = "{keys.file}"\n'
        f'host_key = "{tmp_path / "host_key"}"\n'
    )
    log = tmp_path / "server.log"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    command = f"ulimit -n {SYSTEMD_NOFILE} && exec {sys.executable} -m gpuconsole"
    arguments = ["ssh-server", "-c", str(config), "--demo", "--nodes", "1"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["sh", "-c", command + ' "$@"', "sh", *arguments],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(rb"listening on 127\.0\.0\.1:(\d+)", log.read_bytes())):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)
        yield int(found.group(1)), process
    finally:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def descriptors(count: int) -> Iterator[None]:
    """This process may hold `count` more sockets than it does (the stalled clients)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = len(os.listdir("/proc/self/fd")) + count + 64
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"needs {wanted} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_files(process: subprocess.Popen[bytes]) -> int:
    return len(os.listdir(f"/proc/{process.pid}/fd"))


async def test_stalled_handshakes_do_not_lock_the_operator_out(tmp_path: Path, keys: Keys) -> None:
    stalled: list[asyncio.StreamWriter] = []
    tasks: list[asyncio.Task[None]] = []
    greeted: set[int] = set()
    hung_up: set[int] = set()

    async def stall(port: int, number: int) -> None:
        # connects and reads the server's version line, then never says a word; a connection
        # the server never takes in (its accept queue overflowed) is tried again, as a flood would
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.5)
                continue
            stalled.append(writer)
            try:
                if await asyncio.wait_for(reader.readline(), 3):
                    greeted.add(number)  # taken in: the server holds it
            except TimeoutError:
                writer.close()
                continue
            except OSError:
                pass
            with contextlib.suppress(OSError):
                await reader.read()
            hung_up.add(number)
            return

    with descriptors(STALLED):
        async with ssh_server_process(tmp_path, keys) as (port, process):
            try:
                tasks.extend(asyncio.create_task(stall(port, n)) for n in range(STALLED))
                # until every stalled client is taken in or let go, or the server is out of
                # descriptors (then none can be)
                await until(
                    lambda: (
                        len(greeted | hung_up) == STALLED
                        or open_files(process) >= SYSTEMD_NOFILE - 4
                    ),
                    timeout=60,
                )
                began = time.monotonic()
                async with asyncssh.connect(
                    "127.0.0.1",
                    port,
                    username="ops",
                    client_keys=[keys.operator],
                    agent_path=None,
                    known_hosts=None,
                    connect_timeout=12,
                ) as conn:
                    # the stalled clients' login timeout is 30 s: well before it, the operator is in
                    assert time.monotonic() - began < 12
                    assert conn.get_extra_info("username") == "ops"
                # the surplus was let go early, not held until its login timeout
                await until(lambda: len(hung_up) > STALLED - 200, timeout=15)
                # and the flood did not flood the log: a few lines per cause, not per connection
                lines = (tmp_path / "server.log").read_text(errors="replace").splitlines()
                assert len(lines) < STALLED // 10, lines[-20:]
            finally:
                for writer in stalled:
                    writer.close()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)


def test_log_lines_write_out_control_characters_whatever_a_peer_sent() -> None:
    """Log lines quote what peers sent (a BMC's error text, an agent's answer; asyncssh's
    SASLprep already refuses control characters in an ssh user name). Whatever the message or
    the exception holds, the console's log formatter writes it out, never raw."""
    import logging

    from gpuconsole.cli.main import SafeFormatter

    hostile = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\u202e"
    try:
        raise ValueError(f"BMC answered {hostile}")
    except ValueError as exc:
        record = logging.LogRecord(
            "gpuconsole.x",
            logging.WARNING,
            __file__,
            1,
            "from=%s: %s",
            ("ops" + hostile, exc),
            exc_info=(type(exc), exc, exc.__traceback__),
        )
    line = SafeFormatter("%(levelname)s %(message)s").format(record)
    assert not any(ch in line for ch in "\x1b\x07\u202e"), line
    assert "ops\\x1b]52;c;ZXZpbA==\\x07" in line  # shown, not obeyed
    assert "Traceback" in line  # the traceback is kept, line by line
