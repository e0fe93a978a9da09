"""The fleet read through a real Prometheus shows each node's verdict as its agent judged it
(the node's and each GPU's, by bus id, from gpuconsole_node_verdict and
gpuconsole_gpu_verdict), and judges a node here, from its series, only where its agent is
older than those series."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from gpuconsole.export import names as names_
from gpuconsole.export.agent import Agent, select
from gpuconsole.export.collector import MetricsCache
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.facts.summaries import node_facts
from gpuconsole.facts.verdict import (
    AS_ITS_AGENT_JUDGED,
    Action,
    actions_verdict,
    carry_verdict,
    gpu_verdict,
    judge_fleet,
    node_verdict,
)
from gpuconsole.hub import Hub
from gpuconsole.readings.base import Health, Severity
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sources.promql import PARTS, FleetSeries, PromQLSource, build_node
from gpuconsole.wiring import AgentSettings
from tests.export_fixtures import HeldHub, frozen_fleet
from tests.test_promql import (
    NAMED,
    NodeAgent,
    Prometheus,
    fresh,
    head,
    names,
    prometheus,  # noqa: F401  (the fixture, over this module's agents)
)
from tests.test_promql_fleet import _matched, record_queries
from tests.waiting import until

# apollo-01 with the NVIDIA Fabric Manager down (drain), dgx-003 (GPU 5 fell off the bus)
# from an agent that exports verdicts and from one older than them, dgx-004 (a row remap
# pending: reset GPU 2, a warning), dgx-002 (a fan stopped: service), and apollo-01 with
# nothing wrong four times over (fit): a round asks the GPU verdicts of the others alone
NODES = ("apollo-01", "dgx-003", "dgx-003", "dgx-004", "dgx-002", *("apollo-01",) * 4)
OLDER = 2
FIT = range(5, 9)
LATER = (b"gpuconsole_node_verdict", b"gpuconsole_gpu_verdict", b"gpuconsole_fabric_manager")


class OlderMetrics(MetricsCache):
    """An agent's series from before it exported verdicts and Fabric Manager's state."""

    def render(self, peer: str = "") -> bytes:
        body = super().render(peer)
        return b"".join(
            line for line in body.splitlines(keepends=True) if not any(n in line for n in LATER)
        )


def _latest(hub: Hub) -> Callable[[], FleetSnapshot | None]:
    return lambda: hub.latest


def _apollo(*, fabric_manager: bool) -> NodeSnapshot:
    node = frozen_fleet().node("apollo-01")
    assert node is not None and node.nvml is not None and node.fabric is not None
    nvml = msgspec.structs.replace(node.nvml, fabric_manager_running=fabric_manager)
    # with Fabric Manager running, nothing else wrong: fit
    fabric = msgspec.structs.replace(node.fabric, peermem_loaded=True if fabric_manager else None)
    return msgspec.structs.replace(
        node, nvml=nvml, fabric=fabric if fabric_manager else node.fabric
    )


@pytest.fixture
async def agents() -> AsyncIterator[list[NodeAgent]]:
    fleet = frozen_fleet()
    started = []
    try:
        for i, name in enumerate(NODES):
            served = select(fleet, name, summary=False)
            if i == 0 or i in FIT:
                apollo = _apollo(fabric_manager=i in FIT)
                served = msgspec.structs.replace(served, nodes=(apollo,))
            agent = Agent(HeldHub(served), AgentSettings(port=0))
            if i == OLDER:
                agent.metrics = OlderMetrics(_latest(agent.hub))
            await agent.start()
            assert agent.port is not None
            started.append(NodeAgent(served.nodes[0], agent, agent.port))
        yield started
    finally:
        for a in started:
            await a.agent.stop()


def _serve(agent: NodeAgent, node: NodeSnapshot) -> None:
    """Have `agent` serve `node` from now on."""
    served = agent.agent.hub
    assert isinstance(served, HeldHub)
    agent.node = node
    served.held = msgspec.structs.replace(served.held, nodes=(node,), seq=served.held.seq + 1)


def _with_gpu(node: NodeSnapshot, index: int, **pcie: Any) -> NodeSnapshot:
    assert node.nvml is not None
    gpus = tuple(
        msgspec.structs.replace(g, pcie=msgspec.structs.replace(g.pcie, **pcie))
        if g.index == index
        else g
        for g in node.nvml.gpus
    )
    nvml = msgspec.structs.replace(node.nvml, gpus=gpus)
    return carry_verdict(msgspec.structs.replace(node, nvml=nvml, verdict=None))  # as agents do


def _shown(hub: Hub, name: str) -> NodeSnapshot:
    assert hub.latest is not None
    judge_fleet(hub.latest)  # as the fleet view does, before it reads each node's verdict
    node = hub.latest.node(name)
    assert node is not None
    return node


def _as_judged(node: NodeSnapshot) -> dict[str, Any]:
    """What the fleet view, its sort, the wallboard and the GPU rows show of a verdict."""
    verdict = node_verdict(node)
    facts = node_facts(node)
    return {
        "action": verdict.action,
        "health": verdict.health,
        "sort": (facts.health, facts.unfit, facts.action_rank),
        "gpus": {
            row.bus_id: (gpu_verdict(node, row).action, gpu_verdict(node, row).health)
            for row in node_gpus(node)
        },
    }


def _agrees(hub: Hub, name: str, agent: NodeAgent) -> bool:
    """Whether the node shows the verdict its agent judged, and each GPU the overview has
    (a GPU passed through to a guest is not among them: its agent reads it) its own."""
    node = _shown(hub, name)
    ours, theirs = _as_judged(node), _as_judged(agent.node)
    shown = ours["gpus"].keys()
    assert shown <= theirs["gpus"].keys()
    theirs["gpus"] = {bus: v for bus, v in theirs["gpus"].items() if bus in shown}
    return node.verdict is not None and ours == theirs


async def test_the_fleet_read_through_prometheus_shows_each_agents_verdict(
    agents: list[NodeAgent],
    prometheus: Prometheus,  # noqa: F811
) -> None:
    hub = head(prometheus)
    members = names(agents)
    new = [i for i in range(len(NODES)) if i != OLDER]
    reader = next(s for s in hub.sources if isinstance(s, PromQLSource)).reader
    sent = record_queries(reader)
    await hub.start()
    try:
        await until(lambda: all(fresh(hub, m) for m in members), timeout=30)
        # every node whose agent exports its verdict shows it: the node's action and light,
        # what the fleet sorts by, each GPU's action and light by bus id
        await until(lambda: all(_agrees(hub, members[i], agents[i]) for i in new), timeout=30)
        apollo = _shown(hub, NAMED)
        verdict = node_verdict(apollo)
        assert (verdict.action, verdict.health) == (Action.DRAIN, Health.CRITICAL)
        # the evidence stays with the agent (opening the node reads it), and it says so
        assert [f.text for f in verdict.problems] == [AS_ITS_AGENT_JUDGED]
        assert verdict.summary == f"drain it: {AS_ITS_AGENT_JUDGED}"
        assert apollo.nvml is not None and apollo.nvml.fabric_manager_running is False
        # a reset a warning calls for is a warning here too, named by the GPU's bus id
        calm = node_verdict(_shown(hub, members[3]))
        assert (calm.action, calm.health) == (Action.RESET_GPU, Health.WARNING)
        assert calm.advice == "reset GPU 2 (61:00.0), then verify"
        lost = node_verdict(_shown(hub, members[1]))
        assert lost.advice == "reset GPU 5 (c3:00.0), then verify"
        for node in (apollo, _shown(hub, members[1])):
            assert all(f.code != "verdict_refused" for f in node_verdict(node).findings)
        # an agent older than the verdict series: judged here from its series, as before
        older = _shown(hub, members[OLDER])
        assert older.verdict is None
        judged = node_verdict(older)
        assert judged.action is not Action.FIT and judged.health is Health.CRITICAL
        assert all(f.text != AS_ITS_AGENT_JUDGED for f in judged.findings)
        assert "gpu_lost" in {f.code for f in judged.findings}
        assert older.nvml is not None and older.nvml.fabric_manager_running is None
        # each round every node's verdict where not fit; the GPUs' verdicts and health of
        # the nodes not fit alone, once in PARTS rounds (none of them moved)
        unfit = {agents[i].agent.port for i in (0, 1, 3, 4)}
        began = reader.rounds
        await until(lambda: reader.rounds >= began + PARTS + 1, timeout=30)
        asked = []
        for queries in [sent[r] for r in range(began + 1, began + PARTS + 1)]:
            nodes = [q for q in queries if f"({names_.NODE_VERDICT[0]}{{" in q and "> 0" in q]
            assert len(nodes) == 1 and "instance=~" not in nodes[0]  # (and whole in its part)
            gpus = [q for q in queries if names_.GPU_VERDICT[0] in q or "gpu_health" in q]
            if gpus:
                asked.append(gpus)
        assert len(asked) == 1 and len(asked[0]) == 2
        assert all({int(i.split(":")[1]) for i in _matched(q)} == unfit for q in asked[0])
        # Fabric Manager runs again, nothing else is wrong: fit, and so are its GPUs
        fixed = _apollo(fabric_manager=True)
        _serve(agents[0], fixed)
        assert node_verdict(fixed).action is Action.FIT
        await until(lambda: _agrees(hub, NAMED, agents[0]), timeout=30)
        back = _shown(hub, NAMED)
        assert node_verdict(back).findings == () and node_facts(back).action_rank == 0
        assert all(gpu_verdict(back, row).fit for row in node_gpus(back))
        # the others stay as their agents judged them
        assert all(_agrees(hub, members[i], agents[i]) for i in new)
        # dgx-004's GPU 0 runs its PCIe link at Gen3 while it works (watch): its node is
        # still to reset GPU 2, a warning, and has as many GPUs flagged; the round that
        # asks every node not fit shows it
        _serve(agents[3], _with_gpu(agents[3].node, 0, gen_current=3, busy=True))
        assert node_verdict(agents[3].node).action is Action.RESET_GPU
        began = reader.rounds
        await until(lambda: _agrees(hub, members[3], agents[3]), timeout=30)
        assert reader.rounds <= began + PARTS + 4
        gpu = gpu_verdict(_shown(hub, members[3]), node_gpus(agents[3].node)[0].bus_id)
        assert (gpu.action, gpu.health) == (Action.WATCH, Health.WARNING)
    finally:
        await hub.stop()


def _taken(node: NodeSnapshot, action: Action, gpus: dict[str, Action], **kw: Any) -> Any:
    shown = msgspec.structs.replace(node, verdict=actions_verdict(node, action, gpus, **kw))
    verdict = node_verdict(shown)
    assert all(f.code != "verdict_refused" for f in verdict.findings), verdict.findings
    assert verdict.action is action
    return shown, verdict


def test_a_verdict_known_by_its_actions_is_taken_as_its_agent_sent_it() -> None:
    """Every demo node's actions and GPU lights, as Prometheus holds them, make the verdict
    its agent judged: the same action and light, each GPU's by bus id. Actions read at
    other moments, that no agent would judge together, are taken too: the node's first."""
    lights = {Health.WARNING: Severity.WARNING, Health.CRITICAL: Severity.CRITICAL}
    for node in frozen_fleet().nodes:
        judged = node_verdict(node)
        rows = node_gpus(node)
        gpus = {row.bus_id: gpu_verdict(node, row).action for row in rows}
        severities = {
            row.bus_id: lights[health]
            for row in rows
            if (health := gpu_verdict(node, row).health) in lights
        }
        shown, verdict = _taken(node, judged.action, gpus, severities=severities)
        assert verdict.health is judged.health, node.node
        assert node_facts(shown) == node_facts(node), node.node
        for row in rows:
            ours, theirs = gpu_verdict(shown, row), gpu_verdict(node, row)
            assert (ours.action, ours.health) == (theirs.action, theirs.health), row.bus_id
    faulty = frozen_fleet().node("dgx-003")
    assert faulty is not None
    node = faulty
    buses = [g.pci_bus_id for g in node.gpus]
    # a GPU worse than its node, one as bad: the node's action, its light by its action
    _, verdict = _taken(node, Action.WATCH, {buses[5]: Action.REBOOT_NODE, buses[0]: Action.WATCH})
    assert verdict.health is Health.WARNING
    assert verdict.findings[0].subject == "GPU 0 (1b:00.0)"
    # none of its GPUs: the node's own; a GPU the node does not have is named by its bus
    _, verdict = _taken(node, Action.DRAIN, {})
    assert [f.message for f in verdict.findings] == [AS_ITS_AGENT_JUDGED]
    _, verdict = _taken(node, Action.SERVICE, {"0000:ff:00.0": Action.SERVICE})
    assert [f.message for f in verdict.findings] == [f"GPU ff:00.0: {AS_ITS_AGENT_JUDGED}"]
    # fit: its GPUs are, whatever was read of them before
    shown, verdict = _taken(node, Action.FIT, {buses[5]: Action.RESET_GPU})
    assert verdict.findings == () and gpu_verdict(shown, buses[5]).fit


def _sample(name: str, value: float, **labels: str) -> dict[str, Any]:
    metric = {"__name__": name, "instance": "n1:9400", "node": "n1", **labels}
    return {"metric": metric, "value": [1796000000.5, str(value)]}


def test_a_verdict_an_agent_exports_wrong_is_judged_here_or_shown_safe() -> None:
    """A rank no action has (an agent gone wrong, or newer), NaN: judged here from its
    series, as an older agent's; a GPU verdict naming no bus, or with escapes in its label,
    never a traceback nor a raw escape on a terminal."""
    info = [_sample(names_.GPU_INFO[0], 1, gpu="0", uuid="GPU-0", pci_bus_id="0000:1b:00.0")]
    for rank in ("99", "NaN", "-1", "+Inf"):
        series = FleetSeries()
        series.take_values([_sample("up", 1), _sample(names_.NODE_VERDICT[0], float(rank))])
        series.take_info(info)
        _, found = series.overview().pick("n1:9400", "n1")
        assert build_node("n1", found, 0.0).verdict is None, rank
    series = FleetSeries()
    series.take_values(
        [
            _sample("up", 1),
            _sample(names_.NODE_VERDICT[0], Action.DRAIN.rank),
            _sample(names_.GPU_VERDICT[0], Action.DRAIN.rank, gpu="GPU 0"),
            _sample(names_.GPU_VERDICT[0], Action.SERVICE.rank, gpu="0000:ee:00.0\x1b[2J"),
        ]
    )
    series.take_info(info)
    _, found = series.overview().pick("n1:9400", "n1")
    node = build_node("n1", found, 0.0)
    verdict = node_verdict(node)
    assert verdict.action is Action.DRAIN
    assert all(f.message.isprintable() for f in verdict.findings), verdict.findings
    assert "verdict_refused" not in {f.code for f in verdict.findings}
