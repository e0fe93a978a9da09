"""The one data loop: polls sources, keeps the latest good readings, fans snapshots out.

Each source runs on its own interval with a timeout and exponential backoff. A poll that
overruns its timeout is never started twice: the hub waits for the stuck one instead (a
source that holds no thread, `cancellable`, has it cancelled there).
Readings are merged into one immutable NodeSnapshot per node; counters become rates
here (32-bit wrap and resets handled once), and so do per-interval deltas of the
counters a reading marks; gauges go into bounded history rings.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import queue
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Collection
from concurrent.futures import Future
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

import msgspec

from gpuconsole.config import DEFAULTS
from gpuconsole.counters import RateTracker
from gpuconsole.history import HistoryStore
from gpuconsole.readings.agents import REMOTE_PARTS, AgentReading
from gpuconsole.readings.alerts import ActiveAlert
from gpuconsole.readings.base import (
    Event,
    Key,
    Severity,
    SourceStatus,
    record_fields,
    safe_strings,
    safe_text,
)
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot, Rebuilt
from gpuconsole.sources.base import Blocking, Focusable, Reading, Source, Viewable

# asyncio (and ssl, which it imports) only where a loop runs: a one-shot reading of
# blocking sources (read_once) runs none, and asyncio is a tenth of its start.
if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)

Subscriber = Callable[[FleetSnapshot], None]
_NODE_FIELDS = frozenset(f.name for f in record_fields(NodeSnapshot))

# Polls are paused and timed out to a tick of the hub's own: a head polling a thousand
# sources would otherwise keep two loop timers per poll, each pushed onto and popped off
# the loop's heap at a dozen comparisons in Python.
TICK_S = 0.02


class _SourceState(msgspec.Struct):
    source: Source
    status: SourceStatus
    task: asyncio.Task[None] | None = None
    inflight: asyncio.Task[Reading] | None = None
    waiter: asyncio.Future[None] | None = None  # its poll loop's pause, cut short by focus()
    wanted_now: bool = False  # focus() wants it read without its pause (a viewer waits)


class _NodeState(msgspec.Struct):
    name: str
    simulated: bool
    profile: str | None
    readings: dict[str, Any] = msgspec.field(default_factory=dict)
    rates: dict[str, dict[Key, float]] = msgspec.field(default_factory=dict)
    deltas: dict[str, dict[Key, int]] = msgspec.field(default_factory=dict)
    trackers: dict[str, RateTracker] = msgspec.field(default_factory=dict)
    history: HistoryStore = msgspec.field(
        default_factory=lambda: HistoryStore(DEFAULTS.hub.history_points)
    )
    snapshot: NodeSnapshot | None = None
    sources: list[_SourceState] = msgspec.field(default_factory=list)
    last_xid: dict[str, int] = msgspec.field(default_factory=dict)
    at: int = -1  # its position in the snapshots published
    # since its last snapshot, a source failed, answered after it had not, or was added:
    # the next one is not `steady` (Rebuilt)
    turned: bool = True
    said: object = None  # the verdict its last snapshot carried (its agent's)


class HubSettings(msgspec.Struct, frozen=True):
    """Knobs of the data loop; [hub] in the config declares the defaults of those it sets."""

    history_points: int = DEFAULTS.hub.history_points
    event_log_size: int = DEFAULTS.hub.event_log_size
    snapshot_events: int = 200
    max_backoff_s: float = DEFAULTS.hub.max_backoff_s
    publish_gap_s: float = 0.2


class Hub:
    """Runs sources, merges readings, publishes FleetSnapshots to subscribers."""

    def __init__(
        self,
        settings: HubSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or HubSettings()
        self._clock = clock
        self._monotonic = monotonic
        self._nodes: dict[str, _NodeState] = {}
        self._events: deque[Event] = deque(maxlen=self.settings.event_log_size)
        self._event_seq = 0
        self._events_cache: tuple[int, tuple[Event, ...]] = (0, ())
        self._event_counts: Counter[tuple[str, str, str]] = Counter()
        self._counts_cache: tuple[tuple[str, str, str, int], ...] = ()
        self._subscribers: list[Subscriber] = []
        self._dirty: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._say_stale = True  # a line in the log when a source goes stale
        self._publisher: asyncio.Task[None] | None = None
        self._seq = 0
        self._latest: FleetSnapshot | None = None
        self._mark: object = None  # the last snapshot's Rebuilt.mark
        self._laid_out = 0  # nodes whose positions `at` holds
        self._running = False
        self._focused: dict[int, str] = {}  # viewer (a console) -> the node it drilled into
        self._in_view: dict[int, frozenset[str]] = {}  # viewer -> the rows on its screen
        self._alerts: tuple[ActiveAlert, ...] = ()
        self._alarms: _Alarms | None = None

    # --- setup ---------------------------------------------------------------------

    def add_node(self, name: str, *, simulated: bool = False, profile: str | None = None) -> None:
        if name not in self._nodes:
            node = _NodeState(name, simulated, profile)
            node.history = HistoryStore(self.settings.history_points)
            self._nodes[name] = node
            self._dirty.add(name)

    def add_source(self, source: Source) -> None:
        self.add_node(source.node)
        status = SourceStatus(
            node=source.node, source=source.kind, ok=False, error="waiting for first reading"
        )
        node = self._nodes[source.node]
        node.sources.append(_SourceState(source, status))
        node.turned = True

    @property
    def sources(self) -> list[Source]:
        return [s.source for node in self._nodes.values() for s in node.sources]

    def focus(self, node: str | None, viewer: object = None) -> None:
        """Read every detail of `node` (`viewer`, a console, drilled into it) and only the
        overview of the nodes no viewer is in; None: `viewer` left its node. Several consoles
        on one hub (the ssh server's sessions) each hold their own node."""
        if node is None:
            self._focused.pop(id(viewer), None)
        else:
            self._focused[id(viewer)] = node
        self._tell_sources()

    def show(self, rows: Collection[str] | None, viewer: object = None) -> None:
        """The nodes `viewer` (a console) has in view, its fleet's rows; None: it says no
        more (it left). A source that reads some of a node only for viewers (Prometheus)
        reads it for every viewer's rows and opened nodes; while no viewer says, for none."""
        before = self._seen()
        if rows is None:
            self._in_view.pop(id(viewer), None)
        else:
            self._in_view[id(viewer)] = frozenset(rows)
        after = self._seen()
        # a scroll tells the nodes that came into view or left it, not every source
        self._tell_sources(None if before is None or after is None else before ^ after)

    def _seen(self) -> set[str] | None:
        """The nodes some viewer sees: in view or opened; None while no viewer says."""
        if not self._in_view:
            return None
        return set(self._focused.values()).union(*self._in_view.values())

    def _tell_sources(self, nodes: Collection[str] | None = None) -> None:
        """The sources of `nodes` (None: of all) what the viewers want of their node:
        every detail, or to see it."""
        wanted = set(self._focused.values())
        seen = self._seen()
        told = (
            self._nodes.values()
            if nodes is None
            else [self._nodes[n] for n in nodes if n in self._nodes]
        )
        for node_state in told:
            for state in node_state.sources:
                source = state.source
                viewable, focusable = _roles(source)
                if viewable:
                    viewed = cast("Viewable", source)
                    shown = seen is not None and viewed.node in seen
                    if viewed.in_view != shown:
                        viewed.in_view = shown
                if focusable:
                    focused = cast("Focusable", source)
                    opened = focused.node in wanted and not focused.detail
                    focused.detail = focused.node in wanted
                    if opened:  # read now, not at its next turn: a viewer waits
                        state.wanted_now = True
                        if state.waiter is not None:
                            _done(state.waiter)

    # --- running -------------------------------------------------------------------

    async def start(self) -> None:
        """Start every source and its poll loop, and the publisher."""
        import asyncio

        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._running = True
        # The publisher first and the sources side by side, each polled once it has started:
        # a reading is published as it lands, not after the slowest source has started
        # (a simulated node's sysfs tree, a BMC's session, a kubelet's socket).
        self._publisher = asyncio.create_task(self._publish_loop(), name="hub publisher")
        await asyncio.gather(
            *(self._start_and_poll(node, state) for node in self._nodes.values()
              for state in node.sources)
        )  # fmt: skip
        self._wake.set()  # a hub of no sources publishes once too

    async def _start_and_poll(self, node: _NodeState, state: _SourceState) -> None:
        import asyncio

        await self._start_source(state)
        if self._running:  # not stopped while it started
            state.task = asyncio.create_task(
                self._poll_loop(node, state), name=f"poll {node.name}/{state.source.kind}"
            )

    async def stop(self) -> None:
        """Stop polling and close every source."""
        import asyncio

        self._running = False
        tasks = [s.task for n in self._nodes.values() for s in n.sources if s.task is not None]
        if self._publisher is not None:
            tasks.append(self._publisher)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for node in self._nodes.values():
            for state in node.sources:
                try:
                    await state.source.close()
                except Exception:
                    log.exception("closing %s/%s", node.name, state.source.kind)

    async def poll_once(
        self,
        rounds: int = 1,
        *,
        between: Callable[[], None] | None = None,
        say_stale: bool = True,
    ) -> FleetSnapshot:
        """Start, poll every source `rounds` times, stop; for one-shot readers and tests.

        Rates, GPM and other two-sample figures need two rounds; `between` runs before each
        later round (a test moves its clock there). Without `say_stale` a source going stale
        is not logged: the caller reports the snapshot's statuses itself (a line per stale
        source and node would bury that report on a large fleet).
        """
        import asyncio

        self._loop = asyncio.get_running_loop()
        self._say_stale = say_stale
        states = [(n, s) for n in self._nodes.values() for s in n.sources]
        await asyncio.gather(*(self._start_source(state) for _node, state in states))
        try:
            for round_ in range(rounds):
                if round_ and between is not None:
                    between()
                await asyncio.gather(*(self._poll(node, state) for node, state in states))
        finally:
            for _node, state in states:
                with contextlib.suppress(Exception):
                    await state.source.close()
        return self.publish()

    @property
    def blocking(self) -> bool:
        """Whether every source reads blocking (`Blocking`), so read_once can read them."""
        return all(isinstance(source, Blocking) for source in self.sources)

    def read_once(self, *, say_stale: bool = True) -> FleetSnapshot:
        """poll_once's one round without an event loop, for a hub whose every source reads
        blocking (`blocking`): started and polled side by side, each poll waited for up to
        its timeout, then closed; the same snapshot as poll_once makes. The events sources
        post from their threads are recorded on this one, in turn with its own."""
        self._say_stale = say_stale
        posted: queue.SimpleQueue[Event] = queue.SimpleQueue()

        def record_posted() -> None:
            while not posted.empty():
                self.post_event(posted.get())

        states = [
            (n, s, cast("Blocking", s.source)) for n in self._nodes.values() for s in n.sources
        ]
        try:
            starts = [(s, _begun(b.start_blocking, posted.put)) for _n, s, b in states]
            for state, started in starts:
                try:
                    started.result()
                except Exception as exc:
                    self._mark_failed(state, f"start failed: {_describe(exc)}")
            began = self._monotonic()
            polls = [(n, s, b, _begun(b.poll_blocking)) for n, s, b in states]
            for node, state, source, poll in polls:
                left = began + source.timeout_s - self._monotonic()
                try:
                    reading = poll.result(max(0.0, left))
                except TimeoutError:  # the wait's, or a source's own within it
                    self._mark_failed(state, f"timeout after {source.timeout_s:g} s")
                    continue
                except Exception as exc:
                    self._mark_failed(state, _describe(exc))
                    continue
                finally:
                    record_posted()  # what it told before it answered, first
                self._accept(node, state, reading, self._monotonic() - began)
        finally:
            for _node, _state, source in states:
                with contextlib.suppress(Exception):
                    source.close_blocking()
            record_posted()
        return self.publish()

    async def _start_source(self, state: _SourceState) -> None:
        source = state.source
        try:
            await source.start(self.post_event)
        except Exception as exc:
            self._mark_failed(state, f"start failed: {_describe(exc)}")

    async def _poll_loop(self, node: _NodeState, state: _SourceState) -> None:
        source = state.source
        failures = 0
        while self._running:
            began = self._monotonic()
            ok = await self._poll(node, state)
            failures = 0 if ok else failures + 1
            delay = source.interval_s * (2 ** min(failures, 10)) if failures else source.interval_s
            delay = min(delay, max(self.settings.max_backoff_s, source.interval_s))
            elapsed = self._monotonic() - began
            await self._pause(state, max(0.0, delay - elapsed))

    async def _pause(self, state: _SourceState, seconds: float) -> None:
        """Wait `seconds` (to the nearest tick) before the next poll, or less where focus()
        wants it now."""
        import asyncio

        if seconds <= 0 or state.wanted_now:
            state.wanted_now = False
            await asyncio.sleep(0)
            return
        alarms = self._timers()
        waiter = state.waiter = alarms.future(seconds, nearest=True)
        try:
            await waiter
        finally:
            alarms.drop(waiter)  # cut short by focus(): its tick need not wake the loop
            state.waiter = None
            state.wanted_now = False

    async def _poll(self, node: _NodeState, state: _SourceState) -> bool:
        """One poll with a timeout; True when a fresh reading landed."""
        import asyncio

        source = state.source
        began = self._monotonic()
        if getattr(source, "cancellable", False):
            return await self._poll_here(node, state, began)
        inflight = state.inflight
        if inflight is None or inflight.done():
            inflight = state.inflight = asyncio.ensure_future(source.poll())
            # A poll that outlives its timeout may fail later, unawaited: collect its error.
            inflight.add_done_callback(_retrieve)
        if not inflight.done():  # wait for it, up to its timeout; it goes on after that
            alarms = self._timers()
            waiter = alarms.future(source.timeout_s)
            landed = functools.partial(_landed, waiter)
            inflight.add_done_callback(landed)
            try:
                await waiter
            finally:
                inflight.remove_done_callback(landed)
                alarms.drop(waiter)
        try:
            if not inflight.done():
                raise TimeoutError
            reading = inflight.result()
        except TimeoutError:  # the hub's, or a source's own within it
            self._mark_failed(state, f"timeout after {source.timeout_s:g} s")
            return False
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            state.inflight = None
            self._mark_failed(state, _describe(exc))
            return False
        state.inflight = None
        self._accept(node, state, reading, self._monotonic() - began)
        return True

    def _timers(self) -> _Alarms:
        """The alarms of the running loop (a hub may be run again on another)."""
        import asyncio

        loop = asyncio.get_running_loop()
        if self._alarms is None or self._alarms.loop is not loop:
            self._alarms = _Alarms(loop)
        return self._alarms

    async def _poll_here(self, node: _NodeState, state: _SourceState, began: float) -> bool:
        """_poll for a source whose poll may be cancelled (it holds no thread): awaited in
        the poll loop's own task, and cancelled at its timeout, where a task of its own
        would cost a thousand sources a task and its wake-ups per poll."""
        import asyncio

        source = state.source
        task = asyncio.current_task()
        assert task is not None
        cancelling, polling, expired = task.cancelling(), True, False

        def expire(_alarm: asyncio.Future[None]) -> None:
            nonlocal expired
            if polling:  # not where the poll ended as the alarm rang
                expired = True
                task.cancel()

        alarms = self._timers()
        alarm = alarms.future(source.timeout_s)
        alarm.add_done_callback(expire)
        try:
            reading = await source.poll()
        except asyncio.CancelledError:
            if not expired or task.uncancel() > cancelling:
                raise  # cancelled from outside as well: the hub stops
            self._mark_failed(state, f"timeout after {source.timeout_s:g} s")
            return False
        except TimeoutError:
            self._mark_failed(state, f"timeout after {source.timeout_s:g} s")
            return False
        except Exception as exc:
            self._mark_failed(state, _describe(exc))
            return False
        finally:
            polling = False
            alarm.remove_done_callback(expire)
            alarms.drop(alarm)
        if expired:  # the source took the cancel as an answer: it is taken back
            task.uncancel()
        self._accept(node, state, reading, self._monotonic() - began)
        return True

    # --- merging -------------------------------------------------------------------

    def _accept(self, node: _NodeState, state: _SourceState, reading: Reading, took: float) -> None:
        kind = state.source.kind
        now = self._clock()
        # The very reading it last gave: the source read nothing new of the node (a
        # Prometheus round that did not ask its gauges), so no rates and no history point.
        if reading is not node.readings.get(kind):
            node.readings[kind] = reading
            self._record(node, kind, reading, now)
        old = state.status
        if not old.ok:
            node.turned = True
        if not old.ok and old.polls > 0 and old.stale_since is not None:
            self.post_event(
                Event(
                    now,
                    node.name,
                    kind,
                    "source_recovered",
                    Severity.INFO,
                    f"{kind} recovered after {now - old.stale_since:.0f} s",
                )
            )
        state.status = msgspec.structs.replace(
            old,
            ok=True,
            last_ok_at=now,
            stale_since=None,
            error=None,
            polls=old.polls + 1,
            last_poll_s=took,
        )
        self._mark_dirty(node.name)

    def _record(self, node: _NodeState, kind: str, reading: Reading, now: float) -> None:
        tracker = node.trackers.get(kind)
        if tracker is None:
            tracker = node.trackers[kind] = RateTracker()
        rates = tracker.update(reading.counters(), self._monotonic())
        node.rates[kind] = rates
        deltas, before = tracker.deltas, node.deltas.get(kind, {})
        node.deltas[kind] = deltas
        # A reading may turn counters that moved into events (fabric: error counters that
        # started to climb), so the counting stays here and the meaning stays with it.
        delta_events = getattr(reading, "delta_events", None)
        if deltas and delta_events is not None and tracker.interval_s is not None:
            for event in delta_events(node.name, now, deltas, before, tracker.interval_s):
                self.post_event(event)
        node.history.record(reading.series())
        node.history.record(tracker.history)

    def _mark_failed(self, state: _SourceState, error: str) -> None:
        error = safe_text(error)  # an exception's words may quote what a peer sent
        now = self._clock()
        old = state.status
        was_ok = old.ok or (old.polls == 0 and old.failures == 0)
        state.status = msgspec.structs.replace(
            old,
            ok=False,
            stale_since=old.stale_since if old.stale_since is not None else now,
            error=error,
            polls=old.polls + 1,
            failures=old.failures + 1,
        )
        node = self._nodes.get(old.node)
        if node is not None:
            node.turned = True
        if self._say_stale and (was_ok or old.error != error):
            log.warning("%s/%s stale: %s", old.node, old.source, error)
        if was_ok:
            self.post_event(
                Event(
                    now,
                    old.node,
                    old.source,
                    "source_stale",
                    Severity.WARNING,
                    f"{old.source} stale: {error}",
                )
            )
        self._mark_dirty(old.node)

    def _mark_dirty(self, node: str) -> None:
        self._dirty.add(node)
        if self._wake is not None:
            self._wake.set()

    # --- events --------------------------------------------------------------------

    def post_event(self, event: Event) -> None:
        """Record an event; safe to call from any thread."""
        loop = self._loop
        if loop is not None and loop.is_running():
            import asyncio  # a loop runs: asyncio is loaded

            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                loop.call_soon_threadsafe(self._record_event, event)
                return
        self._record_event(event)

    def _record_event(self, event: Event) -> None:
        event = safe_strings(event)  # a source's or an action's words may quote a peer's
        self._events.append(event)
        self._event_seq += 1
        self._event_counts[(event.node, event.kind, event.severity.value)] += 1
        node = self._nodes.get(event.node)
        if node is not None and event.kind == "xid" and event.code is not None:
            if event.gpu_uuid:
                node.last_xid[event.gpu_uuid] = event.code
            if event.gpu_bus_id:
                node.last_xid[event.gpu_bus_id] = event.code
        if event.node in self._nodes:
            self._mark_dirty(event.node)
        elif self._wake is not None:
            self._wake.set()

    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)

    def set_alerts(self, alerts: tuple[ActiveAlert, ...]) -> None:
        """What the alert rules hold now, for the next snapshot; call it on the hub's loop."""
        if alerts != self._alerts:
            self._alerts = alerts
            if self._wake is not None:
                self._wake.set()

    # --- publishing ----------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback` with every new snapshot; returns the unsubscribe function.

        Callbacks run on the hub's loop and must be quick (post a message, set a slot).
        """
        self._subscribers.append(callback)
        if self._latest is not None:
            callback(self._latest)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(callback)

        return unsubscribe

    async def snapshots(self) -> AsyncIterator[FleetSnapshot]:
        """Latest-wins stream: a slow reader skips snapshots instead of queueing them."""
        import asyncio

        slot: list[FleetSnapshot] = []
        ready = asyncio.Event()

        def put(snapshot: FleetSnapshot) -> None:
            slot[:] = [snapshot]
            ready.set()

        unsubscribe = self.subscribe(put)
        try:
            while True:
                await ready.wait()
                ready.clear()
                yield slot[0]
        finally:
            unsubscribe()

    @property
    def latest(self) -> FleetSnapshot | None:
        return self._latest

    async def _publish_loop(self) -> None:
        import asyncio

        assert self._wake is not None
        loop = asyncio.get_running_loop()
        published_at = -math.inf
        while self._running:
            await self._wake.wait()
            # what changes within the gap after a publish waits for its end, in one snapshot;
            # a change that comes later goes at once, and a quiet hub sleeps for no gap
            gap = published_at + self.settings.publish_gap_s - loop.time()
            if gap > 0:
                await asyncio.sleep(gap)
            self._wake.clear()
            self.publish()
            published_at = loop.time()

    def publish(self) -> FleetSnapshot:
        """Build a snapshot from what changed and hand it to every subscriber."""
        # the positions built anew; a byte per position, 1 where built steady (a new node,
        # not laid out yet, never is)
        built, steady = [], bytearray(self._laid_out)
        for name in self._dirty:
            node = self._nodes.get(name)
            if node is not None:
                made = node.snapshot = self._node_snapshot(node)
                # told here, where the node is at hand: a judge of a thousand nodes would
                # look into each one (Rebuilt.steady)
                if node.turned or made.verdict is not node.said:
                    node.turned, node.said = False, made.verdict
                    built.append(node.at)
                else:
                    steady[node.at] = 1
        self._dirty.clear()
        self._seq += 1
        if self._events_cache[0] != self._event_seq:
            tail = itertools.islice(reversed(self._events), self.settings.snapshot_events)
            self._events_cache = (self._event_seq, tuple(reversed(list(tail))))
            self._counts_cache = tuple(
                (*key, count) for key, count in sorted(self._event_counts.items())
            )
        events = self._events_cache[1]
        nodes = tuple(n.snapshot for n in self._nodes.values() if n.snapshot is not None)
        # Nodes are only ever added, and each has its snapshot from the publish after:
        # as many nodes as last time are the same nodes in the same places.
        after = self._mark
        if len(nodes) != self._laid_out:
            for at, node in enumerate(n for n in self._nodes.values() if n.snapshot is not None):
                node.at = at
            self._laid_out, after = len(nodes), None
        self._mark = mark = object()
        if after is None:
            built, steady = [], bytearray()
        snapshot = FleetSnapshot(
            self._seq,
            self._clock(),
            nodes,
            events,
            self._counts_cache,
            self._alerts,
            Rebuilt(after, mark, nodes, tuple(built), bytes(steady)),
        )
        self._latest = snapshot
        for callback in list(self._subscribers):
            try:
                callback(snapshot)
            except Exception:
                log.exception("snapshot subscriber failed")
        return snapshot

    def _node_snapshot(self, node: _NodeState) -> NodeSnapshot:
        rates: dict[Key, float] = {}
        for part in node.rates.values():
            rates.update(part)
        deltas: dict[Key, int] = {}
        for moved in node.deltas.values():
            deltas.update(moved)
        fields = {kind: reading for kind, reading in node.readings.items() if kind in _NODE_FIELDS}
        simulated = node.simulated or any(
            getattr(reading, "simulated", False) for reading in node.readings.values()
        )
        statuses = tuple(s.status for s in node.sources)
        profile, last_xid = node.profile, dict(node.last_xid)
        remote = node.readings.get("remote")
        if isinstance(remote, AgentReading):
            # A node read through its agent: its parts, statuses and rates, as sent.
            far = remote.node
            # the agent's verdict judged its parts: a part read here instead is judged here
            if far.verdict is not None and all(fields.get(k) is None for k in REMOTE_PARTS):
                fields["verdict"] = far.verdict
            for kind in REMOTE_PARTS:
                if fields.get(kind) is None and getattr(far, kind) is not None:
                    fields[kind] = getattr(far, kind)
            # renamed only where the head's config names the node otherwise than its agent
            statuses += tuple(
                s if s.node == node.name else msgspec.structs.replace(s, node=node.name)
                for s in far.statuses
            )
            rates.update(far.rates)
            deltas.update(far.deltas)
            profile = profile or far.profile
            simulated = simulated or far.simulated
            last_xid = {**far.last_xid, **last_xid}
        fields.pop("remote", None)
        return NodeSnapshot(
            node=node.name,
            simulated=simulated,
            profile=profile,
            statuses=statuses,
            rates=MappingProxyType(rates),
            deltas=MappingProxyType(deltas),
            last_xid=MappingProxyType(last_xid),
            history=node.history.view(),
            **fields,
        )


_ROLES: dict[type, tuple[bool, bool]] = {}


def _roles(source: Source) -> tuple[bool, bool]:
    """Whether a source is Viewable and Focusable, found once per class: a protocol's
    isinstance costs about 10 µs, and a fleet's viewers tell 10,000 sources at a time."""
    kind = type(source)
    roles = _ROLES.get(kind)
    if roles is None:
        roles = _ROLES[kind] = (isinstance(source, Viewable), isinstance(source, Focusable))
    return roles


class _Alarms:
    """Futures done at their deadline, rounded to a tick (TICK_S): one loop timer a tick
    for all of them. A future done before its deadline is passed over then; one dropped
    (its poll landed first) is forgotten, and a tick left with none wakes nobody."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._due: dict[int, dict[asyncio.Future[None], None]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._tick_of: dict[asyncio.Future[None], int] = {}

    def future(self, seconds: float, *, nearest: bool = False) -> asyncio.Future[None]:
        """A future done after `seconds`: never before where not `nearest`, else at the
        tick nearest to then (a pause: over many polls, as long as asked)."""
        at = (self.loop.time() + seconds) / TICK_S
        tick = round(at) if nearest else math.ceil(at)
        waiter: asyncio.Future[None] = self.loop.create_future()
        due = self._due.get(tick)
        if due is None:
            due = self._due[tick] = {}
            self._timers[tick] = self.loop.call_at(tick * TICK_S, self._ring, tick)
        due[waiter] = None
        self._tick_of[waiter] = tick
        return waiter

    def drop(self, waiter: asyncio.Future[None]) -> None:
        """`waiter` is no longer waited for: where no other future shares its tick, the
        loop's timer goes too (a poll's timeout would otherwise wake an idle loop for
        nothing, once per poll)."""
        tick = self._tick_of.pop(waiter, None)
        if tick is None:
            return  # rung already
        due = self._due[tick]
        due.pop(waiter, None)
        if not due:
            del self._due[tick]
            self._timers.pop(tick).cancel()

    def _ring(self, tick: int) -> None:
        self._timers.pop(tick, None)
        for waiter in self._due.pop(tick, ()):
            del self._tick_of[waiter]
            _done(waiter)


def _done(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _landed(waiter: asyncio.Future[None], _poll: asyncio.Future[Reading]) -> None:
    _done(waiter)


def _retrieve(task: asyncio.Future[Reading]) -> None:
    if not task.cancelled():
        task.exception()


def _begun(begin: Callable[..., Future[Any]], *args: Any) -> Future[Any]:
    """What a blocking source's `begin` (start_blocking, poll_blocking) hands back, or a
    future holding what it raised."""
    try:
        return begin(*args)
    except Exception as exc:
        failed: Future[Any] = Future()
        failed.set_exception(exc)
        return failed


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text and name not in text else (text or name)
