"""How the agent's HTTP server holds up against clients that hold connections open: a
bound on open connections well under the process's file descriptors, and logs that say
each cause once a minute instead of once per connection.

A slow client (a slowloris sending its headers a byte at a time, an idle keep-alive)
costs a descriptor and nothing else; at the bound, a new connection pushes out the one
that has waited longest without a request in progress, so a scrape still gets in while
a thousand stalled connections come and go.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuconsole.readings.base import safe_text

# At most this many open connections: Prometheus, a few heads and a person with curl need
# a handful; the rest of the descriptors stay with the sources.
MAX_CONNECTIONS = 256
# The listen queue, which is also how many connections asyncio accepts at once before the
# guard sees any of them: kept short, so that a burst cannot run past the descriptors.
BACKLOG = 32
# A request in progress (or a response the client does not read) for longer than this
# may be pushed out too, when nothing else can be.
STUCK_S = 60.0
# A cause of log lines is said at most once in this long, with how often it happened.
LOG_EVERY_S = 60.0


def connection_limit(wanted: int = MAX_CONNECTIONS) -> int:
    """The connections the agent keeps open at most: `wanted`, or fewer when the
    descriptor limit (systemd's LimitNOFILE, `ulimit -n`) is low. Half the descriptors,
    less two bursts of accepts (one arriving, one being closed), at most; the other half
    stay with the sources (NVML's device nodes, sysfs reads, netlink, BMC sessions), the
    journal and the process itself."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(4, min(wanted, (soft - 2 * BACKLOG) // 2))


class OncePerCause(logging.Filter):
    """Lets a cause of log records through once per `every_s`, as one line (the exception's
    type and text, no traceback), counting what it held back since.

    A cause is the record's message template and its exception type, so a thousand
    clients that send the same bad request are one cause, not a thousand lines.
    """

    def __init__(
        self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._said: dict[tuple[str, str], tuple[float, int]] = {}  # cause: (said at, held)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        cause = (str(record.msg), type(exc).__name__ if exc is not None else "")
        now = self.clock()
        said = self._said.get(cause)
        if said is not None and now - said[0] < self.every_s:
            self._said[cause] = (said[0], said[1] + 1)
            return False
        held = said[1] if said is not None else 0
        if len(self._said) >= _CAUSES:
            self._said.clear()  # a flood of distinct texts: start counting over
        self._said[cause] = (now, 0)
        text = record.getMessage()
        if exc is not None:
            text = f"{text}: {type(exc).__name__}: {exc}"
        if held:
            text = f"{text} (and {held} more in the last {self.every_s:g} s)"
        # what a client sent may end up in the text: no control character reaches the log
        record.msg = safe_text(text)
        record.args = None
        record.exc_info = None
        record.exc_text = None
        return True


_CAUSES = 1000  # causes remembered at most


def quiet_logger(name: str, every_s: float = LOG_EVERY_S) -> logging.Logger:
    """The logger `name`, saying each cause once per `every_s` (see OncePerCause)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, OncePerCause) for f in logger.filters):
        logger.addFilter(OncePerCause(every_s))
    return logger


def quiet_loop_errors(logger: logging.Logger) -> Callable[[Any, Mapping[str, Any]], None]:
    """An event loop exception handler that logs to `logger` (a quiet one): asyncio's own
    handler writes a traceback for each failed accept, thousands a second once the
    descriptors run out."""

    def handle(loop: Any, context: Mapping[str, Any]) -> None:
        exc = context.get("exception")
        # the message is the cause (asyncio's are fixed texts), so it is the template;
        # with no arguments logging does not %-format it
        message = str(context.get("message") or "event loop error")
        logger.error(
            message, exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None
        )

    return handle


class _Connection(asyncio.Protocol):
    """One accepted connection: the server's own protocol, seen by the guard on its way in
    and out (and, with TLS, taken through its handshake first, so that a client stalling
    there is a connection the guard can close too)."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.raw: asyncio.BaseTransport | None = None  # the socket's own transport
        self.transport: asyncio.BaseTransport | None = None  # what the server writes to
        self.handshake: asyncio.Task[None] | None = None
        self.since = guard.clock()  # accepted, or its last request ended
        self.busy = 0  # requests in progress
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport
        if self.guard.tls is None:
            self._made(transport)
        else:
            self.handshake = asyncio.get_running_loop().create_task(self._start_tls(transport))

    async def _start_tls(self, raw: asyncio.BaseTransport) -> None:
        assert self.guard.tls is not None and isinstance(raw, asyncio.Transport)
        try:
            tls = await asyncio.get_running_loop().start_tls(
                raw, self, self.guard.tls, server_side=True,
                ssl_handshake_timeout=self.guard.handshake_s,
            )  # fmt: skip
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            raw.abort()
            self.guard._lost(self)
            self.guard.log.info("TLS handshake not completed: %s", type(exc).__name__)
            return
        finally:
            self.handshake = None
        if tls is None or self.closing:  # pushed out as the handshake ended
            raw.abort()
            self.guard._lost(self)
            return
        self._made(tls)

    def _made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.guard._by_transport[transport] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard._lost(self)
        if self.transport is not None:
            self.inner.connection_lost(exc)

    def close(self) -> None:
        """Close at once: a client that waits is not owed a goodbye."""
        if isinstance(self.raw, asyncio.WriteTransport):
            self.raw.abort()
        elif self.raw is not None:
            self.raw.close()


class _Refused(asyncio.Protocol):
    """A connection the guard had no room for: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.WriteTransport):
            transport.abort()
        else:
            transport.close()


class ConnectionGuard:
    """Keeps a server's open connections at `limit`: a new one past it pushes out the
    connection that has waited longest with no request in progress and nothing left to
    send (a slow or idle client, or one still in its TLS handshake); when every connection
    is busy, one stuck for `stuck_s` goes, else the newcomer is closed.

    With `tls`, the guard runs each TLS handshake (give the server's listener no TLS of
    its own), at most `handshake_s` long."""

    def __init__(
        self,
        limit: int,
        log: logging.Logger,
        *,
        tls: ssl.SSLContext | None = None,
        handshake_s: float = 60.0,
        stuck_s: float = STUCK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.log = log
        self.tls = tls
        self.handshake_s = handshake_s
        self.stuck_s = stuck_s
        self.clock = clock
        # oldest first, by `since`: a connection moves to the end when a request ends
        self._open: dict[_Connection, None] = {}
        self._by_transport: dict[asyncio.BaseTransport, _Connection] = {}
        self.live = 0  # open and not being closed by the guard
        self.pushed_out = 0
        self.refused = 0

    def factory(self, make: Callable[[], asyncio.BaseProtocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for `loop.create_server` around the server's own `make`."""

        def accept() -> asyncio.Protocol:
            if self.live >= self.limit and not self._push_out():
                self.refused += 1
                self.log.warning("refusing connections: %d open, none of them idle", self.limit)
                return _Refused()
            inner = make()
            assert isinstance(inner, asyncio.Protocol)
            connection = _Connection(self, inner)
            self._open[connection] = None
            self.live += 1
            return connection

        return accept

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        connection = self._by_transport.get(transport) if transport is not None else None
        if connection is not None:
            connection.busy += 1
            connection.since = self.clock()

    def request_ended(self, transport: asyncio.BaseTransport | None) -> None:
        connection = self._by_transport.get(transport) if transport is not None else None
        if connection is not None:
            connection.busy -= 1
            connection.since = self.clock()
            if connection in self._open:
                self._open.pop(connection)
                self._open[connection] = None

    def close_all(self) -> None:
        """Close every connection (the server is stopping)."""
        for connection in list(self._open):
            connection.closing = True
            connection.close()

    def _push_out(self) -> bool:
        """Close the connection that has waited longest with nothing to do; False when
        every connection is at work and none has been for `stuck_s`."""
        now = self.clock()
        victim = None
        for connection in self._open:
            if connection.closing or connection.raw is None:
                continue  # closing already, or accepted this instant
            transport = connection.transport
            if transport is None or (not connection.busy and not _unsent(transport)):
                victim = connection
                break
            if victim is None and now - connection.since > self.stuck_s:
                victim = connection
        if victim is None:
            return False
        victim.closing = True
        self.live -= 1
        self.pushed_out += 1
        self.log.warning(
            "closing the connections that wait longest for a request: more than %d open "
            "(slow or stalled clients)",
            self.limit,
        )
        victim.close()
        return True

    def _lost(self, connection: _Connection) -> None:
        if self._open.pop(connection, False) is None and not connection.closing:
            self.live -= 1
        if connection.transport is not None:
            self._by_transport.pop(connection.transport, None)


def _unsent(transport: asyncio.BaseTransport) -> int:
    """Bytes a transport still holds for its client (a response being written)."""
    if isinstance(transport, asyncio.WriteTransport):
        return transport.get_write_buffer_size()
    return 0
