"""The verdict as the exporter serves it: every GPU's health series is its verdict's, and
the XIDs behind a verdict are counted per code, a guest's GPU's as much as the host's."""

from __future__ import annotations

import msgspec

from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.readings.nvml import XidCount
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from tests.export_fixtures import FIXED, frozen_fleet

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
