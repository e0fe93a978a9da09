"""The agent's HTTP server: /metrics, /api/v1/snapshot, /-/healthy and /-/ready.

It serves what the hub already holds; no request ever polls hardware, and for a scraper
with a steady period the body is rendered just before it comes (see MetricsCache).
Optional TLS and HTTP basic auth (the password compared in constant time, never logged).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import gzip
import hmac
import itertools
import json
import logging
import secrets
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from gpuconsole.codec import dumps, snapshot_json
from gpuconsole.config import ConfigError
from gpuconsole.export.collector import MetricsCache
from gpuconsole.export.guard import (
    BACKLOG,
    ConnectionGuard,
    connection_limit,
    quiet_logger,
    quiet_loop_errors,
)
from gpuconsole.facts.verdict import carry_verdict
from gpuconsole.hub import Hub
from gpuconsole.readings.agents import (
    BEAT,
    WATCH_MAX_S,
    WATCH_MIN_S,
    WATCH_TYPE,
    frame,
    held_parts,
    part_versions,
    summarize,
)
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.wiring import AgentSettings

log = logging.getLogger(__name__)
LoopErrors = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]
# What clients make the server say (bad requests, failed accepts, connections pushed out):
# each cause once a minute, however many clients.
clients_log = quiet_logger(f"{__name__}.clients")

# A connection that holds no whole request for this long is closed: it bounds the time a
# client may take over its headers (or its TLS handshake) and how long an idle keep-alive
# holds a descriptor. Long enough for Prometheus' default 15 s scrape (and a head's 1 s
# reads) to reuse their connection; slower scrapers connect again, which costs less than
# a stalled client's descriptor. Under pressure the guard closes idle ones sooner.
KEEPALIVE_S = 20.0
# Watches one peer may hold open: a head holds one per agent (a second while it reopens
# one), several heads behind one NAT a few more.
WATCHES_PER_PEER = 4


def not_served(node: str, snapshot: FleetSnapshot) -> web.Response:
    """404 for a node this agent does not serve, naming those it does: a head that calls
    the node otherwise learns the agent's name from it (sources.agents)."""
    served = [n.node for n in snapshot.nodes]
    body = {"error": f"no node {node!r} here", "nodes": served}
    return web.Response(status=404, text=json.dumps(body) + "\n", content_type="application/json")


def select(snapshot: FleetSnapshot, node: str | None, *, summary: bool) -> FleetSnapshot:
    """The snapshot cut to one node (when it is served here) and, for fleets, summarized;
    each node with its verdict, judged here where every detail is, so that a head reading
    a thousand nodes need not judge them again from their summaries (a summary's verdict
    holds its words while only they move: facts.verdict.WORDS_HELD_S)."""
    nodes = snapshot.nodes
    if node is not None and any(n.node == node for n in nodes):
        nodes = tuple(n for n in nodes if n.node == node)
    nodes = tuple(carry_verdict(n, hold=summary) for n in nodes)
    if summary:
        nodes = tuple(summarize(n) for n in nodes)
    names = {n.node for n in nodes}
    events = tuple(e for e in snapshot.events if e.node in names)
    counts = tuple(c for c in snapshot.event_counts if c[0] in names)
    return msgspec.structs.replace(snapshot, nodes=nodes, events=events, event_counts=counts)


def snapshot_body(
    snapshot: FleetSnapshot,
    node: str | None,
    *,
    summary: bool,
    have: Mapping[str, str] | None = None,
) -> bytes:
    """The JSON body served for a snapshot; the summary sparse, as a thousand nodes need.

    `have`: the parts (BMC, fabric, tenancy) a head holds of the node it asked for, by
    version. Then the node says each part's version, and leaves out ("kept") those the
    head holds as they are, with when each was read ("kept_at"); a head that sends no
    `have` gets the body it always did.
    """
    selected = select(snapshot, node, summary=summary)
    if have is None or len(selected.nodes) != 1 or selected.nodes[0].node != node:
        return dumps(selected, sparse=summary).encode()
    document = snapshot_json(selected, sparse=summary)
    served, body = selected.nodes[0], document["nodes"][0]
    whole = snapshot.node(node)
    assert whole is not None  # served: selected found it
    versions = part_versions(whole, summary=summary)
    kept = [part for part, version in versions.items() if have.get(part) == version]
    for part in kept:
        body.pop(part, None)
    body["versions"] = versions
    if kept:
        body["kept"] = kept
        # read again since, finding what the head holds: when, which the head takes
        body["kept_at"] = {part: getattr(served, part).at for part in kept}
    return json.dumps(document, allow_nan=False).encode()


# A node's 25 KB summary packs to 3.6 KB in 0.2 ms, once per snapshot (rendering it takes
# 3 ms): level 1 would save 0.14 ms of that and send 18% more bytes.
GZIP_LEVEL = 6


@dataclass(slots=True)
class Body:
    """One rendered JSON body and its validator; gzipped at most once, however many
    clients ask for it."""

    raw: bytes
    etag: str
    _packed: bytes | None = field(default=None, repr=False)

    def packed(self) -> bytes:
        if self._packed is None:
            self._packed = gzip.compress(self.raw, GZIP_LEVEL, mtime=0)
        return self._packed


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header takes gzip: named, or else `*`, at a quality above 0."""
    qualities: dict[str, float] = {}
    for item in accept_encoding.split(","):
        name, *params = (part.strip().lower() for part in item.split(";"))
        quality = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    quality = float(param[2:])
                except ValueError:
                    quality = 0.0
        qualities[name] = quality
    return qualities.get("gzip", qualities.get("*", 0.0)) > 0


def holds(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names `etag` (weak comparison, as RFC 9110 asks)."""
    if not if_none_match:
        return False
    tag = etag.removeprefix("W/")
    return any(
        given.strip() == "*" or given.strip().removeprefix("W/") == tag
        for given in if_none_match.split(",")
    )


def respond(body: Body, request: web.Request) -> web.Response:
    """`body` as `request` asks for it: 304 when the client holds it already, gzip when the
    client takes gzip, JSON otherwise."""
    headers = {"ETag": body.etag, "Vary": "Accept-Encoding", "Cache-Control": "no-cache"}
    if holds(request.headers.get("If-None-Match"), body.etag):
        return web.Response(status=304, headers=headers)
    if accepts_gzip(request.headers.get("Accept-Encoding", "")):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=body.packed(), headers=headers, content_type="application/json")
    return web.Response(body=body.raw, headers=headers, content_type="application/json")


def basic_auth_holds(header: str, user: str, password: str) -> bool:
    """Whether an Authorization header gives `user` and `password` (RFC 7617, in UTF-8).

    Compared as bytes, in constant time: any byte a client sends is a wrong guess at worst
    (hmac.compare_digest refuses str with non-ASCII characters)."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        given = base64.b64decode(token.strip(), validate=True)
    except ValueError:
        return False
    given_user, _, given_password = given.partition(b":")
    same_user = hmac.compare_digest(given_user, user.encode())
    return hmac.compare_digest(given_password, password.encode()) & same_user


class _Encrypted(Exception):
    """The TLS key asked for a password: the agent has none to give."""


def _no_password() -> bytes:
    raise _Encrypted


def tls_context(settings: AgentSettings) -> ssl.SSLContext | None:
    """The server's TLS context from [agent] tls_cert and tls_key (None without them);
    ConfigError naming the file and what is wrong with it."""
    cert, key = settings.tls_cert, settings.tls_key
    if cert is None:
        return None
    key = key or cert  # one PEM file may hold both
    for what, path in (("tls_cert", cert), ("tls_key", key)):
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"[agent] {what} {path}: cannot read: {exc.strerror}") from None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ssl.create_default_context().load_verify_locations(cafile=cert)
    except (ssl.SSLError, ValueError):
        raise ConfigError(f"[agent] tls_cert {cert}: holds no PEM certificate") from None
    try:
        # without a password callback, OpenSSL would ask for one on the terminal
        context.load_cert_chain(cert, key, password=_no_password)
    except _Encrypted:
        raise ConfigError(
            f"[agent] tls_key {key}: the key is encrypted; give the agent an unencrypted "
            "key (mode 0600)"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(f"[agent] tls_key {key}: not the key of tls_cert {cert}") from None
        raise ConfigError(f"[agent] tls_key {key}: holds no PEM private key") from None
    return context


CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class Agent:
    """Serves one hub over HTTP."""

    def __init__(self, hub: Hub, settings: AgentSettings) -> None:
        self.hub = hub
        self.settings = settings
        self.metrics = MetricsCache(lambda: hub.latest)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        # the loop's own exception handler, put back when the agent stops
        self._loop_errors: tuple[asyncio.AbstractEventLoop, LoopErrors | None] | None = None
        self.guard = ConnectionGuard(connection_limit(), clients_log, handshake_s=KEEPALIVE_S)
        self.port: int | None = None
        # The bodies rendered from the latest snapshot, by (view, node served): heads that
        # read one node each share one rendering, and its gzip.
        self._bodies: dict[tuple[str, str | None, tuple[str, ...] | None], Body] = {}
        self._bodies_seq: int | None = None
        # An ETag names one rendering by one process: a restarted agent matches none it gave.
        self._boot = secrets.token_hex(4)
        self._renders = itertools.count()
        self._ahead: dict[str, asyncio.TimerHandle] = {}  # by peer: a render before its scrape
        # watches wait on these: the next publish, and the agent stopping
        self._published = asyncio.Event()
        self._stopping = asyncio.Event()
        self._closing = False
        self._unsubscribe = hub.subscribe(self._on_publish)
        # open watches by peer: each holds a connection for as long as its head runs, so a
        # peer past its share, or all of them past half the connections, is answered as a
        # poll (a head then polls), and scrapes and other heads keep their connections
        self._watching: collections.Counter[str] = collections.Counter()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._track, self._auth])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/v1/snapshot", self._snapshot)
        app.router.add_get("/-/healthy", self._healthy)
        app.router.add_get("/-/ready", self._ready)
        app.router.add_get("/", self._index)
        return app

    @web.middleware
    async def _track(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Tell the guard a request is in progress on this connection (not one to push out)."""
        transport = request.transport
        self.guard.request_started(transport)
        try:
            return await handler(request)
        finally:
            self.guard.request_ended(transport)

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        user, password = self.settings.basic_auth_user, self.settings.basic_auth_password
        if user is None or request.path == "/-/healthy":
            return await handler(request)
        if not basic_auth_holds(request.headers.get("Authorization", ""), user, password or ""):
            return web.Response(
                status=401, text="unauthorized\n",
                headers={"WWW-Authenticate": 'Basic realm="gpuconsole", charset="UTF-8"'},
            )  # fmt: skip
        return await handler(request)

    async def _metrics(self, request: web.Request) -> web.Response:
        peer = request.remote or ""
        body = self.metrics.render(peer)
        at = self.metrics.ahead_at(peer) if peer else None
        if at is not None:
            self._render_ahead(peer, at)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_METRICS})

    def _render_ahead(self, peer: str, at: float) -> None:
        """Render the newest snapshot at `at` (the cache's clock), just before `peer` scrapes
        again."""
        old = self._ahead.pop(peer, None)
        if old is not None:
            old.cancel()

        def fire() -> None:
            self._ahead.pop(peer, None)
            self.metrics.render_ahead()

        delay = max(0.0, at - self.metrics.clock())
        self._ahead[peer] = asyncio.get_running_loop().call_later(delay, fire)

    async def _snapshot(self, request: web.Request) -> web.StreamResponse:
        """The JSON snapshot; ?view=summary for the fleet view, ?node=NAME for one node;
        ?watch=SECONDS streams it (readings.agents.WATCH_TYPE)."""
        snapshot = self.hub.latest
        if snapshot is None:
            return web.Response(status=503, text="no snapshot yet\n")
        view = request.query.get("view", "full")
        if view not in ("full", "summary"):
            return web.Response(status=400, text="view must be full or summary\n")
        node = request.query.get("node")
        if node is not None and snapshot.node(node) is None:
            return not_served(node, snapshot)
        have = request.query.get("have")
        held = held_parts(have) if have is not None and node is not None else None
        watch = request.query.get("watch")
        if watch is not None:
            try:
                period = float(watch)
            except ValueError:
                period = float("nan")
            if not WATCH_MIN_S <= period <= WATCH_MAX_S:
                return web.Response(
                    status=400,
                    text=f"watch must be seconds from {WATCH_MIN_S:g} to {WATCH_MAX_S:g}\n",
                )
            peer = request.remote or ""
            if (
                self._watching[peer] < WATCHES_PER_PEER
                and self._watching.total() < self.guard.limit // 2
            ):
                self._watching[peer] += 1
                try:
                    return await self._watch(request, view, node, held, period)
                finally:
                    self._watching[peer] -= 1
                    if not self._watching[peer]:
                        del self._watching[peer]
        asked = request.headers.get("If-None-Match")
        if asked and held is not None:
            # a head that holds any rendering of this snapshot's node holds what is current,
            # whichever parts it said it had when it read it
            self._current_bodies(snapshot)
            current = next(
                (
                    b
                    for k, b in self._bodies.items()
                    if k[:2] == (view, node) and holds(asked, b.etag)
                ),
                None,
            )
            if current is not None:
                return respond(current, request)
        return respond(self._body(snapshot, view, node, held), request)

    def _current_bodies(self, snapshot: FleetSnapshot) -> None:
        if self._bodies_seq != snapshot.seq:
            self._bodies.clear()
            self._bodies_seq = snapshot.seq

    def _body(
        self, snapshot: FleetSnapshot, view: str, node: str | None, held: dict[str, str] | None
    ) -> Body:
        """The rendering of `snapshot` for a head holding `held`: by what it holds as it is,
        not by its versions, so heads holding the same parts share a rendering."""
        self._current_bodies(snapshot)
        kept = None
        if held is not None:
            served = snapshot.node(node) if node is not None else None
            versions = part_versions(served, summary=view == "summary") if served else {}
            kept = tuple(part for part, v in versions.items() if held.get(part) == v)
        key = (view, node, kept)
        body = self._bodies.get(key)
        if body is None:
            raw = snapshot_body(snapshot, node, summary=view == "summary", have=held)
            etag = f'W/"{self._boot}-{next(self._renders)}"'
            body = self._bodies[key] = Body(raw, etag)
        return body

    async def _watch(
        self,
        request: web.Request,
        view: str,
        node: str | None,
        held: dict[str, str] | None,
        period: float,
    ) -> web.StreamResponse:
        """Stream the snapshot: a frame when it changes (at most one in `period`), a beat
        when it has not for half a period more. What the head holds is what this
        connection sent it last; a node no longer served ends the stream."""
        packed = accepts_gzip(request.headers.get("Accept-Encoding", ""))
        response = web.StreamResponse(
            headers={"Content-Type": WATCH_TYPE, "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        sent: int | None = None
        try:
            while not self._closing:
                snapshot = self.hub.latest
                if snapshot is None or (node is not None and snapshot.node(node) is None):
                    break
                if snapshot.seq == sent:
                    await response.write(BEAT)
                else:
                    body = self._body(snapshot, view, node, held)
                    payload = body.packed() if packed else body.raw
                    await response.write(frame(payload, packed=packed))
                    sent = snapshot.seq
                    served = snapshot.node(node) if node is not None else None
                    if held is not None and served is not None:
                        held = part_versions(served, summary=view == "summary")
                await self._news(period)
                latest = self.hub.latest
                if latest is not None and latest.seq == sent:
                    await self._news(period / 2, published=True)
        except ConnectionError:  # the head went away
            return response
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    async def _news(self, seconds: float, *, published: bool = False) -> None:
        """Wait `seconds`; with `published`, only until the hub publishes. Either ends when
        the agent stops."""
        wake = self._published if published else self._stopping
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), seconds)

    def _on_publish(self, snapshot: FleetSnapshot) -> None:
        # every watcher waiting for news wakes; the next wait is on a fresh event
        woken, self._published = self._published, asyncio.Event()
        woken.set()
        if self._closing:
            self._published.set()

    async def _healthy(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _ready(self, request: web.Request) -> web.Response:
        snapshot = self.hub.latest
        ready = snapshot is not None and all(
            status.polls > 0 for node in snapshot.nodes for status in node.statuses
        )
        return web.Response(
            status=200 if ready else 503, text="ready\n" if ready else "not ready\n"
        )

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(
            text="gpuconsole agent: /metrics /api/v1/snapshot /-/healthy /-/ready\n"
        )

    async def start(self) -> None:
        """Listen; `port` holds the bound port (useful when 0 was asked for)."""
        context = tls_context(self.settings)
        self.guard.tls = context  # the guard runs the handshakes, so it can end stalled ones
        loop = asyncio.get_running_loop()
        self._loop_errors = (loop, loop.get_exception_handler())
        loop.set_exception_handler(quiet_loop_errors(clients_log))
        self._runner = web.AppRunner(
            self.app(), access_log=None, keepalive_timeout=KEEPALIVE_S, logger=clients_log
        )
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        self._listener = await loop.create_server(
            self.guard.factory(server),
            self.settings.host,
            self.settings.port,
            backlog=BACKLOG,
        )
        sockets = self._listener.sockets
        self.port = sockets[0].getsockname()[1] if sockets else self.settings.port
        scheme = "https" if context is not None else "http"
        log.info(
            "agent listening on %s://%s:%s (at most %d connections)",
            scheme, self.settings.host, self.port, self.guard.limit,
        )  # fmt: skip

    async def stop(self) -> None:
        self._closing = True  # every watch ends, so the server's shutdown waits for none
        self._unsubscribe()
        self._stopping.set()
        self._published.set()
        for handle in self._ahead.values():
            handle.cancel()
        self._ahead.clear()
        if self._listener is not None:
            self._listener.close()
        self.guard.close_all()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
        if self._loop_errors is not None:
            loop, handler = self._loop_errors
            loop.set_exception_handler(handler)
            self._loop_errors = None


async def serve(hub: Hub, settings: AgentSettings) -> None:
    """Run the hub and the agent until cancelled."""
    agent = Agent(hub, settings)
    try:
        # listening first: a port in use or a bad TLS key stops it before any source starts
        await agent.start()
        await hub.start()
        await asyncio.Event().wait()
    finally:
        await agent.stop()
        await hub.stop()
