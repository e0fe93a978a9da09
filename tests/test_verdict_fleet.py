"""A head judges each fleet snapshot its hub publishes as far as it changed (judge_fleet):
every node's verdict is then what judging that node afresh gives, whatever changed, and
never another node's. A real agent on loopback serves the demo fleet, a head reads it node
by node through its agent sources, and the test changes what the agent serves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import ClassVar

import msgspec
import pytest

from gpuconsole import codec
from gpuconsole.export.agent import Agent
from gpuconsole.facts.verdict import (
    Action,
    Verdict,
    forget_verdicts,
    gpu_verdict,
    judge_fleet,
    node_verdict,
    unfit_gpus,
)
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.base import Health
from gpuconsole.readings.nvml import NvmlReading, XidCount
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sources.agents import AgentClient, AgentSource
from gpuconsole.wiring import AgentSettings
from tests.export_fixtures import HeldHub, frozen_fleet
from tests.waiting import until

XID_NODE, GONE_NODE = "dgx-003", "dgx-004"
Shows = Callable[[NodeSnapshot], bool]


@dataclass(frozen=True)
class Seen:
    """What a console shows of a node: its verdict, its GPUs' and how many are out of work."""

    node: str
    verdict: Verdict
    gpus: tuple[tuple[str, Verdict], ...]
    unfit: int


def seen(snapshot: FleetSnapshot) -> list[Seen]:
    return [
        Seen(
            n.node,
            node_verdict(n),
            tuple((g.pci_bus_id, gpu_verdict(n, g)) for g in n.gpus),
            unfit_gpus(n),
        )
        for n in snapshot.nodes
    ]


def afresh(snapshot: FleetSnapshot) -> list[Seen]:
    """Every node of the snapshot judged with nothing remembered."""
    forget_verdicts()
    return seen(snapshot)


def with_xid(fleet: FleetSnapshot, node: str, gpu: int, code: int, count: int) -> FleetSnapshot:
    """The fleet where GPU `gpu` of `node` raised XID `code` `count` times."""
    found = fleet.node(node)
    assert found is not None and found.nvml is not None
    at = fleet.at - 60.0
    gpus = tuple(
        msgspec.structs.replace(g, xids=(XidCount(code, count, at - count, at),))
        if g.index == gpu
        else g
        for g in found.gpus
    )
    nvml = msgspec.structs.replace(found.nvml, gpus=gpus)
    return replaced(fleet, msgspec.structs.replace(found, nvml=nvml))


def with_stale(fleet: FleetSnapshot, node: str, source: str, stale: bool) -> FleetSnapshot:
    """The fleet where `source` of `node` is stale (or answers again), its readings kept."""
    found = fleet.node(node)
    assert found is not None
    statuses = tuple(
        msgspec.structs.replace(
            s,
            ok=not stale,
            stale_since=fleet.at if stale else None,
            error="no answer" if stale else None,
        )
        if s.source == source
        else s
        for s in found.statuses
    )
    return replaced(fleet, msgspec.structs.replace(found, statuses=statuses))


def replaced(fleet: FleetSnapshot, node: NodeSnapshot) -> FleetSnapshot:
    nodes = tuple(node if n.node == node.node else n for n in fleet.nodes)
    return msgspec.structs.replace(fleet, seq=fleet.seq + 1, nodes=nodes)


def without(fleet: FleetSnapshot, node: str) -> FleetSnapshot:
    nodes = tuple(n for n in fleet.nodes if n.node != node)
    return msgspec.structs.replace(fleet, seq=fleet.seq + 1, nodes=nodes)


@dataclass
class Head:
    """A head reading every node of the demo fleet through one agent, that judges each
    snapshot its hub publishes as a console does, and keeps what it showed."""

    agent: Agent
    served: HeldHub
    hub: Hub
    published: list[FleetSnapshot]
    shown: list[list[Seen]]

    def node(self, name: str) -> NodeSnapshot:
        assert self.hub.latest is not None
        found = self.hub.latest.node(name)
        assert found is not None
        return found

    async def serve(self, fleet: FleetSnapshot, name: str, shows: Shows) -> None:
        """Serve `fleet`, and wait for the head to show node `name` as it should."""
        self.served.held = fleet
        await until(lambda: shows(self.node(name)))


@pytest.fixture
async def head() -> AsyncIterator[Head]:
    forget_verdicts()
    fleet = frozen_fleet()
    served = HeldHub(fleet)
    agent = Agent(served, AgentSettings(port=0))
    await agent.start()
    hub = Hub(HubSettings(publish_gap_s=0.02, max_backoff_s=0.2))
    client = AgentClient(max_connections=8)
    url = f"http://127.0.0.1:{agent.port}"
    for node in fleet.nodes:
        hub.add_source(AgentSource(node.node, url, client, interval_s=0.05, timeout_s=2.0))
    published: list[FleetSnapshot] = []
    shown: list[list[Seen]] = []

    def show(snapshot: FleetSnapshot) -> None:
        judge_fleet(snapshot)  # as a console takes each snapshot, before any view asks
        published.append(snapshot)
        shown.append(seen(snapshot))

    hub.subscribe(show)
    await hub.start()
    try:
        await until(
            lambda: hub.latest is not None and all(n.status("remote").ok for n in hub.latest.nodes)  # type: ignore[union-attr]
        )
        yield Head(agent, served, hub, published, shown)
    finally:
        await hub.stop()
        await agent.stop()
        forget_verdicts()


def xids_on(gpu: int, action: Action, times: str) -> Shows:
    def show(node: NodeSnapshot) -> bool:
        verdict = gpu_verdict(node, node.gpus[gpu])
        return verdict.action is action and any(times in f.text for f in verdict.findings)

    return show


async def test_every_published_snapshot_shows_each_node_as_judged_afresh(head: Head) -> None:
    """XIDs counted up on one GPU, a node added, a source of another node going stale and
    back, an agent that stops serving a node and serves it again: each snapshot the head
    published showed every node as judging it afresh does, and the changes themselves."""
    fleet = head.served.held
    before = node_verdict(head.node(XID_NODE))
    # An application's XID: kept as evidence, then a repeat the catalog asks to watch
    fleet = with_xid(fleet, XID_NODE, 1, 13, 2)
    await head.serve(fleet, XID_NODE, xids_on(1, Action.FIT, "(2 times)"))
    fleet = with_xid(fleet, XID_NODE, 1, 13, 3)
    await head.serve(fleet, XID_NODE, xids_on(1, Action.WATCH, "(3 times)"))
    assert (
        "repeats on this GPU"
        in gpu_verdict(head.node(XID_NODE), head.node(XID_NODE).gpus[1]).findings[0].text
    )
    assert node_verdict(head.node(XID_NODE)).action is before.action  # its worse fault stays
    # a node added to the head as it runs, not read yet
    head.hub.add_node("dgx-009")
    await until(
        lambda: head.hub.latest is not None and len(head.hub.latest.nodes) == len(fleet.nodes) + 1
    )
    assert node_verdict(head.node("dgx-009")).health is Health.UNKNOWN
    # a healthy node whose agent says its BMC stopped answering, its verdict's words alike
    fit = next(n.node for n in fleet.nodes if n.bmc is not None and node_verdict(n).fit)
    fleet = with_stale(fleet, fit, "bmc", True)
    await head.serve(fleet, fit, lambda n: node_verdict(n).health is Health.STALE)
    fleet = with_stale(fleet, fit, "bmc", False)
    await head.serve(fleet, fit, lambda n: node_verdict(n).health is Health.OK)
    # the agent stops serving a node: the head shows its agent silent, then back
    await head.serve(
        without(fleet, GONE_NODE),
        GONE_NODE,
        lambda n: "agent_silent" in [f.code for f in node_verdict(n).findings],
    )
    fleet = msgspec.structs.replace(fleet, seq=fleet.seq + 10)
    await head.serve(fleet, GONE_NODE, lambda n: n.status("remote").ok)  # type: ignore[union-attr]
    assert node_verdict(head.node(GONE_NODE)).action is Action.RESET_GPU
    await head.hub.stop()
    published, shown = list(head.published), list(head.shown)
    assert len(published) > 10
    for snapshot, showed in zip(published, shown, strict=True):
        assert showed == afresh(snapshot), snapshot.seq


def xid_count(snapshot: FleetSnapshot) -> int:
    node = snapshot.node(XID_NODE)
    assert node is not None
    return sum(x.count for x in node.gpus[1].xids) if node.gpus else -1  # -1: not read yet


async def test_a_node_moved_removed_or_reordered_keeps_its_own_verdict(head: Head) -> None:
    """The hub's snapshots judged as a console may take them: some passed over, and copies
    with their nodes reordered, one left out, moved to the front, or one node taken from a
    later snapshot (what the hub rebuilt for the snapshot copied says nothing of the
    copy). Every node shows its own verdict, as of the snapshot judged."""
    fleet = head.served.held
    fleet = with_xid(fleet, XID_NODE, 1, 13, 2)
    await head.serve(fleet, XID_NODE, xids_on(1, Action.FIT, "(2 times)"))
    await asyncio.sleep(0.5)
    fleet = with_xid(fleet, XID_NODE, 1, 13, 3)
    await head.serve(fleet, XID_NODE, xids_on(1, Action.WATCH, "(3 times)"))
    await asyncio.sleep(0.5)
    await head.hub.stop()
    published = list(head.published)
    counts = [xid_count(s) for s in published]
    later = published[-1]
    assert counts[-1] == 3

    def unrebuilt(i: int) -> bool:  # the XID node as in the snapshot before
        return published[i].node(XID_NODE) is published[i - 1].node(XID_NODE)

    # one published with 2 XIDs, the next with the XID node as it was
    two = next(i for i in range(1, len(published)) if counts[i] == 2 and unrebuilt(i))
    # one published with 3 XIDs, the XID node as in the one before (3 as well)
    three = next(i for i in range(1, len(published)) if counts[i - 1] == 3 and unrebuilt(i))

    def reordered(s: FleetSnapshot) -> FleetSnapshot:
        return msgspec.structs.replace(s, nodes=tuple(reversed(s.nodes)))

    def one_left_out(s: FleetSnapshot) -> FleetSnapshot:
        return msgspec.structs.replace(s, nodes=s.nodes[1:])

    def moved_first(s: FleetSnapshot) -> FleetSnapshot:
        return msgspec.structs.replace(s, nodes=(s.nodes[-1], *s.nodes[:-1]))

    def mixed(s: FleetSnapshot) -> FleetSnapshot:
        nodes = tuple(later.node(n.node) if n.node == XID_NODE else n for n in s.nodes)
        return msgspec.structs.replace(s, nodes=nodes)  # type: ignore[arg-type]

    order = [
        published[two - 1],
        mixed(published[two]),  # the XID node of the later snapshot, 3 XIDs
        published[two - 1],
        published[three],  # those between passed over: the XID node has 3 XIDs now
        reordered(published[three + 1]),
        published[three + 2],
        one_left_out(published[three + 3]),
        published[three + 4],
        moved_first(published[three + 5]),
        published[three + 5],
    ]
    expected = [afresh(s) for s in order]
    forget_verdicts()
    for at, (snapshot, want) in enumerate(zip(order, expected, strict=True)):
        judge_fleet(snapshot)
        assert seen(snapshot) == want, at
    assert [xid_count(s) for s in order[:4]] == [2, 3, 2, 3]


def test_a_snapshot_read_from_json_says_nothing_of_what_a_hub_rebuilt() -> None:
    """The hub's note on which nodes it rebuilt stays in its process: a snapshot written
    and read back is judged like any other."""
    fleet = frozen_fleet()
    back = codec.loads(codec.dumps(fleet))
    assert "rebuilt" not in codec.snapshot_json(fleet)
    assert back.rebuilt is None and fleet.rebuilt is not None
    forget_verdicts()
    judge_fleet(fleet)
    assert seen(back) == afresh(back)


class Replayed:
    """A node's NVML source that gives its readings in turn, the last again and again."""

    kind: ClassVar[str] = "nvml"

    def __init__(self, node: str, readings: list[NvmlReading]) -> None:
        self.node, self.readings = node, readings
        self.interval_s, self.timeout_s = 1.0, 1.0

    async def start(self, emit: object) -> None:
        pass

    async def poll(self) -> NvmlReading:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    async def close(self) -> None:
        pass


async def test_a_node_judged_here_is_judged_again_whenever_its_readings_move() -> None:
    """A hub's steady nodes (new readings, every source answering as before) with no
    verdict of their agent's are judged from those readings: an XID raised while every
    source answers shows at once, and every snapshot shows each node as judged afresh."""
    fleet = frozen_fleet()
    forget_verdicts()
    fit = next(n.node for n in fleet.nodes if len(n.gpus) > 1 and gpu_verdict(n, n.gpus[1]).fit)
    raised = with_xid(fleet, fit, 1, 79, 1)  # fallen off the bus: reset it
    hub = Hub(HubSettings(publish_gap_s=0.02))
    for node in fleet.nodes:
        later = raised.node(node.node)
        if node.nvml is not None and later is not None and later.nvml is not None:
            hub.add_source(Replayed(node.node, [node.nvml, node.nvml, later.nvml]))
    published, shown = [], []
    for _ in range(4):
        snapshot = await hub.poll_once()
        judge_fleet(snapshot)
        published.append(snapshot)
        shown.append(seen(snapshot))
    at = next(i for i, n in enumerate(published[2].nodes) if n.node == fit)
    assert published[2].rebuilt is not None and published[2].rebuilt.steady[at] == 1
    before, after = published[1].nodes[at], published[2].nodes[at]
    assert gpu_verdict(before, before.gpus[1]).fit
    assert gpu_verdict(after, after.gpus[1]).action is Action.RESET_GPU
    for snapshot, showed in zip(published, shown, strict=True):
        assert showed == afresh(snapshot), snapshot.seq
