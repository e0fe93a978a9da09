"""`gpuconsole snapshot --json` on the fake library: what a one-shot asks NVML, counted by the
library itself (every call is a trip into the kernel driver on a real node)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuconsole.actions.journal_events import JournalEvents
from gpuconsole.cli.derived import snapshot_document
from gpuconsole.facts.verdict import verdicts_json
from gpuconsole.hub import Hub
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sim.fakenvml import read_counts_file
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.nvml import SimNvml
from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_H100, NodeProfile
from gpuconsole.sources.nvml.source import NvmlSource
from tests.fakenvml_fixtures import FakeNvmlEnv
from tests.test_failed_reset_node import failed_reset


def one_shot(
    make_env: FakeNvmlEnv, tmp_path: Path, profile: NodeProfile
) -> tuple[dict[str, Any], dict[str, int]]:
    """The snapshot's node and the NVML calls it took, at every [nvml] default (events on)."""
    config = tmp_path / "gpuconsole.toml"
    config.write_text(
        f"[host]\nname = '{profile.name}'\n[fabric]\nenabled = false\n[tenancy]\nenabled = false\n"
    )
    counts = tmp_path / "calls.counts"
    proc = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "--json", "-c", str(config)],
        env=make_env(profile, counts=counts),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    node: dict[str, Any] = json.loads(proc.stdout)["nodes"][0]
    return node, read_counts_file(counts)


def test_a_one_shot_watches_no_events_and_takes_no_gpm_sample(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    node, calls = one_shot(fake_nvml_env, tmp_path, DGX_H100)
    assert all(g["state"] == "ok" for g in node["nvml"]["gpus"])
    asked = {name for name, n in calls.items() if n}
    assert not asked & {"nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2"}
    assert not {name for name in asked if name.startswith("nvmlGpm")}


def test_an_nvswitch_node_is_read_without_a_call_per_gpu_pair_or_per_link_state(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    node, calls = one_shot(fake_nvml_env, tmp_path, DGX_H100)
    gpus = node["nvml"]["gpus"]
    # what the snapshot shows is all there: NV18 between every pair, every link up to a switch
    assert [tuple(r) for r in node["nvml"]["gpu_topology"]] == list(DGX_H100.gpu_topology())
    assert all(
        link["active"] and link["remote_kind"] == "nvswitch" and link["version"] == 4
        for g in gpus
        for link in g["nvlinks"]
    )
    assert sum(len(g["nvlinks"]) for g in gpus) == 8 * 18
    assert calls.get("nvmlDeviceGetTopologyCommonAncestor", 0) == 0
    assert calls.get("nvmlDeviceGetNvLinkState", 0) == 0
    assert calls.get("nvmlDeviceGetNvLinkVersion", 0) == 0
    assert calls.get("nvmlDeviceGetNvLinkRemoteDeviceType", 0) == 0
    # an NVSwitch's bus id is asked by a long-running reader only (once per link)
    assert calls.get("nvmlDeviceGetNvLinkRemotePciInfo_v2", 0) == 0


def test_a_one_shot_of_a_dgx_asks_nvml_at_most_30_times_per_gpu(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """Every call is an ioctl on a real driver: nvitop -1 makes 25.6 per GPU here."""
    node, calls = one_shot(fake_nvml_env, tmp_path, DGX_H100)
    gpus = node["nvml"]["gpus"]
    per_gpu = sum(calls.values()) / len(gpus)
    assert per_gpu <= 30, sorted(calls.items(), key=lambda kv: -kv[1])
    # the 20 ms PCIe rate sample is never taken, the processes are one call per GPU
    assert calls.get("nvmlDeviceGetPcieThroughput", 0) == 0
    assert calls["nvmlDeviceGetComputeRunningProcesses_v3"] == len(gpus)
    # and the snapshot still shows what it did: limits, thresholds, processes, SMs
    for g in gpus:
        assert g["power_limit_w"] == 700.0
        assert g["temp_slowdown_c"] == 87.0
        assert g["sm_count"] == 132
        assert g["processes"]
        assert g["pstate"] is not None and g["sm_clock_mhz"] is not None


def test_a_pcie_node_still_asks_the_pci_level_of_each_pair(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    node, calls = one_shot(fake_nvml_env, tmp_path, APOLLO_PCIE)
    n = len(APOLLO_PCIE.gpus)
    assert [tuple(r) for r in node["nvml"]["gpu_topology"]] == list(APOLLO_PCIE.gpu_topology())
    assert calls["nvmlDeviceGetTopologyCommonAncestor"] == n * (n - 1) // 2


def test_a_long_running_reader_asks_each_links_far_end_once(fake_nvml_env: FakeNvmlEnv) -> None:
    """What a one-shot leaves out (an NVSwitch's bus id) a long-running reader has, asked once
    per link however many inventory rounds follow."""
    body = """
import json
from gpuconsole.sim.fakenvml import call_counts
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", events=False, inventory_every=1)
for _ in range(3):
    reading = source.collect()
print(json.dumps({"asked": call_counts().get("nvmlDeviceGetNvLinkRemotePciInfo_v2", 0),
                  "far": sorted({l.remote_pci_bus_id for g in reading.gpus for l in g.nvlinks
                                 if l.remote_pci_bus_id})}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", body],
        env=fake_nvml_env(DGX_H100),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["asked"] == 8 * 18
    assert len(result["far"]) == len(DGX_H100.nvswitches)


# --- the one-shot's two paths: blocking sources read with no event loop, others on one --------

GPU_RESET = 1  # nvmlDeviceGpuRecoveryAction_t


def simulated_node_hub(journal: Path, at: float) -> Hub:
    """A hub over a simulated DGX H100 whose GPU 3 fell off the bus and whose driver asks
    for GPU 5's reset, and the node's action journal, every clock stopped at `at`: two hubs
    built so read the same things the same way."""
    node = SimNode("dgx-sim", DGX_H100, scenarios=["xid79:3"], clock=lambda: at, start=at - 90)
    lib = SimNvml(node, driver="580.82")
    lib.recovery_actions[5] = GPU_RESET
    hub = Hub(clock=lambda: at, monotonic=lambda: 100.0)
    hub.add_source(
        NvmlSource(
            "dgx-sim",
            lib=lib,
            one_shot=True,
            simulated=True,
            clock=lambda: at,
            fabric_manager=lambda: False,
        )
    )
    hub.add_source(JournalEvents("dgx-sim", journal, clock=lambda: at))
    return hub


def document(snapshot: FleetSnapshot) -> str:
    """What `gpuconsole snapshot --json` prints of `snapshot`."""
    return json.dumps({**snapshot_document(snapshot), "verdicts": verdicts_json(snapshot)})


def test_a_one_shot_with_no_event_loop_prints_what_one_on_a_loop_prints(tmp_path: Path) -> None:
    """`snapshot` reads this machine's own blocking sources with no event loop (asyncio is a
    tenth of its start), and a head's agents on one: both make the very same document."""
    journal = tmp_path / "actions.db"
    failed_reset(journal, "dgx-sim")
    at = time.time()
    blocking, looped = simulated_node_hub(journal, at), simulated_node_hub(journal, at)
    assert blocking.blocking
    printed = document(blocking.read_once(say_stale=False))
    assert printed == document(asyncio.run(looped.poll_once(say_stale=False)))
    # and not two empty ones: every GPU, the lost one's event, GPU 5's failed reset
    seen = json.loads(printed)
    assert len(seen["nodes"][0]["nvml"]["gpus"]) == 8
    assert all(s["ok"] for s in seen["nodes"][0]["statuses"])
    assert any("is lost" in e["message"] for e in seen["events"])
    assert seen["verdicts"]["dgx-sim"]["action"] == "reboot_node"


def test_a_one_shot_whose_nvml_call_never_returns_says_so_and_ends(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """A GPU gone bad can leave an NVML call in the kernel driver: the reading with no event
    loop still times out, says which source, fails (its one source read nothing), and does
    not wait for the call."""
    config = tmp_path / "gpuconsole.toml"
    config.write_text(
        "[host]\nname = 'dgx'\n[fabric]\nenabled = false\n[tenancy]\nenabled = false\n"
    )
    env = fake_nvml_env(DGX_H100, faults=["3 nvmlDeviceGetMemoryInfo_v2 hang"])
    proc = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "--json", "-c", str(config), "--wait", "0.5"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "nvml timed out on 1 of 1 nodes: dgx" in proc.stderr
    status = json.loads(proc.stdout)["nodes"][0]["statuses"][0]
    assert status["source"] == "nvml" and status["error"] == "timeout after 0.5 s"


LOADED = """
import sys
from gpuconsole.cli.main import main
main(["snapshot", "--json", "-c", sys.argv[1]])
print(sorted(m for m in sys.modules if m.split(".")[0] in ("asyncio", "ssl")), file=sys.stderr)
"""


def test_a_one_shot_of_this_nodes_own_sources_loads_no_event_loop(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """asyncio, and the ssl it imports, are a tenth of a one-shot's start; nvitop -1 loads
    neither. A node's own NVML and journal need no loop (a head's agents do)."""
    config = tmp_path / "gpuconsole.toml"
    config.write_text(
        f"[host]\nname = 'dgx'\n[fabric]\nenabled = false\n[tenancy]\nenabled = false\n"
        f"[actions]\njournal = '{tmp_path / 'actions.db'}'\n"
    )
    failed_reset(tmp_path / "actions.db", "dgx")
    proc = subprocess.run(
        [sys.executable, "-c", LOADED, str(config)],
        env=fake_nvml_env(DGX_H100), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["nodes"][0]["statuses"][1]["source"] == "actions"
    assert proc.stderr.strip().splitlines()[-1] == "[]"
