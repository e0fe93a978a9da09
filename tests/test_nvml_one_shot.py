"""`gpuconsole snapshot --json` on the fake library: what a one-shot asks NVML, counted by the
library itself (every call is a trip into the kernel driver on a real node)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuconsole.sim.fakenvml import read_counts_file
from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_H100, NodeProfile
from tests.fakenvml_fixtures import FakeNvmlEnv


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
