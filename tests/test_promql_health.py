"""Each node's count of flagged GPUs, as its agent exports it, and the Prometheus overview
that asks GPU health flags only of the nodes it is above 0 for (or that lack it: an agent
older than the count); the rest of the fleet has none raised."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from benchmarks.promfleet import (
    BackfilledPrometheus,
    Member,
    targets_file,
    write_openmetrics,
)
from gpuconsole.export import names
from gpuconsole.export.collector import node_metrics
from gpuconsole.export.families import Families
from gpuconsole.facts.verdict import SLOWDOWNS, reading_verdict
from gpuconsole.hub import Hub
from gpuconsole.readings.nvml import GpuReading, NvmlReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.nvml.lib import THROTTLE_BITS
from gpuconsole.sources.promql import FleetSeries, PrometheusReader, PromQLSource, flag_asks
from tests.export_fixtures import frozen_fleet
from tests.peers import require_program
from tests.test_promql_fleet import Fleet, _matched, fresh, head, record_queries
from tests.waiting import until

FLAGGED = names.NODE_GPUS_FLAGGED[0]
VERDICT = names.NODE_VERDICT[0]
GPU_VERDICT = names.GPU_VERDICT[0]
HEALTH = names.GPU_HEALTH[0]
THROTTLE = names.DCGM_THROTTLE[0]
FLAGS = (
    names.GPU_LOST[0],
    names.DCGM_XID[0],
    names.DCGM_ECC_DBE_VOL[0],
    names.DCGM_REMAP_FAILURE[0],
    names.DCGM_REMAP_PENDING[0],
    names.DCGM_RETIRED_SBE[0],
    names.DCGM_RETIRED_DBE[0],
    names.DCGM_RETIRED_PENDING[0],
)
SLOWDOWN_MASK = sum(bit for bit, name in THROTTLE_BITS if name in SLOWDOWNS)


def flagged_by_gpu(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, set[str]]:
    """Of each node, the GPUs (their gpu label) with a health flag series above 0 or clocks
    held down by heat or power in the throttle mask: what the count must count."""
    found: dict[str, set[str]] = {}
    for name, labels, value in samples:
        node = labels.get("Hostname") or labels["node"]
        found.setdefault(node, set())
        if name == THROTTLE:
            raised = bool(int(value) & SLOWDOWN_MASK)
        else:
            raised = name in FLAGS and value > 0
        if raised and labels["gpu"].isdigit():
            found[node].add(labels["gpu"])
    return found


def _with_gpu(node: NodeSnapshot, index: int, **fields: Any) -> NodeSnapshot:
    assert node.nvml is not None
    gpus = tuple(
        msgspec.structs.replace(g, **fields) if g.index == index else g for g in node.nvml.gpus
    )
    nvml: NvmlReading = msgspec.structs.replace(node.nvml, gpus=gpus)
    return msgspec.structs.replace(node, nvml=nvml)


def _faulted() -> list[NodeSnapshot]:
    """The demo's nodes, and one of them with a fault of each kind on GPUs of its own."""
    nodes = list(frozen_fleet().nodes)
    base = next(n for n in nodes if n.node == "dgxa-001")
    gpu: GpuReading = base.gpus[0]
    ecc = gpu.ecc
    faults: list[dict[str, Any]] = [
        {"ecc": msgspec.structs.replace(ecc, volatile_uncorrected=2)},
        {"ecc": msgspec.structs.replace(ecc, remap_pending=True)},
        {"ecc": msgspec.structs.replace(ecc, remap_failure=True)},
        {"ecc": msgspec.structs.replace(ecc, retired_sbe=3, retired_pending=True)},
        {"throttle_reasons": ("sw_power_cap", "hw_slowdown")},
        {"throttle_reasons": ("sw_power_cap", "gpu_idle")},  # not held down: not flagged
    ]
    varied = base
    for index, fault in enumerate(faults):
        varied = _with_gpu(varied, index, **fault)
    xid = msgspec.structs.replace(varied, node="dgxa-xid", last_xid={base.gpus[7].uuid: 48})
    return [*nodes, msgspec.structs.replace(varied, node="dgxa-faults"), xid]


def test_each_nodes_count_of_flagged_gpus_agrees_with_its_gpus_own_series() -> None:
    now = time.time()
    counts = {}
    for node in _faulted():
        out = Families()
        node_metrics(out, node, now)
        samples = [(n, dict(zip(k, v, strict=True)), x) for n, k, v, x in out.samples()]
        count = [x for n, labels, x in samples if n == FLAGGED]
        assert len(count) == 1, node.node  # every node has it, 0 included
        assert count[0] == len(flagged_by_gpu(samples).get(node.node, ())), node.node
        counts[node.node] = count[0]
    # dgx-002: clocks held down by heat on one GPU; dgx-003: a GPU lost; the faulted copy
    # five of six GPUs (power cap and idle hold no clock down), its copy an XID more
    assert counts["dgx-002"] == 1 and counts["dgx-003"] == 1
    assert counts["dgxa-001"] == 0 and counts["dgx-001"] == 0  # dgx-001: no GPUs
    assert counts["dgxa-faults"] == 5 and counts["dgxa-xid"] == 6


def _s(name: str, value: float, node: str, *, named: bool = True, **labels: str) -> Any:
    """A sample as Prometheus answers it; one asked alone comes without its name."""
    metric = {"instance": f"{node}:9400", "node": node, **labels}
    if named:
        metric["__name__"] = name
    return {"metric": metric, "value": [1796000000.5, str(value)]}


def test_a_flag_is_no_longer_raised_once_its_nodes_count_is_0() -> None:
    """A node's count went to 0: the round asks its flags no more, and the flag it held
    raised reads 0, while another node's raised flag stays."""
    lost = names.GPU_LOST[0]
    series = FleetSeries()
    series.take_values(
        [_s("up", 1, "n1"), _s("up", 1, "n2"), _s(FLAGGED, 1, "n1"), _s(FLAGGED, 1, "n2"),
         _s(lost, 1, "n1", gpu="0"), _s(lost, 1, "n2", gpu="0")]
    )  # fmt: skip
    assert series.flagged() == {"n1:9400", "n2:9400"}
    gate = frozenset({FLAGGED})
    answer = [_s(FLAGGED, 0, "n1", named=False), _s(FLAGGED, 1, "n2", named=False)]
    series.take_values(answer, gate, named=FLAGGED)
    within = series.flagged()
    assert within == {"n2:9400"}
    asks = flag_asks(within=within, before=frozenset({"n1:9400", "n2:9400"}))
    asked_lost = next(a for a in asks if a.named == lost)
    assert 'instance=~"n2:9400"' in asked_lost.query
    answer = [_s(lost, 1, "n2", named=False, gpu="0")]
    series.take_values(answer, asked_lost.metrics, asked_lost.raised, lost, asked_lost.within)
    nodes = series.overview().nodes
    assert nodes["n1:9400"]["n1"].gpus[0][lost] == 0.0
    assert nodes["n2:9400"]["n2"].gpus[0][lost] == 1.0
    # the throttle mask of the node flagged the round before is asked too
    throttle = next(a for a in asks if a.named == THROTTLE)
    assert throttle.within == {"n1:9400", "n2:9400"}
    # a node whose agent exports no count (an older one): its flags are asked
    series.take_values([], gate, named=FLAGGED)
    assert series.flagged() == {"n1:9400", "n2:9400"}


NODES = 40
OLD = frozenset({0, 5, 20})  # members whose agent exports no count: faulty, healthy, faulty
MOVERS = (3, 5)  # healthy members whose GPUs are all lost at the first step: with a count, without


@dataclass
class HealthFleet(Fleet):
    steps: list[float]  # the backfill's time, and the step at which the movers lose GPUs


@pytest.fixture
def health_fleet(tmp_path: Path) -> Iterator[HealthFleet]:
    """40 nodes: copies of the demo's healthy GPU nodes, every tenth a copy of a faulty
    one; three of them from agents that export no count of flagged GPUs. At the first step
    after the backfill, two healthy nodes (one from such an agent) lose every GPU."""
    require_program("promtool", "apt-get install prometheus")
    require_program("prometheus", "apt-get install prometheus")
    templates = [n for n in frozen_fleet().nodes if n.gpus]
    now = time.time()

    def count(node: NodeSnapshot) -> float:
        out = Families(frozenset({FLAGGED}))
        node_metrics(out, node, now)
        return next(x for n, _, _, x in out.samples() if n == FLAGGED)

    faulty = [n for n in templates if count(n) > 0]
    healthy = [n for n in templates if count(n) == 0]
    assert len(faulty) >= 3 and len(healthy) >= 2
    fleet = [
        Member(
            f"gpu-{i:03d}",
            f"127.0.0.1:{21000 + i}",
            faulty[i // 10 % len(faulty)] if i % 10 == 0 else healthy[i % len(healthy)],
            lacks=frozenset({FLAGGED}) if i in OLD else frozenset(),
        )
        for i in range(NODES)
    ]
    at = time.time() - 60
    steps = [at, at + 5.0]
    source = tmp_path / "fleet.om"
    movers = {fleet[i].name for i in MOVERS}
    write_openmetrics(
        source, fleet, at, moving=(names.GPU_LOST[0], FLAGGED), steps=steps[1:], movers=movers
    )
    targets = tmp_path / "targets.json"
    targets_file(targets, fleet)
    with BackfilledPrometheus(source) as prometheus:
        yield HealthFleet(prometheus.url, targets, fleet, steps)


def _health(gpu: GpuReading) -> tuple[Any, ...]:
    ecc = gpu.ecc
    return (
        gpu.lost,
        ecc.volatile_uncorrected,
        ecc.remap_failure,
        ecc.remap_pending,
        ecc.retired_sbe,
        ecc.retired_dbe,
        ecc.retired_pending,
        frozenset(gpu.throttle_reasons),
        reading_verdict(gpu).health,
    )


def _node(hub: Hub, name: str) -> NodeSnapshot:
    node = hub.latest.node(name) if hub.latest is not None else None
    assert node is not None
    return node


async def test_a_round_asks_gpu_flags_of_flagged_nodes_and_of_older_agents_only(
    health_fleet: HealthFleet,
) -> None:
    fleet = health_fleet
    hub = head(fleet)
    reader = next(s for s in hub.sources if isinstance(s, PromQLSource)).reader
    assert isinstance(reader, PrometheusReader)
    step = 0
    reader.evaluate_at = lambda: fleet.steps[step] + 0.001
    query = reader.query
    sent = record_queries(reader)
    by_instance = {m.instance: m for m in fleet.members}
    await hub.start()
    try:
        await until(lambda: all(fresh(hub, m.name) for m in fleet.members), timeout=60)
        # the count Prometheus holds of each node agrees with its GPUs' own series there
        flags = "|".join((*FLAGS, THROTTLE))
        raw = await query(f'{{__name__=~"{flags}", GPU_I_ID=""}}')
        counted = {s["metric"]["instance"]: float(s["value"][1]) for s in await query(FLAGGED)}
        assert set(counted) == {m.instance for m in fleet.members if FLAGGED not in m.lacks}
        per_gpu = flagged_by_gpu(
            [(s["metric"]["__name__"], s["metric"], float(s["value"][1])) for s in raw]
        )
        for instance, count in counted.items():
            assert count == len(per_gpu.get(by_instance[instance].name, ())), instance
        flagged = {i for i, c in counted.items() if c > 0}
        assert 0 < len(flagged) < NODES // 4
        asked_of = flagged | {fleet.members[i].instance for i in OLD}
        # rounds after the first: each flag asked of those nodes alone, and every node
        # shows each GPU's health as its agent's reading has it
        began = reader.rounds
        await until(lambda: reader.rounds >= began + 3, timeout=30)
        unfit = {s["metric"]["instance"] for s in await query(f"{VERDICT} > 0")}
        assert unfit  # most of them: their GPUs' verdicts are then asked of all, unmatched
        for r in range(began + 1, began + 3):
            asked = [q for q in sent[r] if "> 0" in q and f"({VERDICT}{{" not in q]
            gpu_verdicts = [q for q in asked if f"({GPU_VERDICT}{{" in q or HEALTH in q]
            asked = [q for q in asked if q not in gpu_verdicts]
            assert len(asked) == len(FLAGS) + 1, asked
            for q in asked:
                assert _matched(q) == asked_of, q
            # each node's verdict where not fit, then its GPUs' of those nodes alone
            assert sum(f"({VERDICT}{{" in q and "instance=~" not in q for q in sent[r]) == 1
            # and their health where a warning or critical: of every node not fit once in
            # PARTS rounds, and of those whose verdict or count moved (none here) each round
            assert len(gpu_verdicts) in (0, 2)
            for q in gpu_verdicts:
                if 2 * len(unfit) > NODES:
                    assert "instance=~" not in q
                else:
                    assert _matched(q) == unfit
        for member in fleet.members:
            shown = [_health(g) for g in _node(hub, member.name).gpus]
            assert shown == [_health(g) for g in member.node.gpus], member.name
            assert dict(_node(hub, member.name).last_xid) == dict(member.node.last_xid)
        # two healthy nodes lose every GPU, one from an agent that exports no count: both
        # are seen, within a round or two, and no other node changes
        step = 1
        began = reader.rounds
        movers = [fleet.members[i].name for i in MOVERS]
        await until(lambda: all(all(g.lost for g in _node(hub, n).gpus) for n in movers), 30)
        assert reader.rounds <= began + 3
        last = sent[reader.rounds - 1]
        lost = next(q for q in last if f"({names.GPU_LOST[0]}{{" in q)
        assert _matched(lost) == asked_of | {fleet.members[i].instance for i in MOVERS}
        for member in fleet.members:
            if member.name not in movers:
                shown = [_health(g) for g in _node(hub, member.name).gpus]
                assert shown == [_health(g) for g in member.node.gpus], member.name
    finally:
        await hub.stop()
