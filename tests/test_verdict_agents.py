"""A node is judged on its agent, where every detail is, and a head shows that verdict:
real agents on loopback, read by a head's agent sources."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp import web

from gpuconsole import codec
from gpuconsole.cli.table import render_table
from gpuconsole.export.agent import Agent, select
from gpuconsole.facts import summaries
from gpuconsole.facts import verdict as verdict_facts
from gpuconsole.facts.verdict import (
    Action,
    carry_verdict,
    forget_verdicts,
    gpu_verdict,
    judge_fleet,
    node_verdict,
    unfit_gpus,
    verdicts_json,
)
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.base import Health, SourceStatus
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sources.agents import AgentClient, AgentSource
from gpuconsole.tui.wallboard import WallboardApp, alerts_page
from gpuconsole.wiring import AgentSettings
from tests.export_fixtures import HeldHub, frozen_fleet, one, parse, render
from tests.test_agents_source import serve
from tests.waiting import until

NODE = "dgx-002"


def with_links_down(fleet: FleetSnapshot, node: str, gpu: int, down: int) -> FleetSnapshot:
    """The fleet cut to `node`, `down` of its GPU `gpu`'s NVLinks down: what only the agent
    sees, since a summary leaves NVLink readings to the drill-down."""
    found = fleet.node(node)
    assert found is not None and found.nvml is not None
    sick = found.gpus[gpu]
    links = tuple(msgspec.structs.replace(link, active=False) for link in sick.nvlinks[:down])
    sick = msgspec.structs.replace(sick, nvlinks=links + sick.nvlinks[down:])
    gpus = tuple(sick if g.index == gpu else g for g in found.gpus)
    found = msgspec.structs.replace(found, nvml=msgspec.structs.replace(found.nvml, gpus=gpus))
    return msgspec.structs.replace(fleet, nodes=(found,), events=(), event_counts=())


@pytest.fixture
async def sick_agent() -> AsyncIterator[Agent]:
    """A real agent serving dgx-002 (a fan failed) with two NVLinks of GPU 2 down."""
    agent = Agent(HeldHub(with_links_down(frozen_fleet(), NODE, 2, 2)), AgentSettings(port=0))
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


def head_of(*urls: tuple[str, str]) -> Hub:
    head = Hub(HubSettings(publish_gap_s=0.05, max_backoff_s=0.5))
    client = AgentClient(max_connections=4)
    for node, url in urls:
        head.add_source(AgentSource(node, url, client, interval_s=0.2, timeout_s=2.0))
    return head


async def test_an_agents_verdict_reaches_the_heads_fleet_view(sick_agent: Agent) -> None:
    """The summary carries no NVLink readings, yet the head's fleet row, wallboard,
    `snapshot` and exporter say what the agent judged: reset GPU 2, two NVLinks down."""
    snapshot = await head_of((NODE, f"http://127.0.0.1:{sick_agent.port}")).poll_once()
    node = snapshot.node(NODE)
    assert node is not None and node.status("remote").ok  # type: ignore[union-attr]
    assert all(g.nvlinks == () for g in node.gpus)  # the summary, as the head reads it
    sick = node.gpus[2]
    verdict = gpu_verdict(node, sick)
    assert verdict.action is Action.RESET_GPU and verdict.health is Health.WARNING
    assert [(f.code, f.text) for f in verdict.findings] == [("nvlink_down", "2 of 18 NVLinks down")]
    assert gpu_verdict(node, node.gpus[0]).fit
    assert "nvlink_down" in [f.code for f in node_verdict(node).problems]
    assert node_verdict(node).action is Action.SERVICE  # its failed fan comes first
    # the fleet's GPU lights, the wallboard, `snapshot` and the exporter of the head
    lights = {row.bus_id: summaries.row_health(node, row) for row in summaries.gpu_rows(node)}
    assert lights[sick.pci_bus_id] is Health.WARNING
    assert summaries.facets(node)[0].health is Health.WARNING
    board = alerts_page(snapshot, WallboardApp(None, theme_dirs=[]).palette, snapshot.at).body
    assert f"{NODE} GPU 2 (52:00.0): 2 of 18 NVLinks down" in board.plain  # type: ignore[union-attr]
    judged = verdicts_json(snapshot)[NODE]
    assert judged["gpus"][sick.pci_bus_id]["action"] == "reset_gpu"  # type: ignore[index]
    assert "2 of 18 NVLinks down" in render_table(snapshot)
    series = parse(render(snapshot))["gpuconsole_gpu_verdict"]
    assert one(series, node=NODE, uuid=sick.uuid).labels["action"] == "reset_gpu"


async def test_a_stale_agent_shows_stale_with_the_verdict_it_last_sent() -> None:
    """dgx-004 (a row remap pending) with two NVLinks of GPU 0 down: its agent stops, and
    the head shows the node stale, still with what the agent last judged."""
    held = with_links_down(frozen_fleet(), "dgx-004", 0, 2)
    agent = Agent(HeldHub(held), AgentSettings(port=0))
    await agent.start()
    head = head_of(("dgx-004", f"http://127.0.0.1:{agent.port}"))
    await head.start()
    try:
        await until(lambda: head.latest is not None and head.latest.node("dgx-004") is not None
                    and head.latest.node("dgx-004").status("remote").ok)  # type: ignore[union-attr]  # fmt: skip
        await agent.stop()
        await until(lambda: not head.latest.node("dgx-004").status("remote").ok)  # type: ignore[union-attr]
        node = head.latest.node("dgx-004")  # type: ignore[union-attr]
        assert node is not None
        verdict = node_verdict(node)
        assert verdict.health is Health.STALE  # a warning, from a node that does not answer
        assert verdict.action is Action.RESET_GPU
        assert gpu_verdict(node, node.gpus[0]).action is Action.RESET_GPU  # as last sent
        silent = [f for f in verdict.findings if f.code == "agent_silent"]
        assert silent and "no answer from its agent since" in silent[0].text
        assert "the last it sent is shown" in silent[0].text
        assert summaries.source_facet(node, "remote") is Health.STALE
    finally:
        await head.stop()
        await agent.stop()


async def test_an_agent_that_sends_no_verdict_is_judged_by_the_head() -> None:
    """An agent of an earlier version sends the summary alone: the head judges it, as it
    always has (dgx-004's pending row remap is in the summary)."""
    fleet = frozen_fleet()
    body = codec.snapshot_json(select(fleet, "dgx-004", summary=True), sparse=True)
    for node in body["nodes"]:
        node.pop("verdict")

    async def older_agent(request: web.Request) -> web.Response:
        return web.json_response(body)

    runner, port = await serve(older_agent)
    try:
        snapshot = await head_of(("dgx-004", f"http://127.0.0.1:{port}")).poll_once()
    finally:
        await runner.cleanup()
    node = snapshot.node("dgx-004")
    assert node is not None and node.verdict is None
    here = fleet.node("dgx-004")
    assert here is not None
    verdict = node_verdict(node)
    assert verdict.action is Action.RESET_GPU
    assert [f.message for f in verdict.problems] == [f.message for f in node_verdict(here).problems]


def test_a_fleet_judged_as_it_changes_reads_as_one_judged_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """judge_fleet judges only the nodes a snapshot changed: snapshot after snapshot, every
    node's verdict, and a critical node's GPUs out of work, are what judging it with
    nothing remembered gives. Nodes read through agents that send their verdict, as a head
    has them: verdicts sent again, one that changed, a source gone stale, an agent gone
    silent, a verdict refused, a node added and the order changed."""
    fleet = frozen_fleet()
    heard = SourceStatus("", "remote", True, last_ok_at=fleet.at, polls=1)

    def read(node: NodeSnapshot, ok: bool = True, stale_since: float | None = None) -> NodeSnapshot:
        """The node as a head has it: its agent's status first, answering or not."""
        remote = msgspec.structs.replace(heard, node=node.node, ok=ok, stale_since=stale_since)
        kept = tuple(s for s in node.statuses if s.source != "remote")
        return msgspec.structs.replace(node, statuses=(remote, *kept))

    carried = [read(carry_verdict(n)) for n in fleet.nodes if n.nvml is not None]
    first = carried[:-1]
    at = next(i for i, n in enumerate(first) if n.node == NODE)  # a fan failed: service
    sick = read(carry_verdict(with_links_down(fleet, NODE, 2, 2).nodes[0]))
    said = first[at].verdict
    assert said is not None and said.action is Action.SERVICE
    liar = msgspec.structs.replace(
        first[at], verdict=msgspec.structs.replace(said, action=Action.FIT)
    )

    def again(node: NodeSnapshot) -> NodeSnapshot:
        """The node read again: its agent's verdict as before (the same object)."""
        return msgspec.structs.replace(node, statuses=(*node.statuses,))

    def bmc_stale(node: NodeSnapshot) -> NodeSnapshot:
        return msgspec.structs.replace(node, statuses=tuple(
            msgspec.structs.replace(s, ok=False) if s.source == "bmc" else s for s in node.statuses
        ))  # fmt: skip

    def put(nodes: list[NodeSnapshot], i: int, node: NodeSnapshot) -> list[NodeSnapshot]:
        return [*nodes[:i], node, *nodes[i + 1 :]]

    rounds = [first, [again(n) for n in first], put(first, at, sick)]
    fit = next(i for i, n in enumerate(first) if node_verdict(n).fit)
    other = next(i for i in range(len(first)) if i not in (at, fit))
    rounds.append(put(rounds[-1], other, read(first[other], ok=False, stale_since=fleet.at)))
    rounds.append(put(rounds[-1], fit, bmc_stale(first[fit])))
    rounds.append(put(rounds[-1], other, bmc_stale(first[other])))  # it answers again
    rounds.append([*put(rounds[-1], at, liar), carried[-1]])  # a node added
    rounds.append(put(rounds[-1], at, again(liar)))  # the same lie, read again
    rounds.append(list(reversed(carried)))
    snapshots = [msgspec.structs.replace(fleet, nodes=tuple(nodes)) for nodes in rounds]
    afresh = []
    for snapshot in snapshots:
        forget_verdicts()
        afresh.append([(node_verdict(n), unfit_gpus(n)) for n in snapshot.nodes])
    forget_verdicts()
    judged: list[str] = []
    judge = verdict_facts._judge

    def counted(node: NodeSnapshot, seen: Any = None) -> Any:
        judged.append(node.node)
        return judge(node, seen)

    monkeypatch.setattr(verdict_facts, "_judge", counted)
    last: tuple[NodeSnapshot, ...] = ()
    for snapshot, expected in zip(snapshots, afresh, strict=True):
        # the nodes not where they were, all where the fleet grew
        moved = sum(n is not b for n, b in zip(snapshot.nodes, last, strict=False))
        grown = len(snapshot.nodes) != len(last)
        assert judge_fleet(snapshot) == (len(snapshot.nodes) if grown else moved)
        assert judge_fleet(snapshot) == 0  # the same snapshot again: nothing to judge
        last = snapshot.nodes
        judged.clear()
        assert [node_verdict(n) for n in snapshot.nodes] == [v for v, _ in expected]
        assert judged == []  # every verdict a look-up, none judged as a view asks
        assert [unfit_gpus(n) for n in snapshot.nodes] == [unfit for _, unfit in expected]
    assert afresh[3][fit][0].health is Health.OK and afresh[4][fit][0].health is Health.STALE
    assert any(unfit for _, unfit in afresh[0])  # a critical node's GPUs out of work
    codes = {f.code for judged in afresh for v, _ in judged for f in v.findings}
    assert {"verdict_refused", "agent_silent", "nvlink_down"} <= codes


def _later(node: NodeSnapshot, seconds: float, inlet_c: float | None = None) -> NodeSnapshot:
    """The node read `seconds` later; the temperature past its critical limit at `inlet_c`
    where given (the same finding, other words)."""
    statuses = tuple(
        msgspec.structs.replace(s, last_ok_at=(s.last_ok_at or 0.0) + seconds)
        for s in node.statuses
    )
    bmc = node.bmc
    if inlet_c is not None and bmc is not None:
        hot = "HGX_GPU_SXM_1_TEMP_0"
        sensors = tuple(
            msgspec.structs.replace(s, value=inlet_c) if s.name == hot else s for s in bmc.sensors
        )
        bmc = msgspec.structs.replace(bmc, sensors=sensors)
    return msgspec.structs.replace(node, statuses=statuses, bmc=bmc)


def _node(fleet: FleetSnapshot) -> NodeSnapshot:
    found = fleet.node(NODE)
    assert found is not None
    return found


def _served_verdict(node: NodeSnapshot, *, summary: bool) -> Any:
    fleet = msgspec.structs.replace(frozen_fleet(), nodes=(node,), events=(), event_counts=())
    return select(fleet, node.node, summary=summary).nodes[0].verdict


def test_a_summary_holds_its_verdicts_words_while_only_they_move() -> None:
    """A temperature climbing past its limit changes the words of one finding each second:
    a fleet's summary sends the verdict as it was for WORDS_HELD_S of the node's time (a
    head checks a verdict when it changes, not each second a counter climbs), then the new
    words. Anything else that changes is sent at once, and a node read whole (a head that
    opened it) has its words live."""
    forget_verdicts()
    node = _node(frozen_fleet())
    first = _served_verdict(node, summary=True)
    words = [f.text for f in first.findings]
    assert "temperature at 89 C past its critical limit" in words
    warmer = _later(node, 1.0, inlet_c=91.0)
    held = _served_verdict(warmer, summary=True)
    assert held is first  # the very verdict: the head's agent source keeps it as it is
    live = _served_verdict(warmer, summary=False)
    assert "temperature at 91 C past its critical limit" in [f.text for f in live.findings]
    # a GPU's NVLinks go down: a finding more, sent at once, with the words as they are
    sicker = _later(_node(with_links_down(frozen_fleet(), NODE, 2, 2)), 2.0, inlet_c=92.0)
    changed = _served_verdict(sicker, summary=True)
    assert len(changed.findings) > len(first.findings)
    assert "temperature at 92 C past its critical limit" in [f.text for f in changed.findings]
    # then, only the words moving: held, until WORDS_HELD_S after they were sent
    hotter = _later(sicker, 1.0, inlet_c=93.0)
    assert _served_verdict(hotter, summary=True) is changed
    fresh = _served_verdict(_later(sicker, verdict_facts.WORDS_HELD_S, inlet_c=95.0), summary=True)
    assert fresh is not changed
    assert "temperature at 95 C past its critical limit" in [f.text for f in fresh.findings]
    assert [(f.code, f.severity, f.bus_id) for f in fresh.findings] == [
        (f.code, f.severity, f.bus_id) for f in changed.findings
    ]


def test_a_verdict_whose_findings_come_out_of_order_is_taken_in_order() -> None:
    """An agent sends its findings worst first; one that does not is taken sorted here:
    the same actions and health, each GPU's too, its evidence worst first."""
    forget_verdicts()
    node = carry_verdict(_node(with_links_down(frozen_fleet(), NODE, 2, 2)))
    said = node.verdict
    assert said is not None and len(said.findings) > 2
    shuffled = msgspec.structs.replace(
        node, verdict=msgspec.structs.replace(said, findings=tuple(reversed(said.findings)))
    )
    taken = verdict_facts._carried(shuffled, shuffled.verdict)  # type: ignore[arg-type]
    ordered = verdict_facts._carried(node, said)
    assert isinstance(taken, verdict_facts._Judged) and isinstance(ordered, verdict_facts._Judged)
    assert ordered.verdict == node_verdict(node)
    came = shuffled.verdict.findings  # type: ignore[union-attr]
    assert taken.verdict.findings == tuple(sorted(came, key=verdict_facts._worst_first))
    assert taken.verdict.findings != came  # sorted here
    assert (taken.verdict.action, taken.verdict.health) == (Action.SERVICE, Health.CRITICAL)
    assert taken.gpus.keys() == ordered.gpus.keys() and taken.gpus
    for bus, verdict in taken.gpus.items():
        assert sorted(verdict.findings, key=id) == sorted(ordered.gpus[bus].findings, key=id)
        assert (verdict.action, verdict.health) == (
            ordered.gpus[bus].action,
            ordered.gpus[bus].health,
        )
        assert list(verdict.findings) == sorted(verdict.findings, key=verdict_facts._worst_first)
