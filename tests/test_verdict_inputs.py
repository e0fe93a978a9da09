"""What the verdict makes of the NVML inputs that point at one GPU's fault: the mildest
action that can clear it first, the driver's own advice kept ahead, and the BMC's record of
the same fault as evidence beside NVML's."""

from __future__ import annotations

import msgspec

from gpuconsole.facts.verdict import Action, Verdict, gpu_verdict, node_verdict, reading_verdict
from gpuconsole.readings.actions import JournalReading, RepairAttempt
from gpuconsole.readings.base import Health, known_bus_id
from gpuconsole.readings.nvml import GpuReading, XidCount
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
        verdict = reading_verdict(msgspec.structs.replace(gpu, xids=xids))
        assert verdict.action is Action.RESET_GPU, code
        assert "if it does not come back, reboot the node" in verdict.findings[0].text


def test_the_driver_s_own_recovery_action_stays_first() -> None:
    gpu = _node("dgx-002").gpus[0]
    xids = (XidCount(79, 1, FIXED - 60, FIXED),)
    reboot = reading_verdict(msgspec.structs.replace(gpu, xids=xids, recovery_action=2))
    assert reboot.action is Action.REBOOT_NODE
    assert reboot.findings[0].text == "the driver asks for a node reboot"
    reset = reading_verdict(msgspec.structs.replace(gpu, xids=xids, recovery_action=1))
    assert reset.action is Action.RESET_GPU
    assert reset.findings[0].code == "driver_recovery_action"


def test_story_8_xid_48_says_drain_then_reset_with_the_dbe_count_and_nvidia_s_bucket() -> None:
    gpu = _node("dgx-002").gpus[2]
    ecc = msgspec.structs.replace(gpu.ecc, volatile_uncorrected=2, aggregate_uncorrected=2)
    xids = (XidCount(48, 1, FIXED - 60, FIXED),)
    verdict = reading_verdict(msgspec.structs.replace(gpu, xids=xids, ecc=ecc))
    assert (verdict.action, verdict.health) == (Action.RESET_GPU, Health.CRITICAL)
    xid = verdict.findings[0]
    assert xid.code == "xid" and xid.text.startswith("XID 48 double-bit ECC error")
    assert "drain, then reset the GPU" in xid.text
    # NVIDIA's catalog row as evidence: its mnemonic, its immediate and investigatory buckets
    assert "ROBUST_CHANNEL_GPU_ECC_DBE" in xid.text
    assert "WORKFLOW_XID_48 now, WORKFLOW_XID_48 to investigate" in xid.text
    counts = [f.text for f in verdict.findings if f.code == "ecc_uncorrectable"]
    assert counts == ["2 uncorrectable (double-bit) ECC errors since the driver loaded"]


def test_each_xid_finding_names_its_catalog_row() -> None:
    gpu = _node("dgx-002").gpus[0]
    for code, mnemonic, buckets in (
        (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU now, IGNORE (sympathetic) to"),
        (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP now"),
        (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU now, CONTACT_SUPPORT to"),
    ):
        xids = (XidCount(code, 1, FIXED - 60, FIXED),)
        text = reading_verdict(msgspec.structs.replace(gpu, xids=xids)).findings[0].text
        assert mnemonic in text and buckets in text, text


def _with_gpu(
    node: NodeSnapshot, gpu: GpuReading, repairs: tuple[RepairAttempt, ...]
) -> NodeSnapshot:
    assert node.nvml is not None
    gpus = tuple(gpu if g.index == gpu.index else g for g in node.nvml.gpus)
    nvml = msgspec.structs.replace(node.nvml, gpus=gpus)
    return msgspec.structs.replace(node, nvml=nvml, actions=JournalReading(FIXED, 0, repairs))


def test_story_8_after_the_plan_s_reset_the_xid_it_cleared_is_history() -> None:
    """The plan reset the GPU and its final check passed: the XID 48 that asked for it is
    what the reset cleared, though NVML never saw the GPU go (it answered throughout)."""
    node = _node("dgx-002")
    gpu = node.gpus[2]
    bus = known_bus_id(gpu.pci_bus_id)
    assert bus is not None
    before = (XidCount(48, 1, FIXED - 600, FIXED - 600),)
    reset = RepairAttempt(bus, Action.RESET_GPU, FIXED - 300, ok=True)
    fixed = _with_gpu(node, msgspec.structs.replace(gpu, xids=before), (reset,))
    assert gpu_verdict(fixed, bus).action is Action.FIT
    # without the journal's word, the XID still asks for the reset
    unrepaired = _with_gpu(node, msgspec.structs.replace(gpu, xids=before), ())
    assert gpu_verdict(unrepaired, bus).action is Action.RESET_GPU
    # one raised again after the reset: the reset did not hold
    again = (XidCount(79, 1, FIXED - 60, FIXED - 60),)
    after = _with_gpu(node, msgspec.structs.replace(gpu, xids=before + again), (reset,))
    verdict = gpu_verdict(after, bus)
    assert verdict.action is Action.REBOOT_NODE
    assert [f.text.split(":")[0] for f in verdict.findings] == ["XID 79 GPU has fallen off the bus"]
    assert "did not hold" in verdict.findings[0].text
    # XID 61 asks for NVIDIA's support, which no reset stands in for
    support = (XidCount(61, 1, FIXED - 600, FIXED - 600),)
    asked = _with_gpu(node, msgspec.structs.replace(gpu, xids=before + support), (reset,))
    assert gpu_verdict(asked, bus).action is Action.SERVICE
    # a reset the plan could not verify clears nothing
    failed = RepairAttempt(bus, Action.RESET_GPU, FIXED - 300, ok=False)
    tried = _with_gpu(node, msgspec.structs.replace(gpu, xids=before), (failed,))
    assert gpu_verdict(tried, bus).action is Action.REBOOT_NODE


def test_an_xid_the_catalog_lists_for_other_gpus_only_is_watched_not_acted_on() -> None:
    h100 = _node("dgx-002").gpus[0]
    a100 = _node("dgxa-002").gpus[0]
    assert (h100.architecture, a100.architecture) == ("hopper", "ampere")

    def judged(gpu: GpuReading, code: int) -> Verdict:
        xids = (XidCount(code, 1, FIXED - 60, FIXED),)
        return reading_verdict(msgspec.structs.replace(gpu, xids=xids))

    # NVLink5's XIDs are Blackwell's: an H100 that reports one is not reset on its word
    saw = judged(h100, 144)
    assert (saw.action, saw.health) == (Action.WATCH, Health.WARNING)
    assert "NVIDIA's catalog lists it for B100, GB200 only, not H100" in saw.findings[0].text
    assert "NVLINK_SAW_ERROR" in saw.findings[0].text
    assert judged(h100, 74).action is Action.RESET_GPU  # NVLink error: A100 and H100
    assert judged(a100, 136).action is Action.WATCH  # ALI training: H100 only
    assert judged(h100, 136).action is Action.RESET_GPU
    blackwell = msgspec.structs.replace(h100, architecture="blackwell", name="NVIDIA B200")
    assert judged(blackwell, 74).action is Action.WATCH
    assert judged(blackwell, 144).action is Action.RESET_GPU
    # a GPU of no known generation: the catalog's bucket, as before
    assert judged(msgspec.structs.replace(h100, architecture=None), 144).action is Action.RESET_GPU


def test_xid_154_follows_the_recovery_action_the_driver_reports_now() -> None:
    """XID 154 says the driver's recovery action changed; the action itself is read each
    poll. Once the driver says none again, the XID is evidence, not a GPU to watch for a
    day; where the action cannot be read, it is watched."""
    gpu = _node("dgx-002").gpus[0]
    xids = (XidCount(154, 2, FIXED - 600, FIXED - 60),)

    def judged(recovery: int | None) -> Verdict:
        return reading_verdict(msgspec.structs.replace(gpu, xids=xids, recovery_action=recovery))

    settled = judged(0)
    assert (settled.action, settled.health) == (Action.FIT, Health.OK)
    assert "the driver asks for none now" in settled.findings[0].text
    drain = judged(3)
    assert drain.action is Action.DRAIN
    assert [f.code for f in drain.findings] == ["driver_recovery_action", "xid"]
    unknown = judged(None)
    assert (unknown.action, unknown.health) == (Action.WATCH, Health.WARNING)


def test_every_recovery_action_of_the_driver_is_judged_and_an_unknown_one_is_not_fit() -> None:
    gpu = _node("dgx-002").gpus[0]
    expected = {
        0: Action.FIT,
        1: Action.RESET_GPU,  # GPU_RESET
        2: Action.REBOOT_NODE,  # NODE_REBOOT
        3: Action.DRAIN,  # DRAIN_P2P
        4: Action.RESET_GPU,  # DRAIN_AND_RESET
        5: Action.DRAIN,  # RECOVER_IMEX_DOMAIN
        6: Action.RESET_GPU,  # BUS_RESET
        7: Action.REBOOT_NODE,  # SYSTEM_REBOOT
    }
    for value, action in expected.items():
        verdict = reading_verdict(msgspec.structs.replace(gpu, recovery_action=value))
        assert verdict.action is action, value
    # a value a newer driver adds: shown by number and watched, never taken for fit
    later = reading_verdict(msgspec.structs.replace(gpu, recovery_action=9))
    assert (later.action, later.health) == (Action.WATCH, Health.WARNING)
    assert later.findings[0].code == "driver_recovery_action"
    assert "recovery action 9" in later.findings[0].text


def test_the_health_sort_puts_gpus_out_of_work_then_the_stronger_action_first() -> None:
    from gpuconsole.facts import summaries
    from gpuconsole.tui.screens.fleet import Sort, sort_key

    fleet = frozen_fleet()
    facts = {n.node: summaries.node_facts(n) for n in fleet.nodes}
    assert facts["dgx-003"].unfit == 1 and facts["dgx-002"].unfit == 0
    ordered = [n.node for n in sorted(fleet.nodes, key=sort_key(Sort.HEALTH, facts))]
    # a GPU out of work on dgx-003 (lost), dgx-005 (a double-bit ECC error), dgx-006 (lost)
    assert ordered[:5] == ["dgx-003", "dgx-005", "dgx-006", "dgx-002", "dgxa-001"]
    # two critical nodes with no GPU out of work: the one whose verdict asks more first
    crit = facts["dgx-002"]
    facts["dgx-002"] = crit._replace(action_rank=Action.DRAIN.rank)
    facts["dgxa-001"] = crit._replace(action_rank=Action.SERVICE.rank)
    ordered = [n.node for n in sorted(fleet.nodes, key=sort_key(Sort.HEALTH, facts))]
    assert ordered[3:5] == ["dgxa-001", "dgx-002"]


def test_the_exporter_serves_each_link_s_error_counters_and_the_retired_pages() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from gpuconsole.export.collector import build
    from gpuconsole.readings.nvml import EccReading

    fleet = frozen_fleet()
    nodes = list(fleet.nodes)
    i = next(i for i, n in enumerate(nodes) if n.node == "dgx-002")
    nvml = nodes[i].nvml
    assert nvml is not None
    gpus = list(nvml.gpus)
    links = list(gpus[0].nvlinks)
    links[1] = msgspec.structs.replace(links[1], replay_errors_total=12, recovery_errors_total=0,
                                   crc_errors_total=40)  # fmt: skip
    ecc = EccReading(retired_sbe=3, retired_dbe=1, retired_pending=True)
    gpus[0] = msgspec.structs.replace(gpus[0], nvlinks=tuple(links), ecc=ecc)
    nodes[i] = msgspec.structs.replace(
        nodes[i], nvml=msgspec.structs.replace(nvml, gpus=tuple(gpus))
    )
    text = build(msgspec.structs.replace(fleet, nodes=tuple(nodes))).text().decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    errors = {
        s.labels["counter"]: s.value
        for s in samples
        if s.name == "gpuconsole_gpu_nvlink_errors_total"
        and s.labels["node"] == "dgx-002"
        and s.labels["link"] == "1"
        and s.labels["uuid"] == gpus[0].uuid
    }
    assert errors == {"replay": 12.0, "recovery": 0.0, "crc": 40.0}
    retired = {
        s.name: s.value
        for s in samples
        if s.name.startswith("DCGM_FI_DEV_RETIRED") and s.labels.get("UUID") == gpus[0].uuid
    }
    assert retired == {
        "DCGM_FI_DEV_RETIRED_SBE": 3.0,
        "DCGM_FI_DEV_RETIRED_DBE": 1.0,
        "DCGM_FI_DEV_RETIRED_PENDING": 1.0,
    }
    # links and GPUs that do not read them (Blackwell, Ampere and newer) have no series
    assert not any(
        s.name.startswith("DCGM_FI_DEV_RETIRED") and s.labels.get("UUID") == gpus[1].uuid
        for s in samples
    )


def test_a_link_that_keeps_retraining_is_drained_and_too_many_retired_pages_go_to_service() -> None:
    from gpuconsole.readings.nvml import EccReading, NvLinkErrors

    gpu = _node("dgx-002").gpus[0]
    flapping = (NvLinkErrors(4, replay=30, recovery=5, crc=0),)
    verdict = reading_verdict(msgspec.structs.replace(gpu, nvlink_errors=flapping))
    assert verdict.action is Action.DRAIN
    assert "NVLink 4: 30 replay, 5 recovery errors in the last 10 min" in verdict.summary
    worn = msgspec.structs.replace(gpu, ecc=EccReading(retired_sbe=50, retired_dbe=12))
    verdict = reading_verdict(worn)
    assert (verdict.action, verdict.health) == (Action.SERVICE, Health.CRITICAL)
    assert "62 memory pages retired (12 for double-bit errors)" in verdict.summary
    few = msgspec.structs.replace(gpu, ecc=EccReading(retired_sbe=2, retired_dbe=0))
    assert reading_verdict(few).action is Action.FIT  # a few retired pages: what DPR is for


def test_a_sel_record_names_a_gpu_by_its_bus_in_the_forms_bioses_write() -> None:
    from gpuconsole.facts.verdict import bmc_findings
    from gpuconsole.readings.base import Severity
    from gpuconsole.readings.bmc import BmcReading, SelEntry

    gpus = {"c3": (LOST, "GPU 5 (c3:00.0)")}
    for event in ("Bus Fatal Error (bus c3 dev 00 fn 0)", "Bus Fatal Error, Bus 0xC3",
                  "Bus Fatal Error at bus C3h device 0", "Bus Fatal Error, bus: c3"):  # fmt: skip
        entry = SelEntry(1, FIXED, "PCIe SXM5", "Critical Interrupt", event, Severity.CRITICAL)
        (found,) = bmc_findings(BmcReading(at=FIXED, sel_recent=(entry,)), gpus)
        assert (found.bus_id, found.action) == (LOST, Action.RESET_GPU), event
    # another bus, or none: the node's, as the catalog's action has it
    for event in ("Bus Fatal Error (bus 3b dev 00 fn 0)", "Bus Fatal Error"):
        entry = SelEntry(1, FIXED, "PCIe", "Critical Interrupt", event, Severity.CRITICAL)
        (found,) = bmc_findings(BmcReading(at=FIXED, sel_recent=(entry,)), gpus)
        assert (found.bus_id, found.action) == (None, Action.REBOOT_NODE), event


def test_the_bmcs_record_of_a_gpus_fault_asks_what_follows_a_failed_repair() -> None:
    """Story 1's SEL record of GPU 5's bus error asks for its reset; once the node's journal
    says that reset failed, the record asks for what follows it (the node's power cycle),
    as the GPU's XID does, never for the reset again."""
    node = _node("dgx-003")
    sel = [f for f in node_verdict(node).findings if f.source == "bmc" and f.bus_id == LOST]
    assert [(f.code, f.action) for f in sel] == [("sel_critical", Action.RESET_GPU)]
    failed = RepairAttempt(LOST, Action.RESET_GPU, FIXED - 30, ok=False)
    tried = msgspec.structs.replace(node, actions=JournalReading(FIXED, repairs=(failed,)))
    sel = [f for f in node_verdict(tried).findings if f.source == "bmc" and f.bus_id == LOST]
    assert [(f.code, f.action) for f in sel] == [("sel_critical", Action.REBOOT_NODE)]
    assert "reboot the node: the reset of GPU 5 (c3:00.0) at" in sel[0].text
    assert gpu_verdict(tried, LOST).action is Action.REBOOT_NODE


def test_a_state_a_bmc_says_a_sensor_asserts_is_shown_cut_to_its_length() -> None:
    """A discrete sensor's finding names the states it asserts, as its BMC words them: a
    BMC that sends a state of 5,000 characters gets 64 of them shown, never a finding so
    long that a head refuses the node's verdict for it."""
    from gpuconsole.facts.verdict import bmc_findings
    from gpuconsole.readings.bmc import BmcReading, BmcSensor, SensorHealth, SensorKind

    def said(*states: str) -> str:
        psu = BmcSensor("PSU1 Status", "10", SensorKind.OTHER, "Power Supply", None, "",
                        SensorHealth.WARNING, states, context="psu")  # fmt: skip
        (found,) = bmc_findings(BmcReading(at=FIXED, sensors=(psu,)))
        return found.text

    assert said("Predictive failure") == "warning: Predictive failure"
    assert said("x" * 5000, "Present") == f"warning: {'x' * 64}, Present"
