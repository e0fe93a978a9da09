"""The ssh-in console end to end: a real asyncssh client, a terminal emulator (pyte) on its
output, and the server on 127.0.0.1 with a port chosen by the test."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncssh
import msgspec
import pyte
import pytest

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.power import PowerRequest, power
from gpuconsole.actions.roles import ActionRefused, Role
from gpuconsole.sim.cluster import demo_hub
from gpuconsole.sources.bmc import PowerAction
from gpuconsole.ssh.server import ConsoleServer, SessionInfo, console_factory
from gpuconsole.wiring import SshSettings
from tests.waiting import until

KEY_TYPE = "ssh-ed25519"


class Terminal(asyncssh.SSHClientSession[bytes]):
    """A client terminal: everything the server sends, drawn on a pyte screen."""

    def __init__(self, width: int, height: int) -> None:
        self.screen = pyte.Screen(width, height)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.chan: asyncssh.SSHClientChannel[bytes] | None = None

    def connection_made(self, chan: Any) -> None:
        self.chan = chan

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self.raw += data
        self.stream.feed(data)

    @property
    def text(self) -> str:
        return "\n".join(self.screen.display)

    async def wait_for(self, *needles: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text + self.raw.decode("utf-8", "replace")[-500:]
            if all(n in text for n in needles):
                return self.text
            await asyncio.sleep(0.05)
        raise AssertionError(f"{needles} never appeared; the screen:\n{self.text}")

    def send(self, keys: str) -> None:
        assert self.chan is not None
        self.chan.write(keys.encode())

    def resize(self, width: int, height: int) -> None:
        assert self.chan is not None
        self.screen.resize(height, width)
        self.chan.change_terminal_size(width, height)

    async def closed(self, timeout: float = 10.0) -> int | None:
        assert self.chan is not None
        await asyncio.wait_for(self.chan.wait_closed(), timeout)
        return self.chan.get_exit_status()


class Keys:
    """Client keys and the authorized-keys file that names their roles."""

    def __init__(self, folder: Path) -> None:
        self.operator = asyncssh.generate_private_key(KEY_TYPE)
        self.viewer = asyncssh.generate_private_key(KEY_TYPE)
        self.stranger = asyncssh.generate_private_key(KEY_TYPE)
        self.file = folder / "authorized_keys"
        self.file.write_text(
            "# who may log in\n"
            f"role=operator {self.operator.export_public_key().decode().strip()} ops\n"
            f"{self.viewer.export_public_key().decode().strip()} a viewer (no role named)\n"
        )


@contextlib.asynccontextmanager
async def console_server(
    tmp_path: Path, keys: Keys, factory: Callable[..., Any] | None = None, **overrides: Any
) -> AsyncIterator[ConsoleServer]:
    # the console end to end needs GPUs, not every source: keeps each test near a second
    hub = demo_hub(nodes=3, events=False, bmc=False, fabric=False, tenancy=False)
    options: dict[str, Any] = {"idle_timeout_s": 0, **overrides}
    settings = SshSettings(
        host="127.0.0.1",
        port=0,
        host_key=tmp_path / "state" / "host_key",
        authorized_keys=keys.file,
        **options,
    )
    make = console_factory(hub, theme=None, wallboard_theme=None, page_s=15, theme_dirs=[])
    server = ConsoleServer(hub, settings, factory(make) if factory else make)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def login(
    server: ConsoleServer, key: asyncssh.SSHKey, user: str = "ops"
) -> AsyncIterator[asyncssh.SSHClientConnection]:
    async with asyncssh.connect(
        "127.0.0.1", server.port, username=user, client_keys=[key], known_hosts=None
    ) as conn:
        yield conn


async def open_terminal(
    conn: asyncssh.SSHClientConnection, width: int, height: int, **kwargs: Any
) -> Terminal:
    _, term = await conn.create_session(
        lambda: Terminal(width, height),
        term_type="xterm-256color",
        term_size=(width, height),
        encoding=None,
        **kwargs,
    )
    return term


def session_of(server: ConsoleServer, user: str) -> Any:
    """The session the client logged in to as `user`."""
    return next(s for s in server.sessions if s.actor.login == user)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


async def test_two_sessions_at_their_own_sizes_resize_and_quit(
    tmp_path: Path, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuconsole.ssh")
    async with console_server(tmp_path, keys) as server:
        async with login(server, keys.operator, "ops") as a, login(server, keys.viewer, "amy") as b:
            wide = await open_terminal(a, 120, 40)
            narrow = await open_terminal(b, 80, 24)
            await wide.wait_for("Fleet", "dgx-002", "dgx-003", "Quit")
            await narrow.wait_for("Fleet", "dgx-002", "Jump")
            assert session_of(server, "ops").app.size == (120, 40)
            assert session_of(server, "amy").app.size == (80, 24)
            # each session's bottom line (its footer) sits at its own height
            assert "Quit" in wide.screen.display[39]
            assert "Jump" in narrow.screen.display[23]

            narrow.resize(100, 30)
            await narrow.wait_for("Quit")
            deadline = time.monotonic() + 5
            while "Quit" not in narrow.screen.display[29] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert "Quit" in narrow.screen.display[29], narrow.text
            assert session_of(server, "amy").app.size == (100, 30)

            narrow.send("q")
            assert await narrow.closed() == 0
            assert [s.actor.login for s in server.sessions] == ["ops"]
            wide.send("e")  # the other session still answers keys
            await wide.wait_for("\u203a Events")  # the breadcrumb, not the footer key
            wide.send("q")
            assert await wide.closed() == 0
    fingerprint = keys.operator.get_fingerprint("sha256")
    logged = caplog.text
    assert f"login user=ops role=operator key={fingerprint}" in logged
    assert f"logout user=ops role=operator key={fingerprint}" in logged
    assert "login user=amy role=viewer" in logged


async def test_an_unknown_key_is_refused_and_logged(
    tmp_path: Path, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuconsole.ssh")
    async with console_server(tmp_path, keys) as server:
        with pytest.raises(asyncssh.PermissionDenied):
            async with login(server, keys.stranger):
                pass
        assert not server.sessions
    assert f"refused key={keys.stranger.get_fingerprint('sha256')}" in caplog.text


async def test_a_client_without_a_pty_is_told_it_needs_one(tmp_path: Path, keys: Keys) -> None:
    async with console_server(tmp_path, keys) as server, login(server, keys.operator) as conn:
        result = await conn.run(encoding="utf-8")  # a shell, no pty
        assert "needs a terminal" in str(result.stdout)
        assert result.exit_status == 1
        command = await conn.run("uptime", encoding="utf-8")
        assert "runs no commands" in str(command.stdout)
        assert not server.sessions


async def test_the_next_client_is_told_the_server_is_full(tmp_path: Path, keys: Keys) -> None:
    async with (
        console_server(tmp_path, keys, max_sessions=1) as server,
        login(server, keys.operator) as conn,
    ):
        first = await open_terminal(conn, 80, 24)
        await first.wait_for("Fleet")
        second = await open_terminal(conn, 80, 24)
        await second.wait_for("server is full (1 sessions)")
        assert await second.closed() == 1
        first.send("q")
        assert await first.closed() == 0


async def test_the_wallboard_user_gets_the_wallboard(tmp_path: Path, keys: Keys) -> None:
    async with (
        console_server(tmp_path, keys) as server,
        login(server, keys.viewer, "wallboard") as conn,
    ):
        term = await open_terminal(conn, 120, 40)
        await term.wait_for("Fleet heat", "page 1/5", "p pause")
        assert type(session_of(server, "wallboard").app).__name__ == "WallboardApp"
        term.send(":")  # no palette on the wall
        term.send("p")
        await term.wait_for("PAUSED")
        term.send("q")
        assert await term.closed() == 0


async def test_a_viewers_action_is_refused_where_it_executes(tmp_path: Path, keys: Keys) -> None:
    class Bmc:
        label = "fake bmc"
        calls: list[PowerAction] = []

        async def set_power(self, action: PowerAction) -> str:
            self.calls.append(action)
            return "ok"

    async with (
        console_server(tmp_path, keys) as server,
        login(server, keys.viewer, "amy") as conn,
    ):
        term = await open_terminal(conn, 120, 40)
        await term.wait_for("Fleet", "read-only")
        app = session_of(server, "amy").app
        assert app.actor.role is Role.VIEWER and app.read_only
        audit = AuditLog(tmp_path / "audit.jsonl")
        request = PowerRequest("dgx-001", PowerAction.OFF, app.actor, "dgx-001")
        bmc = Bmc()
        with pytest.raises(ActionRefused, match="viewer may not act"):
            await power(request, bmc, audit)
        assert bmc.calls == []
        [record] = audit.records()
        # the key that logged in, named as the keys file names it: not the name amy typed
        assert (record["user"], record["role"], record["outcome"]) == (
            "a viewer (no role named)",
            "viewer",
            "refused",
        )
        assert record["key_fingerprint"] == keys.viewer.get_fingerprint("sha256")
        term.send("q")
        await term.closed()


async def test_an_idle_session_times_out(tmp_path: Path, keys: Keys) -> None:
    async with (
        console_server(tmp_path, keys, idle_timeout_s=1.0) as server,
        login(server, keys.operator) as conn,
    ):
        term = await open_terminal(conn, 80, 24)
        await term.wait_for("Fleet")
        assert await term.closed(timeout=10) == 0
        assert "closed after 1 s without input" in term.raw.decode()
        assert not server.sessions


async def test_a_slow_client_skips_frames_then_catches_up(tmp_path: Path, keys: Keys) -> None:
    limit = 8192
    async with (
        console_server(tmp_path, keys, output_buffer_bytes=limit) as server,
        login(server, keys.operator) as conn,
    ):
        # A small receive window: the server can send little before the client reads.
        term = await open_terminal(conn, 120, 40, window=4096)
        await term.wait_for("cells: util %")
        session = session_of(server, "ops")
        assert term.chan is not None
        term.chan.pause_reading()
        for _ in range(30):  # colour by: util, temp, power, memory, util, ...
            term.send("m")
            await asyncio.sleep(0.03)
        await asyncio.sleep(0.5)
        stats = session.output.stats
        assert stats.frames_dropped > 0
        assert session.chan.get_write_buffer_size() <= limit + 64 * 1024  # bounded
        term.send("m")  # 31 presses from util end on memory (util, temp, power, memory)
        term.chan.resume_reading()
        # the table repainted too, not only the summary
        await term.wait_for("cells: memory", "GPUs: memory")
        # the screen can show the last frame a moment before the sender marks itself fresh
        await until(lambda: not session.output.stale)
        term.send("q")
        assert await term.closed() == 0


async def test_one_session_crashing_leaves_the_others_running(tmp_path: Path, keys: Keys) -> None:
    def crashing(make: Callable[[SessionInfo], Any]) -> Callable[[SessionInfo], Any]:
        def factory(info: SessionInfo) -> Any:
            app = make(info)
            if info.user == "crash":

                def boom() -> None:
                    raise RuntimeError("a bug in one view")

                app.call_after_refresh(boom)
            return app

        return factory

    async with (
        console_server(tmp_path, keys, factory=crashing) as server,
        login(server, keys.operator, "ops") as good_conn,
        login(server, keys.viewer, "crash") as bad_conn,
    ):
        good = await open_terminal(good_conn, 80, 24)
        await good.wait_for("Fleet")
        bad = await open_terminal(bad_conn, 80, 24)
        assert await bad.closed() == 1
        assert "this session failed" in bad.raw.decode()
        good.send("e")
        await good.wait_for("\u203a Events")  # the breadcrumb, not the footer key
        assert [s.actor.login for s in server.sessions] == ["ops"]
        good.send("q")
        assert await good.closed() == 0


async def test_a_watched_node_view_needs_little_of_a_thin_line(tmp_path: Path, keys: Keys) -> None:
    async with console_server(tmp_path, keys) as server, login(server, keys.operator) as conn:
        term = await open_terminal(conn, 120, 40)
        await term.wait_for("Fleet", "dgx-002")
        term.send("\r")  # the first node's view
        await until(lambda: "dgx-" in term.screen.display[0])  # its name in the top line
        await asyncio.sleep(2)  # past the first paint
        top, before, began = term.screen.display[0], len(term.raw), time.monotonic()
        await asyncio.sleep(4)
        rate = (len(term.raw) - before) / (time.monotonic() - began)
        assert term.screen.display[0] != top  # still live: the clock moved
        # Textual repaints whole widgets each second; only what changed goes out (the
        # issue's budget is 10 KB/s at 120x40; repainting widgets whole took ~4 KB/s)
        assert rate < 2000, rate
        term.send("q")
        assert await term.closed() == 0
        assert not server.sessions


async def test_a_restarted_server_shows_clients_the_same_host_key(
    tmp_path: Path, keys: Keys
) -> None:
    seen = []
    for _ in range(2):
        async with console_server(tmp_path, keys) as server, login(server, keys.operator) as conn:
            host_key = conn.get_server_host_key()
            assert host_key is not None
            seen.append(host_key.get_fingerprint("sha256"))
            assert seen[-1] == server.host_key_fingerprint
    assert seen[0] == seen[1]  # no "host key changed" warning after a restart
    key_file = tmp_path / "state" / "host_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_settings_default_to_port_2222_and_a_wallboard_user() -> None:
    settings = SshSettings()
    assert settings.port == 2222 and settings.wallboard_user == "wallboard"
    assert msgspec.structs.replace(settings, max_sessions=2).max_sessions == 2


async def test_passwords_are_off_unless_configured(tmp_path: Path, keys: Keys) -> None:
    from gpuconsole.ssh.keys import hash_password

    async with console_server(tmp_path, keys) as server:
        with pytest.raises(asyncssh.PermissionDenied):
            await asyncssh.connect("127.0.0.1", server.port, username="ops", password="pw",
                                   client_keys=None, known_hosts=None)  # fmt: skip
    passwords = tmp_path / "passwords"
    passwords.write_text(f"ops:operator:{hash_password('pw')}\n")
    passwords.chmod(0o600)
    async with console_server(tmp_path, keys, password_file=passwords) as server:
        async with asyncssh.connect("127.0.0.1", server.port, username="ops", password="pw",
                                    client_keys=None, known_hosts=None) as conn:  # fmt: skip
            term = await open_terminal(conn, 80, 24)
            await term.wait_for("Fleet")
            assert session_of(server, "ops").actor.role is Role.OPERATOR
            term.send("q")
            assert await term.closed() == 0
