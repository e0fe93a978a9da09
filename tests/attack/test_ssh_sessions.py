"""Sessions and connections, tried as an attacker (or a crowded NOC) would: one key cannot
take every session, wallboards leave the on-call operator a way in, and stalled handshakes
cannot hold the door shut."""

from __future__ import annotations

from pathlib import Path

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
        refused = [b for b in boards if b.raw.startswith(b"gpuconsole:")]
        assert len(refused) == 1 and "kept for operators" in refused[0].raw.decode()
        async with login(server, keys.operator, "ops") as ops:
            console = await open_terminal(ops, 100, 30)
            await console.wait_for("Fleet", "dgx-002", timeout=20)
            assert "full" not in console.raw.decode()
            console.send("q")
            assert await console.closed() == 0
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
