"""The ssh-in console: an asyncssh server that gives each session its own Textual app over
the process's one hub.

Keys decide the role (see `keys.py`); the wallboard user gets the wallboard. Sessions are
counted against a limit (per key too, with slots only operators may take), time out when
idle, and are each a task of their own: a session that crashes is logged and closed, and
the others carry on. Connections still logging in are bounded, the longest waiting dropped
first, so stalled handshakes cannot hold the door shut. Textual's colour depth and
stdout capture are process-wide, so the server picks one colour system before the first
session, and nothing in a session prints (it logs).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import asyncssh
from textual.app import App

from gpuconsole.actions.roles import Actor, Role, key_actor, password_actor
from gpuconsole.config import DEFAULTS
from gpuconsole.export.guard import quiet_logger
from gpuconsole.hub import Hub
from gpuconsole.ssh.driver import BoundedOutput, SshDriver
from gpuconsole.ssh.feed import PacedFeed
from gpuconsole.ssh.keys import (
    AuthorizedKeys,
    AuthorizedKeysFile,
    KeyFileError,
    Passwords,
    fingerprint,
    load_or_create_host_key,
    load_passwords,
)
from gpuconsole.wiring import SshSettings

if TYPE_CHECKING:
    from gpuconsole.tui.actions import ActionAccess

log = logging.getLogger(__name__)
# what a flood of clients causes: each cause once per 10 s, with the count it held back
_quiet = quiet_logger(f"{__name__}.flood", every_s=10.0)

NEEDS_PTY = (
    "gpuconsole: this console needs a terminal. Connect with `ssh -t` "
    "(and without -T or a command).\r\n"
)
NO_COMMANDS = "gpuconsole: this server runs no commands; connect with plain `ssh -p PORT host`.\r\n"
NO_PTY_KEY = (
    "gpuconsole: this key may not have a terminal (no-pty or restrict in the authorized "
    "keys), and this console is only served on one.\r\n"
)
PENDING_INPUT_BYTES = 4096  # input kept before a session's app takes it; then reading waits
# A session draws at most this many columns and rows, whatever size its client claims: a
# repaint costs the shared loop in proportion (2000x1000 holds it ~0.3 s; 65535x65535 would
# hold every session for minutes). Wider than any real terminal window.
MAX_COLUMNS, MAX_ROWS = 1024, 512


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """Who a session belongs to: user, role, the key that let them in, where from."""

    user: str  # the name the client logged in as (the wallboard's, say); who it is: actor
    actor: Actor
    fingerprint: str
    peer: str
    wallboard: bool
    term_type: str


AppFactory = Callable[[SessionInfo], Any]  # returns a textual App


def use_color_system(name: str) -> None:
    """Textual reads its colour system once per process: pick it before the first app."""
    from textual import constants

    os.environ["TEXTUAL_COLOR_SYSTEM"] = name
    setattr(constants, "COLOR_SYSTEM", name)  # noqa: B010 - Final in textual, set on purpose


class ConsoleServer:
    """Serves consoles (and the wallboard) over SSH, all reading one hub."""

    def __init__(
        self,
        hub: Hub,
        settings: SshSettings,
        app_factory: AppFactory,
        *,
        start_hub: bool = True,
    ) -> None:
        self.hub = hub
        self.settings = settings
        self.app_factory = app_factory
        self.sessions: set[ConsoleSession] = set()
        self._start_hub = start_hub
        self._hub_started = False
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._keys = AuthorizedKeysFile(settings.authorized_keys)
        self.passwords = Passwords({})
        self._connections: set[asyncssh.SSHServerConnection] = set()
        self._logging_in: dict[_Connection, str] = {}  # by source address, longest waiting first
        self._stdio: tuple[TextIO, TextIO] = (sys.stdout, sys.stderr)
        self.host_key_fingerprint = ""

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Load keys, pick the colour system, start the hub, listen."""
        s = self.settings
        use_color_system(s.color_system)
        self._stdio = (sys.stdout, sys.stderr)
        host_key = load_or_create_host_key(s.host_key)
        self.host_key_fingerprint = fingerprint(host_key)
        self.authorized_keys()  # a missing or bad file fails the start, not the first login
        if s.password_file is not None:
            self.passwords = Passwords(load_passwords(s.password_file))
        if self._start_hub:
            await self.hub.start()
            self._hub_started = True
        self._acceptor = await asyncssh.create_server(
            lambda: _Connection(self),
            s.host,
            s.port,
            server_host_keys=[host_key],
            line_editor=False,
            encoding=None,
            login_timeout=s.login_timeout_s,
            keepalive_interval=s.keepalive_s,
            allow_scp=False,
            agent_forwarding=False,
            x11_forwarding=False,
        )
        log.info(
            "ssh console listening on %s:%d (host key %s, %d authorized keys)",
            s.host,
            self.port,
            self.host_key_fingerprint,
            len(self._keys.current()),
        )

    @property
    def port(self) -> int:
        assert self._acceptor is not None
        return int(self._acceptor.sockets[0].getsockname()[1])

    async def serve_forever(self) -> None:
        assert self._acceptor is not None
        await self._acceptor.wait_closed()

    async def stop(self) -> None:
        """Close every session and connection, stop listening, stop the hub we started."""
        if self._acceptor is not None:
            self._acceptor.close()
            self._acceptor = None
        for session in list(self.sessions):
            session.close("gpuconsole: the server is shutting down.")
        tasks = [s.task for s in self.sessions if s.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for conn in list(self._connections):
            conn.close()
        if self._hub_started:
            self._hub_started = False
            await self.hub.stop()

    # --- authentication ----------------------------------------------------------------

    def authorized_keys(self) -> AuthorizedKeys:
        """The authorized keys, read again whenever the file's content changes."""
        return self._keys.current()

    # --- connections still logging in --------------------------------------------------

    def arrived(self, conn: _Connection) -> None:
        """Count a new connection as logging in. Past [ssh] max_startups_per_source from its
        address, or max_startups in all, the one that has waited longest is dropped: a
        stalled handshake cannot keep a newer one out."""
        s = self.settings
        same = [c for c, source in self._logging_in.items() if source == conn.source]
        if len(same) >= s.max_startups_per_source:
            self._drop(same[0], f"more than max_startups_per_source = {s.max_startups_per_source}")
        elif len(self._logging_in) >= s.max_startups:
            self._drop(next(iter(self._logging_in)), f"more than max_startups = {s.max_startups}")
        self._logging_in[conn] = conn.source

    def settled(self, conn: _Connection) -> None:
        """The connection logged in, or left."""
        self._logging_in.pop(conn, None)

    def _drop(self, conn: _Connection, reason: str) -> None:
        self._logging_in.pop(conn, None)
        if conn.conn is not None:
            conn.conn.abort()
        # a flood is one line per cause and interval, with the count it held back
        _quiet.warning(
            "dropped a connection still logging in from=%s: %s at once (the longest waiting "
            "goes first)",
            conn.peer,
            reason,
        )

    # --- sessions ----------------------------------------------------------------------

    def admit(self, session: ConsoleSession) -> str | None:
        """Take the session in, or say why not: one key holds at most max_sessions_per_key,
        and viewers (wallboards too) leave operator_sessions of max_sessions to operators."""
        s = self.settings
        held = sum(1 for other in self.sessions if other.credential == session.credential)
        if held >= s.max_sessions_per_key:
            holder = "this key" if session.key != "password" else f"user {session.actor.user}"
            return (
                f"gpuconsole: {holder} already holds {held} sessions "
                "([ssh] max_sessions_per_key); close one first."
            )
        if len(self.sessions) >= s.max_sessions:
            return f"gpuconsole: the server is full ({s.max_sessions} sessions); try again later."
        viewers = sum(1 for other in self.sessions if not other.acts)
        if not session.acts and viewers >= s.max_sessions - s.operator_sessions:
            return (
                f"gpuconsole: the server is full for viewers ({viewers} sessions; "
                f"{s.operator_sessions} kept for operators); try again later."
            )
        self.sessions.add(session)
        return None

    def release(self, session: ConsoleSession) -> None:
        self.sessions.discard(session)
        # Each app redirected sys.stdout while it ran, and apps end in any order: put the
        # process's own streams back rather than a finished session's capture.
        sys.stdout, sys.stderr = self._stdio


class _Connection(asyncssh.SSHServer):
    """One TCP connection: authentication and login/logout logging."""

    def __init__(self, server: ConsoleServer) -> None:
        self.server = server
        self.conn: asyncssh.SSHServerConnection | None = None
        self.user = ""
        self.peer = "?"
        self.source = "?"  # the client's address, without its port
        self.actor: Actor | None = None
        self.key_fingerprint = ""
        self.credential = ""  # what session limits count by: the key, or the password's user
        self.may_have_pty = True
        self.logged_in = False

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        self.server._connections.add(conn)
        peer = conn.get_extra_info("peername")
        if peer:
            self.source, self.peer = _address(str(peer[0])), f"{peer[0]}:{peer[1]}"
        self.server.arrived(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.settled(self)
        if self.conn is not None:
            self.server._connections.discard(self.conn)
        if self.logged_in:
            log.info(
                "logout user=%s role=%s key=%s from=%s",
                self.user,
                self.actor.role.value if self.actor else "?",
                self.key_fingerprint,
                self.peer,
            )

    def begin_auth(self, username: str) -> bool:
        self.user = username
        return True  # authentication is always required

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        try:
            keys = self.server.authorized_keys()
        except KeyFileError as exc:
            log.error("refused key=%s user=%s: %s", fingerprint(key), username, exc)
            return False
        found = keys.find(key, self.source)
        if found is None:
            log.warning(
                "refused key=%s user=%s from=%s: %s",
                fingerprint(key),
                username,
                self.peer,
                "not from an address its from= allows" if keys.knows(key) else "not authorized",
            )
            return False
        self.actor = key_actor(found.role, found.fingerprint, found.comment, username)
        self.key_fingerprint = self.credential = found.fingerprint
        self.may_have_pty = found.pty
        return True

    def password_auth_supported(self) -> bool:
        return bool(self.server.passwords)

    async def validate_password(self, username: str, password: str) -> bool:
        entry = await asyncio.to_thread(self.server.passwords.check, username, password)
        if entry is None:
            log.warning("refused password user=%s from=%s", username, self.peer)
            return False
        self.actor = password_actor(entry.role, username)
        self.key_fingerprint = "password"
        self.credential = f"password {username}"
        return True

    def auth_completed(self) -> None:
        self.logged_in = True
        self.server.settled(self)
        log.info(
            "login user=%s role=%s key=%s from=%s",
            self.user,
            self.actor.role.value if self.actor else "?",
            self.key_fingerprint,
            self.peer,
        )

    def session_requested(self) -> ConsoleSession:
        actor = self.actor or Actor(self.user, Role.VIEWER, login=self.user)
        return ConsoleSession(
            self.server,
            actor,
            self.key_fingerprint,
            self.peer,
            credential=self.credential,
            may_have_pty=self.may_have_pty,
        )


def _address(text: str) -> str:
    """A client's address as from= patterns see it: an IPv4 client of a dual-stack listener
    (::ffff:10.1.2.3) is 10.1.2.3, as sshd has it."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return text
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return str(mapped or address)


class ConsoleSession(asyncssh.SSHServerSession[bytes]):
    """One SSH session channel: one app, one driver, one idle timer."""

    def __init__(
        self,
        server: ConsoleServer,
        actor: Actor,
        key: str,
        peer: str,
        *,
        credential: str = "",
        may_have_pty: bool = True,
    ) -> None:
        self.server = server
        self.actor = actor
        self.key = key
        self.peer = peer
        self.credential = credential or key
        self.may_have_pty = may_have_pty
        self.wallboard = bool(server.settings.wallboard_user) and (
            actor.login == server.settings.wallboard_user
        )
        self.chan: asyncssh.SSHServerChannel[bytes] | None = None
        self.size = (80, 24)
        self.term_type: str | None = None
        self.command: str | None = None
        self.app: Any = None
        self.output: BoundedOutput | None = None
        self.driver: SshDriver | None = None
        self.task: asyncio.Task[None] | None = None
        self.info: SessionInfo | None = None
        self.last_input = time.monotonic()
        self._pending_input: list[bytes] = []
        self._idle: asyncio.TimerHandle | None = None
        self._farewell = ""
        self._closed = False

    # --- asyncssh callbacks ----------------------------------------------------------

    def connection_made(self, chan: Any) -> None:
        assert isinstance(chan, asyncssh.SSHServerChannel)
        self.chan = chan

    @property
    def acts(self) -> bool:
        """Whether this session may act (an operator's console), not only watch."""
        return self.actor.role.may_act and not self.wallboard

    def pty_requested(
        self, term_type: str, term_size: tuple[int, int, int, int], term_modes: Any
    ) -> bool:
        if not self.may_have_pty:
            return False
        self.term_type = term_type or "xterm"
        if term_size[0] and term_size[1]:
            self.size = self._bounded(term_size[0], term_size[1])
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        self.command = command
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        return False

    def session_started(self) -> None:
        assert self.chan is not None
        if self.command is not None:
            self._refuse(NO_COMMANDS)
            return
        if self.term_type is None:
            log.info("refused session user=%s from=%s: no pty", self.actor.login, self.peer)
            self._refuse(NEEDS_PTY if self.may_have_pty else NO_PTY_KEY)
            return
        refusal = self.server.admit(self)
        if refusal is not None:
            log.warning(
                "refused session user=%s key=%s from=%s: %s",
                self.actor.login,
                self.key,
                self.peer,
                refusal.removeprefix("gpuconsole: "),
            )
            self._refuse(refusal + "\r\n")
            return
        self.info = SessionInfo(
            user=self.actor.login,
            actor=self.actor,
            fingerprint=self.key,
            peer=self.peer,
            wallboard=self.wallboard,
            term_type=self.term_type,
        )
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"ssh {self.peer}")
        if not self.wallboard and self.server.settings.idle_timeout_s > 0:
            self._arm_idle(self.server.settings.idle_timeout_s)

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self.last_input = time.monotonic()
        if self.driver is not None:
            self.driver.feed(data)
            return
        # Typed ahead while the app starts: kept, and past a few KB the channel waits.
        self._pending_input.append(data)
        if sum(map(len, self._pending_input)) >= PENDING_INPUT_BYTES and self.chan is not None:
            self.chan.pause_reading()

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if not (width and height):
            return
        self.size = self._bounded(width, height)
        if self.driver is not None:
            self.driver.resize(*self.size)

    def _bounded(self, width: int, height: int) -> tuple[int, int]:
        """The size to draw at: the client's, at most MAX_COLUMNS x MAX_ROWS."""
        size = (min(width, MAX_COLUMNS), min(height, MAX_ROWS))
        if size != (width, height):
            log.warning(
                "terminal size %dx%d from user=%s from=%s drawn at %dx%d",
                width,
                height,
                self.actor.login,
                self.peer,
                *size,
            )
        return size

    def eof_received(self) -> bool:
        self.close("")
        return False

    def resume_writing(self) -> None:
        if self.driver is not None:
            self.driver.writable()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self.output is not None:
            self.output.closed = True
        self.close("")

    # --- running the app ---------------------------------------------------------------

    def _refuse(self, message: str) -> None:
        assert self.chan is not None
        self.chan.write(message.encode())
        self.chan.exit(1)

    async def _run(self) -> None:
        assert self.chan is not None and self.info is not None
        info = self.info
        started = time.monotonic()
        log.info(
            "session start user=%s role=%s key=%s from=%s view=%s size=%dx%d",
            info.user,
            info.actor.role.value,
            info.fingerprint,
            info.peer,
            "wallboard" if info.wallboard else "console",
            *self.size,
        )
        status = 0
        try:
            self.output = BoundedOutput(self.chan, self.server.settings.output_buffer_bytes)
            limit = self.server.settings.output_buffer_bytes
            self.chan.set_write_buffer_limits(high=limit, low=limit // 4)
            self.app = self.server.app_factory(info)
            self.app.driver_class = SshDriver.bind(
                self.output, self.size, self._driver_ready, self._pause_input
            )
            await self.app.run_async()
            if self.app.return_code:
                status = 1
                log.error(
                    "session crashed user=%s from=%s",
                    info.user,
                    info.peer,
                    exc_info=getattr(self.app, "_exception", None),
                )
                self._farewell = self._farewell or (
                    "gpuconsole: this session failed and was closed; the error is in the "
                    "server's log."
                )
        except Exception:
            status = 1
            log.exception("session failed to start user=%s from=%s", info.user, info.peer)
            self._farewell = "gpuconsole: this session could not start; see the server's log."
        finally:
            if self._idle is not None:
                self._idle.cancel()
            self.driver = None
            self.server.release(self)
            log.info(
                "session end user=%s key=%s from=%s after %.0f s",
                info.user,
                info.fingerprint,
                info.peer,
                time.monotonic() - started,
            )
            if not self._closed:
                self._closed = True
                if self._farewell:
                    self.chan.write(self._farewell.encode() + b"\r\n")
                self.chan.exit(status)

    def _driver_ready(self, driver: SshDriver) -> None:
        self.driver = driver
        pending, self._pending_input = self._pending_input, []
        for data in pending:
            driver.feed(data)
        if sum(map(len, pending)) >= PENDING_INPUT_BYTES and not driver.input_paused:
            self._pause_input(False)

    def _pause_input(self, pause: bool) -> None:
        """The driver has more input waiting than it should hold: stop reading the channel
        (the client's window fills and its writes wait), or read again."""
        if self.chan is None or self._closed:
            return
        if pause:
            log.info(
                "input paused user=%s from=%s: it arrives faster than it is taken",
                self.actor.login,
                self.peer,
            )
            self.chan.pause_reading()
        else:
            self.chan.resume_reading()

    def close(self, farewell: str) -> None:
        """End the session's app (it then closes the channel); a no-op before it started."""
        if farewell and not self._farewell:
            self._farewell = farewell
        if self.app is not None and self.app.is_running:
            self.app.exit()
        elif self.task is not None and not self.task.done() and self.app is None:
            self.task.cancel()

    def _arm_idle(self, delay: float) -> None:
        self._idle = asyncio.get_running_loop().call_later(delay, self._check_idle)

    def _check_idle(self) -> None:
        limit = self.server.settings.idle_timeout_s
        idle = time.monotonic() - self.last_input
        if idle < limit:
            self._arm_idle(limit - idle)
            return
        log.info("session idle user=%s from=%s: closing", self.actor.login, self.peer)
        self.close(f"gpuconsole: closed after {limit:g} s without input.")


def console_factory(
    hub: Hub,
    *,
    theme: str | None,
    wallboard_theme: str | None,
    page_s: float,
    theme_dirs: list[Path] | None = None,
    refresh_s: float = DEFAULTS.ssh.refresh_s,
    actions: ActionAccess | None = None,
) -> AppFactory:
    """Apps for sessions: the wallboard for the wallboard user, else the console with the
    session's actor (read-only for viewers). The hub is the server's: apps never start it;
    each reads it through a feed paced to `refresh_s`. With `actions` (this machine's)
    operators' sessions can move this machine's GPUs, each as its own key's actor."""
    # Imported with the server, not by its first session: a login waits for nothing more
    # than its own app.
    from gpuconsole.tui.app import ConsoleApp

    def make(info: SessionInfo) -> App[None]:
        feed = PacedFeed(hub, refresh_s)
        if info.wallboard:
            from gpuconsole.tui.wallboard import WallboardApp

            board = WallboardApp(
                hub,
                feed=feed,
                theme=wallboard_theme,
                page_s=page_s,
                start_hub=False,
                theme_dirs=theme_dirs,
            )
            board.animation_level = "none"
            return board
        app = ConsoleApp(
            hub,
            feed=feed,
            theme=theme,
            read_only=not info.actor.role.may_act,
            start_hub=False,
            cursor_blink=False,  # a blinking cursor is a repaint twice a second per session
            actor=info.actor,
            theme_dirs=theme_dirs,
            actions=actions,
        )
        app.animation_level = "none"
        return app

    return make


async def serve(server: ConsoleServer) -> None:
    """Run the server until SIGINT or SIGTERM, then close every session cleanly."""
    import signal

    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()
