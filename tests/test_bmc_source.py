"""How BMC sources share polling slots: the timeout is the BMC's own, a silent BMC gives
its slot back, and a poll that waits for a slot keeps its place.

The link here is a stand-in that blocks until the test lets it answer: these are rules of
the source itself, whatever protocol is under it (the peers' tests cover those).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpuconsole.hub import Hub
from gpuconsole.readings.bmc import BmcReading, PowerState
from gpuconsole.sources.bmc import BmcError, BmcPool, BmcSource, PowerAction
from gpuconsole.sources.bmc.link import LinkReading


class HeldLink:
    """A BMC that answers each read only once the test releases it (or at once, if open)."""

    def __init__(self, label: str, *, open_: bool = False) -> None:
        self.label = label
        self.gate = threading.Event()
        if open_:
            self.gate.set()
        self.reads = 0
        self.powered: list[PowerAction] = []
        self.power_gate = threading.Event()  # a power request answers once this is set
        self.power_gate.set()

    def read(self, *, sel: bool) -> LinkReading:
        self.reads += 1
        self.gate.wait(30)
        return LinkReading(PowerState.ON, ())

    def set_power(self, action: PowerAction) -> str:
        self.powered.append(action)
        self.power_gate.wait(30)
        return action.value

    def close(self) -> None:
        self.gate.set()  # let a call still blocked finish, so the source's thread ends
        self.power_gate.set()


async def started(*sources: BmcSource) -> None:
    for source in sources:
        await source.start(lambda _e: None)


def test_the_timeout_counts_the_bmcs_own_answer_not_the_wait_for_a_slot() -> None:
    # One slot. The first BMC takes a second to answer; the second answers at once but
    # waits that second for the slot: longer than its own 0.5 s timeout, and still fine.
    pool = BmcPool(1)
    slow, quick = HeldLink("slow"), HeldLink("quick", open_=True)
    hub = Hub()
    hub.add_source(BmcSource("slow", slow, timeout_s=5.0, pool=pool))
    hub.add_source(BmcSource("quick", quick, timeout_s=0.5, queue_timeout_s=5.0, pool=pool))
    threading.Timer(1.0, slow.gate.set).start()
    snapshot = asyncio.run(hub.poll_once())
    assert all(n.status("bmc").ok for n in snapshot.nodes)  # type: ignore[union-attr]
    assert snapshot.node("quick").status("bmc").last_poll_s >= 0.5  # type: ignore[union-attr,operator]


def test_a_silent_bmc_gives_its_slot_back_at_its_timeout_and_is_not_asked_twice() -> None:
    async def run() -> None:
        pool = BmcPool(1)
        silent, other = HeldLink("silent"), HeldLink("other", open_=True)
        hung = BmcSource("hung", silent, timeout_s=0.3, pool=pool)
        fine = BmcSource("fine", other, timeout_s=0.3, queue_timeout_s=5.0, pool=pool)
        await started(hung, fine)
        first = asyncio.ensure_future(hung.poll())
        await asyncio.sleep(0.05)  # the silent one holds the only slot
        assert (await fine.poll()).power_state is PowerState.ON
        with pytest.raises(BmcError, match=r"silent: no answer within 0\.3 s"):
            await first
        # still blocked: the next poll waits for that call instead of sending another,
        # and a power request is refused rather than queued behind it
        with pytest.raises(BmcError, match=r"silent: no answer within 0\.3 s"):
            await hung.poll()
        with pytest.raises(BmcError, match="power off was not sent"):
            await hung.set_power(PowerAction.OFF)
        assert (silent.reads, silent.powered) == (1, [])
        answered = asyncio.ensure_future(hung.poll())
        await asyncio.sleep(0.05)  # that poll waits for the call under way
        silent.gate.set()  # which answers at last, and brings the reading
        assert (await answered).power_state is PowerState.ON
        assert silent.reads == 1
        await hung.close()
        await fine.close()

    asyncio.run(run())


def test_a_poll_that_waits_too_long_for_a_slot_says_so_and_keeps_its_place() -> None:
    async def run() -> None:
        pool = BmcPool(1, silent_limit=1)
        busy, waiting = HeldLink("busy"), HeldLink("waiting", open_=True)
        holder = BmcSource("holder", busy, timeout_s=5.0, pool=pool)
        queued = BmcSource("queued", waiting, timeout_s=1.0, queue_timeout_s=0.2, pool=pool)
        await started(holder, queued)
        held = asyncio.ensure_future(holder.poll())
        await asyncio.sleep(0.05)
        with pytest.raises(BmcError, match=r"waiting: no free polling slot within 0\.2 s"):
            await queued.poll()
        assert waiting.reads == 0
        busy.gate.set()
        await held
        # the next poll takes over the queued attempt, or the reading it brought meanwhile
        assert (await queued.poll()).power_state is PowerState.ON
        assert waiting.reads == 1
        await holder.close()
        await queued.close()

    asyncio.run(run())


def test_a_poll_after_a_power_request_still_under_way_waits_for_it_then_reads() -> None:
    async def run() -> None:
        link = HeldLink("bmc", open_=True)
        link.power_gate.clear()
        source = BmcSource("dgx-017", link, timeout_s=0.3)
        await started(source)
        with pytest.raises(BmcError, match="to power off; the BMC may still carry it out"):
            await source.set_power(PowerAction.OFF)
        polled = asyncio.ensure_future(source.poll())
        await asyncio.sleep(0.05)  # the poll waits for the power request to end
        assert link.reads == 0
        link.power_gate.set()
        reading = await polled
        assert isinstance(reading, BmcReading) and reading.power_state is PowerState.ON
        assert (link.reads, link.powered) == (1, [PowerAction.OFF])
        await source.close()

    asyncio.run(run())


async def test_a_part_that_keeps_failing_is_told_once_not_each_time_its_text_moves() -> None:
    """A Redfish part's failure text counts its failures ("... (and 3 more)"): the source
    posts one part_stale when it fails and one part_recovered when it reads again, not a
    warning each poll."""
    from gpuconsole.readings.base import Event, PartStatus
    from gpuconsole.readings.bmc import PowerState
    from gpuconsole.sources.bmc.link import LinkReading
    from gpuconsole.sources.bmc.source import BmcSource

    texts = iter(["HTTP 500", "HTTP 500 (and 1 more)", "HTTP 500 (and 2 more)", None])

    class Flaky:
        label = "redfish://127.0.0.1:1"

        def read(self, *, sel: bool) -> LinkReading:
            text = next(texts)
            part = PartStatus("Chassis/1U/Thermal", text is None, text or "3 sensors")
            return LinkReading(PowerState.ON, (), parts=(part,))

        def set_power(self, action: object) -> str:
            raise NotImplementedError

        def close(self) -> None:
            pass

    events: list[Event] = []
    source = BmcSource("dgx-001", Flaky(), sel=False)  # type: ignore[arg-type]
    await source.start(events.append)
    try:
        for _ in range(4):
            await source.poll()
    finally:
        await source.close()
    assert [e.kind for e in events if e.kind.startswith("part_")] == [
        "part_stale",
        "part_recovered",
    ]
