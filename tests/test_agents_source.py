"""The head reads nodes through their agents: real agents on loopback, killed and restarted."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from gpuconsole import codec
from gpuconsole.export.agent import Agent, Body, accepts_gzip, respond, select, snapshot_body
from gpuconsole.facts import summaries
from gpuconsole.facts.verdict import node_verdict
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.agents import part_version
from gpuconsole.readings.base import Event, Severity
from gpuconsole.readings.fabric import port_deltas, port_problems, port_rates
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sim.cluster import add_sim_sources, build_sim_nodes, demo_cluster
from gpuconsole.sources import agents as agents_source
from gpuconsole.sources.agents import AgentClient, AgentSource
from gpuconsole.wiring import AgentSettings
from tests.export_fixtures import HeldHub, frozen_fleet
from tests.waiting import until


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def serve(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    path: str = "/api/v1/snapshot",
) -> tuple[web.AppRunner, int]:
    """An HTTP server on loopback answering `path` with `handler`; cleanup() ends it."""
    app = web.Application()
    app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


class NodeAgent:
    """A simulated GPU node running its own hub and agent, as `gpuconsole agent` does."""

    def __init__(self, name: str, profile: str, port: int) -> None:
        self.name, self.port = name, port
        spec = next(s for s in demo_cluster() if s.profile == profile)
        self.hub = Hub(HubSettings(publish_gap_s=0.05))
        sims = build_sim_nodes([type(spec)(name, profile, spec.scenarios)])
        add_sim_sources(self.hub, sims, interval_s=0.2, events=False)
        self.agent = Agent(self.hub, AgentSettings(port=port))

    async def start(self) -> None:
        await self.hub.start()
        await self.agent.start()

    async def stop(self) -> None:
        await self.agent.stop()
        await self.hub.stop()


@pytest.fixture
async def agents() -> AsyncIterator[list[NodeAgent]]:
    nodes = [
        NodeAgent("dgx-101", "dgx-h100", free_port()),
        NodeAgent("dgx-102", "dgx-h100", free_port()),
        NodeAgent("dgxa-101", "dgx-a100", free_port()),
    ]
    for node in nodes:
        await node.start()
    try:
        yield nodes
    finally:
        for node in nodes:
            await node.stop()


def head_for(agents: list[NodeAgent], **kw: object) -> tuple[Hub, AgentClient]:
    head = Hub(HubSettings(publish_gap_s=0.05, max_backoff_s=0.5))
    client = AgentClient(max_connections=4)
    for a in agents:
        head.add_source(
            AgentSource(
                a.name, f"http://127.0.0.1:{a.port}", client, interval_s=0.2, timeout_s=2.0, **kw
            )  # type: ignore[arg-type]
        )
    return head, client


def ok(snapshot: FleetSnapshot | None, node: str, source: str = "remote") -> bool:
    if snapshot is None or snapshot.node(node) is None:
        return False
    status = snapshot.node(node).status(source)  # type: ignore[union-attr]
    return status is not None and status.ok


async def test_the_head_shows_every_node_its_agents_serve(agents: list[NodeAgent]) -> None:
    head, _ = head_for(agents)
    await head.start()
    try:
        await until(
            lambda: all(ok(head.latest, a.name) and ok(head.latest, a.name, "nvml") for a in agents)
        )
        snapshot = head.latest
        assert snapshot is not None
        for a in agents:
            ours, theirs = snapshot.node(a.name), a.hub.latest.node(a.name)  # type: ignore[union-attr]
            assert ours is not None and theirs is not None
            assert [g.uuid for g in ours.gpus] == [g.uuid for g in theirs.gpus]
            assert ours.simulated and ours.profile == theirs.profile
        assert snapshot.node("dgxa-101").gpus[0].name == "NVIDIA A100-SXM4-40GB"  # type: ignore[union-attr]
        # the summary leaves per-link NVLink readings to the drill-down
        assert snapshot.node("dgx-101").gpus[0].nvlinks == ()  # type: ignore[union-attr]
        # history builds on the head from what the agents send
        await asyncio.sleep(0.6)
        node = head.latest.node("dgx-101")  # type: ignore[union-attr]
        uuid = node.gpus[0].uuid  # type: ignore[union-attr]
        assert len(node.history.series("gpu", uuid, "power_w")) >= 3  # type: ignore[union-attr]
    finally:
        await head.stop()


async def test_an_agent_killed_and_restarted_goes_stale_and_comes_back(
    agents: list[NodeAgent],
) -> None:
    head, _ = head_for(agents)
    await head.start()
    victim = agents[1]
    try:
        await until(lambda: all(ok(head.latest, a.name, "nvml") for a in agents))
        await victim.stop()
        await until(lambda: not ok(head.latest, victim.name))
        status = head.latest.node(victim.name).status("remote")  # type: ignore[union-attr]
        assert status is not None and "unreachable" in (status.error or "")
        # its last reading is kept, the others keep updating
        assert head.latest.node(victim.name).gpus  # type: ignore[union-attr]
        assert ok(head.latest, agents[0].name) and ok(head.latest, agents[2].name)
        revived = NodeAgent(victim.name, "dgx-h100", victim.port)
        agents[1] = revived
        await revived.start()
        await until(lambda: ok(head.latest, victim.name))
        assert any(e.kind == "source_recovered" and e.node == victim.name for e in head.events())
    finally:
        await head.stop()


async def test_events_recorded_by_an_agent_reach_the_head_once(agents: list[NodeAgent]) -> None:
    head, _ = head_for(agents[:1])
    await head.start()
    try:
        await until(lambda: ok(head.latest, agents[0].name))
        xid = Event(
            agents[0].hub.latest.at,
            agents[0].name,
            "nvml",
            "xid",
            Severity.CRITICAL,  # type: ignore[union-attr]
            "XID 79 on GPU 5: GPU has fallen off the bus",
            5,
            "GPU-x",
            79,
        )
        agents[0].hub.post_event(xid)
        await until(lambda: any(e.kind == "xid" for e in head.events()))
        await asyncio.sleep(0.6)  # several more polls
        assert [e.message for e in head.events() if e.kind == "xid"] == [xid.message]
        assert head.latest.node(agents[0].name).last_xid.get("GPU-x") == 79  # type: ignore[union-attr]
    finally:
        await head.stop()


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        (b"<html>oops</html>", 200, "not JSON"),
        (b'{"schema_version": 99, "nodes": []}', 200, "schema 99"),
        (b'{"schema_version": 1, "nodes": [{"node": 5}]}', 200, "does not fit"),
        (b"busy", 503, "HTTP 503"),
    ],
)
async def test_an_agent_that_returns_garbage_is_stale_with_a_reason(
    body: bytes, status: int, expected: str
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, status=status)

    runner, port = await serve(handler)
    head = Hub()
    head.add_source(AgentSource("dgx-9", f"http://127.0.0.1:{port}", AgentClient()))
    try:
        snapshot = await head.poll_once()
    finally:
        await runner.cleanup()
    status_ = snapshot.node("dgx-9").status("remote")  # type: ignore[union-attr]
    assert status_ is not None and not status_.ok
    assert expected in (status_.error or "")


def fleet_row(node: NodeSnapshot) -> tuple[object, ...]:
    """Everything the fleet view, the wallboard and the node's panels compute from a node."""
    rows = summaries.gpu_rows(node)
    ports = node.fabric.ports if node.fabric is not None else ()
    return (
        summaries.gpu_counts(node),
        node_verdict(node),
        summaries.facets(node),
        summaries.node_power_w(node),
        summaries.node_hottest_c(node),
        summaries.node_model(node),
        summaries.filter_text(node),
        [summaries.row_cell_text(row, metric) for row in rows for metric in summaries.Metric],
        [summaries.row_health(node, row) for row in rows],
        [summaries.gpu_owner(node, gpu) for gpu in node.gpus],
        summaries.bmc_panel(node),
        summaries.fabric_panel(node),
        [port_problems(p, port_rates(node.rate, p), port_deltas(node.delta, p)) for p in ports],
    )


def test_the_summary_carries_the_fleet_view_in_under_a_third_of_the_bytes() -> None:
    """Every node of the demo cluster (all four sources): the head computes the same fleet
    row from the summary as from everything, and an 8-GPU node, with its verdict, fits in
    42 KB."""
    fleet = frozen_fleet()
    full_bytes = small_bytes = 0
    for node in fleet.nodes:
        full_text = codec.dumps(FleetSnapshot(1, 0.0, (node,)))
        small_text = codec.dumps(select(fleet, node.node, summary=True))
        full_bytes, small_bytes = full_bytes + len(full_text), small_bytes + len(small_text)
        full, small = codec.loads(full_text).nodes[0], codec.loads(small_text).nodes[0]
        assert fleet_row(small) == fleet_row(full), node.node
        assert len(small_text) < 42_000, node.node
        assert all(g.nvlinks == () for g in small.gpus)  # left to the drill-down
    assert small_bytes * 3 < full_bytes


def test_parts_an_agent_sends_unchanged_are_kept_as_they_were() -> None:
    """BMC and tenancy poll every few seconds, the head every second: a part whose JSON did
    not change is not decoded again, and stays the same object (owners stay remembered)."""
    doc = codec.snapshot_json(select(frozen_fleet(), "dgx-002", summary=True))
    source = AgentSource("dgx-002", "http://127.0.0.1:1", AgentClient())
    first = source.parse(json.dumps(doc).encode()).node
    moved = json.loads(json.dumps(doc))
    moved["nodes"][0]["nvml"]["gpus"][0]["power_w"] = 123.0
    moved["nodes"][0]["fabric"]["at"] += 2.0
    second = source.parse(json.dumps(moved).encode()).node
    assert second.tenancy is first.tenancy and second.bmc is first.bmc
    assert first.fabric is not None and second.fabric is not first.fabric
    assert second.fabric == msgspec.structs.replace(first.fabric, at=first.fabric.at + 2.0)
    assert second.gpus[0].power_w == 123.0
    assert second == codec.decode_node(moved["nodes"][0])


def test_the_head_names_a_node_its_own_way_in_every_status() -> None:
    """A file_sd target 10.1.0.2:9400 is node 10.1.0.2 on the head, dgx-002 to its agent."""
    doc = codec.snapshot_json(select(frozen_fleet(), "dgx-002", summary=True))
    node = (
        AgentSource("10.1.0.2", "http://10.1.0.2:9400", AgentClient())
        .parse(json.dumps(doc).encode())
        .node
    )
    assert node.statuses and {s.node for s in node.statuses} == {"10.1.0.2"}
    theirs = codec.decode_node(doc["nodes"][0])
    assert [msgspec.structs.replace(s, node="dgx-002") for s in node.statuses] == list(
        theirs.statuses
    )
    assert msgspec.structs.replace(node, statuses=theirs.statuses) == theirs


def with_power(fleet: FleetSnapshot, power_w: float) -> FleetSnapshot:
    """The next snapshot, where the first GPU of the first node draws `power_w`."""
    node = fleet.nodes[0]
    assert node.nvml is not None
    gpus = (msgspec.structs.replace(node.gpus[0], power_w=power_w), *node.gpus[1:])
    node = msgspec.structs.replace(node, nvml=msgspec.structs.replace(node.nvml, gpus=gpus))
    return msgspec.structs.replace(fleet, seq=fleet.seq + 1, nodes=(node, *fleet.nodes[1:]))


async def test_a_node_its_agent_has_not_republished_is_not_read_again() -> None:
    """The agent answers 304 while its hub holds the same snapshot: the head keeps the node
    it decoded, figure for figure what the agent serves, and reads the next one whole."""
    hub = HeldHub(select(frozen_fleet(), "dgx-002", summary=False))
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    client = AgentClient()
    source = AgentSource("dgx-002", f"http://127.0.0.1:{agent.port}", client)
    try:
        first = await source.poll()
        served = codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
        assert first.node == served
        again = await source.poll()
        assert again.node is first.node  # not decoded again
        hub.held = with_power(hub.held, 123.0)
        third = await source.poll()
        assert third.node.gpus[0].power_w == 123.0
        assert third.node == codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
    finally:
        await source.close()
        await agent.stop()


async def test_the_head_asks_for_gzip_and_reads_it() -> None:
    """What travels is a sixth of the JSON; what the head reads is the same node."""
    raw = snapshot_body(frozen_fleet(), "dgx-002", summary=True)
    asked: list[str] = []
    sent: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Accept-Encoding", ""))
        response = respond(Body(raw, 'W/"1"'), request)
        assert isinstance(response.body, bytes)
        sent.append(len(response.body))
        return response

    runner, port = await serve(handler)
    source = AgentSource("dgx-002", f"http://127.0.0.1:{port}", AgentClient())
    try:
        reading = await source.poll()
    finally:
        await source.close()
        await runner.cleanup()
    assert len(asked) == 1 and accepts_gzip(asked[0])
    assert sent[0] * 4 < len(raw)
    assert reading.node == codec.loads(raw).nodes[0]


async def test_drilling_into_a_node_reads_everything_its_agent_has(
    agents: list[NodeAgent],
) -> None:
    head, _ = head_for(agents)
    await head.start()
    try:
        await until(lambda: all(ok(head.latest, a.name, "nvml") for a in agents))
        assert all(not g.nvlinks for n in head.latest.nodes for g in n.gpus)  # type: ignore[union-attr]
        head.focus("dgx-102")
        await until(lambda: bool(head.latest.node("dgx-102").gpus[0].nvlinks))  # type: ignore[union-attr]
        theirs = agents[1].hub.latest.node("dgx-102")  # type: ignore[union-attr]
        ours = head.latest.node("dgx-102")  # type: ignore[union-attr]
        assert ours is not None and theirs is not None
        assert len(ours.gpus[0].nvlinks) == len(theirs.gpus[0].nvlinks) == 18
        assert not head.latest.node("dgx-101").gpus[0].nvlinks  # type: ignore[union-attr]
        head.focus(None)
        await until(lambda: not head.latest.node("dgx-102").gpus[0].nvlinks)  # type: ignore[union-attr]
    finally:
        await head.stop()


async def test_a_console_drilling_into_a_node_reads_it_whole_while_it_shows_it(
    agents: list[NodeAgent],
) -> None:
    from gpuconsole.tui.app import ConsoleApp
    from gpuconsole.tui.screens.node import NodeScreen

    head, _ = head_for(agents)
    await head.start()
    sources = {s.node: s for s in head.sources if isinstance(s, AgentSource)}
    other = ConsoleApp(head, start_hub=False, theme_dirs=[])
    app = ConsoleApp(head, start_hub=False, theme_dirs=[])
    try:
        await until(lambda: all(ok(head.latest, a.name, "nvml") for a in agents), 30)
        async with other.run_test(size=(120, 40)), app.run_test(size=(120, 40)) as pilot:
            other.open_node("dgxa-101")  # another console (an ssh session) on the same hub
            app.open_node("dgx-102")
            await pilot.pause()
            assert isinstance(app.screen, NodeScreen)
            assert {n for n, s in sources.items() if s.detail} == {"dgx-102", "dgxa-101"}
            await until(lambda: bool(head.latest.node("dgx-102").gpus[0].nvlinks), 30)  # type: ignore[union-attr]
            app.open_gpu("dgx-102", 0)
            await pilot.press("question_mark")  # help over the GPU view: still that node
            await pilot.pause()
            assert sources["dgx-102"].detail
            for _ in range(2):
                await pilot.press("escape")
            await pilot.pause()
            assert isinstance(app.screen, NodeScreen) and sources["dgx-102"].detail
            await pilot.press("escape")  # back on the fleet: the summary again
            await pilot.pause()
            assert {n for n, s in sources.items() if s.detail} == {"dgxa-101"}
            await until(lambda: not head.latest.node("dgx-102").gpus[0].nvlinks)  # type: ignore[union-attr]
        # a console that ends lets go of its node
        assert not any(s.detail for s in sources.values())
    finally:
        await head.stop()


async def test_a_large_body_is_read_whole() -> None:
    """An answer bigger than one read of the socket (a full 8-GPU snapshot is 130 KB)."""
    body = json.dumps({"pad": "x" * 3_000_000}).encode()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    runner, port = await serve(handler, "/big")
    client = AgentClient()
    client.acquire()
    try:
        data = await client.get_json(f"http://127.0.0.1:{port}/big", 10.0)
        assert len(data["pad"]) == 3_000_000
        with pytest.raises(ValueError, match="more than 1000000 bytes"):
            await client.get_json(f"http://127.0.0.1:{port}/big", 10.0, limit=1_000_000)
    finally:
        await client.release()
        await runner.cleanup()


async def test_an_odd_event_from_an_agent_is_dropped_alone() -> None:
    """Events an agent sends that no snapshot could hold (a time that is a string, a GPU
    index that is not a number, an unknown severity) are skipped; the good one and the
    node's reading still arrive, and the head's snapshot still writes itself out."""
    doc = json.loads(codec.dumps(frozen_fleet()))
    node = next(n for n in doc["nodes"] if n["node"] == "dgx-001")
    good = {
        "at": 1_796_000_100.0,
        "node": "dgx-001",
        "source": "nvml",
        "kind": "xid",
        "severity": "critical",
        "message": "GPU 3: Xid 79",
        "gpu_index": 3,
    }
    odd = [
        {**good, "at": "inf"},
        {**good, "gpu_index": "three"},
        {**good, "severity": "boom"},
        {**good, "message": None},
        "not an event",
    ]
    body = json.dumps({**doc, "nodes": [node], "events": [*odd, good]}).encode()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    runner, port = await serve(handler)
    head = Hub(HubSettings(publish_gap_s=0.05))
    head.add_source(AgentSource("dgx-001", f"http://127.0.0.1:{port}", AgentClient()))
    await head.start()
    try:
        await until(
            lambda: ok(head.latest, "dgx-001") and any(e.kind == "xid" for e in head.events())
        )
        assert [e.message for e in head.events() if e.kind == "xid"] == ["GPU 3: Xid 79"]
        assert codec.loads(codec.dumps(head.latest))  # type: ignore[arg-type]
    finally:
        await head.stop()
        await runner.cleanup()


async def test_an_agents_event_names_its_gpu_by_bus_id_and_an_older_ones_still_arrives() -> None:
    """An agent writes an event's GPU as NVML writes bus ids; the head holds it in sysfs form.
    An agent from before events carried a bus id sends none: its event still arrives."""
    doc = json.loads(codec.dumps(frozen_fleet()))
    node = next(n for n in doc["nodes"] if n["node"] == "dgx-001")
    older = {
        "at": 1_796_000_100.0,
        "node": "dgx-001",
        "source": "nvml",
        "kind": "xid",
        "severity": "critical",
        "message": "XID 79 on GPU 3: GPU has fallen off the bus",
        "gpu_index": 3,
        "gpu_uuid": "GPU-3",
        "code": 79,
    }
    newer = {**older, "at": 1_796_000_101.0, "gpu_bus_id": "00000000:C3:00.0"}
    body = json.dumps({**doc, "nodes": [node], "events": [older, newer]}).encode()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    runner, port = await serve(handler)
    head = Hub(HubSettings(publish_gap_s=0.05))
    head.add_source(AgentSource("dgx-001", f"http://127.0.0.1:{port}", AgentClient()))
    await head.start()
    try:
        await until(lambda: len([e for e in head.events() if e.kind == "xid"]) == 2)
        xids = sorted((e for e in head.events() if e.kind == "xid"), key=lambda e: e.at)
        assert [e.gpu_bus_id for e in xids] == [None, "0000:c3:00.0"]
        # and a head passes it on as the agent wrote it
        assert [codec.encode(e)["gpu_bus_id"] for e in xids] == [None, "00000000:C3:00.0"]
    finally:
        await head.stop()
        await runner.cleanup()


async def test_connections_are_bounded() -> None:
    """Twenty nodes behind one slow agent: never more than the client's limit at once."""
    open_now = 0
    most = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        await asyncio.sleep(0.1)
        open_now -= 1
        return web.Response(status=503, text="busy")

    runner, port = await serve(handler)
    head = Hub()
    client = AgentClient(max_connections=3)
    for i in range(20):
        head.add_source(AgentSource(f"n{i}", f"http://127.0.0.1:{port}", client))
    try:
        await head.poll_once()
    finally:
        await runner.cleanup()
    assert 1 <= most <= 3


def with_bmc(fleet: FleetSnapshot, **read: Any) -> FleetSnapshot:
    """The next snapshot, where the first node's BMC was read again: at another time, or
    with other figures."""
    node = fleet.nodes[0]
    assert node.bmc is not None
    node = msgspec.structs.replace(node, bmc=msgspec.structs.replace(node.bmc, **read))
    return msgspec.structs.replace(fleet, seq=fleet.seq + 1, nodes=(node, *fleet.nodes[1:]))


async def test_parts_the_head_holds_are_not_sent_again() -> None:
    """The head says which BMC, fabric and tenancy readings it holds; the agent sends only
    the parts that changed, and the head's node is still, figure for figure, the agent's."""
    hub = HeldHub(select(frozen_fleet(), "dgx-002", summary=False))
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    sizes: list[int] = []
    client = AgentClient()
    # polled, as a head reads an agent that does not stream
    source = AgentSource("dgx-002", f"http://127.0.0.1:{agent.port}", client, watch=False)
    get = client.get

    async def counted(url: Any, timeout_s: float, **kw: Any) -> Any:
        answer = await get(url, timeout_s, **kw)
        sizes.append(len(answer.body or b""))
        return answer

    client.get = counted  # type: ignore[method-assign]
    try:
        first = await source.poll()
        assert first.node == codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
        hub.held = with_power(hub.held, 123.0)
        second = await source.poll()
        assert second.node.gpus[0].power_w == 123.0
        assert second.node == codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
        assert second.node.fabric is first.node.fabric  # kept, not sent
        assert sizes[1] < sizes[0] * 0.6, sizes  # 13 KiB of 26
        hub.held = with_bmc(hub.held, power_w=4321.0)
        third = await source.poll()
        assert third.node.bmc is not None and third.node.bmc.power_w == 4321.0
        assert third.node == codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
        assert sizes[0] > sizes[2] > sizes[1], sizes
        # read again, finding what it found before: only its time is sent
        hub.held = with_bmc(hub.held, at=1_796_000_099.0)
        fourth = await source.poll()
        assert fourth.node.bmc is not None and fourth.node.bmc.at == 1_796_000_099.0
        assert fourth.node == codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
        assert sizes[3] < sizes[1] + 64, sizes
        # a head of the previous version asks without `have`: the body it always had
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{agent.port}/api/v1/snapshot?view=summary&node=dgx-002"
            async with session.get(url) as response:
                old = await response.read()
        assert old == codec.dumps(select(hub.held, "dgx-002", summary=True), sparse=True).encode()
    finally:
        await source.close()
        await agent.stop()


async def test_a_part_that_changed_is_sent_though_its_source_read_it_at_the_same_time() -> None:
    """A part's version is what it says, not when it was read: a BMC read again within the
    clock's resolution (or after the clock stepped back) with other figures is sent, and the
    head shows them; as it does on a watch."""
    hub = HeldHub(select(frozen_fleet(), "dgx-002", summary=False))
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    client = AgentClient()
    polled = AgentSource("dgx-002", f"http://127.0.0.1:{agent.port}", client, watch=False)
    watched = AgentSource(
        "dgx-002", f"http://127.0.0.1:{agent.port}", client, interval_s=0.2, timeout_s=3.0
    )
    try:
        for source in (polled, watched):
            first = await source.poll()
            assert first.node.bmc is not None and first.node.bmc.power_w != 4321.0
        at = hub.held.nodes[0].bmc.at  # type: ignore[union-attr]
        hub.held = with_bmc(hub.held, power_w=4321.0, at=at)
        for source in (polled, watched):
            node = (await source.poll()).node
            if source is watched and node.bmc is not None and node.bmc.power_w != 4321.0:
                node = (await source.poll()).node  # the beat of the second before
            assert node.bmc is not None and node.bmc.power_w == 4321.0, source.watch
            assert node == codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
    finally:
        await polled.close()
        await watched.close()
        await agent.stop()


def test_an_agent_that_restarts_says_new_versions_for_the_very_same_parts() -> None:
    """Versions are an agent process's own: one started again has a head that held parts
    of the one before read each whole once, whatever its parts say."""
    node = frozen_fleet().nodes[0]
    parts = {p: getattr(node, p) for p in ("bmc", "fabric", "tenancy") if getattr(node, p)}
    here = {p: part_version(r) for p, r in parts.items()}
    assert here == {p: part_version(msgspec.structs.replace(r)) for p, r in parts.items()}
    script = (
        "import json; from gpuconsole.readings.agents import part_version; "
        "from tests.export_fixtures import frozen_fleet; n = frozen_fleet().nodes[0]; "
        f"print(json.dumps({{p: part_version(getattr(n, p)) for p in {sorted(parts)!r}}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    there = json.loads(out.stdout)
    assert set(there) == set(here) and all(there[p] != here[p] for p in here), (here, there)


async def test_a_streaming_agent_is_read_through_one_watch_that_sends_only_changed_parts() -> None:
    """One request, held open: each change arrives as a frame, figure for figure what the
    agent serves, parts the head holds left out; while nothing changes, beats keep it fresh."""
    hub = HeldHub(select(frozen_fleet(), "dgx-002", summary=False))
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    client = AgentClient()
    source = AgentSource(
        "dgx-002", f"http://127.0.0.1:{agent.port}", client, interval_s=0.2, timeout_s=3.0
    )
    requests: list[str] = []
    watch, get = client.watch, client.get

    async def watched(url: Any, timeout_s: float, **kw: Any) -> Any:
        requests.append(f"watch {url}")
        return await watch(url, timeout_s, **kw)

    async def polled(url: Any, timeout_s: float, **kw: Any) -> Any:
        requests.append(f"get {url}")
        return await get(url, timeout_s, **kw)

    client.watch, client.get = watched, polled  # type: ignore[method-assign]
    sizes: list[int] = []
    sent: list[dict[str, Any]] = []  # each frame's node
    take = agents_source._take_frame

    def measured(frames: bytearray) -> tuple[bytes, bytes] | None:
        got = take(frames)
        if got is not None and got[1]:
            sizes.append(len(got[1]))
            body = gzip.decompress(got[1]) if got[0] == b"gzip" else got[1]
            sent.append(json.loads(body)["nodes"][0])
        return got

    agents_source._take_frame = measured  # type: ignore[assignment]
    try:
        first = await source.poll()
        assert first.node == codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
        still = await source.poll()  # nothing new: a beat
        assert still.node is first.node and still.at > first.at
        hub.held = with_power(hub.held, 123.0)
        second = await source.poll()
        if second.node.gpus[0].power_w != 123.0:  # the beat of the second before
            second = await source.poll()
        assert second.node == codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
        assert second.node.fabric is first.node.fabric  # kept, not sent
        hub.held = with_bmc(hub.held, power_w=4321.0)
        third = await source.poll()
        if third.node.bmc is None or third.node.bmc.power_w != 4321.0:
            third = await source.poll()
        assert third.node == codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
        assert third.node.fabric is first.node.fabric  # kept, not sent
        assert len(requests) == 1 and "watch=0.2" in requests[0], requests
        # gzip frames: the BMC's few changed figures weigh about what its time does
        assert len(sizes) == 3 and sizes[0] > max(sizes[1:]) + 300, sizes
        assert [sorted(n.get("kept", ())) for n in sent] == [
            [],
            ["bmc", "fabric", "tenancy"],
            ["fabric", "tenancy"],
        ]
    finally:
        agents_source._take_frame = take  # type: ignore[assignment]
        await source.close()
        await agent.stop()


async def test_an_agent_that_does_not_stream_is_polled() -> None:
    """An agent of the previous version answers the watch as a poll: the head takes that
    answer, then polls it as it always did (asking whether its copy is current)."""
    raw = snapshot_body(frozen_fleet(), "dgx-002", summary=True)
    asked: list[tuple[bool, str | None]] = []

    async def handler(request: web.Request) -> web.Response:
        asked.append(("watch" in request.query, request.headers.get("If-None-Match")))
        return respond(Body(raw, 'W/"1"'), request)

    runner, port = await serve(handler)
    source = AgentSource("dgx-002", f"http://127.0.0.1:{port}", AgentClient())
    try:
        first = await source.poll()
        second = await source.poll()
    finally:
        await source.close()
        await runner.cleanup()
    assert first.node == codec.loads(raw).nodes[0] and second.node is first.node
    assert asked == [(True, None), (False, 'W/"1"')]


async def test_an_agent_behind_a_proxy_that_holds_its_watch_back_is_polled_in_time() -> None:
    """A proxy that sends an answer only whole never answers a watch: the head polls in
    the same read, and from then on."""
    raw = snapshot_body(frozen_fleet(), "dgx-002", summary=True)
    asked: list[bool] = []

    async def handler(request: web.Request) -> web.Response:
        asked.append("watch" in request.query)
        if "watch" in request.query:
            await asyncio.sleep(5)  # the stream, held back
        return respond(Body(raw, 'W/"1"'), request)

    runner, port = await serve(handler)
    source = AgentSource("dgx-002", f"http://127.0.0.1:{port}", AgentClient(), timeout_s=1.0)
    try:
        first = await asyncio.wait_for(source.poll(), 1.0)
        second = await asyncio.wait_for(source.poll(), 1.0)
    finally:
        await source.close()
        await runner.cleanup()
    assert first.node == codec.loads(raw).nodes[0] and second.node is first.node
    assert asked == [True, False, False]


async def test_an_agent_that_restarts_is_watched_again_without_going_stale(
    agents: list[NodeAgent],
) -> None:
    head, _ = head_for(agents[:1])
    await head.start()
    node = agents[0]
    try:
        await until(lambda: ok(head.latest, node.name, "nvml"))
        await node.agent.stop()  # its watches end; the node's hub goes on
        node.agent = Agent(node.hub, AgentSettings(port=node.port))
        await node.agent.start()
        before = head.latest.node(node.name).status("remote").polls  # type: ignore[union-attr]
        await until(
            lambda: head.latest.node(node.name).status("remote").polls > before + 3  # type: ignore[union-attr]
        )
        status = head.latest.node(node.name).status("remote")  # type: ignore[union-attr]
        assert status is not None and status.ok and status.failures == 0, status
    finally:
        await head.stop()


async def test_an_agent_answers_404_for_a_node_it_does_not_serve_naming_those_it_does() -> None:
    hub = HeldHub(frozen_fleet())
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    base = f"http://127.0.0.1:{agent.port}/api/v1/snapshot"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}?node=nope") as response:
                assert response.status == 404
                said = await response.json()
            async with session.get(base) as response:
                every = await response.json()
        assert said["nodes"] == [n.node for n in hub.held.nodes] and "nope" in said["error"]
        assert [n["node"] for n in every["nodes"]] == said["nodes"]
    finally:
        await agent.stop()


async def test_a_head_that_names_a_lone_node_otherwise_still_reads_it() -> None:
    """The head's config says `gpu-a=http://...`, the agent calls its node dgx-002: the
    head learns the agent's name once from its 404 and reads the node under its own name."""
    hub = HeldHub(select(frozen_fleet(), "dgx-002", summary=False))
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    source = AgentSource("gpu-a", f"http://127.0.0.1:{agent.port}", AgentClient())
    served = codec.loads(snapshot_body(hub.held, "dgx-002", summary=True)).nodes[0]
    try:
        reading = await source.poll()
        assert reading.node.gpus == served.gpus and served.gpus
        assert {s.node for s in reading.node.statuses} == {"gpu-a"}
        assert source.asks == "dgx-002"
        hub.held = with_power(hub.held, 123.0)
        assert (await source.poll()).node.gpus[0].power_w == 123.0
    finally:
        await source.close()
        await agent.stop()


async def test_a_head_asking_a_fleet_agent_for_a_node_it_lacks_is_told_which_it_has() -> None:
    hub = HeldHub(frozen_fleet())
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    source = AgentSource("gpu-a", f"http://127.0.0.1:{agent.port}", AgentClient())
    try:
        with pytest.raises(ValueError, match=r"does not serve node gpu-a \(dgx-001, dgx-002, "):
            await source.poll()
    finally:
        await source.close()
        await agent.stop()
