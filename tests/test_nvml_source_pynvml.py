"""gpuconsole's NVML source through the real pynvml ctypes path, on the fake library.

Each test runs in a child process: the library is found through LD_LIBRARY_PATH, exactly
as libnvidia-ml.so.1 is on a GPU node. gpustat reads the same library for comparison.
"""

from __future__ import annotations

import json
import re
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
import re
from gpuconsole.sim.fakenvml import call_counts
from gpuconsole.sources.nvml.source import NvmlSource
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
from gpuconsole.sources.nvml.source import NvmlSource
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
from gpuconsole.sources.nvml.source import NvmlSource
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


def test_ecc_events_arrive_through_the_event_set(fake_nvml_env: FakeNvmlEnv) -> None:
    body = """
import asyncio, json
from gpuconsole.hub import Hub
from gpuconsole.sources.nvml.source import NvmlSource
async def main():
    hub = Hub()
    hub.add_source(NvmlSource("n", interval_s=0.2))
    await hub.start()
    for _ in range(100):
        if any(e.kind == "ecc" for e in hub.events()):
            break
        await asyncio.sleep(0.05)
    await hub.stop()
    return [(e.kind, e.gpu_index, e.severity.value, e.message) for e in hub.events()]
print(json.dumps(asyncio.run(main())))
"""
    events = run_child(fake_nvml_env(DGX_H100, scenarios=["ecc 2 at 0.5"]), body)
    ecc = [e for e in events if e[0] == "ecc"]
    assert ecc == [["ecc", 2, "info", "single-bit ECC error on GPU 2"]]


def test_without_pcie_byte_counters_the_drivers_own_rate_is_read(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    # An older driver knows no PCIE_COUNT_TX/RX_BYTES fields (197, 198).
    body = """
import json, time
from gpuconsole.sim.fakenvml import call_counts
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", events=False, detail_every=1)
source.collect(); time.sleep(0.1)
gpu = source.collect().gpus[0]
print(json.dumps({"tx": gpu.pcie.tx_bytes_per_s, "rx": gpu.pcie.rx_bytes_per_s,
                  "total": gpu.pcie.tx_bytes_total, "unsupported": gpu.unsupported,
                  "calls": call_counts().get("nvmlDeviceGetPcieThroughput", 0)}))
"""
    result = run_child(fake_nvml_env(DGX_H100, missing_fields=[197, 198]), body)
    assert result["total"] is None
    assert "field 197" in result["unsupported"] and "field 198" in result["unsupported"]
    assert result["rx"] > 0 and result["tx"] > 0
    assert result["calls"] == 2 * 2 * 8  # tx and rx, two detail polls, eight GPUs


def test_gpm_buffers_are_freed_through_the_real_binding(fake_nvml_env: FakeNvmlEnv) -> None:
    body = """
import asyncio, json, time
from gpuconsole.sim.fakenvml import call_counts
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", events=False, detail_every=1)
source.collect(); time.sleep(0.11); source.collect()
asyncio.run(source.close())
counts = call_counts()
print(json.dumps([counts.get("nvmlGpmSampleAlloc", 0), counts.get("nvmlGpmSampleFree", 0)]))
"""
    alloc, free = run_child(fake_nvml_env(DGX_H100, scenarios=["mig 7"]), body)
    assert alloc == free == 2 * (8 + 4)


NVITOP_GPU = re.compile(
    r"│\s+(?P<index>\d+)\s+(?P<name>\S.*?)\s+On │ (?P<bus>[0-9A-F]{8}:[0-9A-F:.]+) .*\n"
    r"│ N/A\s+(?P<temp>\d+)C\s+P(?P<pstate>\d+)\s+(?P<power>\d+)W / (?P<limit>\d+)W │"
    r"\s+(?P<used>[\d.]+)(?P<unit>MiB|GiB) / [\d.]+(?:MiB|GiB) │\s+(?P<util>\d+%|N/A)"
)
NVITOP_MIG = re.compile(r"│ (?P<gpu>\d+):\d+\s+(?P<profile>\S+) @ GI/CI: (?P<gi>\d+)/(?P<ci>\d+)")


def test_nvitop_and_gpuconsole_read_the_same_figures(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    nvitop = shutil.which("nvitop") or str(Path(sys.executable).parent / "nvitop")
    require_peer("nvitop", Path(nvitop).exists(), "pip install nvitop==1.7.2")
    # One frozen instant, so both programs read the same moment of the simulated node.
    env = fake_nvml_env(DGX_H100, scenarios=["mig 7", "thermal 3"], frozen_time=120.0)
    gpus = snapshot(env, tmp_path, "dgx-h100")["nodes"][0]["nvml"]["gpus"]
    env.update(TERM="xterm-256color", COLUMNS="160", LINES="80")
    out = subprocess.run(
        [nvitop, "--once"], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    theirs = [m.groupdict() for m in NVITOP_GPU.finditer(out)]
    assert [int(t["index"]) for t in theirs] == [g["index"] for g in gpus]
    for ours, t in zip(gpus, theirs, strict=True):
        assert ours["name"].removeprefix("NVIDIA ") == t["name"]
        assert ours["pci_bus_id"] == t["bus"]
        assert round(ours["temp_gpu_c"]) == int(t["temp"])
        assert ours["pstate"] == int(t["pstate"])
        assert round(ours["power_w"]) == int(t["power"])
        assert round(ours["power_limit_w"]) == int(t["limit"])
        used_mib = float(t["used"]) * (1024 if t["unit"] == "GiB" else 1)
        # both read memory v2: "used" without the driver's reservation
        assert abs(ours["mem_used_bytes"] / 2**20 - used_mib) <= 0.01 * 1024 / 2  # 0.01 GiB
        util = None if t["util"] == "N/A" else float(t["util"].rstrip("%"))
        assert ours["util_gpu_pct"] == util
    migs = sorted((int(m["gpu"]), int(m["gi"]), m["profile"]) for m in NVITOP_MIG.finditer(out))
    assert migs == sorted(
        (g["index"], m["gpu_instance_id"], m["profile_name"])
        for g in gpus
        for m in g["mig_instances"]
    )
    assert "hw_thermal_slowdown" in gpus[3]["throttle_reasons"]
