"""The verdict as the exporter serves it: every GPU's health series is its verdict's, and
the XIDs behind a verdict are counted per code, a guest's GPU's as much as the host's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from gpuconsole.export.agent import Agent
from gpuconsole.export.collector import build
from gpuconsole.facts import summaries
from gpuconsole.facts.inventory import node_gpus, short_bus_id
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.readings.actions import JournalReading, RepairAttempt
from gpuconsole.readings.base import known_bus_id
from gpuconsole.readings.nvml import XidCount
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.wiring import AgentSettings
from tests.export_fixtures import FIXED, HeldHub, frozen_fleet, parse, pick
from tests.test_export_agent import eventually, prometheus, promql

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


XID_RULES = """groups:
- name: site
  rules:
  - alert: GpuDoubleBitEcc
    expr: gpuconsole_gpu_xid_window{xid="48"} > 0
    labels: {severity: critical}
    annotations: {summary: "GPU {{ $labels.gpu }} on {{ $labels.node }}: {{ $labels.mnemonic }}"}
"""


async def test_prometheus_alerts_on_the_verdict_and_the_xid_and_holds_one_action_at_a_time(
    tmp_path: Path,
) -> None:
    """A real Prometheus scrapes an agent whose guest's GPU raised XID 48, evaluates the rules
    `gpuconsole rules` prints and a site's rule over the XID counts; the GPU is then reset."""
    fleet = frozen_fleet()
    raised, bus = _guest_raised(fleet, XidCount(48, 2, FIXED - 60, FIXED - 5))
    node = raised.node(GUESTS)
    assert node is not None
    hub = HeldHub(msgspec.structs.replace(raised, nodes=(node,)))
    (tmp_path / "empty.toml").write_text("")
    printed = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "rules", "-c", str(tmp_path / "empty.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    rules = [tmp_path / "gpuconsole.rules.yml", tmp_path / "site.rules.yml"]
    rules[0].write_text(printed.stdout)
    rules[1].write_text(XID_RULES)
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    gpu = f'node="{GUESTS}",gpu="{bus}"'
    try:
        async with prometheus(f"127.0.0.1:{agent.port}", tmp_path, rules) as url:

            async def firing(name: str, state: str = "firing") -> list[dict[str, Any]] | None:
                query = f'ALERTS{{alertname="{name}",alertstate="{state}",{gpu}}}'
                return await promql(url, query) or None

            [ecc] = await eventually(lambda: firing("GpuDoubleBitEcc"), timeout=60)
            assert ecc["metric"]["mnemonic"] == "ROBUST_CHANNEL_GPU_ECC_DBE"
            # the verdict's rule fires once it has held 2 minutes: pending until then
            [unfit] = await eventually(lambda: firing("GpuNotFitForWork", "pending"))
            assert unfit["metric"]["action"] == "reset_gpu"
            [judged] = await promql(url, f"gpuconsole_gpu_verdict{{{gpu}}}")
            assert judged["metric"]["action"] == "reset_gpu" and judged["value"][1] == "3"
            [whole] = await promql(url, f'gpuconsole_node_verdict{{node="{GUESTS}"}}')
            assert whole["metric"]["action"] == "reset_gpu"

            # the GPU reset: its XIDs cleared, its verdict fit
            reset, _ = _guest_raised(fleet)
            node = reset.node(GUESTS)
            assert node is not None and gpu_verdict(node, bus).fit
            hub.held = msgspec.structs.replace(reset, nodes=(node,), seq=hub.held.seq + 1)

            async def fit() -> bool | None:
                # never two actions of one GPU at once, the old one gone by the next scrape
                twice = await promql(url, "count by (node, gpu) (gpuconsole_gpu_verdict) > 1")
                assert twice == []
                now = await promql(url, f"gpuconsole_gpu_verdict{{{gpu}}}")
                return True if [s["metric"]["action"] for s in now] == ["fit"] else None

            await eventually(fit)

            async def resolved() -> bool | None:
                left = await promql(url, f"ALERTS{{{gpu}}}")  # pending ones too
                return True if left == [] else None

            await eventually(resolved)
            assert await promql(url, f"gpuconsole_gpu_xid_window{{{gpu}}}") == []
    finally:
        await agent.stop()


def test_a_gpu_lost_before_nvml_read_its_bus_id_is_not_fit_before_tenancy_reads() -> None:
    """dgx-003's GPU 5 fell off the bus before the agent started: NVML never told its bus id,
    and until the tenancy source reads sysfs nothing else does. Its verdict is still its
    evidence's, in the node view's light and in the exporter, not fit."""
    node = frozen_fleet().node("dgx-003")
    assert node is not None
    early = msgspec.structs.replace(
        node, tenancy=None, statuses=tuple(s for s in node.statuses if s.source != "tenancy")
    )
    [lost] = [r for r in node_gpus(early) if r.lost]
    assert ":" not in lost.bus_id  # nothing named its bus yet
    assert gpu_verdict(early, lost).action is Action.RESET_GPU
    assert summaries.row_health(early, lost).value == "critical"
    samples = parse(build(msgspec.structs.replace(frozen_fleet(), nodes=(early,))).text().decode())
    actions = [s.labels["action"] for s in samples["gpuconsole_gpu_verdict"] if s.value > 0]
    assert actions == ["reset_gpu"]


def test_an_xid_a_journaled_reset_cleared_is_no_longer_counted_as_the_verdict_turns_fit() -> None:
    """A site's rule on gpuconsole_gpu_xid_window resolves when the verdict does: the XID
    48 the plan's verified reset cleared is history for both, though NVML never saw the GPU
    go; one raised after the reset is counted."""
    fleet = frozen_fleet()
    node = fleet.node("dgx-002")
    assert node is not None and node.nvml is not None
    gpu = node.nvml.gpus[2]
    bus = known_bus_id(gpu.pci_bus_id)
    assert bus is not None

    def counted(*xids: XidCount, repairs: tuple[RepairAttempt, ...]) -> dict[str, float]:
        assert node is not None and node.nvml is not None
        raised = msgspec.structs.replace(gpu, xids=xids)
        gpus = tuple(raised if g.index == gpu.index else g for g in node.nvml.gpus)
        changed = msgspec.structs.replace(
            node,
            nvml=msgspec.structs.replace(node.nvml, gpus=gpus),
            actions=JournalReading(FIXED, 0, repairs),
        )
        samples = parse(build(_with_node(fleet, changed)).text().decode())
        verdicts = [
            s.labels["action"]
            for s in samples["gpuconsole_gpu_verdict"]
            if s.labels["node"] == "dgx-002" and s.labels["gpu"] == bus
        ]
        assert verdicts == [gpu_verdict(changed, bus).action.value]
        return {
            s.labels["xid"]: s.value
            for s in samples.get("gpuconsole_gpu_xid_window", [])
            if s.labels["node"] == "dgx-002" and s.labels["gpu"] == bus
        }

    dbe = XidCount(48, 1, FIXED - 600, FIXED - 600)
    reset = RepairAttempt(bus, Action.RESET_GPU, FIXED - 300, ok=True)
    assert counted(dbe, repairs=()) == {"48": 1.0}
    assert counted(dbe, repairs=(reset,)) == {}
    again = XidCount(48, 1, FIXED - 60, FIXED - 60)
    assert counted(dbe, again, repairs=(reset,)) == {"48": 1.0}
    # a reset the plan could not verify clears nothing
    failed = RepairAttempt(bus, Action.RESET_GPU, FIXED - 300, ok=False)
    assert counted(dbe, repairs=(failed,)) == {"48": 1.0}
