"""The hub: intervals, timeouts, staleness, recovery, fan-out, events, rates, history."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import ClassVar

import pytest

from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.agents import AgentReading
from gpuconsole.readings.base import CounterSample, Event, Key, Severity
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.readings.verdict import Action, CarriedVerdict
from gpuconsole.sources.base import DaemonThread, EmitEvent
from tests.waiting import until


@dataclass(frozen=True)
class CountReading:
    value: int

    def counters(self) -> Iterator[CounterSample]:
        yield CounterSample(("thing", "bytes"), self.value, 32)

    def series(self) -> Iterator[tuple[Key, float]]:
        yield ("thing", "value"), float(self.value)


class ScriptedSource:
    """A source whose behaviour the test steers: fine, failing or hanging."""

    kind: ClassVar[str] = "nvml"

    def __init__(self, node: str, interval_s: float = 0.05, timeout_s: float = 0.2) -> None:
        self.node = node
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.mode = "ok"
        self.value = 0
        self.step = 100
        self.polls = 0
        self.concurrent = 0
        self.max_concurrent = 0
        self.release = asyncio.Event()
        self.closed = False
        self.emit: EmitEvent | None = None

    async def start(self, emit: EmitEvent) -> None:
        self.emit = emit

    async def poll(self) -> CountReading:
        self.polls += 1
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.mode == "fail":
                raise OSError("BMC at 10.0.0.9 unreachable")
            if self.mode == "hang":
                await self.release.wait()
            self.value += self.step
            return CountReading(self.value)
        finally:
            self.concurrent -= 1

    async def close(self) -> None:
        self.closed = True


def fast_hub() -> Hub:
    return Hub(HubSettings(publish_gap_s=0.01, max_backoff_s=0.2))


async def test_a_failing_source_is_stale_with_its_reason_and_the_others_keep_going() -> None:
    hub = fast_hub()
    good, bad = ScriptedSource("n1"), ScriptedSource("n2")
    bad.mode = "fail"
    hub.add_source(good)
    hub.add_source(bad)
    await hub.start()
    try:
        await until(lambda: good.polls >= 5)
        snap = hub.latest
        assert snap is not None
        bad_status = snap.node("n2").statuses[0]  # type: ignore[union-attr]
        assert not bad_status.ok
        assert "unreachable" in (bad_status.error or "")
        assert bad_status.stale_since is not None
        assert snap.node("n1").statuses[0].ok  # type: ignore[union-attr]
        kinds = [e.kind for e in hub.events()]
        assert "source_stale" in kinds
    finally:
        await hub.stop()
    assert good.closed and bad.closed


async def test_a_source_recovers_by_itself_and_says_so() -> None:
    hub = fast_hub()
    src = ScriptedSource("n1")
    src.mode = "fail"
    hub.add_source(src)
    await hub.start()
    try:
        await until(lambda: src.polls >= 2)
        src.mode = "ok"
        await until(lambda: hub.latest is not None and hub.latest.nodes[0].statuses[0].ok)
        assert any(e.kind == "source_recovered" for e in hub.events())
    finally:
        await hub.stop()


async def test_a_hung_poll_times_out_and_is_never_started_twice() -> None:
    hub = fast_hub()
    src = ScriptedSource("n1", interval_s=0.02, timeout_s=0.05)
    src.mode = "hang"
    hub.add_source(src)
    await hub.start()
    try:
        await until(
            lambda: (
                hub.latest is not None
                and "timeout" in (hub.latest.nodes[0].statuses[0].error or "")
            )
        )
        await asyncio.sleep(0.3)  # several intervals pass while the poll is stuck
        assert src.polls == 1
        assert src.max_concurrent == 1
        src.mode = "ok"
        src.release.set()
        await until(lambda: hub.latest is not None and hub.latest.nodes[0].statuses[0].ok)
    finally:
        await hub.stop()


async def test_backoff_slows_a_failing_source() -> None:
    hub = Hub(HubSettings(publish_gap_s=0.01, max_backoff_s=5.0))
    src = ScriptedSource("n1", interval_s=0.02)
    src.mode = "fail"
    hub.add_source(src)
    await hub.start()
    await asyncio.sleep(0.5)
    await hub.stop()
    # Without backoff 25 polls would fit in 0.5 s; doubling from 20 ms allows about 5.
    assert 2 <= src.polls <= 7


async def test_many_subscribers_share_one_poll() -> None:
    hub = fast_hub()
    src = ScriptedSource("n1", interval_s=0.1)
    hub.add_source(src)
    received: list[list[FleetSnapshot]] = [[] for _ in range(10)]
    for inbox in received:
        hub.subscribe(inbox.append)
    await hub.start()
    await asyncio.sleep(0.55)
    await hub.stop()
    assert 4 <= src.polls <= 8
    assert all(len(inbox) >= 3 for inbox in received)
    assert all(inbox[-1] is received[0][-1] for inbox in received)


async def test_rates_and_history_come_from_the_readings() -> None:
    hub = fast_hub()
    src = ScriptedSource("n1", interval_s=0.05)
    src.step = 1000
    hub.add_source(src)
    await hub.start()
    try:
        await until(lambda: src.polls >= 4)
        await asyncio.sleep(0.05)
        node = hub.latest.nodes[0]  # type: ignore[union-attr]
        rate = node.rate("thing", "bytes")
        assert rate is not None and 5_000 < rate < 40_000  # 1000 per ~50 ms
        series = node.history.series("thing", "value")  # type: ignore[union-attr]
        assert len(series) >= 3 and list(series) == sorted(series)
    finally:
        await hub.stop()


async def test_history_is_bounded() -> None:
    hub = Hub(HubSettings(history_points=5, publish_gap_s=0.01))
    src = ScriptedSource("n1", interval_s=0.01)
    hub.add_source(src)
    await hub.start()
    await until(lambda: src.polls >= 20)
    await hub.stop()
    snapshot = hub.publish()
    assert len(snapshot.nodes[0].history.series("thing", "value")) == 5  # type: ignore[union-attr]


async def test_events_posted_from_another_thread_reach_the_snapshot() -> None:
    hub = fast_hub()
    src = ScriptedSource("n1")
    hub.add_source(src)
    await hub.start()
    try:
        event = Event(1.0, "n1", "nvml", "xid", Severity.CRITICAL, "XID 79 on GPU 5", 5, None, 79)
        thread = threading.Thread(target=lambda: src.emit(event))  # type: ignore[misc]
        thread.start()
        thread.join()
        await until(lambda: hub.latest is not None and event in hub.latest.events)
    finally:
        await hub.stop()


async def test_a_slow_reader_skips_snapshots_instead_of_queueing_them() -> None:
    hub = fast_hub()
    src = ScriptedSource("n1", interval_s=0.01)
    hub.add_source(src)
    await hub.start()
    seen: list[int] = []
    try:
        async for snapshot in hub.snapshots():
            seen.append(snapshot.seq)
            await asyncio.sleep(0.15)  # much slower than the hub publishes
            if len(seen) == 3:
                break
    finally:
        await hub.stop()
    assert seen[1] - seen[0] > 1 and seen[2] - seen[1] > 1


async def test_a_source_that_fails_to_start_is_stale_not_fatal() -> None:
    class Broken(ScriptedSource):
        async def start(self, emit: EmitEvent) -> None:
            raise RuntimeError("no driver")

    hub = fast_hub()
    hub.add_source(Broken("n1"))
    snapshot = await hub.poll_once()
    assert snapshot.nodes[0].statuses[0].ok  # its poll still succeeded
    assert any("no driver" in (e.message or "") for e in hub.events())


@pytest.mark.parametrize("mode", ["ok", "fail"])
async def test_poll_once_reads_every_source_once(mode: str) -> None:
    hub = fast_hub()
    sources = [ScriptedSource(f"n{i}") for i in range(3)]
    for s in sources:
        s.mode = mode
        hub.add_source(s)
    snapshot = await hub.poll_once()
    assert [s.polls for s in sources] == [1, 1, 1]
    assert [n.statuses[0].ok for n in snapshot.nodes] == [mode == "ok"] * 3
    assert all(s.closed for s in sources)


async def test_sources_start_side_by_side_and_a_slow_start_holds_up_no_other_reading() -> None:
    class SlowToStart(ScriptedSource):
        """A start that waits (a BMC's session, a simulated node's sysfs tree)."""

        async def start(self, emit: EmitEvent) -> None:
            await self.release.wait()

    hub = fast_hub()
    slow = SlowToStart("n1")
    hub.add_source(slow)
    quick = ScriptedSource("n2")
    hub.add_source(quick)
    starting = asyncio.create_task(hub.start())
    try:
        await until(lambda: hub.latest is not None and hub.latest.node("n2") is not None)
        assert hub.latest is not None
        n2 = hub.latest.node("n2")
        assert n2 is not None and n2.statuses[0].ok  # read and published while n1 starts
        assert not starting.done() and slow.polls == 0
        slow.release.set()
        await asyncio.wait_for(starting, 5)
        await until(lambda: slow.polls > 0)
    finally:
        slow.release.set()
        await hub.stop()
    assert slow.closed and quick.closed


async def test_a_node_a_viewer_opens_is_read_at_once_not_at_its_next_turn() -> None:
    class Overview(ScriptedSource):
        """A source that reads an overview until a viewer drills into its node (Focusable)."""

        detail = False

    hub = fast_hub()
    opened, other = Overview("n1", interval_s=60.0), Overview("n2", interval_s=60.0)
    hub.add_source(opened)
    hub.add_source(other)
    await hub.start()
    try:
        await until(lambda: opened.polls == 1 and other.polls == 1)
        hub.focus("n1", viewer="console")
        await until(lambda: opened.polls == 2, timeout=5.0)  # not a minute later
        assert opened.detail and not other.detail and other.polls == 1
    finally:
        await hub.stop()


def test_the_nodes_viewers_see_are_the_union_of_their_rows_and_opened_nodes() -> None:
    """Two consoles (ssh sessions) each tell the rows they show and the node they opened;
    a source that reads some of a node only for viewers is told whether any sees it, and
    once every console has left, none is seen (as with none at all)."""

    class Overview(ScriptedSource):
        """A source that reads some of its node only while a viewer sees it (Viewable)."""

        in_view = True

    hub = fast_hub()
    nodes = {name: Overview(name) for name in ("n1", "n2", "n3", "n4", "n5")}
    for source in nodes.values():
        hub.add_source(source)

    def seen() -> set[str]:
        return {name for name, source in nodes.items() if source.in_view}

    one, two = object(), object()
    hub.show(["n1", "n2"], viewer=one)
    assert seen() == {"n1", "n2"}
    hub.show(["n4"], viewer=two)
    hub.focus("n5", viewer=two)  # opened from its row, which then scrolled away
    assert seen() == {"n1", "n2", "n4", "n5"}
    hub.show(["n2", "n3"], viewer=one)  # the first one scrolled
    assert seen() == {"n2", "n3", "n4", "n5"}
    hub.show(None, viewer=one)
    assert seen() == {"n4", "n5"}
    hub.focus(None, viewer=two)
    hub.show(None, viewer=two)
    assert seen() == set()


async def test_a_one_shot_read_starts_its_sources_side_by_side() -> None:
    class WaitsForTheOther(ScriptedSource):
        """A start that finishes only once the other source has begun to start."""

        def __init__(self, node: str, other_began: asyncio.Event, began: asyncio.Event) -> None:
            super().__init__(node)
            self.other_began, self.began = other_began, began

        async def start(self, emit: EmitEvent) -> None:
            self.began.set()
            await asyncio.wait_for(self.other_began.wait(), 5)

    a_began, b_began = asyncio.Event(), asyncio.Event()
    hub = fast_hub()
    hub.add_source(WaitsForTheOther("n1", b_began, a_began))
    hub.add_source(WaitsForTheOther("n2", a_began, b_began))
    snapshot = await hub.poll_once()
    assert not [e.message for e in hub.events() if "start failed" in (e.message or "")]
    assert all(s.ok for n in snapshot.nodes for s in n.statuses)


async def test_a_thousand_sources_share_the_hubs_timers() -> None:
    """Each source waits out its interval and its poll's timeout; a head of a thousand nodes
    keeps those as a timer per tick, not thousands of loop timers (each one a push onto the
    loop's heap and a pop off it, at a dozen comparisons in Python)."""
    hub = fast_hub()
    sources = [ScriptedSource(f"n{i}", interval_s=1.0, timeout_s=5.0) for i in range(1000)]
    for source in sources:
        source.mode = "hang"  # every poll waits out its timeout, as a node that stalls
        hub.add_source(source)
    await hub.start()
    try:
        await until(lambda: all(s.polls for s in sources))
        timers = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
        assert len(timers) < 100
        for source in sources:  # they answer: each waits out its interval now
            source.mode = "ok"
            source.release.set()
        await until(lambda: all(s.value for s in sources))
        assert len(timers) < 100
    finally:
        await hub.stop()


class CancellableSource(ScriptedSource):
    """A source that holds no thread (an agent read over HTTP): its poll may be cancelled."""

    cancellable: ClassVar[bool] = True

    def __init__(self, node: str) -> None:
        super().__init__(node, interval_s=0.02, timeout_s=0.05)
        self.cancelled = 0

    async def poll(self) -> CountReading:
        try:
            return await super().poll()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def test_a_poll_that_may_be_cancelled_is_cancelled_at_its_timeout_and_polled_again() -> None:
    hub = fast_hub()
    source = CancellableSource("n1")
    source.mode = "hang"
    hub.add_source(source)
    await hub.start()
    try:
        # each poll hangs past its timeout: cancelled there, stale, and the next one begun
        await until(lambda: source.cancelled >= 2)
        assert source.max_concurrent == 1
        status = hub.publish().nodes[0].statuses[0]
        assert not status.ok and status.error == "timeout after 0.05 s"
        source.mode = "ok"
        await until(lambda: hub.publish().nodes[0].statuses[0].ok)
    finally:
        await hub.stop()
    assert source.concurrent == 0  # stopping cancelled the poll under way, if one was


class BlockingSource(ScriptedSource):
    """A scripted source that reads blocking, on a thread of its own, as the NVML source does."""

    def __init__(self, node: str, timeout_s: float = 0.2) -> None:
        super().__init__(node, timeout_s=timeout_s)
        self.gate = threading.Event()
        self.gate.set()
        self.thread = DaemonThread(f"read {node}")

    def start_blocking(self, emit: EmitEvent) -> Future[None]:
        self.emit = emit
        if self.mode == "no start":
            raise RuntimeError("no driver")
        return self.thread.submit(lambda: None)

    def poll_blocking(self) -> Future[CountReading]:
        def poll() -> CountReading:
            self.polls += 1
            assert self.emit is not None
            self.emit(Event(0.0, self.node, "nvml", "xid", Severity.WARNING, f"{self.node} said"))
            if self.mode == "fail":
                raise OSError("BMC at 10.0.0.9 unreachable")
            self.gate.wait()
            return CountReading(self.value + self.step)

        return self.thread.submit(poll)

    def close_blocking(self) -> None:
        self.closed = True
        self.thread.shutdown(wait=False)


def test_a_read_with_no_event_loop_waits_for_each_source_up_to_its_timeout_and_no_longer() -> None:
    hub = fast_hub()
    fine, stuck, failing, unstarted = (BlockingSource(f"n{i}") for i in range(4))
    stuck.gate.clear()  # a call left in the driver
    failing.mode, unstarted.mode = "fail", "no start"
    for source in (fine, stuck, failing, unstarted):
        hub.add_source(source)
    assert hub.blocking
    began = time.monotonic()
    snapshot = hub.read_once()
    assert time.monotonic() - began < 1.0
    statuses = {n.node: n.statuses[0] for n in snapshot.nodes}
    assert statuses["n0"].ok and snapshot.nodes[0].nvml == CountReading(100)
    assert statuses["n1"].error == "timeout after 0.2 s"
    assert "unreachable" in (statuses["n2"].error or "")
    assert statuses["n3"].ok  # its poll still answered, as poll_once's would
    assert any("no driver" in (e.message or "") for e in hub.events())
    # what each told from its thread is in the snapshot, the stuck one's too
    said = {e.message for e in snapshot.events if e.kind == "xid"}
    assert said == {"n0 said", "n1 said", "n2 said", "n3 said"}
    assert all(s.closed for s in (fine, stuck, failing, unstarted))
    stuck.gate.set()
    mixed = fast_hub()
    mixed.add_source(BlockingSource("n0"))
    mixed.add_source(ScriptedSource("n1"))
    assert not mixed.blocking  # a source that needs a loop: poll_once reads them all


async def test_an_idle_hub_wakes_its_loop_once_a_poll() -> None:
    """Between polls an idle hub sleeps: a poll that landed leaves no timeout to wake the
    loop later, and a publish no gap to sleep out while nothing else changed. Each wake of
    an idle console or agent is CPU spent for nothing."""
    hub = Hub(HubSettings(publish_gap_s=0.05))
    source = ScriptedSource("n1", interval_s=0.1, timeout_s=0.3)
    hub.add_source(source)
    loop = asyncio.get_running_loop()
    selector = loop._selector  # type: ignore[attr-defined]
    select = selector.select
    sleeps = 0

    def counted(timeout: float | None = None) -> list[object]:
        nonlocal sleeps
        if timeout is None or timeout > 0:
            sleeps += 1
        result: list[object] = select(timeout)
        return result

    await hub.start()
    try:
        await until(lambda: source.polls >= 2)
        selector.select = counted
        polls = source.polls
        await asyncio.sleep(1.0)
        polls = source.polls - polls
    finally:
        selector.select = select
        await hub.stop()
    assert polls >= 5
    assert sleeps <= polls + 2, (sleeps, polls)  # one per poll: its interval's end


class AgentLike(ScriptedSource):
    """A node read through its agent: the verdict it sends is `verdict`, as the test sets
    it (an agent source keeps it the same object while its agent sends it again)."""

    kind: ClassVar[str] = "remote"

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.verdict = CarriedVerdict(Action.FIT)

    async def poll(self) -> AgentReading:  # type: ignore[override]
        await super().poll()
        return AgentReading(
            time.time(), "http://agent", NodeSnapshot(self.node, verdict=self.verdict)
        )


def steady(snapshot: FleetSnapshot) -> list[str]:
    assert snapshot.rebuilt is not None
    return [snapshot.nodes[at].node for at, one in enumerate(snapshot.rebuilt.steady) if one]


def rebuilt(snapshot: FleetSnapshot) -> list[str]:
    assert snapshot.rebuilt is not None
    return sorted(snapshot.nodes[at].node for at in snapshot.rebuilt.positions)


async def test_a_snapshot_says_which_nodes_moved_in_their_readings_alone() -> None:
    """Rebuilt.steady: the nodes built anew whose sources answered as they did, and whose
    agent's verdict is the very one before. A source that fails (again), answers after
    failing or is added, or a verdict sent anew (however alike), is not steady."""
    hub = fast_hub()
    local, far = ScriptedSource("n0"), AgentLike("n1")
    hub.add_source(local)
    hub.add_source(far)
    first = await hub.poll_once()
    assert first.rebuilt is not None and first.rebuilt.after is None
    assert first.rebuilt.steady == b""  # laid out anew: said of no node
    second = await hub.poll_once()
    assert second.rebuilt is not None and second.rebuilt.after is first.rebuilt.mark
    assert (steady(second), rebuilt(second)) == (["n0", "n1"], [])
    assert second.nodes[1].verdict is first.nodes[1].verdict
    local.mode = "fail"
    far.verdict = CarriedVerdict(Action.FIT)  # alike, not the same: sent anew
    snapshots = [await hub.poll_once() for _ in range(2)]  # failed, failed again
    assert [(steady(s), rebuilt(s)) for s in snapshots] == [([], ["n0", "n1"]), (["n1"], ["n0"])]
    local.mode = "ok"
    snapshots = [await hub.poll_once() for _ in range(2)]  # answers again, then as before
    assert [(steady(s), rebuilt(s)) for s in snapshots] == [(["n1"], ["n0"]), (["n0", "n1"], [])]
    hub.add_source(ScriptedSource("n1"))  # a second source of n1, not read yet
    assert (steady(await hub.poll_once()), rebuilt(hub.latest)) == (["n0"], ["n1"])  # type: ignore[arg-type]
