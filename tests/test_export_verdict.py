"""The verdict as the exporter serves it: every GPU's health series is its verdict's, and
the XIDs behind a verdict are counted per code, a guest's GPU's as much as the host's."""

from __future__ import annotations

import msgspec

from gpuconsole.export.collector import build
from gpuconsole.facts.inventory import node_gpus, short_bus_id
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.readings.nvml import XidCount
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from tests.export_fixtures import FIXED, frozen_fleet, parse, pick

GUESTS = "dgx-004"  # its GPU 52:00.0 is tenant-b-vm7's, read by the guest's own agent


def _with_node(fleet: FleetSnapshot, node: NodeSnapshot) -> FleetSnapshot:
    nodes = tuple(node if n.node == node.node else n for n in fleet.nodes)
    return msgspec.structs.replace(fleet, nodes=nodes)


def _guest_raised(fleet: FleetSnapshot, *xids: XidCount) -> tuple[FleetSnapshot, str]:
    """The fleet with the guest's GPU on GUESTS having raised `xids`, and its host bus id."""
    node = fleet.node(GUESTS)
    assert node is not None and node.tenancy is not None
    guest = node.tenancy.guest_gpus[0]
    assert guest.reading is not None
    raised = msgspec.structs.replace(
        guest, reading=msgspec.structs.replace(guest.reading, xids=xids)
    )
    tenancy = msgspec.structs.replace(
        node.tenancy, guest_gpus=(raised, *node.tenancy.guest_gpus[1:])
    )
    return _with_node(fleet, msgspec.structs.replace(node, tenancy=tenancy)), guest.bus_id


def test_each_gpus_health_series_is_its_verdicts_a_guests_gpu_too() -> None:
    fleet = frozen_fleet()
    health = {
        (s.labels["node"], s.labels["gpu"]): s.labels["state"]
        for s in parse(build(fleet).text().decode())["gpuconsole_gpu_health"]
        if s.value == 1.0
    }
    guests = 0
    for node in fleet.nodes:
        for row in node_gpus(node):
            seen = row.seen
            if seen is None or seen.unreadable:
                continue
            gpu = str(row.index) if row.reading is not None else short_bus_id(row.bus_id)
            guests += row.reading is None
            state = health[(node.node, gpu)]
            assert state == gpu_verdict(node, row).health.value, (node.node, row.bus_id)
    assert guests  # the demo's guest's GPU, whose NVLinks are off by design, was among them


def test_an_xid_a_guests_gpu_raises_is_judged_though_its_owner_stays() -> None:
    fleet = frozen_fleet()
    before = fleet.node(GUESTS)
    assert before is not None
    raised, bus = _guest_raised(fleet, XidCount(48, 1, FIXED - 5, FIXED - 5))
    assert gpu_verdict(before, bus).fit  # judged once, as every console asks
    after = raised.node(GUESTS)
    assert after is not None
    verdict = gpu_verdict(after, bus)
    assert verdict.action is Action.RESET_GPU, verdict
    assert "XID 48" in verdict.summary and "in tenant-b-vm7" in verdict.summary


def test_the_xids_a_guests_gpu_raised_are_counted_beside_its_verdict() -> None:
    fleet, bus = _guest_raised(frozen_fleet(), XidCount(48, 2, FIXED - 60, FIXED - 5))
    node = fleet.node(GUESTS)
    assert node is not None
    assert gpu_verdict(node, bus).action is Action.RESET_GPU
    samples = parse(build(fleet).text().decode())
    [verdict] = pick(samples["gpuconsole_gpu_verdict"], node=GUESTS, gpu=bus)
    assert verdict.labels["action"] == "reset_gpu" and verdict.value == 3.0
    counted = [
        (s.labels["xid"], s.value)
        for s in samples["gpuconsole_gpu_xid_window"]
        if s.labels["node"] == GUESTS and s.labels["gpu"] == bus
    ]
    assert counted == [("48", 2.0)]


def test_each_xid_is_counted_by_its_code_and_named_by_its_mnemonic() -> None:
    fleet, bus = _guest_raised(
        frozen_fleet(),
        XidCount(79, 1, FIXED - 60, FIXED - 60),
        XidCount(999, 3, FIXED - 60, FIXED - 5),  # no code the catalog knows
    )
    samples = parse(build(fleet).text().decode())
    named = {
        s.labels["xid"]: (s.labels["mnemonic"], s.value)
        for s in samples["gpuconsole_gpu_xid_window"]
        if s.labels["node"] == GUESTS and s.labels["gpu"] == bus
    }
    assert named == {"79": ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", 1.0), "999": ("", 3.0)}
