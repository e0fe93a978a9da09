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
from gpuconsole.sources.nvml.lib import BASE_FIELDS
from tests.fakenvml_fixtures import MIG_GPU, FakeNvmlEnv, NvmlCase
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


def test_field_values_packed_in_one_go_are_pynvmls_own(fake_nvml_env: FakeNvmlEnv) -> None:
    """The source builds nvmlDeviceGetFieldValues' array itself (pynvml's wrapper costs more
    than the call): the driver answers it exactly as it answers the wrapper's, scoped fields,
    a field it does not know and a GPU it cannot read included."""
    body = """
import json
import pynvml
from gpuconsole.sources.nvml.lib import BASE_FIELDS, FIELD_VALUE, field_values
pynvml.nvmlInit()
asked = [*BASE_FIELDS, (138, 0), (138, 1), 99999]
answers = {}
for index in (0, 3):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    ours, theirs = field_values(pynvml, handle, asked), pynvml.nvmlDeviceGetFieldValues(handle, asked)
    answers[index] = [[list(map(str, FIELD_VALUE.iter_unpack(bytes(a)))) for a in (ours, theirs)]]
try:
    field_values(pynvml, pynvml.nvmlDeviceGetHandleByIndex(5), asked)
    answers["lost"] = "answered"
except pynvml.NVMLError as exc:
    answers["lost"] = type(exc).__name__
print(json.dumps(answers))
"""
    env = fake_nvml_env(DGX_H100, frozen_time=30.0, scenarios=["xid79 5"])
    result = run_child(env, body)
    for index in ("0", "3"):
        [(ours, theirs)] = result[index]
        assert ours == theirs
        returns = [int(entry.split(", ")[3]) for entry in ours]
        assert len(ours) == len(BASE_FIELDS) + 3 and 0 in returns and returns[-1] != 0
    assert result["lost"] == "NVMLError_GpuIsLost"


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
    for _ in range(50):  # the event set says XID 79, and a poll after it finds the GPU lost
        if {"xid", "gpu_lost"} <= {e.kind for e in hub.events()}:
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
    return [(e.kind, e.gpu_index, e.gpu_bus_id, e.severity.value, e.message)
            for e in hub.events()]
print(json.dumps(asyncio.run(main())))
"""
    events = run_child(fake_nvml_env(DGX_H100, scenarios=["ecc 2 at 0.5"]), body)
    ecc = [e for e in events if e[0] == "ecc"]
    # by bus id too, which outlives NVML's number for it
    assert ecc == [["ecc", 2, "0000:52:00.0", "info", "single-bit ECC error on GPU 2 (52:00.0)"]]


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
    # the driver's rate stands in for the counters: nothing the operator misses
    assert not {"field 197", "field 198"} & set(result["unsupported"])
    assert result["rx"] > 0 and result["tx"] > 0
    # tx and rx at the first detail poll, eight GPUs; from the second, GPM has measured them
    assert result["calls"] == 2 * 8


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


# -------------------------------------------------------------------------------------------
# Real driver branches (the fake plays each: gpuconsole.sim.drivers)
# -------------------------------------------------------------------------------------------

HOT = {"hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}

# Two polls at frozen instants of the fake's clock, then a child's body.
TWO_POLLS = """
import json, os
from gpuconsole.sources.nvml.source import NvmlSource
from gpuconsole.facts.verdict import reading_verdict
events = []
source = NvmlSource("n", events=False, detail_every=1000, inventory_every=1000)
source._emit = events.append
os.environ["GPUCONSOLE_FAKE_NVML_TIME"] = "10"
first = source.collect()
os.environ["GPUCONSOLE_FAKE_NVML_TIME"] = "20"
second = source.collect()
"""


def gpu_facts(body: str) -> str:
    return (
        TWO_POLLS
        + body
        + """
def facts(g):
    return {"temp": g.temp_gpu_c, "throttle": g.throttle_reasons, "sm": g.sm_count,
            "versions": sorted({l.version for l in g.nvlinks}), "state": g.state.value,
            "tx_total": g.pcie.tx_bytes_total, "tx_rate": g.pcie.tx_bytes_per_s,
            "downtrained": g.pcie.downtrained, "unsupported": list(g.unsupported),
            "migs": sorted(m.sm_count for m in g.mig_instances), "denied": list(g.denied)}
print(json.dumps({"gpus": [facts(g) for g in second.gpus],
                  "events": [[e.kind, e.gpu_index, e.severity.value, e.message] for e in events]}))
"""
    )


def test_the_source_reads_a_dgx_h100_right_on_every_driver_branch(nvml_case: NvmlCase) -> None:
    """Temperature, throttle reasons, PCIe rates, NVLink generation and SM counts come out the
    same whichever driver branch answers, MIG or not; a power-smoothing change is no event."""
    env = nvml_case.env("smoothing 0 at 15", "thermal 3 at 15")
    result = run_child(env, gpu_facts(""))
    gpus, events = result["gpus"], result["events"]
    counters = nvml_case.driver.throttle_counters_at != 0
    for index, gpu in enumerate(gpus):
        assert gpu["state"] == "ok"
        assert gpu["temp"] is not None and "temperature" not in gpu["unsupported"]
        assert gpu["sm"] == 132
        assert gpu["versions"] == [4]  # NVLink 4.0
        assert gpu["tx_total"] is None and gpu["tx_rate"] > 0  # the driver's rate, not a wrap
        assert not gpu["downtrained"]
        # GPU 3's slowdown shows between two bitmask reads only where the driver counts it
        assert bool(HOT & set(gpu["throttle"])) == (index == 3 and counters), index
    warnings = [e for e in events if e[2] == "warning"]
    assert [(e[0], e[1]) for e in warnings] == ([("throttle", 3)] if counters else [])
    assert gpus[MIG_GPU]["migs"] == ([16, 16, 32, 60] if nvml_case.mig else [])
    # what only root may read is said, and leaves each GPU ok (above)
    root_only = [] if nvml_case.privileged else ["gpm"]
    assert [g["denied"] for g in gpus[:MIG_GPU]] == [root_only] * MIG_GPU
    mig_root_only = ["gpm", "memory", "mig_placement", "processes"]
    assert gpus[MIG_GPU]["denied"] == (root_only if nvml_case.privileged else mig_root_only)


@pytest.mark.parametrize("driver", ["535", "550"])
def test_before_r560_the_gpu_temperature_comes_from_the_older_call(
    fake_nvml_env: FakeNvmlEnv, driver: str
) -> None:
    body = """
import json
import pynvml
from gpuconsole.sim.fakenvml import call_counts
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", events=False, detail_every=1000, inventory_every=1000)
source.collect(); source.collect()
before = sum(call_counts().values())
reading = source.collect()
table = (sum(call_counts().values()) - before) / len(reading.gpus)
legacy = [pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(g.index), 0)
          for g in reading.gpus]
print(json.dumps({"temps": [g.temp_gpu_c for g in reading.gpus], "legacy": legacy,
                  "table": table, "unsupported": [list(g.unsupported) for g in reading.gpus]}))
"""
    result = run_child(fake_nvml_env(DGX_H100, driver=driver, frozen_time=30.0), body)
    assert result["temps"] == result["legacy"]
    assert all(25 <= t < 90 for t in result["temps"])
    assert not any("temperature" in u for u in result["unsupported"])
    assert result["table"] <= 4


@pytest.mark.parametrize(("driver", "counter"), [("575", 252), ("580.65", 252), ("580.82", 270)])
def test_thermal_time_is_read_where_the_branch_keeps_it_and_smoothing_is_not_time(
    fake_nvml_env: FakeNvmlEnv, driver: str, counter: int
) -> None:
    """On 575 and 580.65 fields 269-271 are power-smoothing settings: an administrator changing
    them is no slowdown. The HW thermal time counter is 252 there, 270 from 580.82."""
    env = fake_nvml_env(DGX_H100, driver=driver, scenarios=["smoothing 0 at 15", "thermal 3 at 15"])
    body = """
import pynvml
h = pynvml.nvmlDeviceGetHandleByIndex(3)
held = pynvml.nvmlDeviceGetFieldValues(h, [FIELD])[0].value.ullVal
print(json.dumps({"held_ns": held, "gpu0": second.gpus[0].throttle_reasons,
                  "gpu3": second.gpus[3].throttle_reasons,
                  "health0": reading_verdict(second.gpus[0]).health.value,
                  "events": [[e.kind, e.gpu_index, e.severity.value] for e in events]}))
""".replace("FIELD", str(counter))
    result = run_child(env, TWO_POLLS + body)
    assert abs(result["held_ns"] - 5e9) < 1e6  # from 15 s to 20 s
    assert not HOT & set(result["gpu0"]) and result["health0"] == "ok"
    assert "hw_thermal_slowdown" in result["gpu3"]
    assert [e for e in result["events"] if e[2] == "warning"] == [["throttle", 3, "warning"]]


def test_pcie_byte_counters_are_32_bits_and_a_wrap_is_one_wrap(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    """Polled fast enough that one wrap at most passes between two polls, the 32-bit counters
    give the rate across a wrap (not a reset)."""
    env = fake_nvml_env(DGX_H100, driver="580.82", frozen_time=0.0)
    body = """
import json, os
import pynvml
from gpuconsole.counters import RateTracker
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", events=False, interval_s=0.02)
source.collect()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def rx(t):
    os.environ["GPUCONSOLE_FAKE_NVML_TIME"] = str(t)
    return pynvml.nvmlDeviceGetFieldValues(h, [198])[0].value.uiVal
t = 1.0
while rx(t + 1.0) >= rx(t):  # find a second in which the counter wraps
    t += 1.0
tracker = RateTracker()
rates = []
for at in (t, t + 1.0):
    os.environ["GPUCONSOLE_FAKE_NVML_TIME"] = str(at)
    reading = source.collect()
    rates.append(tracker.update(reading.counters(), at))
gpu = reading.gpus[0]
bits = getattr(gpu.pcie, "bytes_counter_bits", 64)  # a reading of old knew only 64
print(json.dumps({"before": rx(t), "after": rx(t + 1.0), "bits": bits,
                  "total": gpu.pcie.rx_bytes_total, "resets": tracker.resets,
                  "rate": rates[1].get(("gpu", gpu.uuid, "pcie_rx_bytes"))}))
"""
    result = run_child(env, body)
    assert result["resets"] == 0  # a wrap, not a driver reload
    assert result["rate"] == result["after"] + 2**32 - result["before"]
    assert result["bits"] == 32 and result["total"] == result["after"] < result["before"]


def test_pcie_counters_that_wrap_between_polls_give_way_to_the_drivers_rate(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    """At one poll a second a Gen5 x16 link can wrap a 32-bit counter many times over: the
    counters say nothing then, and the driver's own rate is read (in the detail tier)."""
    body = """
import json
from gpuconsole.sim.fakenvml import call_counts
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", events=False, interval_s=1.0)
readings = [source.collect() for _ in range(3)]
print(json.dumps({"totals": [g.pcie.tx_bytes_total for r in readings for g in r.gpus],
                  "rates": [g.pcie.tx_bytes_per_s for g in readings[-1].gpus],
                  "asked": call_counts().get("nvmlDeviceGetFieldValues", 0)}))
"""
    result = run_child(fake_nvml_env(DGX_H100, driver="580.82", frozen_time=40.0), body)
    assert result["totals"] == [None] * 24
    assert all(rate > 0 for rate in result["rates"])


@pytest.mark.parametrize(("profile", "gpm"), [(DGX_H100, True), (DGX_A100, False)])
def test_where_gpm_measures_pcie_the_drivers_blocking_rate_call_is_not_made(
    fake_nvml_env: FakeNvmlEnv, profile: NodeProfile, gpm: bool
) -> None:
    """nvmlDeviceGetPcieThroughput samples for 20 ms per call (21 ms on a real H200): a Hopper
    GPU's PCIe rates come from GPM once it has two samples; an A100 (no GPM) still asks."""
    body = """
import json, time
from gpuconsole.sim.fakenvml import call_counts
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", events=False, interval_s=1.0, detail_every=1)
source.collect(); time.sleep(0.2); source.collect(); time.sleep(0.2)
before = call_counts().get("nvmlDeviceGetPcieThroughput", 0)
reading = source.collect()
print(json.dumps({"asked": call_counts().get("nvmlDeviceGetPcieThroughput", 0) - before,
                  "rates": [g.pcie.tx_bytes_per_s for g in reading.gpus],
                  "gpm": [g.gpm.pcie_tx_bytes_per_s if g.gpm else None for g in reading.gpus]}))
"""
    result = run_child(fake_nvml_env(profile, driver="580.82"), body)
    assert all(rate is not None and rate > 0 for rate in result["rates"])
    if gpm:
        assert result["asked"] == 0
        assert result["rates"] == result["gpm"]
    else:
        assert result["asked"] == 2 * len(result["rates"])


@pytest.mark.parametrize(("profile", "generation", "sms"), [(DGX_H100, 4, 132), (DGX_A100, 3, 108)])
def test_nvlink_generation_and_sm_count_are_the_models(
    fake_nvml_env: FakeNvmlEnv, profile: NodeProfile, generation: int, sms: int
) -> None:
    """nvmlDeviceGetNvLinkVersion answers nvmlNvlinkVersion_t (6 is NVLink 4.0) and
    nvmlDeviceGetAttributes a MIG device only: the reading says generation 4 and 132 SMs."""
    body = """
import json
from gpuconsole.sources.nvml.source import NvmlSource
gpus = NvmlSource("n", events=False).collect().gpus
print(json.dumps({"versions": sorted({l.version for g in gpus for l in g.nvlinks}),
                  "sms": sorted({g.sm_count for g in gpus}),
                  "migs": [sorted(m.sm_count for m in g.mig_instances) for g in gpus]}))
"""
    result = run_child(fake_nvml_env(profile, scenarios=["mig 1"]), body)
    assert result["versions"] == [generation]
    assert result["sms"] == [sms]
    expected = {4: [16, 16, 32, 60], 3: [14, 14, 28, 42]}[generation]
    assert result["migs"][1] == expected and result["migs"][0] == []


def test_an_idle_gpu_whose_link_trained_down_is_not_downtrained(fake_nvml_env: FakeNvmlEnv) -> None:
    """Idle, the fake's GPUs drop to PCIe Gen1 as real ones do: no warning for that."""
    env = fake_nvml_env(DGX_H100, driver="550", frozen_time=0.0)
    body = """
import json, os
import pynvml
from gpuconsole.facts.verdict import reading_verdict
from gpuconsole.sources.nvml.source import NvmlSource
pynvml.nvmlInit()
hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
t = 0
while True:  # an instant at which one GPU idles and another works
    os.environ["GPUCONSOLE_FAKE_NVML_TIME"] = str(t)
    gens = [pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) for h in hs]
    if 1 in gens and 5 in gens:
        break
    t += 1
gpus = NvmlSource("n", events=False).collect().gpus
print(json.dumps([[g.pcie.gen_current, g.pcie.downtrained, reading_verdict(g).health.value, g.util_gpu_pct]
                  for g in gpus]))
"""
    result = run_child(env, body)
    idle = [g for g in result if g[0] == 1]
    assert idle and all(not down and health == "ok" for _gen, down, health, _util in idle)
    assert all(util < 10 for *_rest, util in idle)


# --- what real drivers answer that the fake once did not -------------------------------------

POLLS = """
import asyncio, json, time
from gpuconsole.codec import encode
from gpuconsole.sources.nvml.source import NvmlSource
events = []
source = NvmlSource("n", events=False, detail_every=1, inventory_every={inventory_every})
asyncio.run(source.start(events.append))
readings = []
for _ in range({polls}):
    readings.append(source.collect())
    time.sleep({pause})
gpus = [encode(r.gpus) for r in readings]
print(json.dumps({{"polls": gpus, "events": [[e.kind, e.gpu_index] for e in events]}},
                 allow_nan=False))
"""


def polls(
    env: dict[str, str], count: int = 4, pause: float = 0.12, inventory_every: int = 2
) -> Any:
    """`count` polls of the NVML source: each poll's GPUs as JSON, and the events."""
    return run_child(env, POLLS.format(polls=count, pause=pause, inventory_every=inventory_every))


def test_an_unprivileged_reader_keeps_every_gpu_ok_and_says_what_it_cannot_see(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    result = polls(fake_nvml_env(DGX_H100, scenarios=["mig 7"], privileged=False))
    for gpus in result["polls"]:
        assert [g["state"] for g in gpus] == ["ok"] * 8, [g["error"] for g in gpus]
    last = result["polls"][-1]
    mig, plain = last[7], last[0]
    assert mig["denied"] == ["gpm", "memory", "mig_placement", "processes"]
    assert plain["denied"] == ["gpm"]
    assert plain["mem_used_bytes"] is not None and plain["processes"]
    # what the MIG devices themselves tell anyone: memory, processes, their profile
    instances = mig["mig_instances"]
    assert sorted(m["profile_name"] for m in instances) == sorted(
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    )
    assert all(m["mem_used_bytes"] is not None for m in instances)
    assert mig["processes"]
    assert {p["gpu_instance_id"] for p in mig["processes"]} <= {1, 2, 3, 4}
    assert mig["mem_used_bytes"] is None  # the whole GPU's memory is root's to read


def test_a_gpu_that_cannot_be_opened_is_unreadable_not_lost(fake_nvml_env: FakeNvmlEnv) -> None:
    result = polls(fake_nvml_env(DGX_H100, open_errors={2: 4, 5: 8}), count=3, pause=0)
    gpus = result["polls"][-1]
    assert [g["state"] for g in gpus] == ["ok", "ok", "unreadable", "ok", "ok", "unreadable",
                                          "ok", "ok"]  # fmt: skip
    assert "no permission" in gpus[2]["error"] and "power" in gpus[5]["error"]
    assert not any(kind == "gpu_lost" for kind, _ in result["events"])


def test_a_gpu_that_falls_off_between_two_polls_stays_lost(fake_nvml_env: FakeNvmlEnv) -> None:
    # The library answers a lost GPU's UUID from its cache: only a live reading shows the loss.
    result = polls(fake_nvml_env(DGX_H100, scenarios=["xid79 5 at 0.3"]), count=8, pause=0.1)
    states = [gpus[5]["state"] for gpus in result["polls"]]
    assert states[0] == "ok" and states[-1] == "lost"
    assert states[states.index("lost") :] == ["lost"] * (len(states) - states.index("lost"))
    assert [kind for kind, gpu in result["events"] if gpu == 5] == ["gpu_lost"]


def test_gpm_figures_nvml_gives_as_nan_are_unknown(fake_nvml_env: FakeNvmlEnv) -> None:
    # a frozen clock: both samples of one instant, every rate 0/0
    result = polls(fake_nvml_env(DGX_H100, frozen_time=60.0), count=3, pause=0)
    assert [g["gpm"] for g in result["polls"][-1]] == [None] * 8


def test_one_mig_instance_without_gpm_leaves_the_gpu_and_its_siblings_theirs(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    env = fake_nvml_env(
        DGX_H100,
        scenarios=["mig 7"],
        faults=["7 nvmlGpmMetricsGet 3 2", "7 nvmlGpmMigSampleGet 3 3"],
    )
    # no inventory round between: nothing NotSupported is asked again
    gpu = polls(env, count=3, inventory_every=100)["polls"][-1][7]
    assert gpu["gpm"] is not None and gpu["gpm"]["sm_util_pct"] is not None
    gpm = {m["gpu_instance_id"]: m["gpm"] for m in gpu["mig_instances"]}
    assert gpm[2] is None and gpm[3] is None
    assert gpm[1] is not None and gpm[4] is not None


def test_a_mig_instance_nvml_cannot_number_is_not_taken_for_instance_0(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    env = fake_nvml_env(
        DGX_H100, scenarios=["mig 7"], faults=["7 nvmlDeviceGetGpuInstanceId 999 3"]
    )
    gpu = polls(env)["polls"][-1][7]
    assert sorted(m["gpu_instance_id"] for m in gpu["mig_instances"]) == [1, 2, 4]
    assert all(m["gpm"] is not None for m in gpu["mig_instances"])


def test_a_mig_device_without_a_uuid_does_not_end_the_poll(fake_nvml_env: FakeNvmlEnv) -> None:
    env = fake_nvml_env(DGX_H100, scenarios=["mig 7"], faults=["7 nvmlDeviceGetUUID 999 2"])
    gpus = polls(env, count=3, pause=0)["polls"][-1]
    assert sorted(m["gpu_instance_id"] for m in gpus[7]["mig_instances"]) == [1, 3, 4]
    assert [g["state"] for g in gpus[:7]] == ["ok"] * 7


def test_a_driver_without_the_v3_process_call_has_no_process_list(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    # pynvml raises NVMLLibraryMismatchError, which is not an NVMLError, for this
    env = fake_nvml_env(DGX_H100, faults=["0 nvmlDeviceGetComputeRunningProcesses_v3 13"])
    gpus = polls(env, count=2, pause=0)["polls"][-1]
    assert gpus[0]["state"] == "ok" and "processes" in gpus[0]["unsupported"]
    assert gpus[1]["processes"]


@pytest.mark.parametrize("function", ["nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo"])
def test_one_mig_device_that_is_not_supported_costs_only_itself(
    fake_nvml_env: FakeNvmlEnv, function: str
) -> None:
    """NVML's answers are remembered per MIG device: one device answering NotSupported must not
    make the source skip its siblings (or drop them, with their GPM samples)."""
    body = """
import json
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", events=False, detail_every=1)
readings = [source.collect() for _ in range(3)]
gpu = readings[-1].gpus[7]
print(json.dumps({"gis": sorted(m.gpu_instance_id for m in gpu.mig_instances),
                  "memory": {m.gpu_instance_id: m.mem_used_bytes for m in gpu.mig_instances},
                  "state": gpu.state.value}))
"""
    clean = run_child(fake_nvml_env(DGX_H100, scenarios=["mig 7"]), body)
    first = clean["gis"][0]
    env = fake_nvml_env(DGX_H100, scenarios=["mig 7"], faults=[f"7 {function} 3 {first}"])
    result = run_child(env, body)
    assert result["state"] == "ok"
    others = [gi for gi in clean["gis"] if gi != first]
    assert set(others) <= set(result["gis"])  # every sibling is still read
    assert all(result["memory"][str(gi)] is not None for gi in others)
