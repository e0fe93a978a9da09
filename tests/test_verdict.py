"""One verdict per GPU and node, from every source, shown the same everywhere: the fleet,
the node view, the wallboard, `snapshot` and the exporter."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuconsole.facts import summaries
from gpuconsole.readings.base import Health
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.tui.themes import Palette
from gpuconsole.tui.wallboard import WallboardApp, alerts_page, heat_page
from tests.conftest_tui import FIXED, frozen_fleet


def _node(name: str) -> NodeSnapshot:
    node = frozen_fleet().node(name)
    assert node is not None
    return node


def _palette() -> Palette:
    return WallboardApp(None, theme_dirs=[]).palette


def test_a_failed_psu_is_not_ok_in_the_fleet_the_node_view_or_the_wallboard(utc: None) -> None:
    """dgxa-001: SEL 'PSU2 Status: Failure' and PSUs 5/6 ok."""
    from gpuconsole.tui.screens.node import node_info

    node = _node("dgxa-001")
    assert "PSUs 5/6 ok" in summaries.bmc_panel(node)
    assert summaries.node_facts(node).health is Health.CRITICAL  # the fleet's light and sort
    assert [f.letter for f in summaries.facets(node) if f.health is Health.CRITICAL] == ["B"]
    palette = _palette()
    header = node_info(node, palette, FIXED).plain
    assert not header.startswith("● ok") and header.startswith("✖ critical")
    assert "return it for service" in header
    board = alerts_page(frozen_fleet(), palette, FIXED).body
    lines = [line for line in str(board).splitlines() if "dgxa-001" in line]
    assert any("1 of 6 PSUs failed" in line for line in lines)
    assert any("PSU2" in line and "Failure" in line for line in lines)
    heat = heat_page(frozen_fleet(), palette, FIXED).body
    names = [name.plain for name, _cells, _word in heat.rows]  # type: ignore[union-attr]
    assert "✖ dgxa-001" in names


def test_the_fabric_panel_says_the_link_that_trained_at_half_its_rate() -> None:
    """dgx-003's mlx5_11 runs 200 Gb/s where its siblings run 400: not just '12/12 active'."""
    panel = summaries.fabric_panel(_node("dgx-003"))
    assert panel.splitlines()[0] == "12/12 ports active, 1 downtrained"
    assert "mlx5_11/1 at 200 Gb/sec (2X NDR), expected 400 Gb/s" in panel


def test_the_wallboard_says_dgx_004s_real_problem_in_words() -> None:
    """ECC with a row remap pending, not 'GPU 1: gpu_idle'; no raw throttle names."""
    board = str(alerts_page(frozen_fleet(), _palette(), FIXED).body)
    dgx004 = [line for line in board.splitlines() if " dgx-004 " in line]
    assert dgx004 and "row remap pending" in dgx004[0]
    assert "gpu_idle" not in board and "_slowdown" not in board
    assert "SW thermal slowdown" in board  # dgx-002's GPU 3, in words


async def test_a_drained_lost_gpu_keeps_its_node_from_looking_ok(tmp_path: Path) -> None:
    """dgx-003 after its lost GPU 5 was drained: NVML no longer lists it, the node is not
    '● ok', and the XID that put it there still calls for a reboot."""
    from gpuconsole.actions.plan import Target
    from gpuconsole.actions.roles import Actor, Role
    from gpuconsole.sim.actions import SimWorld
    from tests.assign_fixtures import executor_for

    world = SimWorld.demo("dgx-003", tmp_path / "world")
    world.node.scenarios = tuple(
        dataclasses.replace(s, at_s=0.0) if s.kind == "xid79" else s for s in world.node.scenarios
    )
    executor = executor_for(world, tmp_path / "state")
    plan = await executor.plan(["5"], Target.parse("drained"))
    outcome = await executor.execute(plan, Actor("ops", Role.OPERATOR, "SHA256:x", "ssh"), "5")
    assert outcome.ok, outcome
    node = await world.snapshot()
    assert all(g.pci_bus_id != "0000:c3:00.0" for g in node.gpus)  # NVML cannot see it
    assert summaries.node_facts(node).health is not Health.OK
    drained = [r for r in summaries.gpu_rows(node) if r.bus_id == "0000:c3:00.0"]
    assert summaries.row_health(node, drained[0]) is Health.WARNING
    # the hub saw the GPU's XID 79 before it was drained: a reset of it first, then the
    # node's reboot if it does not come back
    from gpuconsole.facts.verdict import Action, node_verdict

    seen = msgspec.structs.replace(node, last_xid={"0000:c3:00.0": 79})
    verdict = node_verdict(seen)
    assert (verdict.health, verdict.action) == (Health.CRITICAL, Action.RESET_GPU)
    assert verdict.findings[0].message.startswith("GPU (c3:00.0): drained after XID 79")
    assert "if it does not come back, reboot the node" in verdict.findings[0].text


def test_every_finding_has_words_an_operator_reads_and_a_source() -> None:
    import re

    from gpuconsole.facts.verdict import SOURCES, node_verdict, reading_verdict
    from gpuconsole.readings.nvml import XidCount

    gpu = _node("dgx-002").gpus[0]
    xids = tuple(XidCount(code, 1, FIXED - 60, FIXED) for code in (48, 144, 999))
    findings = [f for node in frozen_fleet().nodes for f in node_verdict(node).findings]
    findings += reading_verdict(msgspec.structs.replace(gpu, xids=xids)).findings
    assert any("ROBUST_CHANNEL_GPU_ECC_DBE" in f.text for f in findings)
    for finding in findings:
        assert finding.source in SOURCES
        # no raw names of ours (sw_thermal_slowdown); NVIDIA's catalog names are evidence
        assert not re.search(r"[a-z]_[a-z]", finding.text), finding
        assert finding.code and finding.text[0].isalnum()


def test_the_xid_catalog_decides_what_an_xid_calls_for() -> None:
    from gpuconsole.facts.verdict import Action, reading_verdict
    from gpuconsole.facts.xids import XID_CATALOG, Bucket
    from gpuconsole.readings.nvml import XidCount

    assert XID_CATALOG[79].immediate is Bucket.RESTART_BM
    assert XID_CATALOG[79].mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert XID_CATALOG[74].applies_to == ("A100", "H100")
    gpu = _node("dgx-002").gpus[0]

    def judged(*counts: tuple[int, int]) -> tuple[Action, Health]:
        xids = tuple(XidCount(code, n, FIXED - 60, FIXED) for code, n in counts)
        verdict = reading_verdict(msgspec.structs.replace(gpu, xids=xids))
        return verdict.action, verdict.health

    assert judged() == (Action.FIT, Health.OK)
    assert judged((13, 1)) == (Action.FIT, Health.OK)  # an application's fault: evidence
    assert judged((13, 3)) == (Action.WATCH, Health.WARNING)  # repeats: the GPU is suspect
    assert judged((63, 1)) == (Action.FIT, Health.OK)  # a remap recorded: no action
    assert judged((48, 1)) == (Action.RESET_GPU, Health.CRITICAL)
    assert judged((95, 1), (94, 2)) == (Action.RESET_GPU, Health.CRITICAL)  # uncontained
    # RESTART_BM for one GPU's fault: that GPU's reset first, the reboot if it stays lost
    assert judged((79, 1)) == (Action.RESET_GPU, Health.CRITICAL)
    assert judged((54, 1)) == (Action.RESEAT, Health.CRITICAL)
    assert judged((999, 1)) == (Action.WATCH, Health.WARNING)  # not in the catalog
    recovery = reading_verdict(msgspec.structs.replace(gpu, recovery_action=2))
    assert recovery.action is Action.REBOOT_NODE
    assert "the driver asks for a node reboot" in recovery.summary


def test_fabric_manager_down_drains_an_nvswitch_node() -> None:
    from gpuconsole.facts.verdict import Action, node_verdict

    node = _node("dgx-002")
    assert node.nvml is not None
    nvml = msgspec.structs.replace(node.nvml, fabric_manager_running=False)
    verdict = node_verdict(msgspec.structs.replace(node, nvml=nvml))
    assert any(f.code == "fabric_manager_down" for f in verdict.findings)
    assert verdict.health is Health.CRITICAL and verdict.action.rank >= Action.DRAIN.rank


def test_the_exporter_serves_each_verdict_with_its_action() -> None:
    from gpuconsole.export.collector import build
    from gpuconsole.readings.nvml import XidCount

    fleet = frozen_fleet()
    nodes = list(fleet.nodes)
    i = next(i for i, n in enumerate(nodes) if n.node == "dgx-004")
    nvml = nodes[i].nvml
    assert nvml is not None
    gpus = list(nvml.gpus)
    gpus[0] = msgspec.structs.replace(gpus[0], xids=(XidCount(13, 2, FIXED - 9, FIXED - 1),))
    nodes[i] = msgspec.structs.replace(
        nodes[i], nvml=msgspec.structs.replace(nvml, gpus=tuple(gpus))
    )
    text = build(msgspec.structs.replace(fleet, nodes=tuple(nodes))).text().decode()
    series = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }

    def value(name: str, **labels: str) -> float | None:
        return series.get((name, tuple(sorted(labels.items()))))

    assert value("gpuconsole_node_verdict", node="dgxa-001", action="service") == 6.0
    assert value("gpuconsole_node_verdict", node="dgx-001", action="fit") == 0.0
    remap = gpus[2]  # NVML's 2 on dgx-004 (its GPU 2 is a guest's): a remap pending
    labels = {"node": "dgx-004", "gpu": remap.pci_bus_id, "uuid": remap.uuid}
    assert value("gpuconsole_gpu_verdict", **labels, action="reset_gpu") == 3.0
    first = {"node": "dgx-004", "gpu": gpus[0].pci_bus_id, "uuid": gpus[0].uuid}
    xid = {"xid": "13", "mnemonic": "ROBUST_CHANNEL_GR_EXCEPTION"}
    assert value("gpuconsole_gpu_xid_window", **first, **xid) == 2.0
    # a guest's GPU, which NVML cannot see, has a verdict too
    guest = {"node": "dgx-001", "gpu": "0000:1b:00.0", "uuid": ""}
    assert value("gpuconsole_gpu_verdict", **guest, action="fit") == 0.0


def test_the_gpu_detail_says_what_to_do_and_why(utc: None) -> None:
    from gpuconsole.tui.screens.gpu import verdict_box

    node = _node("dgx-004")
    row = next(r for r in summaries.gpu_rows(node) if r.reading and r.reading.ecc.remap_pending)
    text = verdict_box(node, row, _palette()).plain  # type: ignore[union-attr]
    assert text.splitlines()[0] == "▲ reset GPU 2 (61:00.0), then verify"  # by its bus id
    assert "row remap pending" in text and "(NVML)" in text


def test_snapshot_json_carries_each_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuconsole.cli.main import main

    assert main(["snapshot", "--demo", "--json", "--nodes", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    verdicts = data["verdicts"]
    assert set(verdicts) == {n["node"] for n in data["nodes"]}
    for verdict in verdicts.values():
        assert verdict["action"] in ("fit", "watch", "drain", "reset_gpu", "reboot_node",
                                     "reseat", "service")  # fmt: skip
        for finding in verdict["findings"]:
            assert set(finding) >= {"code", "text", "severity", "source", "action", "bus_id"}
