"""gpuconsole's NVML source through the real pynvml ctypes path, on the fake library.

Each test runs in a child process: the library is found through LD_LIBRARY_PATH, exactly
as libnvidia-ml.so.1 is on a GPU node. gpustat reads the same library for comparison.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_A100, DGX_H100, NodeProfile
from tests.fakenvml_fixtures import FakeNvmlEnv
from tests.peers import require_peer


def snapshot(env: dict[str, str], tmp_path: Path, node: str) -> dict[str, Any]:
    config = tmp_path / "gpuconsole.toml"
    config.write_text(f"[host]\nname = '{node}'\n[nvml]\nevents = false\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "--json", "-c", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def run_child(env: dict[str, str], body: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", body],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("profile", [DGX_H100, DGX_A100, APOLLO_PCIE], ids=lambda p: p.name)
def test_gpuconsole_and_gpustat_report_the_same_gpus(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path, profile: NodeProfile
) -> None:
    gpustat = shutil.which("gpustat") or str(Path(sys.executable).parent / "gpustat")
    require_peer("gpustat", Path(gpustat).exists(), "pip install gpustat==1.1.1")
    env = fake_nvml_env(profile, seed=3)
    ours = snapshot(env, tmp_path, profile.name)["nodes"][0]
    theirs = json.loads(
        subprocess.run(
            [gpustat, "--json"], env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )["gpus"]
    gpus = ours["nvml"]["gpus"]
    assert ours["statuses"][0]["ok"] is True
    assert [g["index"] for g in gpus] == [g["index"] for g in theirs]
    assert [g["uuid"] for g in gpus] == [g["uuid"] for g in theirs]
    assert [g["name"] for g in gpus] == [g["name"] for g in theirs]
    assert [g["mem_total_bytes"] // 2**20 for g in gpus] == [g["memory.total"] for g in theirs]
    assert [g["pci_bus_id"] for g in gpus] == [s.bus_id for s in profile.gpus]
    assert ours["nvml"]["driver_version"] == profile.driver_version
    assert [tuple(row) for row in ours["nvml"]["gpu_topology"]] == list(profile.gpu_topology())
    assert [g["numa_node"] for g in gpus] == [s.numa_node for s in profile.gpus]
    assert [g["cpu_affinity"] for g in gpus] == [s.cpu_affinity for s in profile.gpus]


def test_scenarios_read_through_the_ctypes_path(fake_nvml_env: FakeNvmlEnv, tmp_path: Path) -> None:
    env = fake_nvml_env(DGX_H100, scenarios=["thermal 3", "mig 7", "ecc 2", "xid79 5"])
    gpus = snapshot(env, tmp_path, "dgx-017")["nodes"][0]["nvml"]["gpus"]
    assert gpus[5]["state"] == "lost"
    assert all(g["state"] == "ok" for g in gpus if g["index"] != 5)
    assert "hw_thermal_slowdown" in gpus[3]["throttle_reasons"]
    assert gpus[3]["sm_clock_mhz"] == 1410
    assert gpus[2]["ecc"]["remap_pending"] is True
    assert gpus[7]["mig_enabled"] is True
    assert sorted(m["profile_name"] for m in gpus[7]["mig_instances"]) == sorted(
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    )
    assert gpus[0]["nvlinks"][0]["remote_kind"] == "nvswitch"
    assert sum(link["active"] for link in gpus[0]["nvlinks"]) == 18


def test_the_table_costs_at_most_four_calls_per_gpu_on_the_real_binding(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    body = """
import json
from gpuconsole.sim.fakenvml import call_counts
from gpuconsole.sources.nvml import NvmlSource
source = NvmlSource("n", events=False, detail_every=1000, inventory_every=1000)
source.collect(); source.collect()
before = sum(call_counts().values())
for _ in range(10):
    reading = source.collect()
print(json.dumps({"per_gpu": (sum(call_counts().values()) - before) / 10 / len(reading.gpus),
                  "gpm": reading.gpus[0].gpm is not None}))
"""
    result = run_child(fake_nvml_env(DGX_H100), body)
    assert result["per_gpu"] <= 4


def test_gpm_reads_through_the_real_binding(fake_nvml_env: FakeNvmlEnv) -> None:
    body = """
import json, time
from gpuconsole.sources.nvml import NvmlSource
source = NvmlSource("n", events=False, detail_every=1)
source.collect(); time.sleep(0.2)
gpu = source.collect().gpus[0]
print(json.dumps({"sm": gpu.gpm.sm_util_pct, "nvlink": gpu.gpm.nvlink_tx_bytes_per_s}))
"""
    result = run_child(fake_nvml_env(DGX_H100), body)
    assert 0 <= result["sm"] <= 100 and result["nvlink"] > 0


def test_xid_events_arrive_through_the_event_set(fake_nvml_env: FakeNvmlEnv) -> None:
    body = """
import asyncio, json
from gpuconsole.hub import Hub
from gpuconsole.sources.nvml import NvmlSource
async def main():
    hub = Hub()
    hub.add_source(NvmlSource("n", interval_s=0.2))
    await hub.start()
    for _ in range(50):
        if any(e.kind == "xid" for e in hub.events()):
            break
        await asyncio.sleep(0.1)
    await hub.stop()
    return [(e.kind, e.gpu_index, e.code) for e in hub.events()]
print(json.dumps(asyncio.run(main())))
"""
    events = run_child(fake_nvml_env(DGX_H100, scenarios=["xid79 5 at 1"]), body)
    assert ["xid", 5, 79] in events
    assert ["gpu_lost", 5, 79] in events
