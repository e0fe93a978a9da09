"""The agent's HTTP server: /metrics, /api/v1/snapshot, /-/healthy and /-/ready.

It serves what the hub already holds; no request ever polls hardware, and for a scraper
with a steady period the body is rendered just before it comes (see MetricsCache).
Optional TLS and HTTP basic auth (the password compared in constant time, never logged).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gzip
import hmac
import itertools
import logging
import secrets
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from gpuconsole.codec import dumps
from gpuconsole.export.collector import MetricsCache
from gpuconsole.hub import Hub
from gpuconsole.readings.agents import summarize
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.wiring import AgentSettings

log = logging.getLogger(__name__)


def select(snapshot: FleetSnapshot, node: str | None, *, summary: bool) -> FleetSnapshot:
    """The snapshot cut to one node (when it is served here) and, for fleets, summarized."""
    nodes = snapshot.nodes
    if node is not None and any(n.node == node for n in nodes):
        nodes = tuple(n for n in nodes if n.node == node)
    if summary:
        nodes = tuple(summarize(n) for n in nodes)
    names = {n.node for n in nodes}
    events = tuple(e for e in snapshot.events if e.node in names)
    counts = tuple(c for c in snapshot.event_counts if c[0] in names)
    return dataclasses.replace(snapshot, nodes=nodes, events=events, event_counts=counts)


def snapshot_body(snapshot: FleetSnapshot, node: str | None, *, summary: bool) -> bytes:
    """The JSON body served for a snapshot; the summary sparse, as a thousand nodes need."""
    return dumps(select(snapshot, node, summary=summary), sparse=summary).encode()


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


CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class Agent:
    """Serves one hub over HTTP."""

    def __init__(self, hub: Hub, settings: AgentSettings) -> None:
        self.hub = hub
        self.settings = settings
        self.metrics = MetricsCache(lambda: hub.latest)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        # The bodies rendered from the latest snapshot, by (view, node served): heads that
        # read one node each share one rendering, and its gzip.
        self._bodies: dict[tuple[str, str | None], Body] = {}
        self._bodies_seq: int | None = None
        # An ETag names one rendering by one process: a restarted agent matches none it gave.
        self._boot = secrets.token_hex(4)
        self._renders = itertools.count()
        self._ahead: dict[str, asyncio.TimerHandle] = {}  # by peer: a render before its scrape

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/v1/snapshot", self._snapshot)
        app.router.add_get("/-/healthy", self._healthy)
        app.router.add_get("/-/ready", self._ready)
        app.router.add_get("/", self._index)
        return app

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        user, password = self.settings.basic_auth_user, self.settings.basic_auth_password
        if user is None or request.path == "/-/healthy":
            return await handler(request)
        header = request.headers.get("Authorization", "")
        ok = False
        if header.startswith("Basic "):
            try:
                given = base64.b64decode(header[6:], validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                given = ""
            given_user, _, given_password = given.partition(":")
            ok = hmac.compare_digest(given_user, user) & hmac.compare_digest(
                given_password, password or ""
            )
        if not ok:
            return web.Response(
                status=401, text="unauthorized\n",
                headers={"WWW-Authenticate": 'Basic realm="gpuconsole"'},
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

    async def _snapshot(self, request: web.Request) -> web.Response:
        """The JSON snapshot; ?view=summary for the fleet view, ?node=NAME for one node."""
        snapshot = self.hub.latest
        if snapshot is None:
            return web.Response(status=503, text="no snapshot yet\n")
        view = request.query.get("view", "full")
        if view not in ("full", "summary"):
            return web.Response(status=400, text="view must be full or summary\n")
        node = request.query.get("node")
        if node is not None and snapshot.node(node) is None:
            node = None  # served as the whole snapshot, as select() does
        if self._bodies_seq != snapshot.seq:
            self._bodies.clear()
            self._bodies_seq = snapshot.seq
        body = self._bodies.get((view, node))
        if body is None:
            raw = snapshot_body(snapshot, node, summary=view == "summary")
            etag = f'W/"{self._boot}-{next(self._renders)}"'
            body = self._bodies[(view, node)] = Body(raw, etag)
        return respond(body, request)

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

    def _ssl(self) -> ssl.SSLContext | None:
        cert, key = self.settings.tls_cert, self.settings.tls_key
        if cert is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context

    async def start(self) -> None:
        """Listen; `port` holds the bound port (useful when 0 was asked for)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.settings.host, self.settings.port, ssl_context=self._ssl()
        )
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self.settings.port
        scheme = "https" if self.settings.tls_cert else "http"
        log.info("agent listening on %s://%s:%s", scheme, self.settings.host, self.port)

    async def stop(self) -> None:
        for handle in self._ahead.values():
            handle.cancel()
        self._ahead.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve(hub: Hub, settings: AgentSettings) -> None:
    """Run the hub and the agent until cancelled."""
    await hub.start()
    agent = Agent(hub, settings)
    try:
        await agent.start()
        await asyncio.Event().wait()
    finally:
        await agent.stop()
        await hub.stop()
