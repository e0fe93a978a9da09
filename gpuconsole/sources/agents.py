"""The agent source: a node read through its agent's JSON snapshot, over HTTP.

Many nodes share one client with a bound on open connections; each node is its own
source, so the hub gives each its own timeout, backoff and staleness, and an unreachable
agent never delays the others. Events the agent recorded are re-posted here once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import math
import operator
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol
from urllib.parse import quote

import aiohttp
import msgspec
from yarl import URL

from gpuconsole.codec import (
    DecodeError,
    Partial,
    decode,
    finish_partial,
    parse_json,
    partial_type,
    read_field,
    read_partial,
    refused,
    safe_body,
)
from gpuconsole.config import DEFAULTS
from gpuconsole.readings.agents import (
    FRAME_HEADER_MAX,
    STEADY_PARTS,
    WATCH_MAX_S,
    WATCH_MIN_S,
    WATCH_TYPE,
    AgentReading,
    have_query,
    held_parts,
)
from gpuconsole.readings.base import SCHEMA_VERSION, Event, SourceStatus, safe_text
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.verdict import Action, CarriedVerdict
from gpuconsole.sources.base import EmitEvent
from gpuconsole.sources.targets import FleetMember

MAX_BODY_BYTES = 8 * 1024 * 1024
REASON_BYTES = 4096  # of an error's body: a line says why
# Objects allocated, less those freed, before CPython's collector looks for cycles.
YOUNG_OBJECTS = 50_000


def quiet_collector() -> None:
    """Let the cycle collector run only when objects pile up, not as readings are replaced.

    A head keeps every node's latest reading: with a thousand nodes, some 300,000 objects
    whose million references a full collection walks (0.2 to 0.4 s each). Readings hold
    no cycles and refcounting frees each one the moment its successor lands, yet every 700
    new objects start a collection (the default), and a thousand readings a second add up
    to a full one about once a second: 40% of the head's CPU in bench_fleet. Raised, the
    count of objects allocated less those freed stays below it while nodes are replaced.
    """
    young, middle, old = gc.get_threshold()
    if young < YOUNG_OBJECTS:
        gc.set_threshold(YOUNG_OBJECTS, middle, old)


@dataclass(frozen=True, slots=True)
class Answer:
    """A peer's answer to a GET: its body, or None where the copy asked about is current."""

    body: bytes | None
    etag: str | None = None


class AgentClient:
    """One HTTP client for every agent of a fleet, with a cap on open connections."""

    def __init__(
        self,
        max_connections: int = DEFAULTS.fleet.max_connections,
        *,
        auth: tuple[str, str] | None = None,
    ) -> None:
        self.max_connections = max_connections
        self._auth = aiohttp.BasicAuth(*auth) if auth else None
        self._session: aiohttp.ClientSession | None = None
        self._watches: aiohttp.ClientSession | None = None  # one connection per watch
        # Requests wait for a connection here, in order: aiohttp's connector would shuffle
        # every waiting host on each connection released (a thousand, on a busy head).
        self._slots = asyncio.Semaphore(max_connections)
        self._users = 0

    def acquire(self) -> None:
        self._users += 1

    async def release(self) -> None:
        self._users -= 1
        if self._users <= 0:
            for session in (self._session, self._watches):
                if session is not None:
                    await session.close()
            self._session = self._watches = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._slots = asyncio.Semaphore(self.max_connections)  # of this session's loop
            connector = aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=300)
            # no timeout of aiohttp's own: get() times the wait for a connection as well.
            # Bodies are inflated here, in one call (aiohttp's inflating as it reads costs a
            # head polling a thousand agents twice that), and no peer sets a cookie.
            self._session = aiohttp.ClientSession(
                connector=connector,
                auth=self._auth,
                timeout=aiohttp.ClientTimeout(),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def get(
        self,
        url: str | URL,
        timeout_s: float,
        *,
        peer: str = "agent",
        limit: int = MAX_BODY_BYTES,
        etag: str | None = None,
    ) -> Answer:
        """GET `url` (gzip when the peer offers it); with the `etag` of a copy held, no body
        when the peer says that copy is current. Errors say what went wrong in a line,
        naming the `peer`; TimeoutError after `timeout_s`, waiting for a connection included."""
        session = self._client()
        headers = {"Accept-Encoding": "gzip", "If-None-Match": etag} if etag else _GZIP
        try:
            async with asyncio.timeout(timeout_s), self._slots:
                async with session.get(url, headers=headers) as response:
                    return await _answer(response, peer, limit, etag, packed=True)
        except aiohttp.ClientConnectorError as exc:
            raise ConnectionError(f"{peer} unreachable: {exc.os_error or exc}") from None
        except aiohttp.ClientError as exc:
            raise ConnectionError(f"{peer} connection failed: {exc}") from None

    async def watch(
        self, url: str | URL, timeout_s: float, *, peer: str = "agent", limit: int = MAX_BODY_BYTES
    ) -> aiohttp.ClientResponse | Answer:
        """Ask `url` (with its `watch`) to stream: the open response where the peer streams
        frames (the caller reads them, and closes it), else the peer's plain answer, as
        get() gives it (a peer that does not stream). A stream holds a connection of its
        own, beyond the cap on connections that polls share; it waits for a slot only to
        connect."""
        session = self._watch_client()
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(timeout_s):
                async with self._slots:
                    response = await session.get(url)
                if response.status == 200 and response.content_type == WATCH_TYPE:
                    return response
                try:
                    return await _answer(response, peer, limit, None, packed=False)
                finally:
                    response.release()
        except aiohttp.ClientConnectorError as exc:
            raise ConnectionError(f"{peer} unreachable: {exc.os_error or exc}") from None
        except aiohttp.ClientError as exc:
            raise ConnectionError(f"{peer} connection failed: {exc}") from None
        except BaseException:
            if response is not None:
                response.close()
            raise

    def _watch_client(self) -> aiohttp.ClientSession:
        if self._watches is None or self._watches.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._watches = aiohttp.ClientSession(
                connector=connector, auth=self._auth, timeout=aiohttp.ClientTimeout()
            )
        return self._watches

    async def get_json(
        self, url: str | URL, timeout_s: float, *, peer: str = "agent", limit: int = MAX_BODY_BYTES
    ) -> Any:
        """GET a JSON document (gzip when the peer offers it); errors say what went wrong
        in a line, naming the `peer`."""
        answer = await self.get(url, timeout_s, peer=peer, limit=limit)
        assert answer.body is not None  # asked without an etag
        return _json(answer.body, peer)


class NotFound(ConnectionError):
    """The peer answered 404: it has no such thing (an agent: no such node)."""


_GZIP = {"Accept-Encoding": "gzip"}


async def _answer(
    response: aiohttp.ClientResponse, peer: str, limit: int, etag: str | None, *, packed: bool
) -> Answer:
    """A response read as get() answers: its body, None for a copy still current, errors
    saying in a line what went wrong. `packed`: the body is as the peer sent it (gzip where
    it says so), not inflated by aiohttp."""
    if response.status == 304 and etag:
        return Answer(None, etag)
    if response.status == 404:
        raise NotFound(f"{peer} answered HTTP 404: {await _reason(response, packed)}")
    if response.status != 200:
        reason = await _reason(response, packed)
        raise ConnectionError(f"{peer} answered HTTP {response.status}: {reason}")
    body = await read_body(response, limit + 1)
    if len(body) > limit:
        raise ValueError(f"{peer} sent more than {limit} bytes")
    encoding = response.headers.get("Content-Encoding", "identity") if packed else "identity"
    if encoding.strip().lower() == "gzip":
        body = _gunzip(body, peer, limit)
    elif encoding.strip().lower() != "identity":
        raise ValueError(f"{peer} sent its body as {safe_text(encoding)[:40]}, asked for gzip")
    return Answer(body, response.headers.get("ETag"))


async def _reason(response: aiohttp.ClientResponse, packed: bool) -> str:
    """The start of an error's body, as text: what a line can say of why."""
    said = await read_body(response, REASON_BYTES)
    if packed and response.headers.get("Content-Encoding", "").strip().lower() == "gzip":
        try:
            said = zlib.decompressobj(wbits=31).decompress(said, REASON_BYTES)
        except zlib.error:
            said = b""
    return said.decode("utf-8", "replace")[:200].strip()


def _gunzip(body: bytes, peer: str, limit: int, what: str = "body") -> bytes:
    """A gzip `what` (a body, a frame) inflated, no more than `limit` bytes; ValueError for
    what does not inflate whole."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise ValueError(f"{peer} sent a gzip {what} that does not inflate") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise ValueError(f"{peer} sent a {what} that inflates to more than {limit} bytes")
    if not inflater.eof:
        raise ValueError(f"{peer} sent a gzip {what} cut short")
    return out


def _json(body: bytes, peer: str) -> Any:
    try:
        return parse_json(body)
    except DecodeError as exc:  # "not JSON: why"
        raise ValueError(f"{peer} sent something that is {exc}") from None


async def read_body(response: aiohttp.ClientResponse, most: int) -> bytes:
    """The body, up to `most` bytes: one read returns only what has arrived so far."""
    body = bytearray()
    while len(body) < most:
        chunk = await response.content.read(most - len(body))
        if not chunk:
            break
        body += chunk
    return bytes(body)


class AgentSource:
    """One node, read from its agent (`gpuconsole agent`) at `url`."""

    kind: ClassVar[str] = "remote"  # the name statuses, stale marks and metrics show
    # it holds no thread: the hub may cancel a poll at its timeout, and awaits it in place
    cancellable: ClassVar[bool] = True

    def __init__(
        self,
        node: str,
        url: str,
        client: AgentClient,
        *,
        interval_s: float = DEFAULTS.fleet.interval_s,
        timeout_s: float = DEFAULTS.fleet.timeout_s,
        summary: bool = True,
        watch: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        # the name the agent calls the node by, where this head calls it otherwise (its
        # config named it so): learnt from the agent's answer to the head's own name
        self.asks = node
        self.url = url.rstrip("/")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.summary = summary
        # the console is drilling into this node: read everything, not the summary
        self.detail = False
        self._client = client
        self._clock = clock
        self._emit: EmitEvent | None = None
        self._seen_events: float | None = None
        # part -> (its JSON's length and hash, decoded)
        self._last_verdict: (
            tuple[tuple[int, int, tuple[bool, ...]], CarriedVerdict | None] | None
        ) = None
        self._last_parts: dict[str, tuple[tuple[int, int], Any]] = {}
        # part -> (view, version, decoded): what the agent need not send again while current
        self._versions: dict[str, tuple[str, str, Any]] = {}
        self._urls: dict[tuple[str, str], URL] = {}  # by view and parts held, parsed once
        # what the agent last sent, to ask whether it is still current: (view, ETag, reading)
        self._held: tuple[str, str, AgentReading] | None = None
        # Read the summary through a watch where the agent streams one: a frame read costs
        # the head a fraction of a request and its answer. False once the agent answers
        # the watch as a poll (an agent of the previous version): it is polled from then.
        self.watch = watch
        self._stream: aiohttp.ClientResponse | None = None
        self._frames = bytearray()  # what the stream sent beyond its last whole frame
        self._watched: AgentReading | None = None  # the last reading it sent: a beat renews it
        client.acquire()

    async def start(self, emit: EmitEvent) -> None:
        self._emit = emit

    async def close(self) -> None:
        self._end_watch()
        await self._client.release()

    def _view(self) -> str:
        return "summary" if self.summary and not self.detail else "full"

    def _request_url(self) -> URL:
        view = self._view()
        have = have_query({p: v for p, (seen, v, _) in self._versions.items() if seen == view})
        url = self._urls.get((view, have))
        if url is None:
            if len(self._urls) > 64:  # versions come and go: keep only the latest few
                self._urls.clear()
            url = self._urls[(view, have)] = URL(
                f"{self.url}/api/v1/snapshot?view={view}&node={quote(self.asks)}"
                f"&have={quote(have, safe=':,')}"
            )
        return url

    async def poll(self) -> AgentReading:
        started = time.monotonic()
        try:
            return await self._read(self.timeout_s * 0.9)
        except NotFound:
            await self._learn_name(self.timeout_s * 0.45)
            left = self.timeout_s * 0.9 - (time.monotonic() - started)
            return await self._read(max(left, 0.01))

    async def _read(self, timeout_s: float) -> AgentReading:
        if self.watch and self._view() == "summary":
            started = time.monotonic()
            try:
                return await self._next_watched(timeout_s)
            except _Unanswered:
                timeout_s -= time.monotonic() - started
        self._end_watch()  # drilling in: the whole node, polled
        return await self._poll(max(timeout_s, 0.01))

    async def _next_watched(self, timeout_s: float) -> AgentReading:
        """The newest reading the watch has sent (waiting for the next where none came
        since the last poll); the watch is opened first where none is, and again at once
        where one that has served before ended (an agent restarted). Whatever else goes
        wrong ends the watch, and a later poll opens another."""
        if self._stream is not None:
            # a frame has come since the last poll, as it does at 1 Hz: taken with no timer
            # of its own (the hub times the poll, and a thousand timers a second cost)
            try:
                arrived = self._newest_frame(self._stream)
            except (ConnectionError, aiohttp.ClientError):
                arrived = None
                self._end_watch()  # it served before: opened again below
            except BaseException:
                self._end_watch()
                raise
            if arrived is not None:
                return self._watched_reading(*arrived)
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    fresh = self._stream is None
                    if self._stream is None:
                        every = min(max(self.interval_s, WATCH_MIN_S), WATCH_MAX_S)
                        url = URL(f"{self._request_url()}&watch={every:g}")
                        try:
                            opened = await self._client.watch(url, timeout_s / 2)
                        except TimeoutError:
                            # unanswered: a proxy before the agent may hold the stream back
                            # to send it whole. Polled from now on, as agents that do not
                            # stream.
                            self.watch = False
                            raise _Unanswered from None
                        if isinstance(opened, Answer):  # it does not stream: polled from now on
                            self.watch = False
                            assert opened.body is not None  # asked without an etag
                            return self._took(opened.body, opened.etag)
                        self._stream = opened
                    try:
                        kind, payload = await self._next_frame(self._stream)
                        break
                    except (ConnectionError, aiohttp.ClientError) as exc:
                        self._end_watch()
                        if fresh:
                            raise ConnectionError(f"agent's watch broke off: {exc}") from None
        except TimeoutError:
            streaming = self._stream is not None
            self._end_watch()
            if streaming:
                raise ConnectionError(
                    f"agent's watch stalled: no whole frame within {timeout_s:g} s"
                ) from None
            raise
        except BaseException:
            self._end_watch()
            raise
        return self._watched_reading(kind, payload)

    def _watched_reading(self, kind: bytes, payload: bytes) -> AgentReading:
        """The reading of a watch's frame: a beat renews what it sent last."""
        if not payload:  # a beat: what it sent last stands
            assert self._watched is not None
            return msgspec.structs.replace(self._watched, at=self._clock())
        try:
            body = _inflate(payload) if kind == b"gzip" else payload
            self._watched = self.parse(body)
        except ValueError:
            self._end_watch()
            raise
        return self._watched

    async def _next_frame(self, stream: aiohttp.ClientResponse) -> tuple[bytes, bytes]:
        """The newest whole frame that has arrived (older ones are passed over unread),
        else the next to arrive; a beat only where a reading has come before it."""
        while (newest := self._newest_frame(stream)) is None:
            chunk = await stream.content.readany()
            if not chunk:
                raise ConnectionError("it ended")
            self._frames += chunk
        return newest

    def _newest_frame(self, stream: aiohttp.ClientResponse) -> tuple[bytes, bytes] | None:
        """The newest whole frame that has arrived, older ones passed over unread; a beat
        only where a reading has come before it; None while none has."""
        frames = self._frames
        frames += stream.content.read_nowait(-1)
        newest: tuple[bytes, bytes] | None = None
        while (got := _take_frame(frames)) is not None:
            if got[1] or newest is None:
                newest = got
        if newest is not None and (newest[1] or self._watched is not None):
            return newest
        return None

    def _end_watch(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._frames.clear()
        self._watched = None

    async def _learn_name(self, timeout_s: float) -> None:
        """The agent serves no node by the head's name: where it serves one node, ask for
        that one by the agent's own name from now on; ValueError where it serves several."""
        served = await served_nodes(self._client, self.url, timeout_s)
        if len(served) != 1:
            listed = ", ".join(safe_text(n) for n in served[:8]) or "none"
            raise ValueError(f"agent at {self.url} does not serve node {self.node} ({listed})")
        self.asks = served[0]
        self._urls.clear()

    async def _poll(self, timeout_s: float) -> AgentReading:
        url, held, view = self._request_url(), self._held, self._view()
        etag = held[1] if held is not None and held[0] == view else None
        # the whole poll (connect, transfer, decode) must fit the hub's timeout
        answer = await self._client.get(url, timeout_s, etag=etag)
        if answer.body is None and held is not None:  # the agent has published nothing new
            return msgspec.structs.replace(held[2], at=self._clock())
        assert answer.body is not None
        return self._took(answer.body, answer.etag)

    def _took(self, body: bytes, etag: str | None) -> AgentReading:
        """The reading of a polled body, held by its ETag to ask whether it is current."""
        reading = self.parse(body)
        self._held = (self._view(), etag, reading) if etag else None
        return reading

    def parse(self, body: bytes) -> AgentReading:
        """The reading from an agent's document (its JSON body), and the events it recorded
        re-posted; ValueError says what does not fit."""
        try:
            body = safe_body(body)
            one = _one_node(body)
            if one is None or one.schema_version != SCHEMA_VERSION:
                document, nodes = _document(body)
        except (DecodeError, msgspec.DecodeError, RecursionError) as exc:
            refusal = exc if isinstance(exc, DecodeError) else refused(exc)
            if str(refusal).startswith("not JSON"):
                raise ValueError(f"agent sent something that is {refusal}") from None
            raise ValueError("agent sent JSON that is not an object") from None
        if one is not None and one.schema_version == SCHEMA_VERSION:
            # as every agent sends it: one node, read in the document's one pass
            where = f"{self.url} $.nodes[0]"
            try:
                node = finish_partial(NodeSnapshot, one.nodes[0], raw=_RAW, extra=_EXTRA)
                snapshot = self._decode(node, where)
            except DecodeError as exc:
                raise ValueError(f"agent sent a snapshot that does not fit: {exc}") from None
            return self._reading(snapshot, one, 1)
        version = document.schema_version
        if version != SCHEMA_VERSION:
            shown = safe_text(repr(version))[:40]
            raise ValueError(f"agent speaks schema {shown}, this console {SCHEMA_VERSION}")
        if not nodes:
            raise ValueError("agent sent no node")
        at = 0
        if len(nodes) > 1:  # the one this head asked for
            names = [_name(n) for n in nodes]
            at = next((i for i, n in enumerate(names) if n in (self.node, self.asks)), -1)
            if at < 0:
                raise ValueError(f"agent at {self.url} does not serve node {self.node}")
        where = f"{self.url} $.nodes[{at}]"
        try:  # a lone node is read under any name
            node = read_partial(NodeSnapshot, bytes(nodes[at]), where, raw=_RAW, extra=_EXTRA)
            snapshot = self._decode(node, where)
        except DecodeError as exc:
            raise ValueError(f"agent sent a snapshot that does not fit: {exc}") from None
        return self._reading(snapshot, document, len(nodes))

    def _reading(
        self, snapshot: NodeSnapshot, document: _Document | _Nodes | _OneNode, nodes: int
    ) -> AgentReading:
        """The reading of `snapshot`, read from `document` (of that many nodes), whose
        events are re-posted."""
        if self._emit is not None and bytes(document.events) not in (b"null", b"[]"):
            self._repost_events(document.events, nodes > 1)
        return AgentReading(self._clock(), self.url, snapshot, self.summary and not self.detail)

    def _decode(self, node: Partial, where: str) -> NodeSnapshot:
        """The node, reusing each part (BMC, fabric, tenancy) the agent left out as held, or
        sent exactly as last time.

        Those sources poll every few seconds, the head every second: comparing their JSON
        costs far less than decoding it again, and a part kept as the same object keeps
        what is remembered per reading (the owners of a node's GPUs) remembered.
        """
        fields = node.fields
        fields["verdict"] = self._verdict(node.raw.pop("verdict", None), where, fields["statuses"])
        view = self._view()
        kept, kept_at = node.extra["kept"], node.extra["kept_at"]
        for part in kept if isinstance(kept, list) else ():
            held = self._versions.get(part) if isinstance(part, str) else None
            if held is None or held[0] != view:
                raise DecodeError(f"{where}.kept: {safe_text(str(part))} is not held")
            fields[part] = _renewed(
                held[2], kept_at.get(part) if isinstance(kept_at, dict) else None
            )
        last_parts = {}
        for part, raw in node.raw.items():
            # by its length and hash: a thousand nodes' parts held whole would take 16 MB
            seen, last = (len(raw), hash(raw)), self._last_parts.get(part)
            value = last[1] if last is not None and last[0] == seen else None
            if value is None:
                value = read_field(NodeSnapshot, part, raw, where)
            fields[part] = value
            if value is not None:
                last_parts[part] = (seen, value)
        self._last_parts = last_parts
        # named as the head names the node, which its config may do otherwise than the agent
        fields["statuses"] = tuple(
            s if s.node == self.node else msgspec.structs.replace(s, node=self.node)
            for s in fields["statuses"]
        )
        snapshot = NodeSnapshot(**fields)
        versions = node.extra["versions"]
        sent = held_parts(
            ",".join(f"{p}:{v}" for p, v in versions.items() if isinstance(v, str))
            if isinstance(versions, dict)
            else ""
        )
        self._versions = {
            part: (view, version, getattr(snapshot, part))
            for part, version in sent.items()
            if getattr(snapshot, part) is not None
        }
        return snapshot

    def _verdict(
        self, raw: bytes | None, where: str, statuses: tuple[SourceStatus, ...]
    ) -> CarriedVerdict | None:
        """The verdict the agent sent: decoded apart from its node,
        so that one that does not fit costs the node that verdict alone (the head judges
        the node itself), never its readings. One sent as last time, with as many statuses
        as fresh, is the same object: what facts.verdict judges a node alike by."""
        if raw is None:
            self._last_verdict = None
            return None
        seen = (len(raw), hash(raw), tuple(map(_OK, statuses)))
        if self._last_verdict is not None and self._last_verdict[0] == seen:
            return self._last_verdict[1]
        verdict: CarriedVerdict | None
        try:
            verdict = read_field(NodeSnapshot, "verdict", raw, where)
        except DecodeError as exc:
            verdict = CarriedVerdict(Action.FIT, refused=f"it does not fit: {exc}")
        else:
            if verdict is not None and verdict.refused:
                refused = "it says it was refused, which only a head says"
                verdict = CarriedVerdict(Action.FIT, refused=refused)
        self._last_verdict = (seen, verdict)
        return verdict

    def _repost_events(self, raw: msgspec.Raw, several: bool) -> None:
        try:
            events = _EVENTS.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            return  # the events are no list: the node's reading stands without them
        assert self._emit is not None
        newest = seen = self._seen_events
        for item in events:
            if not isinstance(item, dict):
                continue
            if several and item.get("node") not in (None, self.node):
                continue
            at = item.get("at")
            if seen is not None and isinstance(at, int | float) and at <= seen:
                continue  # re-posted already: not decoded again
            try:
                event = decode(Event, {**item, "node": self.node}, "$.events[]")
            except DecodeError:
                continue  # one odd event never costs the node its reading
            if seen is not None and event.at <= seen:
                continue
            self._emit(event)
            newest = event.at if newest is None else max(newest, event.at)
        self._seen_events = newest


class _Unanswered(Exception):
    """The agent did not answer a watch."""


def _take_frame(frames: bytearray) -> tuple[bytes, bytes] | None:
    """The first whole frame of a watch's bytes, taken off them: (its kind, its payload;
    empty for a beat); None until one has arrived whole. ValueError for what is no frame,
    or one larger than a body may be."""
    end = frames.find(b"\n", 0, FRAME_HEADER_MAX)
    if end < 0:
        if len(frames) >= FRAME_HEADER_MAX:
            raise ValueError("agent's watch sent something that is not a frame")
        return None
    kind, _, length = bytes(frames[:end]).partition(b" ")
    if kind not in (b"json", b"gzip") or not (length.isdigit() and length.isascii()):
        raise ValueError("agent's watch sent something that is not a frame")
    size = int(length)
    if size > MAX_BODY_BYTES:
        raise ValueError(
            f"agent's watch sent a frame of {size} bytes, more than the {MAX_BODY_BYTES} "
            "a body may have"
        )
    if len(frames) < end + 1 + size:
        return None
    payload = bytes(frames[end + 1 : end + 1 + size])
    del frames[: end + 1 + size]
    return kind, payload


def _inflate(payload: bytes) -> bytes:
    """A gzip frame's JSON, no more than a body may have; ValueError for what does not
    inflate whole."""
    return _gunzip(payload, "agent's watch", MAX_BODY_BYTES, "frame")


class _Document(msgspec.Struct):
    """An agent's document as the head first reads it: each node is read on its own."""

    schema_version: Any = None
    nodes: msgspec.Raw = msgspec.Raw(b"null")
    events: msgspec.Raw = msgspec.Raw(b"null")


class _Named(msgspec.Struct):
    node: Any = None


class _Nodes(msgspec.Struct):
    """An agent's document whose nodes are a list, as every agent sends it: read in one pass."""

    schema_version: Any = None
    nodes: list[msgspec.Raw] = []
    events: msgspec.Raw = msgspec.Raw(b"null")


_DOCUMENT = msgspec.json.Decoder(_Document)
_NODES = msgspec.json.Decoder(list[msgspec.Raw])
_LISTED = msgspec.json.Decoder(_Nodes)
_NAMED = msgspec.json.Decoder(_Named)
_EVENTS = msgspec.json.Decoder(list[Any])
# what an agent's node carries beside the snapshot's fields
_EXTRA = ("kept", "versions", "kept_at")


def _renewed(part: Any, at: Any) -> Any:
    """A part held, as read again at `at` (an agent's `kept_at`: it found what it found
    before), where that is a time; as held otherwise (an agent of the previous version
    kept only a part read no later)."""
    if type(at) not in (int, float) or not math.isfinite(at) or at == part.at:
        return part
    return msgspec.structs.replace(part, at=float(at))


# read apart, as raw JSON: a part or verdict sent as before is not decoded again
_RAW = (*STEADY_PARTS, "verdict")
_OK = operator.attrgetter("ok")


@functools.cache
def _one_node_decoder() -> msgspec.json.Decoder[Any]:
    node = partial_type(NodeSnapshot, raw=_RAW, extra=_EXTRA)
    kind = msgspec.defstruct(
        "_OneNode",
        [
            ("schema_version", Any, None),
            ("nodes", tuple[node], ()),  # type: ignore[valid-type]
            ("events", msgspec.Raw, msgspec.Raw(b"null")),
        ],
    )
    return msgspec.json.Decoder(kind)


class _OneNode(Protocol):
    schema_version: Any
    nodes: tuple[Any]
    events: msgspec.Raw


def _one_node(body: bytes) -> _OneNode | None:
    """A document of one node that fits a snapshot, decoded in one pass; None for any
    other (several nodes, or any that does not fit): `_document` reads it apart, and says
    what does not fit."""
    try:
        document: _OneNode = _one_node_decoder().decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    return document if len(document.nodes) == 1 else None


def _document(body: bytes) -> tuple[_Document | _Nodes, list[msgspec.Raw]]:
    """An agent's document and its nodes, each still raw; no nodes where they are no list.
    msgspec's errors for a body that is no JSON object."""
    try:
        listed = _LISTED.decode(body)
    except msgspec.ValidationError:  # its nodes are no list, or it is no object: read apart
        document = _DOCUMENT.decode(body)
        try:
            return document, _NODES.decode(document.nodes)
        except (msgspec.DecodeError, RecursionError):
            return document, []
    return listed, listed.nodes


def _name(node: msgspec.Raw) -> Any:
    try:
        return _NAMED.decode(node).node
    except (msgspec.DecodeError, RecursionError):
        return None


async def served_nodes(client: AgentClient, url: str, timeout_s: float) -> list[str]:
    """The names of the nodes the agent at `url` serves, as it names them; a name that is
    not plain printable text is left out (it could neither be shown nor asked for)."""
    answer = await client.get(URL(f"{url.rstrip('/')}/api/v1/snapshot?view=summary"), timeout_s)
    assert answer.body is not None  # asked without an etag
    data = _json(answer.body, "agent")
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list):
        raise ValueError("agent sent no node")
    names = (n.get("node") for n in nodes if isinstance(n, dict))
    return [n for n in names if isinstance(n, str) and n and n.isprintable() and len(n) <= 253]


async def named_by_agents(members: list[FleetMember], timeout_s: float) -> list[FleetMember]:
    """Each member the operator left unnamed, named as its agent names its node (one member
    per node where the agent serves several); a member whose agent does not answer within
    `timeout_s`, or names a node another member already is, keeps the name it has."""
    unnamed = [m for m in members if not m.named]
    if not unnamed:
        return members
    client = AgentClient()
    client.acquire()
    try:
        answers = await asyncio.gather(
            *(served_nodes(client, m.url, timeout_s) for m in unnamed), return_exceptions=True
        )
    finally:
        await client.release()
    served = {
        m.url: names
        for m, names in zip(unnamed, answers, strict=True)
        if isinstance(names, list) and names
    }
    taken = {m.node for m in members if m.named}
    out: list[FleetMember] = []
    for member in members:
        names = (
            [n for n in served.get(member.url, ()) if n not in taken] if not member.named else []
        )
        if not names:
            taken.add(member.node)
            out.append(member)
            continue
        for name in names:
            taken.add(name)
            out.append(dataclasses.replace(member, node=name, named=True))
    return out


async def wait_closed(sources: list[AgentSource]) -> None:
    """Close every source (and so the shared client)."""
    await asyncio.gather(*(s.close() for s in sources), return_exceptions=True)
