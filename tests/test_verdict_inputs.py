"""What the verdict makes of the NVML inputs that point at one GPU's fault: the mildest
action that can clear it first, the driver's own advice kept ahead, and the BMC's record of
the same fault as evidence beside NVML's."""

from __future__ import annotations

import dataclasses

from gpuconsole.facts.verdict import Action, gpu_verdict, node_verdict, reading_verdict
from gpuconsole.readings.base import Health
from gpuconsole.readings.nvml import XidCount
from gpuconsole.readings.snapshot import NodeSnapshot
from tests.conftest_tui import FIXED, frozen_fleet

LOST = "0000:c3:00.0"  # dgx-003's GPU 5, lost a minute into the demo


def _node(name: str) -> NodeSnapshot:
    node = frozen_fleet().node(name)
    assert node is not None
    return node


def test_story_1_says_reset_gpu_5_then_verify_with_the_xid_and_the_sel_entry() -> None:
    node = _node("dgx-003")
    verdict = gpu_verdict(node, LOST)
    assert (verdict.action, verdict.health) == (Action.RESET_GPU, Health.CRITICAL)
    assert verdict.advice == "reset GPU 5 (c3:00.0), then verify"
    by_source = {f.source: f for f in verdict.findings}
    assert "fell off the bus (XID 79)" in by_source["nvml"].text
    assert "if it does not come back, reboot the node" in by_source["nvml"].text
    # the BMC's PCIe bus error names GPU 5's bus: the same fault, seen from the BMC
    assert "Bus Fatal Error (bus c3" in by_source["bmc"].text
    assert by_source["bmc"].bus_id == LOST and by_source["bmc"].action is Action.RESET_GPU
    # the node's verdict leads with it, not with a reboot of every tenant's GPUs
    whole = node_verdict(node)
    assert whole.action is Action.RESET_GPU
    assert whole.summary.startswith("reset GPU 5 (c3:00.0), then verify: fell off the bus")


def test_a_catalog_reboot_for_one_gpu_is_tried_as_its_reset_first() -> None:
    gpu = _node("dgx-002").gpus[0]
    for code in (79, 160):  # fell off the bus; channel retirement: both RESTART_BM
        xids = (XidCount(code, 1, FIXED - 60, FIXED),)
        verdict = reading_verdict(dataclasses.replace(gpu, xids=xids))
        assert verdict.action is Action.RESET_GPU, code
        assert "if it does not come back, reboot the node" in verdict.findings[0].text


def test_the_driver_s_own_recovery_action_stays_first() -> None:
    gpu = _node("dgx-002").gpus[0]
    xids = (XidCount(79, 1, FIXED - 60, FIXED),)
    reboot = reading_verdict(dataclasses.replace(gpu, xids=xids, recovery_action=2))
    assert reboot.action is Action.REBOOT_NODE
    assert reboot.findings[0].text == "the driver asks for a node reboot"
    reset = reading_verdict(dataclasses.replace(gpu, xids=xids, recovery_action=1))
    assert reset.action is Action.RESET_GPU
    assert reset.findings[0].code == "driver_recovery_action"


def test_the_health_sort_puts_gpus_out_of_work_then_the_stronger_action_first() -> None:
    from gpuconsole.facts import summaries
    from gpuconsole.tui.screens.fleet import Sort, sort_key

    fleet = frozen_fleet()
    facts = {n.node: summaries.node_facts(n) for n in fleet.nodes}
    assert facts["dgx-003"].unfit == 1 and facts["dgx-002"].unfit == 0
    ordered = [n.node for n in sorted(fleet.nodes, key=sort_key(Sort.HEALTH, facts))]
    assert ordered[:3] == ["dgx-003", "dgx-002", "dgxa-001"]
    # two critical nodes with no GPU out of work: the one whose verdict asks more first
    crit = facts["dgx-002"]
    facts["dgx-002"] = crit._replace(action_rank=Action.DRAIN.rank)
    facts["dgxa-001"] = crit._replace(action_rank=Action.SERVICE.rank)
    ordered = [n.node for n in sorted(fleet.nodes, key=sort_key(Sort.HEALTH, facts))]
    assert ordered[:3] == ["dgx-003", "dgxa-001", "dgx-002"]
