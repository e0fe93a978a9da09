"""Whether a GPU or a node is fit for work and, when not, what to do now.

The one place that judges health from every source; every view, `snapshot` and the exporter
ask it. (Shared contract: the `Action` values are what plans, alerts and series carry.)

Evidence, each a `Finding` with the source that showed it:
- nvml: a GPU lost or unreadable; XIDs counted over the health window, judged by NVIDIA's
  XID catalog (`facts.xids`); the driver's own recovery action; row remapping pending or
  failed, pages retired or pending retirement (before Ampere) and uncorrectable ECC
  errors; NVLinks down or their error counters climbing; the PCIe link trained down or
  replaying; the GPU outside the NVLink fabric or the Fabric Manager not running; clocks
  held down by heat or power, judged on how long;
- bmc: critical event log entries (one that names a GPU's PCI bus is that GPU's), failed
  PSUs and fans (named, with their readings), fans and PSUs whose own status warns,
  sensors past their limits (the inlet among them);
- fabric: rails down, gone from sysfs, waiting for a subnet manager or trained below their
  rate; error counters that climbed and links that went down (flaps), counted over the
  source's window;
- tenancy: ownership that does not add up, and GPUs out of service (drained) with the XID
  that put them there.
A verdict's action is its worst finding's (the most severe, then the strongest action); its
health is that finding's severity. A fault of one GPU asks for the least disruptive action
that can clear it first: where NVIDIA's catalog reboots the node, the GPU's reset, with the
reboot named as what follows if it stays lost, and the reboot itself once the fault comes
again after a reset NVML saw (within the XID window); the driver's own recovery action is
kept as it says. Once the node's journal says the GPU's last repair failed (and NVML has not
seen it come back since), what a reset would clear asks for what follows: the node's power
cycle after a reset, service after a power cycle.

A node's agent judges it, where every detail is, and sends the verdict in its snapshot
(`carry_verdict`; a fleet's summary holds its words while only they move, WORDS_HELD_S); a
head checks that verdict against its findings, its sizes and the node's GPUs as it first
judges a snapshot that carries it, and shows it with what only the head knows (the agent
silent). A verdict it refuses
(remembered with why, so that the same verdict sent again is not checked again), or one an
older agent never sent, the head judges from the readings it has. A console judges each
fleet snapshot it shows as far as the snapshot changed (`judge_fleet`); its views then look
each verdict up. The data classes live in `readings.verdict`, where the codec decodes them.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from gpuconsole import format as fmt
from gpuconsole.facts.inventory import GpuRow, node_gpus, short_bus_id
from gpuconsole.facts.ownership import Ownership, node_ownership
from gpuconsole.facts.xids import Bucket, XidEntry, catalog_product, reset_clears, xid_entry
from gpuconsole.readings.actions import RepairAttempt
from gpuconsole.readings.base import Health, Severity, SourceStatus, known_bus_id, safe_text
from gpuconsole.readings.bmc import BmcReading, SensorHealth, SensorKind
from gpuconsole.readings.fabric import (
    ERROR_RULES,
    FABRIC_ERROR_WINDOW_S,
    FabricPort,
    FabricReading,
    PortRole,
    counter_words,
    port_problems,
    port_rates,
)
from gpuconsole.readings.nvml import (
    NVLINK_ERROR_WINDOW_S,
    PCIE_REPLAY_WINDOW_S,
    GpuReading,
    GpuState,
    NvmlReading,
    XidCount,
)
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot, Rebuilt
from gpuconsole.readings.verdict import ACTION_WORDS as ACTION_WORDS
from gpuconsole.readings.verdict import SOURCES as SOURCES
from gpuconsole.readings.verdict import Action as Action
from gpuconsole.readings.verdict import CarriedVerdict, JudgedGpu
from gpuconsole.readings.verdict import Finding as Finding
from gpuconsole.readings.verdict import Verdict as Verdict

_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
_ACTION_RANK = {action: action.rank for action in Action}


def _worst_first(finding: Finding) -> tuple[int, int]:
    return -_SEVERITY_RANK[finding.severity], -finding.action.rank


def _verdict(findings: list[Finding], calm: Health = Health.OK) -> Verdict:
    """The verdict of some findings: the worst action; critical health over `calm` (stale
    or unknown), which wins over a warning, as a stale source cannot vouch for the rest."""
    findings.sort(key=_worst_first)
    return _sorted_verdict(tuple(findings), calm)


def _sorted_verdict(findings: tuple[Finding, ...], calm: Health = Health.OK) -> Verdict:
    """`_verdict` of findings already worst first (as `_verdict` sorts them)."""
    if not findings:
        return _FIT if calm is Health.OK else Verdict(Action.FIT, calm)
    action = findings[0].action  # the worst finding's: a lost GPU's reboot before a cable
    severity = findings[0].severity
    if severity is Severity.CRITICAL:
        health = Health.CRITICAL
    elif calm is not Health.OK:
        health = calm
    elif severity is Severity.WARNING:
        health = Health.WARNING
    else:
        health = Health.OK
    return Verdict(action, health, findings)


_FIT = Verdict(Action.FIT, Health.OK)


# --- NVML ---------------------------------------------------------------------------

# Clocks held down by heat or power, not by the GPU's own choice (idle, app clocks).
_SLOWDOWNS = frozenset(
    {"hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown", "hw_slowdown"}
)
SLOWDOWNS = _SLOWDOWNS  # the exporter counts a GPU so held among those it flags
_BUCKET_ACTIONS = {
    Bucket.IGNORE: Action.FIT,
    Bucket.RESTART_APP: Action.FIT,
    Bucket.RESET_GPU: Action.RESET_GPU,
    Bucket.RESTART_BM: Action.REBOOT_NODE,
    Bucket.RESTART_VM: Action.REBOOT_NODE,
    Bucket.CONTACT_SUPPORT: Action.SERVICE,
    Bucket.CHECK_MECHANICALS: Action.RESEAT,
    Bucket.UPDATE_SWFW: Action.WATCH,
    Bucket.CHECK_UVM: Action.WATCH,
    Bucket.WORKFLOW_XID_45: Action.WATCH,
    Bucket.WORKFLOW_XID_48: Action.RESET_GPU,
    Bucket.WORKFLOW_NVLINK_ERR: Action.RESET_GPU,
    Bucket.WORKFLOW_NVLINK5_ERR: Action.RESET_GPU,
    Bucket.XID_154: Action.WATCH,  # the recovery action it announces is judged on its own
}
_BUCKET_WORDS = {
    Bucket.IGNORE: "no action needed",
    Bucket.RESTART_APP: "restart the application",
    Bucket.RESET_GPU: "reset the GPU",
    Bucket.RESTART_BM: "reboot the node",
    Bucket.RESTART_VM: "restart the VM",
    Bucket.CONTACT_SUPPORT: "contact NVIDIA support",
    Bucket.CHECK_MECHANICALS: "check the mechanicals",
    Bucket.UPDATE_SWFW: "update the driver and firmware",
    Bucket.CHECK_UVM: "check the unified memory driver",
    Bucket.WORKFLOW_XID_45: "follow the XID before it (alone: restart Fabric Manager)",
    # solo: reset the GPU; with XID 63/64: drain and reset. A reset here drains it first
    Bucket.WORKFLOW_XID_48: "drain, then reset the GPU",
    Bucket.WORKFLOW_NVLINK_ERR: "reset the GPU or reboot; decode the link's error",
    Bucket.WORKFLOW_NVLINK5_ERR: "reset the GPU; decode the link's error",
    Bucket.XID_154: "follow the driver's recovery action",
}


def _remedy(
    bucket: Bucket, reset_at: float | None = None, failed: tuple[Action, str] | None = None
) -> tuple[Action, str]:
    """What one GPU's fault calls for first, and the words for it: the least disruptive
    action that can clear it, as NVIDIA Health Validation escalates (drain, reset the GPU,
    then service). A bucket that reboots the node for a fault of one GPU is tried as a reset
    of that GPU first, which clears what the reboot would on it without stopping its
    neighbours; the words say the reboot follows if the GPU does not come back. Where the
    fault came again after a reset NVML saw (`reset_at`), the reset did not hold: the
    bucket's own action, as the escalation goes. Where the GPU's last repair failed, what
    follows it (`failed`: `_after`'s answer)."""
    return _milder_first(_BUCKET_ACTIONS[bucket], _BUCKET_WORDS[bucket], reset_at, failed)


def _milder_first(
    action: Action,
    words: str,
    reset_at: float | None = None,
    failed: tuple[Action, str] | None = None,
) -> tuple[Action, str]:
    if failed is not None and action in _REPAIRS:
        return failed
    if action is Action.REBOOT_NODE:
        if reset_at is not None:
            return action, f"{words}: its reset at {fmt.clock_time(reset_at)} did not hold"
        return Action.RESET_GPU, f"reset the GPU; if it does not come back, {words}"
    return action, words


# What a GPU's reset or its node's power cycle repairs; a repair that failed asks for more.
_REPAIRS = (Action.RESET_GPU, Action.REBOOT_NODE)


def _failed_repair(node: NodeSnapshot, gpu: GpuReading, bus: str | None) -> RepairAttempt | None:
    """The GPU's last repair (its reset, or its node's power cycle), where the node's journal
    says it failed and NVML has not seen the GPU come back since; else None."""
    journal = node.actions
    if journal is None or bus is None or not journal.repairs:
        return None
    tried = journal.repair(bus)
    if tried is None or tried.ok or (gpu.reset_at is not None and gpu.reset_at >= tried.at):
        return None
    return tried


def _repaired_at(node: NodeSnapshot, bus: str | None) -> float | None:
    """When the GPU's last repair (its reset, or its node's power cycle) began, where the
    node's journal says the plan made it fit: the XIDs it raised before are what the repair
    cleared, though NVML may never have seen it go (a reset between two polls)."""
    journal = node.actions
    if journal is None or bus is None or not journal.repairs:
        return None
    tried = journal.repair(bus)
    return tried.at if tried is not None and tried.ok else None


def standing_xids(
    node: NodeSnapshot, gpu: GpuReading, bus: str | None = None
) -> tuple[tuple[XidCount, ...], float | None]:
    """The XIDs a GPU raised that still stand, and when it was last reset: those its reading
    counts over the window, less those a repair the node's journal says made it fit
    cleared (raised before it, of a code a reset recovers). What the verdict judges and
    what the exporter counts, so that a rule on the counts resolves with the verdict."""
    xids, reset_at = gpu.xids, gpu.reset_at
    if not xids and gpu.state is not GpuState.LOST:
        return xids, reset_at
    repaired = _repaired_at(node, bus or known_bus_id(gpu.pci_bus_id))
    if repaired is not None:
        xids = tuple(x for x in xids if x.last_at >= repaired or not reset_clears(x.code))
        reset_at = repaired if reset_at is None else max(reset_at, repaired)
    return xids, reset_at


def _after(failed: RepairAttempt, subject: str) -> tuple[Action, str]:
    """What follows a repair of GPU `subject` that failed, in words that say which and when:
    the node's power cycle after its reset, service after the power cycle."""
    at = fmt.clock_time(failed.at)
    if failed.action is Action.RESET_GPU:
        return Action.REBOOT_NODE, f"reboot the node: the reset of {subject} at {at} failed"
    if failed.reset_failed_at is not None:  # a reboot only its boot id tells
        tried = fmt.clock_time(failed.reset_failed_at)
        return Action.SERVICE, (
            f"return it for service: the node was rebooted at {at}, after the reset of "
            f"{subject} at {tried} failed, and it is not fit since"
        )
    return Action.SERVICE, (
        f"return it for service: the node's power cycle at {at} did not bring {subject} back"
    )


# An application fault seen this often in the window on one GPU points at the GPU:
# NVIDIA's XID 13/31 workflows call for diagnostics on repeats.
APP_FAULT_REPEATS = 3
# nvmlDeviceGpuRecoveryAction_t -> (action, words)
_RECOVERY = {
    1: (Action.RESET_GPU, "the driver asks for a GPU reset"),
    2: (Action.REBOOT_NODE, "the driver asks for a node reboot"),
    3: (Action.DRAIN, "the driver asks to drain peer-to-peer traffic"),
    4: (Action.RESET_GPU, "the driver asks to drain it and reset the GPU"),
    5: (Action.DRAIN, "the driver asks to recover its IMEX domain"),
    6: (Action.RESET_GPU, "the driver asks for a bus reset"),
    7: (Action.REBOOT_NODE, "the driver asks for a system reboot"),
}
PCIE_REPLAYS_PER_MIN = 8.0  # dcgm's PCIe health watch default
# A slowdown held this long is no passing spike: the GPU runs below its clocks for real.
SLOWDOWN_PERSISTS_S = 60.0
# Pages retired (single- and double-bit together) at which a GPU goes back for service:
# dcgm's DCGM_LIMIT_MAX_RETIRED_PAGES.
RETIRED_PAGES_SERVICE = 60
# Recoveries (the link retrained, its traffic stopped) in the window at which a link is
# drained rather than watched.
NVLINK_RECOVERIES_DRAIN = 3
_Add = Callable[[str, str, Severity, Action], None]


def _over(span_s: float, window_s: float) -> str:
    """How long a count covers ("10 min"), as its source says: an agent's word is taken up
    to a sample step past the window, else the window is said."""
    most = window_s * 1.1
    return fmt.age(0.0, span_s if 0.0 <= span_s <= most else most)


def _gpu_subject(gpu: GpuReading, bus: str | None = None) -> str:
    bus = bus or known_bus_id(gpu.pci_bus_id)
    return f"GPU {gpu.index}" + (f" ({short_bus_id(bus)})" if bus else "")


def _catalog_row(entry: XidEntry) -> str:
    """NVIDIA's catalog row as evidence: 'ROBUST_CHANNEL_GPU_ECC_DBE; NVIDIA's buckets:
    WORKFLOW_XID_48 now, WORKFLOW_XID_48 to investigate'."""
    then = f", {entry.investigatory} to investigate" if entry.investigatory else ""
    return f"{entry.mnemonic}; NVIDIA's buckets: {entry.immediate} now{then}"


def _xid_finding(
    gpu: GpuReading,
    code: int,
    count: int,
    bus: str | None,
    failed: tuple[Action, str] | None = None,
    reset_at: float | None = None,
) -> Finding:
    entry = xid_entry(code)
    times = f" ({count} times)" if count > 1 else ""
    if entry is None:
        return Finding("xid", f"XID {code}{times}: not in the catalog carried here",
                       Severity.WARNING, "nvml", Action.WATCH, bus, _gpu_subject(gpu, bus))  # fmt: skip
    product = catalog_product(gpu.architecture, gpu.name)
    if not entry.applies(product):
        # its row is about other GPUs: what it says to do is not known to hold for this one
        listed = ", ".join(entry.applies_to) or "no GPU"
        return Finding("xid", f"XID {code} {entry.words}{times}: NVIDIA's catalog lists it for "
                       f"{listed} only, not {product}: watch it ({entry.mnemonic})",
                       Severity.WARNING, "nvml", Action.WATCH, bus, _gpu_subject(gpu, bus))  # fmt: skip
    # its XIDs are counted since its last reset: one listed came after that reset
    action, advice = _remedy(entry.immediate, reset_at, failed)
    severity = entry.severity
    if entry.immediate is Bucket.XID_154 and gpu.recovery_action is not None:
        # the action it announced is read each poll and judged on its own
        action, severity = Action.FIT, Severity.INFO
        advice = (
            "the recovery action the driver asks for now is judged on its own"
            if gpu.recovery_action
            else "the driver asks for none now"
        )
    elif entry.immediate is Bucket.RESTART_APP:
        if count >= APP_FAULT_REPEATS:
            action, severity = Action.WATCH, Severity.WARNING
            advice = "repeats on this GPU: run diagnostics"
        else:
            severity = Severity.INFO  # the application's fault, kept as evidence
    return Finding("xid", f"XID {code} {entry.words}{times}: {advice} ({_catalog_row(entry)})",
                   severity, "nvml", action, bus, _gpu_subject(gpu, bus))  # fmt: skip


def gpu_findings(
    node: NodeSnapshot,
    gpu: GpuReading,
    fabric_manager: bool | None = None,
    bus: str | None = None,
    *,
    guest: bool = False,
) -> list[Finding]:
    """The evidence NVML gives about one GPU; [] for a healthy one (the common case, which
    a fleet of 8,000 GPUs asks every second: a few attribute reads). `bus` names a GPU that
    NVML lost before it read its bus id (sysfs knows it). A `guest`'s reading (its agent's,
    inside the VM) says nothing of the NVLinks: a guest may run with them off by design."""
    if fabric_manager is not False and _healthy(gpu):
        return []
    state = gpu.state
    ecc = gpu.ecc
    throttled = not _SLOWDOWNS.isdisjoint(gpu.throttle_reasons)
    recovery = gpu.recovery_action
    found: list[Finding] = []
    bus = known_bus_id(gpu.pci_bus_id) or bus
    subject = _gpu_subject(gpu, bus)

    repair = _failed_repair(node, gpu, bus)
    failed = _after(repair, subject) if repair is not None else None
    xids, reset_at = standing_xids(node, gpu, bus)

    def add(code: str, text: str, severity: Severity, action: Action) -> None:
        if failed is not None and action in _REPAIRS and action.rank < failed[0].rank:
            # what a reset (or power cycle) would clear, on a GPU where one failed
            action, text = failed[0], f"{text}; {failed[1]}"
        found.append(Finding(code, text, severity, "nvml", action, bus, subject))

    if state is GpuState.LOST:
        since = f" since {fmt.clock_time(gpu.lost_since)}" if gpu.lost_since else ""
        lost = xid_entry(79)
        action, advice = (
            _remedy(lost.immediate, reset_at, failed) if lost else (Action.RESET_GPU, "reset it")
        )
        add("gpu_lost", f"fell off the bus (XID 79){since}: {advice}", Severity.CRITICAL, action)
    elif state is GpuState.UNREADABLE:
        why = (gpu.error or "").lower()
        if "power" in why:
            add("gpu_unreadable", f"NVML cannot open it: {gpu.error} (check its power cables)",
                Severity.CRITICAL, Action.RESEAT)  # fmt: skip
        elif "irq" in why or "interrupt" in why:
            add("gpu_unreadable", f"NVML cannot open it: {gpu.error}", Severity.CRITICAL,
                Action.REBOOT_NODE)  # fmt: skip
        else:
            add("gpu_unreadable", f"NVML cannot open it: {gpu.error or 'unknown'}",
                Severity.WARNING, Action.WATCH)  # fmt: skip
    elif state is GpuState.ERROR:
        add("gpu_error", f"some readings failed: {gpu.error or 'unknown'}", Severity.WARNING,
            Action.WATCH)  # fmt: skip
    if recovery:
        # the driver's own view, ahead of the catalog's: it leads a tie, and a node reboot
        # it asks for is not tried as a reset first
        known = _RECOVERY.get(recovery)
        if known is not None:
            add("driver_recovery_action", known[1], Severity.CRITICAL, known[0])
        else:  # a value a later driver added: it asks for something, not known here
            add("driver_recovery_action", f"the driver asks for recovery action {recovery}, "
                "which this version does not know: its XID 154 in the kernel log says which",
                Severity.WARNING, Action.WATCH)  # fmt: skip
    for xid in xids:
        if state is GpuState.LOST and xid.code == 79:
            continue  # said above
        found.append(_xid_finding(gpu, xid.code, xid.count, bus, failed, reset_at))
    if ecc.remap_failure:
        add("remap_failed", "a row remap failed: no spare rows left", Severity.CRITICAL,
            Action.SERVICE)  # fmt: skip
    elif ecc.remap_pending:
        add("remap_pending", "ECC error with a row remap pending: a GPU reset puts the spare "
            "row in", Severity.WARNING, Action.RESET_GPU)  # fmt: skip
    _retired_pages(gpu, add)
    if ecc.volatile_uncorrected:
        n = ecc.volatile_uncorrected
        add("ecc_uncorrectable", f"{n} uncorrectable (double-bit) ECC error{'s' if n > 1 else ''} "
            "since the driver loaded", Severity.CRITICAL, Action.RESET_GPU)  # fmt: skip
    if state is GpuState.OK:
        _fabric_and_links(gpu, fabric_manager, add, links=not guest)
        if not guest:
            _nvlink_errors(gpu, add)
        _pcie(node, gpu, add)
        if throttled:
            _slowdown(node, gpu, add)
    return found


@functools.lru_cache(maxsize=256)  # a few sets of reasons in a fleet; an agent's bounded
def _slowdown_words(reasons: tuple[str, ...]) -> str:
    """The reasons that slow a GPU down (SLOWDOWNS) in an operator's words."""
    return fmt.throttle_words(tuple(r for r in reasons if r in _SLOWDOWNS))


def _slowdown(node: NodeSnapshot, gpu: GpuReading, add: _Add) -> None:
    """Clocks held down by heat or power, judged on how long: a passing spike is evidence,
    one that lasts SLOWDOWN_PERSISTS_S or more is a GPU to watch."""
    words = _slowdown_words(gpu.throttle_reasons)
    since = gpu.slowdown_since
    if since is None:  # not known since when (or an older agent's reading): as it looks now
        add("slowdown", f"clocks held down: {words}", Severity.WARNING, Action.WATCH)
        return
    now = node.nvml.at if node.nvml is not None else time.time()
    held = max(0.0, now - since)
    if held < SLOWDOWN_PERSISTS_S:
        add("slowdown_brief", f"clocks held down for {fmt.age(since, now)} so far: {words}",
            Severity.INFO, Action.FIT)  # fmt: skip
    else:
        add("slowdown", f"clocks held down for {fmt.age(since, now)}: {words}",
            Severity.WARNING, Action.WATCH)  # fmt: skip


def _retired_pages(gpu: GpuReading, add: _Add) -> None:
    """Dynamic page retirement (GPUs before Ampere; newer ones answer None): a retirement
    waits for a GPU reset; too many pages retired sends the GPU back for service."""
    ecc = gpu.ecc
    retired = (ecc.retired_sbe or 0) + (ecc.retired_dbe or 0)
    if retired >= RETIRED_PAGES_SERVICE:
        add("retired_pages", f"{retired} memory pages retired ({ecc.retired_dbe or 0} for "
            f"double-bit errors): at NVIDIA's limit of {RETIRED_PAGES_SERVICE}",
            Severity.CRITICAL, Action.SERVICE)  # fmt: skip
    if ecc.retired_pending:
        add("retirement_pending", f"a memory page retirement is pending ({retired} retired): "
            "a GPU reset retires it", Severity.WARNING, Action.RESET_GPU)  # fmt: skip


def _nvlink_errors(gpu: GpuReading, add: _Add) -> None:
    """NVLinks whose error counters climbed over the window: replays and CRC errors are
    corrected by resending (watch, then drain and reseat if they keep on); recoveries stop
    the link's traffic while it retrains (drain once they repeat)."""
    for moved in gpu.nvlink_errors:
        counts = [f"{n} {what}" for n, what in ((moved.replay, "replay"),
                  (moved.recovery, "recovery"), (moved.crc, "CRC")) if n > 0]  # fmt: skip
        if not counts:
            continue  # nothing climbed (a reading that says otherwise is not believed)
        window = _over(moved.window_s, NVLINK_ERROR_WINDOW_S)
        if moved.recovery >= NVLINK_RECOVERIES_DRAIN:
            add("nvlink_errors", f"NVLink {moved.link}: {', '.join(counts)} errors in the last "
                f"{window}, the link keeps retraining: drain it, then reseat",
                Severity.WARNING, Action.DRAIN)  # fmt: skip
        else:
            add("nvlink_errors", f"NVLink {moved.link}: {', '.join(counts)} errors in the last "
                f"{window}: watch it; drain and reseat if they keep climbing",
                Severity.WARNING, Action.WATCH)  # fmt: skip


_FABRIC_FINE = frozenset({None, "completed", "not_supported"})
_ACTIVE = operator.attrgetter("active")


def _healthy(gpu: GpuReading) -> bool:
    """Nothing NVML says of this GPU is worth a finding: the test 8,000 GPUs pass each
    second, cheapest and likeliest failures first."""
    if gpu.state is not _GPU_OK or gpu.xids or gpu.recovery_action or gpu.nvlink_errors:
        return False
    ecc = gpu.ecc
    if (
        ecc.remap_pending
        or ecc.remap_failure
        or ecc.volatile_uncorrected
        or ecc.retired_pending
        or ecc.retired_sbe
        or ecc.retired_dbe
    ):
        return False
    throttled = gpu.throttle_reasons
    if throttled and not _SLOWDOWNS.isdisjoint(throttled):
        return False
    if gpu.fabric_status or gpu.fabric_state not in _FABRIC_FINE:
        return False
    pcie = gpu.pcie
    if pcie.replay_count or (
        (pcie.width_current != pcie.width_max or pcie.busy) and pcie.downtrained
    ):
        return False
    nvlinks = gpu.nvlinks
    # a GPU read inside a guest may run with its NVLinks off by design (single-GPU
    # passthrough on an NVSwitch system)
    return not nvlinks or all(map(_ACTIVE, nvlinks)) or gpu.virtualization_mode == "passthrough"


_GPU_OK = GpuState.OK


def _fabric_and_links(
    gpu: GpuReading, fabric_manager: bool | None, add: _Add, *, links: bool = True
) -> None:
    if gpu.fabric_status:
        add("fabric_join_failed", f"did not join the NVLink fabric (NVML status "
            f"{gpu.fabric_status}): CUDA jobs will not start", Severity.CRITICAL,
            Action.RESET_GPU)  # fmt: skip
    elif gpu.fabric_state not in _FABRIC_FINE:
        words = (gpu.fabric_state or "").replace("_", " ")
        add("fabric_not_joined", f"NVLink fabric {words}: CUDA jobs will not start until it "
            "joins", Severity.WARNING, Action.DRAIN)  # fmt: skip
    if fabric_manager is False and gpu.fabric_state is not None:
        add("fabric_manager_down", "the Fabric Manager service is not running: CUDA jobs "
            "will not start", Severity.CRITICAL, Action.DRAIN)  # fmt: skip
    nvlinks = gpu.nvlinks
    if links and nvlinks and gpu.virtualization_mode != "passthrough":
        down = sum(1 for link in nvlinks if not link.active)
        if down:
            severity = Severity.CRITICAL if down == len(nvlinks) else Severity.WARNING
            add("nvlink_down", f"{down} of {len(nvlinks)} NVLinks down", severity,
                Action.RESET_GPU)  # fmt: skip


def _pcie(node: NodeSnapshot, gpu: GpuReading, add: _Add) -> None:
    pcie = gpu.pcie
    if pcie.downtrained:
        narrow = (pcie.width_current or 0) < (pcie.width_max or 0)
        if narrow:
            add("pcie_narrow", f"PCIe link x{pcie.width_current} of x{pcie.width_max}",
                Severity.WARNING, Action.RESEAT)  # fmt: skip
        else:
            add("pcie_downtrained", f"PCIe link Gen{pcie.gen_current} of Gen{pcie.gen_max} "
                "while it works", Severity.WARNING, Action.WATCH)  # fmt: skip
    span = pcie.replays_climbed_s
    if span is not None:
        # counted over the last minute, as dcgm's watch counts them: a burst of two in one
        # poll is not "120 a minute"
        if pcie.replays_climbed > PCIE_REPLAYS_PER_MIN:
            add("pcie_replays", f"PCIe link replayed {pcie.replays_climbed} times in the last "
                f"{_over(span, PCIE_REPLAY_WINDOW_S)}: more than {PCIE_REPLAYS_PER_MIN:g} a minute",
                Severity.WARNING, Action.WATCH)  # fmt: skip
    elif pcie.replay_count:  # not counted so (an older agent's reading): its last poll's rate
        per_s = node.rate("gpu", gpu.uuid, "pcie_replays")
        if per_s is not None and per_s * 60.0 > PCIE_REPLAYS_PER_MIN:
            add("pcie_replays", f"PCIe replays climbing: {per_s * 60.0:.0f}/min",
                Severity.WARNING, Action.WATCH)  # fmt: skip


# --- BMC ----------------------------------------------------------------------------

# A critical SEL entry older than this is history, not news (entry times are on this host's
# clock: the BMC source takes its clock's skew off each).
SEL_WINDOW_S = 24 * 3600.0
_SEL_ACTIONS = {
    "power supply": Action.SERVICE,
    "fan": Action.SERVICE,
    "memory": Action.SERVICE,
    "processor": Action.SERVICE,
    "temperature": Action.WATCH,
    "critical interrupt": Action.REBOOT_NODE,
}


# A SEL record that names a PCI bus in hex ("Bus Fatal Error (bus c3 dev 00 fn 0)", "Bus
# 0xc3", "bus C3h"): the BIOS's event data for a PCIe error, which says which device it came
# from. A bus written in decimal is not read as one: it would name the wrong GPU.
_SEL_BUS = re.compile(r"\bbus[ :]*(?:0x)?([0-9a-f]{2})h?\b", re.IGNORECASE)


class BusGpu(NamedTuple):
    """The GPU a SEL record names by its PCI bus, and how its repairs went."""

    bus_id: str
    name: str  # "GPU 5 (c3:00.0)"
    repaired: float | None = None  # its last repair that made it fit (None: none known)
    failed: tuple[Action, str] | None = None  # what follows its last repair, which failed
    drained: bool = False  # no driver holds it: out of service, its own verdict says why


def bmc_findings(
    bmc: BmcReading,
    gpus: Mapping[str, tuple[str, str]] | Callable[[str], BusGpu | None] | None = None,
) -> list[Finding]:
    """The evidence the BMC gives about the node: critical SEL entries, failed PSUs and
    fans, sensors past their critical limit. `gpus` (PCI bus number, as "c3" -> the GPU's
    bus id, name and last repair; or a function that answers it, asked only for a SEL
    record to report that names a bus) puts a SEL record that names a GPU's bus on that
    GPU: the BMC's side of its fault, judged as the GPU's until a repair after it (the
    GPU's reset NVML saw, or a repair the journal says made it fit), then kept as history,
    as that repair clears its XIDs. A repair after it that failed asks for what follows it,
    as the GPU's XIDs do; a GPU out of service (no driver holds it: sent for service, or
    drained) has the record as history, its own verdict saying what it needs."""
    found: list[Finding] = []
    on_bus = gpus if callable(gpus) else gpus.get if gpus else None

    def add(code: str, text: str, severity: Severity, action: Action, subject: str) -> None:
        found.append(Finding(code, text, severity, "bmc", action, None, subject))

    if bmc.psus_failed:
        add("psu_failed", f"{bmc.psus_failed} of {max(bmc.psus_present, bmc.psus_failed)} "
            f"PSUs failed{_named(bmc, bmc.failed_psus)}", Severity.CRITICAL, Action.SERVICE,
            "")  # fmt: skip
    if bmc.psus_no_input:
        add(*_psu_no_input(bmc), Action.RESEAT, "")
    if bmc.fans_failed:
        add("fan_failed", f"{bmc.fans_failed} of {max(bmc.fans_present, bmc.fans_failed)} "
            f"fans failed{_named(bmc, bmc.failed_fans)}", Severity.CRITICAL, Action.SERVICE,
            "")  # fmt: skip
    for name, why in bmc.warned_units:
        # its own status, where no sensor says it (a PSU that predicts its failure)
        add("unit_warning", f"{name} reports a warning" + (f": {why}" if why else ""),
            Severity.WARNING, Action.WATCH, f"BMC {name}")  # fmt: skip
    for sensor in bmc.sensors:
        health = sensor.health
        if health is SensorHealth.OK:
            continue
        kind = sensor.kind
        if kind is SensorKind.FAN and bmc.fans_failed:
            continue  # counted above
        if sensor.context == "psu" and (bmc.psus_failed or sensor.name in bmc.no_input_psus):
            continue
        if sensor.value is not None:
            value = f" at {sensor.value:g} {sensor.unit}".rstrip()
        else:  # a discrete sensor (an IPMI PSU's): the states it asserts
            said = [state[:_STATE_CHARS] for state in sensor.states[:_NAMED]]  # the BMC's
            value = f": {', '.join(said)}" if said else ""
        bad = health in (SensorHealth.CRITICAL, SensorHealth.FAILED)
        if kind is SensorKind.TEMPERATURE:
            where = "inlet" if sensor.context == "intake" else "temperature"
            code = "inlet_hot" if sensor.context == "intake" else "temperature_high"
            action = Action.DRAIN if bad else Action.WATCH
            text = f"{where}{value} past its {'critical' if bad else 'warning'} limit"
        else:
            code = "sensor_" + health.value
            action = Action.SERVICE if bad and kind is not SensorKind.OTHER else Action.WATCH
            text = f"{health.value}{value}"
        add(code, text, Severity.CRITICAL if bad else Severity.WARNING, action,
            f"BMC sensor {sensor.name}")  # fmt: skip
    newest = bmc.at
    # each sensor's last deassertion, by its place in the log (oldest first): it clears
    # what that sensor asserted before it, not what it asserted again after
    cleared = {e.sensor: i for i, e in enumerate(bmc.sel_recent) if e.deassertion}
    for i, entry in enumerate(bmc.sel_recent):
        if entry.severity is not Severity.CRITICAL or entry.deassertion:
            continue
        if cleared.get(entry.sensor, -1) > i:
            continue  # a later record deasserted it
        if entry.at is not None and newest - entry.at > SEL_WINDOW_S:
            continue
        when = f" at {fmt.clock_time(entry.at)}" if entry.at is not None else ""
        action = _SEL_ACTIONS.get(entry.sensor_type.lower(), Action.SERVICE)
        bus = _SEL_BUS.search(entry.event) if on_bus is not None else None
        named = on_bus(bus.group(1).lower()) if on_bus is not None and bus else None
        gpu = BusGpu(*named) if named is not None else None
        repaired = gpu.repaired if gpu is not None else None
        if (
            gpu is not None
            and repaired is not None
            and entry.at is not None
            and entry.at <= repaired
        ):
            # the fault the GPU's repair cleared: history, as its XIDs are
            found.append(Finding("sel_repaired", f"BMC event log{when}: {entry.message}: "
                                 f"repaired at {fmt.clock_time(repaired)}", Severity.INFO,
                                 "bmc", Action.FIT, gpu.bus_id, gpu.name))  # fmt: skip
            continue
        if gpu is not None and gpu.drained:
            found.append(Finding("sel_out_of_service", f"BMC event log{when}: "
                                 f"{entry.message}: {gpu.name} is out of service since",
                                 Severity.INFO, "bmc", Action.FIT, gpu.bus_id,
                                 gpu.name))  # fmt: skip
            continue
        if gpu is not None:
            words = _ACTION_ADVICE.get(action, action.words)
            action, advice = _milder_first(action, words, failed=gpu.failed)
            found.append(Finding("sel_critical", f"BMC event log{when}: {entry.message}: "
                                 f"{advice}", Severity.CRITICAL, "bmc", action, gpu.bus_id,
                                 gpu.name))  # fmt: skip
            continue
        add("sel_critical", f"BMC event log{when}: {entry.message}", Severity.CRITICAL, action,
            "")  # fmt: skip
    return found


def _pegged_findings(port: FabricPort) -> list[Finding]:
    """A port's error counters pegged at their maximum: each counts nothing more (a link
    going down again, errors climbing) until it is cleared; its other counters still do."""
    subject = f"{port.name} ({port.role})"
    words = "maximum: further ones are not counted until it is cleared (perfquery -R)"
    found = []
    for name, value in port.pegged:
        if name in _ERROR_COUNTERS:
            text = f"{counter_words(name)} counter pegged at {value}, its {words}"
            found.append(Finding("counter_pegged", text, Severity.WARNING, "fabric",
                                 Action.WATCH, None, subject))  # fmt: skip
    return found


# the counters whose climb is a fault (a pegged transmit wait hides congestion, not faults)
_ERROR_COUNTERS = frozenset(rule.counter for rule in ERROR_RULES)


def _psu_no_input(bmc: BmcReading) -> tuple[str, str, Severity]:
    """PSUs that lost their input power: the node's PSU redundancy is lost (a warning), or
    none is left (critical: one PSU more and the node goes down); the PSU may be fine, its
    cable, PDU or feed is what to check (the Power registry's LossOfInputPower)."""
    lost, present = bmc.psus_no_input, max(bmc.psus_present, bmc.psus_no_input)
    text = (f"{lost} of {present} PSUs {'has' if lost == 1 else 'have'} no input power"
            f"{_named(bmc, bmc.no_input_psus)}")  # fmt: skip
    delivering, needed = bmc.psus_delivering, bmc.psus_needed
    if not delivering:
        left = "none delivers power"
    else:
        left = f"{delivering} {'delivers' if delivering == 1 else 'deliver'}"
        left += f" of the {needed} it needs" if needed is not None else ""
    if bmc.psu_redundancy_left:
        return "psu_no_input", f"{text}; {left}, PSU redundancy lost", Severity.WARNING
    return "psu_no_input", f"{text}; {left}, no PSU redundancy left", Severity.CRITICAL


def _named(bmc: BmcReading, names: tuple[str, ...]) -> str:
    """The failed units by name, with the reading a sensor of that name has (": FAN 1 at
    0 RPM, PSU 2"); "" where the reading names none (an older agent's)."""
    if not names:
        return ""
    said = []
    for name in names[:_NAMED]:
        sensor = bmc.sensor(name)
        if sensor is None or sensor.value is None:
            said.append(name)
        else:
            said.append(f"{name} at {sensor.value:g} {sensor.unit}".rstrip())
    more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    return ": " + ", ".join(said) + more


_NAMED = 8  # failed units named in one finding; a chassis of 60 fans is counted past that
_STATE_CHARS = 64  # of a state a BMC says a sensor asserts ("Predictive failure")


_ACTION_ADVICE = {Action.REBOOT_NODE: "reboot the node", Action.SERVICE: "return it for service"}


def _gpu_on_bus(node: NodeSnapshot, number: str) -> BusGpu | None:
    """The node's GPU on PCI bus `number` ("c3"): its bus id, name and repairs, one NVML
    lost or no longer sees (drained) included; NVML's name first."""
    nvml = node.nvml
    for gpu in reversed(nvml.gpus) if nvml is not None else ():
        bus = known_bus_id(gpu.pci_bus_id)
        if bus is not None and bus.split(":")[-2].lower() == number:
            name = _gpu_subject(gpu, bus)
            repair = _failed_repair(node, gpu, bus)
            failed = _after(repair, name) if repair is not None else None
            return BusGpu(bus, name, _latest(gpu.reset_at, _repaired_at(node, bus)), failed)
    ownership = node_ownership(node)
    for owner in reversed(ownership.gpus) if ownership is not None else ():
        if ":" in owner.bus_id and owner.bus_id.split(":")[-2].lower() == number:
            name = f"GPU {owner.index}" if owner.index is not None else "GPU"
            bus = owner.bus_id
            name = f"{name} ({short_bus_id(bus)})"
            # NVML does not read it: no reset it saw stands against the journal's word
            tried = node.actions.repair(bus) if node.actions is not None else None
            failed = _after(tried, name) if tried is not None and not tried.ok else None
            drained = owner.index is None and owner.driver is None
            return BusGpu(bus, name, _repaired_at(node, bus), failed, drained)
    return None


def _latest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _repairs_key(node: NodeSnapshot) -> tuple[object, ...]:
    """What a SEL record's verdict depends on beside the BMC's reading: each GPU's last
    reset NVML saw, and the journal's repairs."""
    nvml = node.nvml
    return (tuple(g.reset_at for g in nvml.gpus) if nvml is not None else (), node.actions)


# --- fabric -------------------------------------------------------------------------

_ERROR_COUNTERS = frozenset(rule.counter for rule in ERROR_RULES)
# Counters that say the physical link is failing: cable, transceiver or port.
_PHYSICAL = frozenset(
    {"link_downed", "symbol_error", "link_error_recovery", "local_link_integrity_errors"}
)


def _moved_ports(node: NodeSnapshot) -> dict[tuple[str, str], dict[str, int]]:
    """(device, port) -> the error counters that moved over the last interval, by the name
    the rules give them ("symbol_error", "netdev.rx_errors"), and how far."""
    deltas = node.deltas
    if not deltas:
        return _NONE_MOVED
    moved: dict[tuple[str, str], dict[str, int]] = {}
    for key, delta in deltas.items():
        if not delta or key[0] != "fabric":
            continue
        name = key[-1] if len(key) == 4 else f"netdev.{key[-1]}"
        if name in _ERROR_COUNTERS:
            moved.setdefault((key[1], key[2]), {})[name] = delta
    return moved or _NONE_MOVED


_NONE_MOVED: dict[tuple[str, str], dict[str, int]] = {}


def _no_rate(name: str) -> float | None:
    return None


def fabric_findings(
    node: NodeSnapshot,
    fabric: FabricReading,
    moved: dict[tuple[str, str], dict[str, int]] | None = None,
) -> list[Finding]:
    """The evidence the fabric gives: rails down or downtrained, error counters that
    climbed within the source's window (FABRIC_ERROR_WINDOW_S), links that went down in it
    (flaps: a flap is news until the window has passed it, and counted). A port its source
    did not count so (an older agent's, one read from Prometheus) is judged by how far its
    counters moved over the last interval (`moved`). Congestion is traffic, not health: the
    fabric panel shows it."""
    found: list[Finding] = []
    for device in fabric.devices:
        for port in device.ports:
            span = port.errors_climbed_s
            if span is None:
                if moved is None:
                    moved = _moved_ports(node)
                climbed = moved.get((device.name, str(port.port))) if moved else None
            else:
                climbed = dict(port.errors_climbed) if port.errors_climbed else None
            if port.pegged:
                found += _pegged_findings(port)
            if not climbed and port.state == "ACTIVE":
                # up at its rate (FabricPort.downtrained read inline: most ports of a
                # fleet, every time its fabric is read)
                speed, expected = port.rate_gbps, port.expected_rate_gbps
                if speed is None or expected is None or not speed < expected:
                    continue
            subject = f"{port.name} ({port.role})"
            rate: Callable[[str], float | None]
            if span is not None:
                # its state here, its errors over the window below
                rate, counted = _no_rate, _NONE_COUNTED.get
            else:
                # only the counters that moved can be erring: the rest are not looked up
                rate = _moved_rates(node, port, climbed) if climbed else _no_rate
                counted = (climbed or _NONE_COUNTED).get
            for problem in port_problems(port, rate, counted):
                if problem.what.startswith("congestion"):
                    continue
                code, action = _port_code(port, problem.what, problem.counter)
                what = problem.what
                if code == "rail_not_active":
                    what += ": its link is up, no subnet manager has made it active"
                found.append(Finding(code, what, problem.severity, "fabric", action, None,
                                     subject))  # fmt: skip
            if span is not None and climbed:
                found += _climbed_findings(port, span, subject)
    for gone in fabric.missing:
        since, subject = fmt.clock_time(gone.since), f"{gone.name} ({gone.role})"
        if gone.role is PortRole.MANAGEMENT:
            found.append(Finding("port_gone", f"gone from sysfs since {since}",
                                 Severity.WARNING, "fabric", Action.WATCH, None,
                                 subject))  # fmt: skip
            continue
        found.append(Finding("rail_gone", f"gone from sysfs since {since}: its HCA left the "
                             "PCIe bus or its driver was unloaded; reboot the node, reseat the "
                             "card if it stays gone", Severity.CRITICAL, "fabric",
                             Action.REBOOT_NODE, None, subject))  # fmt: skip
    if fabric.peermem_loaded is False and any(p.role is PortRole.COMPUTE for p in fabric.ports):
        found.append(Finding("peermem_missing", "nvidia-peermem not loaded: no GPUDirect RDMA",
                             Severity.WARNING, "fabric", Action.WATCH))  # fmt: skip
    return found


# Times a port went down within the window at which it is flapping: reseat or replace its
# cable or transceiver. Fewer is a port to watch.
LINK_FLAPS_RESEAT = 3
_RULES = {rule.counter: rule for rule in ERROR_RULES}


def _climbed_findings(port: FabricPort, span_s: float, subject: str) -> list[Finding]:
    """A port's error counters that climbed within its source's window (`span_s` of it
    seen so far), each by its rule; a counter that climbs a little under healthy load is
    judged by its rate over that span."""
    found: list[Finding] = []
    window = _over(span_s, FABRIC_ERROR_WINDOW_S)
    for counter, climbed in port.errors_climbed:
        rule = _RULES.get(counter)
        if rule is None or climbed <= 0:
            continue  # not a rule's counter (a reading that says otherwise is not believed)
        said = f"{rule.words} +{climbed} in the last {window}"
        if rule.floor_per_s:  # one that climbs a little under healthy load: by its rate
            per_s = climbed / max(span_s, 1.0)
            if not per_s > rule.floor_per_s:
                continue
            said = f"{rule.words} +{climbed} ({per_s:.3g}/s)"
        if counter == "link_downed":
            times = "once" if climbed == 1 else f"{climbed} times"
            if climbed >= LINK_FLAPS_RESEAT:
                found.append(Finding("link_flap", f"link went down {times} in the last "
                                     f"{window}: it flaps; reseat or replace its cable",
                                     Severity.CRITICAL, "fabric", Action.RESEAT, None,
                                     subject))  # fmt: skip
            else:
                found.append(Finding("link_flap", f"link went down {times} in the last "
                                     f"{window}: watch it; reseat its cable if it goes down "
                                     "again", Severity.WARNING, "fabric", Action.WATCH, None,
                                     subject))  # fmt: skip
            continue
        code = "link_errors" if counter in _PHYSICAL else "port_errors"
        found.append(Finding(code, said, rule.severity, "fabric", Action.WATCH, None,
                             subject))  # fmt: skip
    return found


_NONE_COUNTED: dict[str, int] = {}


def _moved_rates(
    node: NodeSnapshot, port: FabricPort, climbed: dict[str, int]
) -> Callable[[str], float | None]:
    rates = port_rates(node.rate, port)
    return lambda name: rates(name) if name in climbed else None


# Logical states of an IB port whose physical link trained (phys_state LinkUp) and that no
# subnet manager brought to ACTIVE: the SM's fault, not the cable's.
_AWAITING_SM = frozenset({"INIT", "ARMED"})


def _port_code(port: FabricPort, what: str, counter: str | None) -> tuple[str, Action]:
    if counter is None:
        if what.startswith("downtrained"):
            return "rail_downtrained", Action.RESEAT
        if what.startswith("link"):
            if port.role is PortRole.MANAGEMENT:
                return "port_down", Action.WATCH
            if port.state in _AWAITING_SM and port.phys_state == "LinkUp":
                return "rail_not_active", Action.DRAIN  # reseating its cable changes nothing
            return "rail_down", Action.RESEAT
        return "netdev_down", Action.WATCH
    if counter == "link_downed":
        return "link_flap", Action.RESEAT
    if counter in _PHYSICAL:
        return "link_errors", Action.WATCH
    return "port_errors", Action.WATCH


# --- tenancy ------------------------------------------------------------------------


def tenancy_findings(node: NodeSnapshot) -> list[Finding]:
    """Ownership that does not add up; passthrough GPUs as their guests' agents read them;
    GPUs sysfs lists that no driver holds (drained): out of service, with the XID that put
    them there when the hub saw it."""
    ownership = node_ownership(node)
    if ownership is None:
        return []
    found = [
        Finding("ownership", p.message, p.severity, "tenancy",
                Action.DRAIN if p.severity is Severity.CRITICAL else Action.WATCH)
        for p in ownership.problems
    ]  # fmt: skip
    for guest in node.tenancy.guest_gpus if node.tenancy is not None else ():
        # a passthrough GPU as its guest's agent reads it: judged as NVML's reading would be
        if guest.reading is not None and guest.error is None:
            subject = f"GPU {short_bus_id(guest.bus_id)} (in {guest.guest})"
            found += [
                msgspec.structs.replace(f, bus_id=guest.bus_id, subject=subject)
                for f in gpu_findings(node, guest.reading, None, guest.bus_id, guest=True)
            ]
    for owner in ownership.gpus:
        drained = owner.index is None and owner.driver is None
        problems = owner.problems or owner.migs
        if not problems and not drained:
            continue  # the common case, a GPU whose ownership adds up
        subject = f"GPU {owner.index}" if owner.index is not None else "GPU"
        subject += f" ({short_bus_id(owner.bus_id)})"
        for p in owner.all_problems:
            action = Action.DRAIN if p.severity is Severity.CRITICAL else Action.WATCH
            found.append(Finding("ownership", p.message, p.severity, "tenancy", action,
                                 owner.bus_id, subject))  # fmt: skip
        if drained:
            code = node.last_xid.get(owner.bus_id)
            entry = xid_entry(code) if code is not None else None
            if entry is not None and entry.severity is Severity.CRITICAL:
                action, advice = _remedy(entry.immediate)
                found.append(Finding("drained_after_xid", f"drained after XID {code} "
                                     f"{entry.words}: {advice} before it serves again",
                                     Severity.CRITICAL, "tenancy", action, owner.bus_id,
                                     subject))  # fmt: skip
            else:
                found.append(Finding("drained", "no driver holds it: out of service until it "
                                     "is given back", Severity.WARNING, "tenancy",
                                     Action.WATCH, owner.bus_id, subject))  # fmt: skip
    return found


# --- the verdicts -------------------------------------------------------------------


def _gpu_verdict(findings: list[Finding]) -> Verdict:
    """A GPU's verdict: unknown health for one NVML cannot open (nothing else is known of
    it), unless what is known is critical."""
    return _sorted_gpu_verdict(sorted(findings, key=_worst_first))


def _sorted_gpu_verdict(findings: list[Finding]) -> Verdict:
    """`_gpu_verdict` of findings already worst first."""
    unread = any(f.code == "gpu_unreadable" for f in findings)
    return _sorted_verdict(tuple(findings), Health.UNKNOWN if unread else Health.OK)


@dataclass(slots=True)
class _Judged:
    node: weakref.ref[NodeSnapshot]  # the snapshot judged; a hub frees the ones it replaces
    verdict: Verdict
    gpus: dict[str, Verdict]  # by bus id (or "#index" for a GPU NVML could not read)
    # the verdict its agent sent, taken as the node's, and what this process added to it:
    # the health where nothing was found (stale while a source is), its agent silent (next
    # to `node`: what a node that changed is taken again by)
    carried: CarriedVerdict | None = None
    calm: Health = Health.OK
    silence: SourceStatus | None = None  # its agent's status where it did not answer
    # each source's findings with the reading they came from: the BMC, fabric and tenancy
    # readings of a node stand for several of its NVML polls, and are judged once
    bmc: object = None
    repairs: tuple[object, ...] = ()  # `_repairs_key` when the BMC's findings were made
    bmc_found: tuple[Finding, ...] = ()
    fabric: object = None
    fabric_found: tuple[Finding, ...] = ()
    tenancy: object = None
    tenancy_found: tuple[Finding, ...] = ()
    # the verdict its agent sent where it was refused, and why: the node is judged here
    # from its readings, and the same verdict received again is not checked again
    refusal: _Refusal | None = None
    unfit: int = -1  # GPUs whose verdict is critical; -1 until asked
    # a node judged here, its sources answering and no verdict refused: its NVML findings
    # and its health where nothing was found; a snapshot after it with these alike (and the
    # other sources' findings the same) has its verdict
    here: tuple[tuple[Finding, ...], Health] | None = None


@dataclass(frozen=True, slots=True)
class _Refusal:
    carried: CarriedVerdict
    reason: str


_JUDGED: OrderedDict[str, _Judged] = OrderedDict()
_JUDGED_NODES = 16384


def forget_verdicts() -> None:
    """Forget every node judged so far (a benchmark judging afresh)."""
    _JUDGED.clear()
    _SENT.clear()
    _FLEET.clear()


class _Fleet:
    """The last fleet snapshot judged, held weakly (a hub frees the nodes it replaces as it
    replaces them), and what was judged of each of its nodes, by position. A view finds the
    verdict of a node of that snapshot while it lives: by its name's position, where the
    node is the very one asked about. A changed node is judged without a look-up by name."""

    __slots__ = ("calms", "held", "lock", "mark", "names", "taken", "took")

    def __init__(self) -> None:
        self.lock = threading.Lock()  # one judge at a time; views read `held` as it was
        self.clear()

    def clear(self, size: int = 0) -> None:
        # the snapshot, what was judged of each of its nodes and each name's position: one
        # value, replaced whole, never changed (a view in another thread reads it as a
        # judge replaces it)
        self.held: tuple[weakref.ref[FleetSnapshot] | None, list[_Judged | None], dict[str, int]]
        self.held = (None, [None] * size, {})
        self.names = [""] * size
        # the verdict the node there carries where it was taken as its agent sent it, its
        # agent answering: the same verdict with its sources as fresh is judged alike
        self.taken: list[object] = [_NONE] * size
        self.took = bytearray(size)  # 1 where `taken` holds a verdict
        self.calms: list[Health] = [Health.UNKNOWN] * size  # those sources' health then
        self.mark: object = None  # the Rebuilt.mark of the snapshot judged

    def of(self, node: NodeSnapshot) -> _Judged | None:
        """What was judged of `node` where it is a node of the last snapshot judged."""
        shot, judged, place = self.held
        fleet = shot() if shot is not None else None
        at = place.get(node.node)
        if fleet is not None and at is not None and fleet.nodes[at] is node:
            return judged[at]
        return None


_NONE = object()  # no verdict is it
_FLEET = _Fleet()
_OK = operator.attrgetter("ok")


def _ones(flags: int, size: int) -> list[int]:
    """The positions whose byte is 1 in `flags`, `size` bytes read as a little-endian
    number of bytes each 0 or 1."""
    if not flags:
        return []
    found, raw = [], flags.to_bytes(size, "little")
    at = raw.find(1)
    while at >= 0:
        found.append(at)
        at = raw.find(1, at + 1)
    return found


def judge_fleet(snapshot: FleetSnapshot) -> int:
    """Judge every node of a fleet snapshot as far as it changed since the last one judged:
    a view then finds each node's verdict, and a critical node's GPUs out of work (what the
    fleet's sort reads), with a look-up. A hub publishes a few times a second, replaces
    the nodes that changed and says which (`Rebuilt`): where the snapshot judged last is
    the one its hub published before, only those are looked at, less those the hub says
    are steady whose agent's verdict was taken; else, while the snapshot judged last
    lives, each node that is not the one judged in its place; else all. A node its agent
    judged, whose verdict came as last time and whose sources all answer, is taken again
    as it is. Returns how many nodes it looked at."""
    fleet = _FLEET
    with fleet.lock:
        return _judge_fleet(snapshot, fleet)


def _judge_fleet(snapshot: FleetSnapshot, fleet: _Fleet) -> int:
    nodes, (shot, judged_before, place) = snapshot.nodes, fleet.held
    rebuilt = snapshot.rebuilt
    if rebuilt is not None and rebuilt.nodes is not nodes:
        rebuilt = None  # a copy of the hub's snapshot with other nodes
    last = shot() if shot is not None else None
    changed: Sequence[int]
    if len(judged_before) != len(nodes):
        fleet.clear(len(nodes))
        changed, place = range(len(nodes)), {}
        judged_before = fleet.held[1]
    elif rebuilt is not None and rebuilt.after is not None and rebuilt.after is fleet.mark:
        changed = rebuilt.positions  # the hub's word: every other node is the one judged
        steady, took = rebuilt.steady, fleet.took
        # (where every node's verdict was taken, as where every agent sends its own, none)
        if len(steady) == len(nodes) and took.find(0) >= 0:
            # What most nodes a hub rebuilds are: new readings, their sources answering as
            # they did and the verdict their agent sent the one before. Where that verdict
            # was taken (for the node before, its agent answering), it stands: told in C
            # from a byte per node, without a look into the node or at the verdict (a
            # thousand nodes' objects lie far apart in memory: each look is a cache miss).
            # Those judged here are looked at.
            again = _ones(
                int.from_bytes(steady, "little") & ~int.from_bytes(took, "little"), len(nodes)
            )
            if again:
                changed = [*changed, *again]
    elif last is not None:
        # both snapshots held: a node is told from another by what it is, all in C
        changed = list(
            itertools.compress(range(len(nodes)), map(operator.is_not, nodes, last.nodes))
        )
    else:
        changed = range(len(nodes))
    fleet.mark = None
    try:
        return _judge_changed(snapshot, fleet, changed, judged_before, place, rebuilt)
    except BaseException:
        fleet.clear(len(nodes))  # what was judged of some positions is not known
        raise


def _judge_changed(
    snapshot: FleetSnapshot,
    fleet: _Fleet,
    changed: Sequence[int],
    judged_before: list[_Judged | None],
    place: dict[str, int],
    rebuilt: Rebuilt | None,
) -> int:
    nodes = snapshot.nodes
    # judged anew into a copy: a view reads the one before, whole, until this is done
    judged_at, names, taken, calms = list(judged_before), fleet.names, fleet.taken, fleet.calms
    took = fleet.took
    ok, stale, critical, regrouped = Health.OK, Health.STALE, Health.CRITICAL, False
    for i in changed:
        node = nodes[i]
        statuses, carried = node.statuses, node.verdict
        if names[i] is not node.node:
            seen = _JUDGED.get(node.node)
            names[i], regrouped = node.node, True
        else:
            # What most changed nodes are: the verdict its agent sent as before, its sources
            # as fresh as they were and its agent answering (the same node's: its name in
            # its place). Judged alike, with little else read.
            if carried is taken[i] and statuses:
                if all(map(_OK, statuses)):
                    if calms[i] is ok:
                        continue
                elif calms[i] is stale and all(map(_answering, statuses)):
                    continue
            seen = judged_at[i]
        judged = seen if seen is not None and seen.node() is node else _judge(node, seen)
        if judged.unfit < 0 and judged.verdict.health is critical:
            _out_of_work(judged)
        judged_at[i] = judged
        if judged.carried is not None and judged.silence is None:
            taken[i], calms[i], took[i] = judged.carried, judged.calm, 1
        else:
            taken[i], took[i] = _NONE, 0
    if regrouped:
        place = {name: at for at, name in enumerate(names)}
    fleet.held = (weakref.ref(snapshot), judged_at, place)
    fleet.mark = rebuilt.mark if rebuilt is not None else None
    return len(changed)


def _answering(status: SourceStatus) -> bool:
    return status.ok or status.source != "remote"


def _gpu_key(bus_id: str | None, index: int | None) -> str:
    return bus_id if bus_id else f"#{index}"


def _judge(node: NodeSnapshot, seen: _Judged | None = None) -> _Judged:
    """Every finding of a node, judged once per snapshot of it: the fleet, the wallboard
    and the exporter of one process ask about the same snapshot. A node read through its
    agent comes with the verdict the agent judged, where every detail is: checked, it is
    taken as it is, and a head need not judge a thousand nodes a second. (`seen`: what the
    caller found remembered of the node, another snapshot of it.)"""
    if seen is None:
        seen = _JUDGED.get(node.node)
        if seen is not None and seen.node() is node:
            return seen
        held = _FLEET.of(node)
        if held is not None:
            return held
    carried = node.verdict
    refused: _Refusal | None = None
    if carried is not None:
        # the agent's verdict as it last came (unchanged): taken again while what this
        # process adds to it stays as it was (the same verdict object, and its sources'
        # freshness), which is all a snapshot of a node that sends its verdict changes of it
        checked: _Judged | _Refusal | None = None
        if seen is not None:
            if seen.carried is carried:
                checked = seen
            elif seen.refusal is not None and seen.refusal.carried is carried:
                checked = seen.refusal
        if isinstance(checked, _Judged) and checked.carried is carried:
            statuses = node.statuses
            calm = Health.OK if statuses else Health.UNKNOWN
            for status in statuses:
                if not status.ok:
                    calm = Health.STALE
                    break
            if calm is checked.calm and (calm is Health.OK or _silence(node) is checked.silence):
                checked.node = weakref.ref(node)
                if checked is not seen:
                    _JUDGED[node.node] = checked
                return checked
        elif isinstance(checked, _Refusal) and checked.carried is carried:
            refused = checked
    taken = _carried(node, carried) if carried is not None and refused is None else None
    if isinstance(taken, _Judged):
        judged = taken
    else:
        if taken is not None:
            assert carried is not None
            refused = _Refusal(carried, taken)
        judged = _judged_here(node, seen, refused)
    _JUDGED[node.node] = judged
    if seen is None:
        while len(_JUDGED) > _JUDGED_NODES:
            _JUDGED.popitem(last=False)
    return judged


def _judged_here(node: NodeSnapshot, seen: _Judged | None, refused: _Refusal | None) -> _Judged:
    """The node judged from its readings (the verdict its agent sent `refused`, if so)."""
    nvml = node.nvml
    nvml_found = tuple(_nvml_findings(node, nvml)) if nvml is not None else ()
    findings = list(nvml_found)
    judged = _Judged(weakref.ref(node), _FIT, {})
    bmc = node.bmc
    if bmc is not None:
        # a SEL record of a GPU's fault is history once the GPU is repaired
        repairs = _repairs_key(node)
        if seen is not None and seen.bmc is bmc and seen.repairs == repairs:
            judged.bmc_found = seen.bmc_found
        else:
            judged.bmc_found = tuple(bmc_findings(bmc, lambda bus: _gpu_on_bus(node, bus)))
        judged.bmc, judged.repairs = bmc, repairs
        findings += judged.bmc_found
    fabric = node.fabric
    if fabric is not None:
        # the hub moves a port's rates and deltas only when the fabric source reads again,
        # which is a new reading: the same reading judges alike
        if seen is not None and seen.fabric is fabric:
            judged.fabric_found = seen.fabric_found
        else:
            judged.fabric_found = tuple(fabric_findings(node, fabric))
        judged.fabric = fabric
        findings += judged.fabric_found
    tenancy = node.tenancy
    if tenancy is not None:
        ownership = node_ownership(node)
        # what its findings read: the owners, the XID that drained a GPU, and each guest's
        # reading of its GPUs (an XID a guest's GPU raises changes no owner)
        key = (ownership, _drained_xids(node, ownership), tenancy.guest_gpus)
        if seen is not None and seen.tenancy == key:
            judged.tenancy_found = seen.tenancy_found
        else:
            found = tuple(tenancy_findings(node))
            if seen is not None and seen.tenancy_found == found:
                found = seen.tenancy_found  # a guest read again, as fine as before: alike
            judged.tenancy_found = found
        judged.tenancy = key
        findings += judged.tenancy_found
    calm = _calm(node)
    if refused is None and calm is Health.OK:  # else it says what this process adds
        judged.here = (nvml_found, calm)
        if (
            seen is not None
            and seen.here is not None
            and seen.bmc_found is judged.bmc_found
            and seen.fabric_found is judged.fabric_found
            and seen.tenancy_found is judged.tenancy_found
            and seen.here == judged.here
        ):
            # what most snapshots of a node are: new readings, the same evidence
            judged.verdict, judged.gpus = seen.verdict, seen.gpus
            return judged
    if findings:
        per_gpu: dict[str, list[Finding]] = {}
        for finding in findings:
            if finding.bus_id is not None:
                per_gpu.setdefault(finding.bus_id, []).append(finding)
        judged.gpus = {bus: _gpu_verdict(found) for bus, found in per_gpu.items()}
    if calm is not Health.OK or refused is not None:
        findings += _head_findings(node, refused.reason if refused is not None else None)
    judged.verdict = _verdict(findings, calm)
    judged.refusal = refused
    return judged


def _silence(node: NodeSnapshot) -> SourceStatus | None:
    """The status of the node's agent where it does not answer (this process says so)."""
    status = node.status("remote")
    return None if status is None or status.ok else status


def _calm(node: NodeSnapshot) -> Health:
    """The health of a node with nothing found: unknown before any source answered, stale
    while one is."""
    if not node.statuses:
        return Health.UNKNOWN
    for status in node.statuses:
        if not status.ok:
            return Health.STALE
    return Health.OK


def _head_findings(node: NodeSnapshot, refused: str | None) -> list[Finding]:
    """What this process alone knows of a node it reads through an agent: the agent
    silent (its last reading and verdict shown, stale), the verdict it sent refused."""
    found = []
    status = node.status("remote")
    if status is not None and not status.ok:
        since = f" since {fmt.clock_time(status.stale_since)}" if status.stale_since else ""
        why = f" ({status.error})" if status.error else ""
        shown = ": the last it sent is shown" if status.last_ok_at is not None else ""
        found.append(Finding("agent_silent", f"no answer from its agent{since}{why}{shown}",
                             Severity.INFO, "agent", Action.FIT))  # fmt: skip
    if refused is not None:
        found.append(Finding("verdict_refused", f"the verdict its agent sent is refused "
                             f"({refused}): judged here from its readings", Severity.WARNING,
                             "agent", Action.WATCH))  # fmt: skip
    return found


# What a head takes of a verdict an agent sends: far more than a node has, never more.
CARRIED_FINDINGS = 1024
CARRIED_GPUS = 64
_CODE_CHARS, _TEXT_CHARS, _SUBJECT_CHARS = 64, 1000, 200


def _carried(node: NodeSnapshot, carried: CarriedVerdict) -> _Judged | str:
    """The node's verdict as its agent judged it, checked against what its findings say
    and merged with what this process alone knows; or why it is refused.

    Once per verdict that is new, which is each time the text of a climbing counter moves:
    one pass over the findings. An agent sends them worst first (as `_verdict` sorts
    them), so they are taken in its order where they are in order, each GPU's too; else
    sorted here, with the same result."""
    if carried.refused:
        return safe_text(carried.refused[:_TEXT_CHARS])
    sent = carried.findings
    if len(sent) > CARRIED_FINDINGS:
        return f"{len(sent)} findings, more than {CARRIED_FINDINGS}"
    if len(carried.gpus) > CARRIED_GPUS:
        return f"{len(carried.gpus)} GPUs judged, more than {CARRIED_GPUS}"
    findings: list[Finding] | None = None  # where one had to be made safe: all, as shown
    per_gpu: dict[str, list[Finding]] = {}
    buses: frozenset[str] | None = None
    ranks, actions = _SEVERITY_RANK, _ACTION_RANK
    before, ordered = (-3, -len(actions)), True  # the finding before's order: none yet
    for i, finding in enumerate(sent):
        wrong = _unfit(finding)
        if wrong:
            return f"finding {i}: {wrong}"
        if not _printable(finding):
            if findings is None:
                findings = list(sent[:i])
            finding = _safe_finding(finding)
        if findings is not None:
            findings.append(finding)
        key = (-ranks[finding.severity], -actions[finding.action])  # as _worst_first
        if key < before:
            ordered = False
        before = key
        bus = finding.bus_id
        if bus is not None:
            if buses is None:
                buses = _node_buses(node)
            if bus not in buses:
                return f"finding {i} is about GPU {_shown(bus)}, which the node does not have"
            per_gpu.setdefault(bus, []).append(finding)
    judge_gpu = _sorted_gpu_verdict if ordered else _gpu_verdict
    gpus = {bus: judge_gpu(found) for bus, found in per_gpu.items()}
    said: set[str] = set()
    for line in carried.gpus:
        bus = line.bus_id
        expected = gpus.get(bus)
        if bus in said:
            return f"GPU {_shown(bus)} is judged twice"
        said.add(bus)
        if expected is None:
            return f"GPU {_shown(bus)} is judged {line.action} with no finding about it"
        if line.action is not expected.action or line.health is not expected.health:
            return (f"GPU {_shown(bus)} is said {line.action} ({line.health}), its findings say "
                    f"{expected.action} ({expected.health})")  # fmt: skip
    if len(said) != len(gpus):
        unsaid = sorted(gpus.keys() - said)[0]
        return f"GPU {unsaid} has findings and no verdict"
    shown = sent if findings is None else tuple(findings)
    if not ordered:
        shown = tuple(sorted(shown, key=_worst_first))
    worst = shown[0].action if shown else Action.FIT
    if carried.action is not worst:
        return f"the node is said {carried.action}, its findings say {worst}"
    calm = _calm(node)
    silence = _silence(node) if calm is not Health.OK else None
    if silence is not None:
        verdict = _verdict([*shown, *_head_findings(node, None)], calm)
    else:
        verdict = _sorted_verdict(shown, calm)
    judged = _Judged(weakref.ref(node), verdict, gpus, carried=carried)
    judged.calm, judged.silence = calm, silence
    return judged


def _unfit(finding: Finding) -> str | None:
    """What is wrong with a finding an agent sent, beyond its types (the codec's): None
    where nothing is."""
    code = finding.code
    if not (0 < len(code) <= _CODE_CHARS and code.isascii() and code.replace("_", "").isalnum()):
        return f"code {_shown(code)} is not a machine name"
    if len(finding.text) > _TEXT_CHARS:
        return f"its text is longer than {_TEXT_CHARS} characters"
    if len(finding.subject) > _SUBJECT_CHARS:
        return f"its subject is longer than {_SUBJECT_CHARS} characters"
    if finding.source not in SOURCES:
        return f"source {_shown(finding.source)} is none of {', '.join(SOURCES)}"
    return None


def _shown(text: str) -> str:
    """A piece of what an agent sent, short and safe to show in a reason."""
    cut = text[:40] + ("…" if len(text) > 40 else "")
    return f"'{safe_text(cut)}'"


def _printable(finding: Finding) -> bool:
    return (
        finding.text.isprintable()
        and finding.subject.isprintable()
        and finding.code.isprintable()
        and (finding.bus_id is None or finding.bus_id.isprintable())
    )


def _safe_finding(finding: Finding) -> Finding:
    bus = finding.bus_id
    return msgspec.structs.replace(
        finding,
        code=safe_text(finding.code),
        text=safe_text(finding.text),
        subject=safe_text(finding.subject),
        bus_id=safe_text(bus) if bus is not None else None,
    )


def _node_buses(node: NodeSnapshot) -> frozenset[str]:
    """Every GPU a node has, by bus id: what NVML reads, what sysfs lists (a GPU NVML lost,
    or one no driver holds) and what its guests' agents read."""
    buses = {g.pci_bus_id for g in node.gpus}
    tenancy = node.tenancy
    if tenancy is not None:
        buses.update(g.bus_id for g in tenancy.gpus)
        buses.update(g.bus_id for g in tenancy.guest_gpus)
    return frozenset(buses)


# A fleet's summary holds the verdict it sent while only the words of its findings move (a
# counter climbing, a rate): for this long in the node's own time, after which the words are
# sent afresh. A head then checks a verdict when it changes, not each second a counter
# climbs; the summary's readings (the port's counters) are as live as ever, and a node a
# head opens reads the verdict live. Anything else that changes is sent at once.
WORDS_HELD_S = 10.0
_SENT: OrderedDict[str, tuple[float, CarriedVerdict]] = OrderedDict()


def carry_verdict(node: NodeSnapshot, *, hold: bool = False) -> NodeSnapshot:
    """The node with its verdict, judged here where every detail is, as its agent sends it
    to a head; `hold`: as a fleet's summary sends it (WORDS_HELD_S)."""
    judged = _judge(node)
    verdict = judged.verdict
    lines = tuple(JudgedGpu(bus, v.action, v.health) for bus, v in judged.gpus.items())
    carried = CarriedVerdict(verdict.action, verdict.findings, lines)
    if hold:
        carried = _held(node, carried)
    return msgspec.structs.replace(node, verdict=carried)


def _held(node: NodeSnapshot, carried: CarriedVerdict) -> CarriedVerdict:
    """The verdict sent before in its place, where it says all `carried` does but for the
    words of its findings and is younger than WORDS_HELD_S in the node's time."""
    at = max((s.last_ok_at for s in node.statuses if s.last_ok_at is not None), default=None)
    if at is None:
        return carried
    sent = _SENT.get(node.node)
    if sent is not None and 0 < at - sent[0] < WORDS_HELD_S and _worded_alike(sent[1], carried):
        return sent[1]
    _SENT[node.node] = (at, carried)
    _SENT.move_to_end(node.node)
    while len(_SENT) > _JUDGED_NODES:
        _SENT.popitem(last=False)
    return carried


def _worded_alike(before: CarriedVerdict, now: CarriedVerdict) -> bool:
    """Whether two verdicts differ at most in their findings' words."""
    if before.action is not now.action or before.gpus != now.gpus:
        return False
    if len(before.findings) != len(now.findings):
        return False
    for a, b in zip(before.findings, now.findings, strict=True):
        if a is not b and (
            a.code != b.code
            or a.severity is not b.severity
            or a.action is not b.action
            or a.bus_id != b.bus_id
            or a.subject != b.subject
            or a.source != b.source
        ):
            return False
    return True


AS_ITS_AGENT_JUDGED = "as its agent judged it: open the node for the evidence"
_ACTION_SEVERITY = {Action.FIT: Severity.INFO, Action.WATCH: Severity.WARNING}
_MILDER = {Severity.CRITICAL: Severity.WARNING, Severity.WARNING: Severity.INFO}


def actions_verdict(
    node: NodeSnapshot,
    action: Action,
    gpus: Mapping[str, Action],
    severities: Mapping[str, Severity] | None = None,
) -> CarriedVerdict:
    """The verdict a node's agent judged, known by its actions alone (Prometheus holds the
    node's and each GPU's, by bus id, and each GPU's health, not the evidence): a finding
    per GPU not fit and one for the node where no GPU's action is its own, each saying so
    (opening the node reads its agent, evidence and all), as a verdict its agent sent.

    Each finding is as bad as its GPU's health says (`severities`, by bus id), else as its
    action most often is (watch a warning, worse critical). A node takes its worst
    finding's action: a GPU whose action is worse than the node's was less bad at its
    agent, and is a step milder here (as are GPUs read at another moment than the node)."""
    if action is Action.FIT:
        return CarriedVerdict(action)
    said = severities or {}
    rows = {row.bus_id: row for row in node_gpus(node)}
    judged = {bus: a for bus, a in sorted(gpus.items()) if a is not Action.FIT}
    own = [said.get(b, _ACTION_SEVERITY.get(a, Severity.CRITICAL)) for b, a in judged.items()
           if a is action]  # fmt: skip
    worst = (max(own, key=_SEVERITY_RANK.__getitem__) if own
             else _ACTION_SEVERITY.get(action, Severity.CRITICAL))  # fmt: skip
    findings: list[Finding] = []
    for bus, gpu_action in judged.items():
        severity = said.get(bus, _ACTION_SEVERITY.get(gpu_action, Severity.CRITICAL))
        if gpu_action.rank > action.rank:
            mildest = _MILDER.get(worst, Severity.INFO)
            severity = min(severity, mildest, key=_SEVERITY_RANK.__getitem__)
        elif gpu_action is not action:
            severity = min(severity, worst, key=_SEVERITY_RANK.__getitem__)
        row = rows.get(bus)
        gpu = row.reading if row is not None else None
        # one NVML does not number (passed through) by its bus id; one the node does not
        # have (as read here) is the node's
        subject = f"GPU {short_bus_id(bus)}" if gpu is None else _gpu_subject(gpu, bus)
        findings.append(Finding("agent_verdict", AS_ITS_AGENT_JUDGED, severity, "agent",
                                gpu_action, None if row is None else bus, subject))  # fmt: skip
    if not own:
        findings.append(Finding("agent_verdict", AS_ITS_AGENT_JUDGED, worst, "agent", action))
    findings.sort(key=_worst_first)
    per_gpu: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.bus_id is not None:
            per_gpu.setdefault(finding.bus_id, []).append(finding)
    lines = []
    for bus, found in per_gpu.items():
        verdict = _gpu_verdict(found)
        lines.append(JudgedGpu(bus, verdict.action, verdict.health))
    return CarriedVerdict(action, tuple(findings), tuple(lines))


def _drained_xids(node: NodeSnapshot, ownership: Ownership | None) -> tuple[int | None, ...]:
    """The XID the hub saw last on each GPU no driver holds: what the tenancy findings read
    besides the owners."""
    if ownership is None:
        return ()
    xids = node.last_xid
    if not xids:
        return ()
    return tuple(xids.get(g.bus_id) for g in ownership.gpus if g.index is None and g.driver is None)


def _nvml_findings(node: NodeSnapshot, nvml: NvmlReading) -> list[Finding]:
    fm = nvml.fabric_manager_running
    if fm is False:
        found = [Finding("fabric_manager_down", "the NVIDIA Fabric Manager service is not "
                         "running: CUDA jobs will not start on its GPUs", Severity.CRITICAL,
                         "nvml", Action.DRAIN)]  # fmt: skip
    else:
        found = []
    unnamed: dict[int, str] | None = None
    for gpu in nvml.gpus:
        if _healthy(gpu):
            continue  # most GPUs: told here without a call of gpu_findings each
        # the node says Fabric Manager is down once, not on every GPU
        got = gpu_findings(node, gpu, None)
        if got:
            if known_bus_id(gpu.pci_bus_id) is None:  # lost before NVML read it: by sysfs
                if unnamed is None:
                    unnamed = _sysfs_buses(node)
                got = gpu_findings(node, gpu, None, unnamed.get(gpu.index))
            found += got
    return found


def _sysfs_buses(node: NodeSnapshot) -> dict[int, str]:
    """NVML's index -> bus id as ownership joined them (sysfs and the nvidia driver)."""
    ownership = node_ownership(node)
    if ownership is None:
        return {}
    return {g.index: g.bus_id for g in ownership.gpus if g.index is not None and ":" in g.bus_id}


def node_verdict(node: NodeSnapshot) -> Verdict:
    """The node's verdict: every source's evidence about it and its GPUs, worst first.
    Health is unknown before any source answered, stale while a source is stale and nothing
    is critical."""
    seen = _JUDGED.get(node.node)  # _judge's first looks, here: a console asks every node
    if seen is not None and seen.node() is node:
        return seen.verdict
    held = _FLEET.of(node)
    if held is not None:
        return held.verdict
    return _judge(node, seen).verdict


def gpu_verdict(node: NodeSnapshot, gpu: GpuReading | GpuRow | str) -> Verdict:
    """One GPU's verdict (a reading, a row, or its bus id): the evidence about it alone;
    what is wrong with the node around it is the node's verdict."""
    judged = _judge(node)
    if isinstance(gpu, GpuRow) and ":" not in gpu.bus_id and gpu.reading is not None:
        gpu = gpu.reading  # NVML lost it before it read its bus id, and sysfs has not said it
    if isinstance(gpu, str):
        key = gpu
    elif isinstance(gpu, GpuRow):
        key = gpu.bus_id if ":" in gpu.bus_id else f"#{gpu.index}"
    else:
        key = _gpu_key(known_bus_id(gpu.pci_bus_id), gpu.index)
    if key.startswith("#"):
        key = _sysfs_buses(node).get(int(key[1:]), key)
    found = judged.gpus.get(key)
    if found is not None:
        return found
    # a GPU whose bus id NVML could not read: the findings the node's verdict files about
    # it by its number (a row of it too: the exporter's verdict series asks by row)
    reading = gpu.reading if isinstance(gpu, GpuRow) else gpu
    if isinstance(reading, GpuReading) and known_bus_id(reading.pci_bus_id) is None:
        own = [f for f in judged.verdict.findings if f.bus_id is None and
               f.subject == _gpu_subject(reading)]  # fmt: skip
        if own:
            return _gpu_verdict(own)
    return _FIT


def unfit_gpus(node: NodeSnapshot) -> int:
    """How many of the node's GPUs cannot take work now (their verdict is critical): what
    puts one critical node ahead of another for whoever is paged."""
    return _out_of_work(_judge(node))


def _out_of_work(judged: _Judged) -> int:
    if judged.unfit < 0:
        judged.unfit = sum(1 for v in judged.gpus.values() if v.health is Health.CRITICAL)
    return judged.unfit


def reading_verdict(gpu: GpuReading, node: NodeSnapshot | None = None) -> Verdict:
    """A GPU's verdict from its NVML reading alone (and its node's rates, where given): for
    a caller with a reading and no snapshot around it."""
    return _gpu_verdict(gpu_findings(node or _NO_NODE, gpu))


_NO_NODE = NodeSnapshot("")


def gpu_health(node: NodeSnapshot, gpu: GpuReading | GpuRow | str) -> Health:
    """A GPU's light: its verdict's health."""
    return gpu_verdict(node, gpu).health


def node_health(node: NodeSnapshot) -> Health:
    """A node's light: its verdict's health."""
    return node_verdict(node).health


def finding_json(finding: Finding) -> dict[str, str | None]:
    """A finding as `snapshot --json` writes it."""
    return {
        "code": finding.code,
        "text": finding.text,
        "subject": finding.subject,
        "severity": finding.severity.value,
        "source": finding.source,
        "action": finding.action.value,
        "bus_id": finding.bus_id,
    }


def verdicts_json(snapshot: FleetSnapshot) -> dict[str, object]:
    """Every node's verdict and each judged GPU's, by node name and bus id."""
    out: dict[str, object] = {}
    for node in snapshot.nodes:
        judged = _judge(node)
        out[node.node] = {
            "action": judged.verdict.action.value,
            "health": judged.verdict.health.value,
            "findings": [finding_json(f) for f in judged.verdict.findings],
            "gpus": {
                bus: {"action": v.action.value, "health": v.health.value}
                for bus, v in judged.gpus.items()
            },
        }
    return out
