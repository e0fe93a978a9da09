"""A node whose agent sends no verdict is judged by the head each time it changes; what
was judged of it before is reused where its evidence is alike. Round after round, each
node's verdict and its GPUs' must be what judging it with nothing remembered gives: the
same evidence in new readings, an XID come and counted again, a source gone stale and
back, another BMC reading."""

from __future__ import annotations

import msgspec

from gpuconsole.facts.verdict import (
    Verdict,
    forget_verdicts,
    gpu_verdict,
    judge_fleet,
    node_verdict,
)
from gpuconsole.readings.nvml import XidCount
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from tests.export_fixtures import frozen_fleet

Shown = tuple[Verdict, tuple[Verdict, ...]]


def shown(node: NodeSnapshot) -> Shown:
    return node_verdict(node), tuple(gpu_verdict(node, g) for g in node.gpus)


def afresh(node: NodeSnapshot) -> Shown:
    forget_verdicts()
    return shown(msgspec.structs.replace(node))  # another object: nothing remembered of it


def test_a_node_judged_again_reads_as_one_judged_afresh() -> None:
    fleet = frozen_fleet()
    nodes = [msgspec.structs.replace(n, verdict=None) for n in fleet.nodes if n.gpus]

    def nvml_again(node: NodeSnapshot) -> NodeSnapshot:
        """Its NVML read again: new readings, the same evidence; every other part held."""
        assert node.nvml is not None
        gpus = tuple(msgspec.structs.replace(g) for g in node.nvml.gpus)
        return msgspec.structs.replace(node, nvml=msgspec.structs.replace(node.nvml, gpus=gpus))

    def with_xid(node: NodeSnapshot, count: int, code: int = 48) -> NodeSnapshot:
        assert node.nvml is not None
        at = fleet.at - 60.0
        gpus = tuple(
            msgspec.structs.replace(g, xids=(*g.xids, XidCount(code, count, at - count, at)))
            if i == 0
            else g
            for i, g in enumerate(node.nvml.gpus)
        )
        return msgspec.structs.replace(node, nvml=msgspec.structs.replace(node.nvml, gpus=gpus))

    def stale(node: NodeSnapshot, ok: bool = False) -> NodeSnapshot:
        statuses = tuple(
            msgspec.structs.replace(s, ok=ok) if s.source == "nvml" else s for s in node.statuses
        )
        return msgspec.structs.replace(nvml_again(node), statuses=statuses)

    def bmc_again(node: NodeSnapshot) -> NodeSnapshot:
        bmc = node.bmc
        assert bmc is not None
        return msgspec.structs.replace(nvml_again(node), bmc=msgspec.structs.replace(bmc))

    def put(nodes: list[NodeSnapshot], i: int, node: NodeSnapshot) -> list[NodeSnapshot]:
        return [*nodes[:i], node, *nodes[i + 1 :]]

    fit = next(i for i, n in enumerate(nodes) if afresh(n)[0].fit)
    sick = next(i for i, n in enumerate(nodes) if not afresh(n)[0].fit)
    rounds = [nodes, [nvml_again(n) for n in nodes]]
    rounds.append(put(rounds[-1], fit, with_xid(rounds[-1][fit], 1)))
    rounds.append(put(rounds[-1], fit, with_xid(nodes[fit], 2)))  # counted again
    rounds.append(put(rounds[-1], fit, nvml_again(rounds[-1][fit])))  # as before
    rounds.append(put(rounds[-1], fit, nvml_again(nodes[fit])))  # the XID cleared
    rounds.append(put(rounds[-1], sick, with_xid(rounds[-1][sick], 1, 79)))
    rounds.append(put(rounds[-1], sick, stale(rounds[-1][sick])))
    rounds.append(put(rounds[-1], sick, stale(rounds[-1][sick], ok=True)))  # answers again
    rounds.append([bmc_again(n) if n.bmc is not None else nvml_again(n) for n in rounds[-1]])
    expected = [[afresh(n) for n in nodes] for nodes in rounds]
    assert len({e[fit] for e in expected}) >= 3  # what the rounds changed shows
    forget_verdicts()
    for seq, (nodes, want) in enumerate(zip(rounds, expected, strict=True)):
        snapshot = FleetSnapshot(seq, fleet.at + seq, tuple(nodes))
        judge_fleet(snapshot)
        assert [shown(n) for n in nodes] == want, f"round {seq}"
