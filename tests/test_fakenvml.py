"""The fake libnvidia-ml.so.1: pynvml, gpustat and nvitop run against it unchanged.

Every NVML check runs in a subprocess, because LD_LIBRARY_PATH and the profile must be set
before pynvml loads the library (and a library, once loaded, stays loaded in a process).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.hardware import TOPO_LEVEL
from gpuconsole.sim.drivers import (
    DRIVERS,
    SMOOTHING_ACTIVE_PRESET_PROFILE,
    SMOOTHING_FIELDS,
    DriverProfile,
    driver_profile,
)
from gpuconsole.sim.fakenvml import (
    FakeNvmlError,
    build_library,
    driver_of,
    mig_partition,
    parse_scenario,
    read_counts_file,
    write_profile,
)
from gpuconsole.sim.identity import gpu_serial, gpu_uuid, mig_uuid
from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_A100, DGX_H100, NodeProfile
from tests.fakenvml_fixtures import (
    MIG_GPU,
    FakeNvmlEnv,
    FakeNvmlLibs,
    NvmlCase,
    fake_nvml_env,
    fake_nvml_lib,
    fake_nvml_libs,
    nvml_case,
)
from tests.peers import require_peer

# the fixtures, re-exported for pytest
__all__ = ["fake_nvml_env", "fake_nvml_lib", "fake_nvml_libs", "nvml_case"]

REQUIRE_ENV = "GPUCONSOLE_REQUIRE_PEERS"

PRELUDE = """
import ctypes, json, os, sys, time
import pynvml

def err(fn, *args):
    try:
        fn(*args)
    except pynvml.NVMLError as exc:
        return type(exc).__name__
    return None
"""


def run_py(env: dict[str, str], body: str, timeout: float = 60) -> Any:
    """Run `body` (which sets `out`) under `env`; return `out` decoded from JSON."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cpus_of(words: list[int]) -> list[int]:
    return [64 * w + bit for w, word in enumerate(words) for bit in range(64) if word >> bit & 1]


def tool(name: str, hint: str) -> str:
    """The console script `name` from this interpreter's environment."""
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    require_peer(name, path is not None, hint)
    assert path is not None
    return path


# -------------------------------------------------------------------------------------------
# Identity and static facts
# -------------------------------------------------------------------------------------------


def test_dgx_h100_reports_the_profile(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env("dgx-h100"),
        """
        pynvml.nvmlInit()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            links = [
                (pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, k).busId,
                 pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, k),
                 pynvml.nvmlDeviceGetNvLinkState(h, k))
                for k in range(18)
            ]
            gpus.append({
                "name": pynvml.nvmlDeviceGetName(h),
                "uuid": pynvml.nvmlDeviceGetUUID(h),
                "serial": pynvml.nvmlDeviceGetSerial(h),
                "index": pynvml.nvmlDeviceGetIndex(h),
                "bus": pynvml.nvmlDeviceGetPciInfo(h).busId,
                "legacy": pynvml.nvmlDeviceGetPciInfo(h).busIdLegacy,
                "device_id": pynvml.nvmlDeviceGetPciInfo(h).pciDeviceId,
                "attributes": err(pynvml.nvmlDeviceGetAttributes, h),
                "mem": pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).total,
                "module": pynvml.nvmlDeviceGetModuleId(h),
                "numa": pynvml.nvmlDeviceGetNumaNodeId(h),
                "arch": pynvml.nvmlDeviceGetArchitecture(h),
                "tdp": pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
                "slowdown": pynvml.nvmlDeviceGetTemperatureThreshold(
                    h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                "max_sm": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                "pcie": [pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                         pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)],
                "links": links,
                "link_count": pynvml.nvmlDeviceGetFieldValues(h, [91])[0].value.uiVal,
            })
        by_uuid = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(gpus[3]["uuid"]))
        by_bus = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId("0000:9d:00.0"))
        h0, h4 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(4)
        out = {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "cuda": pynvml.nvmlSystemGetCudaDriverVersion_v2(),
            "gpus": gpus,
            "by_uuid": by_uuid,
            "by_bus": by_bus,
            "topo_0_4": pynvml.nvmlDeviceGetTopologyCommonAncestor(h0, h4),
            "past_last_link": err(pynvml.nvmlDeviceGetNvLinkState, h0, 18),
        }
        """,
    )
    p = DGX_H100
    assert out["driver"] == p.driver_version and out["cuda"] == p.cuda_driver_version
    assert len(out["gpus"]) == 8
    for slot, gpu in zip(p.gpus, out["gpus"], strict=True):
        assert gpu["name"] == "NVIDIA H100 80GB HBM3"
        assert gpu["attributes"] == "NVMLError_NotSupported"  # a full GPU: MIG handles only
        assert gpu["index"] == slot.index
        assert gpu["uuid"] == gpu_uuid(p.name, 0, slot.index)
        assert gpu["serial"] == gpu_serial(p.name, 0, slot.index)
        assert gpu["bus"] == slot.bus_id
        assert gpu["legacy"] == slot.bus_id[4:]  # "0000:1B:00.0"
        assert gpu["device_id"] == p.gpu_model.pci_device_id
        assert gpu["mem"] == 80 * 1024**3
        assert gpu["module"] == slot.module_id
        assert gpu["numa"] == slot.numa_node
        assert gpu["arch"] == 9
        assert gpu["tdp"] == 700_000
        assert gpu["slowdown"] == p.gpu_model.temp_slowdown_c
        assert gpu["max_sm"] == 1980
        assert gpu["pcie"] == [5, 16]
        assert gpu["link_count"] == 18
        expected_remotes = [sw.bus_id for sw in p.nvswitches for _ in range(sw.links_per_gpu[0])]
        assert [bus for bus, _, _ in gpu["links"]] == expected_remotes
        assert {(kind, state) for _, kind, state in gpu["links"]} == {(2, 1)}  # SWITCH, up
    assert out["by_uuid"] == 3
    assert out["by_bus"] == 4
    assert out["topo_0_4"] == TOPO_LEVEL[p.pci_level(p.gpus[0].pci_path, p.gpus[4].pci_path)]
    assert out["topo_0_4"] == 50  # SYS: across the sockets
    assert out["past_last_link"] == "NVMLError_InvalidArgument"


@pytest.mark.parametrize("profile", [DGX_A100, APOLLO_PCIE], ids=lambda p: p.name)
def test_topology_matrix_matches_the_profile(
    fake_nvml_env: FakeNvmlEnv, profile: NodeProfile
) -> None:
    out = run_py(
        fake_nvml_env(profile),
        """
        pynvml.nvmlInit()
        hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        out = [[pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b) for b in hs] for a in hs]
        """,
    )
    expected = [
        [TOPO_LEVEL[profile.pci_level(a.pci_path, b.pci_path)] for b in profile.gpus]
        for a in profile.gpus
    ]
    assert out == expected
    assert len({level for row in out for level in row}) >= 3  # not one level everywhere


def test_cpu_affinity_by_node_and_socket(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env("dgx-a100"),
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out = {
            "plain": list(pynvml.nvmlDeviceGetCpuAffinity(h, 4)),
            "node": list(
                pynvml.nvmlDeviceGetCpuAffinityWithinScope(h, 4, pynvml.NVML_AFFINITY_SCOPE_NODE)),
            "socket": list(
                pynvml.nvmlDeviceGetCpuAffinityWithinScope(h, 4, pynvml.NVML_AFFINITY_SCOPE_SOCKET)),
            "numa": pynvml.nvmlDeviceGetNumaNodeId(h),
        }
        """,
    )
    assert cpus_of(out["plain"]) == [*range(48, 64), *range(176, 192)]
    assert cpus_of(out["node"]) == cpus_of(out["plain"])
    assert cpus_of(out["socket"]) == [*range(0, 64), *range(128, 192)]
    assert out["numa"] == 3


def test_pcie_gpus_have_no_nvlink_fabric_or_fans(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env("apollo-pcie"),
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.c_nvmlGpuFabricInfo_t()
        v = pynvml.nvmlDeviceGetFieldValues(h, [91, (138, 0)])
        out = {
            "name": pynvml.nvmlDeviceGetName(h),
            "nvlink": err(pynvml.nvmlDeviceGetNvLinkState, h, 0),
            "fabric": err(pynvml.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(info)),
            "fan": err(pynvml.nvmlDeviceGetFanSpeed, h),
            "fans": err(pynvml.nvmlDeviceGetNumFans, h),
            "fields": [e.nvmlReturn for e in v],
            "gpm": pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice,
            "gpm_sample": err(pynvml.nvmlGpmSampleGet, h, pynvml.nvmlGpmSampleAlloc()),
        }
        """,
    )
    assert out["name"] == "NVIDIA A100-PCIE-40GB"
    assert out["nvlink"] == out["fabric"] == out["fan"] == out["fans"] == "NVMLError_NotSupported"
    assert out["fields"] == [3, 3]
    assert out["gpm"] == 0
    assert out["gpm_sample"] == "NVMLError_NotSupported"


def test_nvswitch_gpus_report_a_completed_fabric(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env("dgx-h100"),
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(2)
        v1 = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(v1))
        v2 = pynvml.c_nvmlGpuFabricInfo_v2_t()
        pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v2))
        bad = pynvml.c_nvmlGpuFabricInfo_v2_t()
        bad.version = 7
        out = {
            "v1": [v1.state, v1.status],
            "v2": [v2.state, v2.status],
            "bad_version": err(pynvml.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(bad)),
            "fan": err(pynvml.nvmlDeviceGetFanSpeed_v2, h, 0),
        }
        """,
    )
    assert out["v1"] == out["v2"] == [3, 0]  # NVML_GPU_FABRIC_STATE_COMPLETED, SUCCESS
    assert out["bad_version"] == "NVMLError_ArgumentVersionMismatch"
    assert out["fan"] == "NVMLError_NotSupported"


# -------------------------------------------------------------------------------------------
# Errors as the real library gives them
# -------------------------------------------------------------------------------------------


def test_a_function_the_library_lacks_is_function_not_found(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env(),
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out = [err(pynvml.nvmlDeviceGetSamples, h, 1, 0), err(pynvml.nvmlDeviceGetPowerUsage, h)]
        """,
    )
    assert out == ["NVMLError_FunctionNotFound", None]


def test_without_a_profile_the_driver_is_not_loaded(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    env = fake_nvml_env()
    body = "out = [err(pynvml.nvmlInit), err(pynvml.nvmlDeviceGetCount)]"
    unset = {k: v for k, v in env.items() if k != "GPUCONSOLE_FAKE_NVML_PROFILE"}
    assert run_py(unset, body) == ["NVMLError_DriverNotLoaded", "NVMLError_Uninitialized"]
    missing = {**env, "GPUCONSOLE_FAKE_NVML_PROFILE": str(tmp_path / "absent")}
    assert run_py(missing, body)[0] == "NVMLError_DriverNotLoaded"
    broken = tmp_path / "broken.profile"
    broken.write_text("format 1\ngpu 0\nwarp_drive 9\n")
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + body + "\nprint(json.dumps(out))"],
        env={**env, "GPUCONSOLE_FAKE_NVML_PROFILE": str(broken)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(proc.stdout)[0] == "NVMLError_DriverNotLoaded"
    assert "line 3" in proc.stderr and "warp_drive" in proc.stderr


def test_calls_before_init_and_after_shutdown_are_uninitialized(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    out = run_py(
        fake_nvml_env(),
        """
        pynvml.nvmlInit()
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlShutdown()
        still = pynvml.nvmlDeviceGetName(h)          # ref-counted: one init left
        pynvml.nvmlShutdown()
        out = [still, err(pynvml.nvmlDeviceGetName, h), err(pynvml.nvmlShutdown)]
        """,
    )
    assert out == ["NVIDIA H100 80GB HBM3", "NVMLError_Uninitialized", "NVMLError_Uninitialized"]


def test_an_unprivileged_user_is_refused_what_a_real_driver_refuses(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    body = """
        pynvml.nvmlInit()
        mig_gpu, plain = pynvml.nvmlDeviceGetHandleByIndex(7), pynvml.nvmlDeviceGetHandleByIndex(0)
        m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 0)
        s = pynvml.nvmlGpmSampleAlloc()
        out = {
            "parent_memory": err(pynvml.nvmlDeviceGetMemoryInfo, mig_gpu),
            "parent_memory_v2": err(pynvml.nvmlDeviceGetMemoryInfo, mig_gpu, pynvml.nvmlMemory_v2),
            "parent_procs": err(pynvml.nvmlDeviceGetComputeRunningProcesses, mig_gpu),
            "gi_by_id": err(pynvml.nvmlDeviceGetGpuInstanceById, mig_gpu, 1),
            "gpm": err(pynvml.nvmlGpmSampleGet, plain, s),
            "gpm_mig": err(pynvml.nvmlGpmMigSampleGet, mig_gpu, 1, s),
            "mig_memory": err(pynvml.nvmlDeviceGetMemoryInfo, m),
            "mig_procs": err(pynvml.nvmlDeviceGetComputeRunningProcesses, m),
            "mig_gi": pynvml.nvmlDeviceGetGpuInstanceId(m),
            "mig_name": pynvml.nvmlDeviceGetName(m),
            "plain_memory": err(pynvml.nvmlDeviceGetMemoryInfo, plain),
            "plain_procs": err(pynvml.nvmlDeviceGetComputeRunningProcesses, plain),
            "power": err(pynvml.nvmlDeviceGetPowerUsage, mig_gpu),
        }
        """
    out = run_py(fake_nvml_env(scenarios=["mig 7"], privileged=False), body)
    denied = "NVMLError_NoPermission"
    assert out["parent_memory"] == out["parent_memory_v2"] == out["parent_procs"] == denied
    assert out["gi_by_id"] == out["gpm"] == out["gpm_mig"] == denied
    # what a MIG device and a GPU without MIG answer anyone
    assert out["mig_memory"] is None and out["mig_procs"] is None
    assert out["mig_gi"] == 1 and out["mig_name"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert out["plain_memory"] is out["plain_procs"] is out["power"] is None
    root = run_py(fake_nvml_env(scenarios=["mig 7"]), body)
    assert not {k: v for k, v in root.items() if v == denied}
    # a node whose driver opens profiling to everyone (RmProfilingAdminOnly=0)
    open_gpm = run_py(
        fake_nvml_env(scenarios=["mig 7"], privileged=False, profiling_admin_only=False), body
    )
    assert open_gpm["gpm"] is open_gpm["gpm_mig"] is None
    assert open_gpm["parent_memory"] == open_gpm["gi_by_id"] == denied


@pytest.mark.parametrize(
    ("code", "name"),
    [(4, "NVMLError_NoPermission"), (8, "NVMLError_InsufficientPower"), (11, "NVMLError_IrqIssue")],
)
def test_a_gpu_that_cannot_be_opened_is_still_counted(
    fake_nvml_env: FakeNvmlEnv, code: int, name: str
) -> None:
    out = run_py(
        fake_nvml_env(open_errors={2: code}),
        f"""
        pynvml.nvmlInit()
        out = {{
            "count": pynvml.nvmlDeviceGetCount(),
            "handles": [err(pynvml.nvmlDeviceGetHandleByIndex, i) for i in range(8)],
            "by_bus": err(pynvml.nvmlDeviceGetHandleByPciBusId, "{DGX_H100.gpus[2].bus_id}"),
        }}
        """,
    )
    assert out["count"] == 8
    assert out["handles"] == [None, None, name] + [None] * 5
    assert out["by_bus"] == name


def test_faults_break_one_call_of_one_gpu_or_mig_instance(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env(
            scenarios=["mig 7"],
            faults=[
                "7 nvmlDeviceGetUUID 999 2",
                "7 nvmlDeviceGetGpuInstanceId 6 3",
                "0 nvmlDeviceGetComputeRunningProcesses_v3 13",
            ],
        ),
        """
        pynvml.nvmlInit()
        h7, h0 = pynvml.nvmlDeviceGetHandleByIndex(7), pynvml.nvmlDeviceGetHandleByIndex(0)
        migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h7, k) for k in range(4)]
        try:
            pynvml.nvmlDeviceGetComputeRunningProcesses(h0)
            procs = None
        except pynvml.NVMLLibraryMismatchError:
            procs = "mismatch"
        out = {
            "uuids": [err(pynvml.nvmlDeviceGetUUID, m) for m in migs],
            "gis": [err(pynvml.nvmlDeviceGetGpuInstanceId, m) for m in migs],
            "parent_uuid": err(pynvml.nvmlDeviceGetUUID, h7),
            "procs": procs,
            "procs_v2": err(pynvml.nvmlDeviceGetComputeRunningProcesses_v2, h0),
        }
        """,
    )
    assert out["uuids"] == [None, "NVMLError_Unknown", None, None]
    assert out["gis"] == [None, None, "NVMLError_NotFound", None]
    assert out["parent_uuid"] is None
    # pynvml's unversioned call on a driver without the _v3 symbol
    assert out["procs"] == "mismatch" and out["procs_v2"] is None


def test_a_lost_gpu_still_answers_its_uuid_from_the_librarys_cache(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    out = run_py(
        fake_nvml_env(frozen_time=0, scenarios=["xid79 5 at 10"]),
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(5)
        os.environ["GPUCONSOLE_FAKE_NVML_TIME"] = "20"
        out = {"uuid": pynvml.nvmlDeviceGetUUID(h),
               "pstate": err(pynvml.nvmlDeviceGetPerformanceState, h),
               "reopen": err(pynvml.nvmlDeviceGetHandleByIndex, 5)}
        """,
    )
    assert out["uuid"] == gpu_uuid("dgx-h100", 0, 5)
    assert out["pstate"] == out["reopen"] == "NVMLError_GpuIsLost"


# -------------------------------------------------------------------------------------------
# Scenarios
# -------------------------------------------------------------------------------------------


def test_xid79_loses_that_gpu_only(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env(scenarios=["xid79 5"]),
        """
        pynvml.nvmlInit()
        out = {
            "count": pynvml.nvmlDeviceGetCount(),
            "handles": [err(pynvml.nvmlDeviceGetHandleByIndex, i) for i in range(8)],
            "by_bus": err(pynvml.nvmlDeviceGetHandleByPciBusId, "00000000:C3:00.0"),
        }
        """,
    )
    assert out["count"] == 8
    assert out["handles"] == [None] * 5 + ["NVMLError_GpuIsLost"] + [None] * 2
    assert out["by_bus"] == "NVMLError_GpuIsLost"


def test_xid79_is_delivered_as_an_event_then_the_gpu_is_lost(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env(scenarios=["xid79 5 at 1"]),
        """
        pynvml.nvmlInit()
        hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        before = pynvml.nvmlDeviceGetName(hs[5])
        es = pynvml.nvmlEventSetCreate()
        for h in hs:
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
        t0 = time.monotonic()
        d = pynvml.nvmlEventSetWait(es, 10000)
        waited = time.monotonic() - t0
        out = {
            "before": before,
            "type": d.eventType,
            "xid": d.eventData,
            "gi": d.gpuInstanceId,
            "is_gpu5": ctypes.addressof(d.device.contents) == ctypes.addressof(hs[5].contents),
            "waited": waited,
            "after": err(pynvml.nvmlDeviceGetName, hs[5]),
            "power": err(pynvml.nvmlDeviceGetPowerUsage, hs[5]),
            "neighbour": err(pynvml.nvmlDeviceGetPowerUsage, hs[4]),
            "again": err(pynvml.nvmlEventSetWait, es, 200),
        }
        pynvml.nvmlEventSetFree(es)
        """,
    )
    assert out["before"] == "NVIDIA H100 80GB HBM3"
    assert out["type"] == 0x8 and out["xid"] == 79 and out["is_gpu5"]
    assert out["gi"] == 0xFFFFFFFF
    assert 0.8 < out["waited"] < 5.0
    assert out["after"] == out["power"] == "NVMLError_GpuIsLost"
    assert out["neighbour"] is None
    assert out["again"] == "NVMLError_Timeout"  # delivered once


def test_event_wait_times_out_when_nothing_happens(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env(),
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        es = pynvml.nvmlEventSetCreate()
        supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
        t0 = time.monotonic()
        out = {
            "wait": err(pynvml.nvmlEventSetWait, es, 300),
            "took": time.monotonic() - t0,
            "xid_supported": bool(supported & pynvml.nvmlEventTypeXidCriticalError),
            "unsupported_type": err(pynvml.nvmlDeviceRegisterEvents, h, 1 << 40, es),
        }
        """,
    )
    assert out["wait"] == "NVMLError_Timeout"
    assert 0.25 <= out["took"] < 3.0
    assert out["xid_supported"]
    assert out["unsupported_type"] == "NVMLError_NotSupported"


@pytest.mark.parametrize(
    ("profile", "gpu", "names", "sms"),
    [
        (DGX_H100, 7, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], [60, 32, 16, 16]),
        (DGX_A100, 2, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"], [42, 28, 14, 14]),
    ],
    ids=["h100", "a100"],
)
def test_mig_scenario_lists_four_mig_devices(
    fake_nvml_env: FakeNvmlEnv, profile: NodeProfile, gpu: int, names: list[str], sms: list[int]
) -> None:
    out = run_py(
        fake_nvml_env(profile, scenarios=[f"mig {gpu}"]),
        f"""
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex({gpu})
        migs, empty = [], []
        for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except pynvml.NVMLError_NotFound:
                empty.append(k)
                continue
            gi = pynvml.nvmlDeviceGetGpuInstanceId(m)
            info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(h, gi))
            by_index = {{p: pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
                         for p in (0, 1, 2, 3, 4, 7)}}
            prof = [p for p in by_index.values() if p.id == info.profileId][0]
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
            migs.append({{
                "name": pynvml.nvmlDeviceGetName(m),
                "profile": prof.name,
                "uuid": pynvml.nvmlDeviceGetUUID(m),
                "gi": gi,
                "ci": pynvml.nvmlDeviceGetComputeInstanceId(m),
                "sm": pynvml.nvmlDeviceGetAttributes(m).multiprocessorCount,
                "mem": pynvml.nvmlDeviceGetMemoryInfo(m).total,
                "is_mig": pynvml.nvmlDeviceIsMigDeviceHandle(m).value,
                "parent": pynvml.nvmlDeviceGetIndex(parent),
                "by_uuid": pynvml.nvmlDeviceIsMigDeviceHandle(
                    pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(m))).value,
            }})
        other = pynvml.nvmlDeviceGetHandleByIndex({(gpu + 1) % 8})
        out = {{
            "mode": pynvml.nvmlDeviceGetMigMode(h),
            "other_mode": pynvml.nvmlDeviceGetMigMode(other),
            "migs": migs,
            "empty": empty,
            "util": err(pynvml.nvmlDeviceGetUtilizationRates, h),
            "procs": [p.gpuInstanceId for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)],
            "parent_is_mig": pynvml.nvmlDeviceIsMigDeviceHandle(h).value,
        }}
        """,
    )
    assert out["mode"] == [1, 1] and out["other_mode"] == [0, 0]
    assert [m["profile"] for m in out["migs"]] == [f"MIG {n}" for n in names]
    assert [m["name"] for m in out["migs"]] == [f"{profile.gpu_model.name} MIG {n}" for n in names]
    assert [m["sm"] for m in out["migs"]] == sms
    assert [m["uuid"] for m in out["migs"]] == [mig_uuid(profile.name, 0, gpu, k) for k in range(4)]
    assert all(m["uuid"].startswith("MIG-") for m in out["migs"])
    partition = mig_partition(profile.gpu_model)
    assert [m["gi"] for m in out["migs"]] == [gi for gi, _, _, _ in partition]
    assert [m["mem"] for m in out["migs"]] == [mp.mem_bytes for _, mp, _, _ in partition]
    assert {m["ci"] for m in out["migs"]} == {0}
    assert all(m["is_mig"] == 1 and m["by_uuid"] == 1 for m in out["migs"])
    assert {m["parent"] for m in out["migs"]} == {gpu}
    assert out["empty"] == [4, 5, 6]
    assert out["util"] == "NVMLError_NotSupported"
    assert set(out["procs"]) <= {gi for gi, _, _, _ in partition} and out["procs"]
    assert out["parent_is_mig"] == 0


def test_an_idle_event_wait_sleeps_once_as_the_drivers_does(fake_nvml_env: FakeNvmlEnv) -> None:
    """A wait that times out with nothing due wakes its thread once, not every 50 ms: an
    event watcher waiting on an idle node costs what it costs on a real driver."""
    out = run_py(
        fake_nvml_env(scenarios=["xid79 5 at 3600"]),
        """
        import resource
        pynvml.nvmlInit()
        es = pynvml.nvmlEventSetCreate()
        for i in range(8):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        waits = [err(pynvml.nvmlEventSetWait, es, 400) for _ in range(3)]
        out = {"waits": waits,
               "sleeps": resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before}
        """,
    )
    assert out["waits"] == ["NVMLError_Timeout"] * 3
    assert out["sleeps"] <= 4  # one per wait (and a spare); every 50 ms would be 24


def test_thermal_scenario_throttles_and_counts_violation_time(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    out = run_py(
        fake_nvml_env(driver="580.82", scenarios=["thermal 3"]),  # HW thermal time: field 270
        """
        pynvml.nvmlInit()
        def read(i):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            v = pynvml.nvmlDeviceGetFieldValues(h, [270, 82])
            return {
                "temp": pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
                "legacy_temp": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                "sm": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
                "throttle": pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
                "violation_ns": v[0].value.ullVal,
                "hbm": v[1].value.uiVal,
            }
        first = read(3)
        time.sleep(0.3)
        out = {"first": first, "later": read(3), "cool": read(2)}
        """,
    )
    first, later, cool = out["first"], out["later"], out["cool"]
    assert first["temp"] >= DGX_H100.gpu_model.temp_slowdown_c
    assert first["legacy_temp"] == first["temp"]
    assert first["sm"] == 1410
    assert first["reasons"] & 0x40 and first["throttle"] == first["reasons"]
    assert first["hbm"] > first["temp"]
    assert later["violation_ns"] - first["violation_ns"] >= 0.2e9
    assert not cool["reasons"] & 0x40
    assert cool["violation_ns"] == 0
    assert cool["temp"] < DGX_H100.gpu_model.temp_slowdown_c


def test_ecc_scenario_shows_corrected_errors_and_a_pending_remap(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    out = run_py(
        fake_nvml_env(scenarios=["ecc 2"]),
        """
        pynvml.nvmlInit()
        def read(i):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            return {
                "vol": pynvml.nvmlDeviceGetTotalEccErrors(
                    h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
                "unc": pynvml.nvmlDeviceGetTotalEccErrors(
                    h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
                "remap": list(pynvml.nvmlDeviceGetRemappedRows(h)),
                "fields": [e.value.ullVal if e.valueType == 3 else e.value.uiVal
                           for e in pynvml.nvmlDeviceGetFieldValues(h, [3, 4, 144])],
                "mode": pynvml.nvmlDeviceGetEccMode(h),
                "retired": err(pynvml.nvmlDeviceGetRetiredPages, h, 0),
            }
        out = {"bad": read(2), "good": read(0)}
        """,
    )
    bad, good = out["bad"], out["good"]
    assert bad["vol"] > 0 and bad["unc"] == 0
    assert bad["remap"] == [1, 0, 1, 0]  # corrected rows, uncorrected, pending, failure
    assert bad["fields"][0] == bad["vol"] and bad["fields"][1:] == [0, 1]
    assert good["vol"] == 0 and good["remap"] == [0, 0, 0, 0] and good["fields"] == [0, 0, 0]
    assert bad["mode"] == [1, 1]
    assert bad["retired"] == "NVMLError_NotSupported"  # Hopper remaps rows instead


def test_notsupported_scenario_keeps_only_identity(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env(scenarios=["notsupported 1"]),
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        out = {
            "identity": [pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetPciInfo(h).busId,
                         pynvml.nvmlDeviceGetIndex(h)],
            "other": [err(pynvml.nvmlDeviceGetPowerUsage, h),
                      err(pynvml.nvmlDeviceGetMemoryInfo, h),
                      err(pynvml.nvmlDeviceGetFieldValues, h, [83]),
                      err(pynvml.nvmlDeviceGetTopologyCommonAncestor, h, h)],
            "neighbour": err(pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetHandleByIndex(0)),
        }
        """,
    )
    assert out["identity"] == ["NVIDIA H100 80GB HBM3", DGX_H100.gpus[1].bus_id, 1]
    assert out["other"] == ["NVMLError_NotSupported"] * 4
    assert out["neighbour"] is None


# -------------------------------------------------------------------------------------------
# Dynamic readings
# -------------------------------------------------------------------------------------------


def test_process_list_follows_nvmls_insufficient_size_protocol(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    out = run_py(
        fake_nvml_env(),
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(6)
        fn = pynvml.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3
        count = ctypes.c_uint(0)
        first = fn(h, ctypes.byref(count), None)
        need = count.value
        small = (pynvml.c_nvmlProcessInfo_v3_t * max(1, need - 1))()
        count.value = need - 1
        second = fn(h, ctypes.byref(count), small)
        exact = (pynvml.c_nvmlProcessInfo_v3_t * need)()
        count.value = need
        third = fn(h, ctypes.byref(count), exact)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        out = {
            "rets": [first, second, third],
            "need": need,
            "count": count.value,
            "pids": [p.pid for p in procs],
            "exact_pids": [exact[i].pid for i in range(need)],
            "used": sum(p.usedGpuMemory for p in procs),
            "gi": {p.gpuInstanceId for p in procs} == {0xFFFFFFFF},
            "mem_used": pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used,
            "graphics": pynvml.nvmlDeviceGetGraphicsRunningProcesses(h),
            "mps": pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h),
        }
        """,
    )
    assert out["need"] >= 1
    assert out["rets"] == [7, 7, 0]  # INSUFFICIENT_SIZE, INSUFFICIENT_SIZE, SUCCESS
    assert out["count"] == out["need"] == len(out["pids"])
    assert out["exact_pids"] == out["pids"]
    assert len(set(out["pids"])) == len(out["pids"])
    assert out["gi"]
    assert 0 < out["used"] <= out["mem_used"]
    assert out["graphics"] == [] and out["mps"] == []


def test_field_values_fill_each_entry(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env(driver="580.82"),
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        ids = [83, 186, 185, 190, 194, 82, 94, 197, 198, 74, 76, 269, 270, 271, 142, 3, 9999,
               (138, 0), (139, 17), (138, 18)]
        def read():
            return [[e.fieldId, e.scopeId, e.nvmlReturn, e.valueType,
                     e.value.ullVal if e.valueType == 3 else e.value.uiVal, e.timestamp]
                    for e in pynvml.nvmlDeviceGetFieldValues(h, ids)]
        first = read()
        time.sleep(0.25)
        out = {"first": first, "later": read(), "now_us": time.time() * 1e6,
               "energy": pynvml.nvmlDeviceGetTotalEnergyConsumption(h)}
        """,
    )
    first = {(f[0], f[1]): f for f in out["first"]}
    later = {(f[0], f[1]): f for f in out["later"]}
    rets = {k: f[2] for k, f in first.items()}
    assert rets.pop((9999, 0)) == 3  # unknown field: NOT_SUPPORTED, only for that entry
    assert rets.pop((138, 18)) == 2  # H100 has links 0-17
    assert set(rets.values()) == {0}
    assert first[(83, 0)][3] == 3 and first[(186, 0)][3] == 1  # ULL energy, UINT power
    assert first[(197, 0)][3] == first[(198, 0)][3] == 1  # PCIe bytes: 32 bits, as drivers do
    assert later[(83, 0)][4] > first[(83, 0)][4]  # energy integrates power
    assert later[(197, 0)][4] > first[(197, 0)][4]  # PCIe bytes integrate throughput
    assert later[(138, 0)][4] >= first[(138, 0)][4]
    assert first[(190, 0)][4] == 700_000 and first[(194, 0)][4] == 87
    assert 200_000 <= first[(186, 0)][4] <= 700_000
    assert abs(first[(83, 0)][5] - out["now_us"]) < 5e6  # microseconds since the epoch
    assert out["energy"] >= later[(83, 0)][4]


def test_dynamics_follow_the_load(fake_nvml_env: FakeNvmlEnv) -> None:
    """Sweep the frozen clock: power tracks utilization, clocks track load, energy only grows."""
    out = run_py(
        fake_nvml_env(frozen_time=0),
        """
        pynvml.nvmlInit()
        hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        rows = []
        for t in range(0, 600, 7):
            os.environ["GPUCONSOLE_FAKE_NVML_TIME"] = str(t)
            for i, h in enumerate(hs):
                rows.append([t, i, pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                             pynvml.nvmlDeviceGetPowerUsage(h), pynvml.nvmlDeviceGetClockInfo(h, 1),
                             pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
                             pynvml.nvmlDeviceGetTemperature(h, 0),
                             pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used,
                             pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)])
        out = rows
        """,
    )
    m = DGX_H100.gpu_model
    lo, hi = m.power_min_w * 1000, m.tdp_w * 1000
    energy: dict[int, int] = {}
    utils: dict[int, set[int]] = {}
    for t, i, util, power, sm, joules, temp, used, reasons in out:
        assert abs(power - (lo + (hi - lo) * util / 100)) <= 0.006 * (hi - lo), (t, i)
        if util <= 1:
            assert sm == m.sm_clock_idle_mhz and reasons & 0x1
        elif 3 <= util < 95:
            assert sm == m.sm_clock_max_mhz and reasons == 0
        assert 25 <= temp < m.temp_slowdown_c
        assert 0 < used < m.mem_bytes
        assert joules >= energy.get(i, 0)
        energy[i] = joules
        utils.setdefault(i, set()).add(util)
    assert all(len(seen) > 10 for seen in utils.values())  # the load moves
    assert len({tuple(sorted(seen)) for seen in utils.values()}) == 8  # differently per GPU
    # Over 600 s a GPU between 200 W and 700 W uses between 120 kJ and 420 kJ.
    assert all(119_000_000 <= e <= 421_000_000 for e in energy.values())


def test_readings_are_deterministic_for_a_seed(fake_nvml_env: FakeNvmlEnv) -> None:
    body = """
    pynvml.nvmlInit()
    out = []
    for i in range(8):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        out.append([pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                    pynvml.nvmlDeviceGetPowerUsage(h), pynvml.nvmlDeviceGetTemperature(h, 0),
                    pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
                    pynvml.nvmlDeviceGetFieldValues(h, [(138, 3)])[0].value.ullVal,
                    [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]])
    """
    a = run_py(fake_nvml_env(frozen_time=123.4), body)
    b = run_py(fake_nvml_env(frozen_time=123.4), body)
    other = run_py(fake_nvml_env(frozen_time=123.4, seed=1), body)
    assert a == b
    assert [row[0] for row in other] == [gpu_uuid("dgx-h100", 1, i) for i in range(8)]
    assert [row[1:] for row in other] != [row[1:] for row in a]


def test_gpm_metrics_on_hopper(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env(scenarios=["mig 0"]),
        """
        pynvml.nvmlInit()
        ids = [1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20, 21, 60, 61, 62, 97, 99, 212]
        def metrics(take):
            s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
            take(s1)
            time.sleep(0.2)
            take(s2)
            req = pynvml.c_nvmlGpmMetricsGet_t()
            req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(ids)
            req.sample1, req.sample2 = s1, s2
            for i, mid in enumerate(ids):
                req.metrics[i].metricId = mid
            pynvml.nvmlGpmMetricsGet(req)
            pynvml.nvmlGpmSampleFree(s1)
            pynvml.nvmlGpmSampleFree(s2)
            return {mid: [req.metrics[i].nvmlReturn, req.metrics[i].value]
                    for i, mid in enumerate(ids)}
        h3, h0 = pynvml.nvmlDeviceGetHandleByIndex(3), pynvml.nvmlDeviceGetHandleByIndex(0)
        bad = pynvml.c_nvmlGpmMetricsGet_t()
        bad.version = 9
        out = {
            "supported": pynvml.nvmlGpmQueryDeviceSupport(h3).isSupportedDevice,
            "gpu": metrics(lambda s: pynvml.nvmlGpmSampleGet(h3, s)),
            "mig": metrics(lambda s: pynvml.nvmlGpmMigSampleGet(h0, 1, s)),
            "util": pynvml.nvmlDeviceGetUtilizationRates(h3).gpu,
            "bad_version": err(pynvml.nvmlGpmMetricsGet, bad),
            "no_such_instance": err(
                pynvml.nvmlGpmMigSampleGet, h0, 42, pynvml.nvmlGpmSampleAlloc()),
        }
        """,
    )
    assert out["supported"] == 1
    for scope in ("gpu", "mig"):
        got = {int(k): v for k, v in out[scope].items()}
        assert got.pop(99) == [3, 0.0]  # a C2C metric: not on H100 SXM
        assert got.pop(212) == [3, 0.0]  # link 18 does not exist on an 18-link GPU
        assert {ret for ret, _ in got.values()} == {0}
        for mid in (1, 2, 3, 5, 10, 12):
            assert 0.0 <= got[mid][1] <= 100.0
        assert got[2][1] <= got[1][1]  # busy SMs never exceed the time anything ran
        assert got[20][1] > 0 and got[21][1] > got[20][1]
        assert got[60][1] > got[62][1] > 0  # all links carry more than link 0 alone
    assert abs(out["gpu"]["1"][1] - out["util"]) < 15  # GPM agrees with the utilization rate
    assert out["bad_version"] == "NVMLError_ArgumentVersionMismatch"
    assert out["no_such_instance"] == "NVMLError_NotFound"


def test_gpm_metrics_over_an_empty_interval_are_nan(fake_nvml_env: FakeNvmlEnv) -> None:
    out = run_py(
        fake_nvml_env(frozen_time=30.0, scenarios=["mig 7"], faults=["7 nvmlGpmMetricsGet nan 2"]),
        """
        pynvml.nvmlInit()
        def metrics(take, t2):
            s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
            os.environ["GPUCONSOLE_FAKE_NVML_TIME"] = "30"
            take(s1)
            os.environ["GPUCONSOLE_FAKE_NVML_TIME"] = t2
            take(s2)
            req = pynvml.c_nvmlGpmMetricsGet_t()
            req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = 2
            req.sample1, req.sample2 = s1, s2
            req.metrics[0].metricId, req.metrics[1].metricId = 2, 99
            pynvml.nvmlGpmMetricsGet(req)
            return [[m.nvmlReturn, repr(m.value)] for m in req.metrics[:2]]
        h = pynvml.nvmlDeviceGetHandleByIndex(7)
        out = {
            "same_instant": metrics(lambda s: pynvml.nvmlGpmSampleGet(h, s), "30"),
            "later": metrics(lambda s: pynvml.nvmlGpmSampleGet(h, s), "31"),
            "faulty_instance": metrics(lambda s: pynvml.nvmlGpmMigSampleGet(h, 2, s), "31"),
        }
        """,
    )
    assert out["same_instant"] == [[0, "nan"], [3, "0.0"]]
    assert out["later"][0][0] == 0 and out["later"][0][1] != "nan"
    assert out["faulty_instance"] == [[0, "nan"], [3, "0.0"]]


# -------------------------------------------------------------------------------------------
# Driver branches
# -------------------------------------------------------------------------------------------


def expected_field(driver: DriverProfile, fid: int) -> tuple[int, int]:
    """(nvmlReturn, valueType) a branch answers for a field id at 251-273, per nvml.h."""
    counters, smoothing = driver.throttle_counters_at, driver.smoothing_at
    if counters and counters <= fid < counters + 3:
        return 0, 3  # nanoseconds held, unsigned long long
    if smoothing and smoothing <= fid < smoothing + SMOOTHING_FIELDS:
        return 0, 1
    return 3, 1  # NOT_SUPPORTED, typed unsigned int as a real driver leaves it


def test_the_fake_plays_each_driver_branch(nvml_case: NvmlCase) -> None:
    """Symbols, field ids and their meaning, value types, MIG-only attributes, NVLink version
    as nvmlNvlinkVersion_t and the idle link, as the driver branch of the profile has them."""
    out = run_py(
        nvml_case.env("smoothing 0"),
        f"""
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        ids = [74, 76, 142, 143, 144, 145, 197, 198, 230, *range(251, 274)]
        fields = {{e.fieldId: [e.nvmlReturn, e.valueType, e.value.uiVal]
                  for e in pynvml.nvmlDeviceGetFieldValues(h, ids)}}
        links = []
        for i in range(8):
            g = pynvml.nvmlDeviceGetHandleByIndex(i)
            links.append([pynvml.nvmlDeviceGetCurrPcieLinkGeneration(g),
                          err(pynvml.nvmlDeviceGetUtilizationRates, g)
                          or pynvml.nvmlDeviceGetUtilizationRates(g).gpu])
        migs = []
        parent = pynvml.nvmlDeviceGetHandleByIndex({MIG_GPU})
        if {nvml_case.mig}:
            for slot in range(4):
                m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
                migs.append(pynvml.nvmlDeviceGetAttributes(m).multiprocessorCount)
        out = {{
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "exports_temperature_v": hasattr(pynvml.nvmlLib, "nvmlDeviceGetTemperatureV"),
            "temperature_v": err(pynvml.nvmlDeviceGetTemperatureV, h, 0),
            "temperature": pynvml.nvmlDeviceGetTemperature(h, 0),
            "fields": fields,
            "attributes": err(pynvml.nvmlDeviceGetAttributes, h),
            "nvlink_version": pynvml.nvmlDeviceGetNvLinkVersion(h, 0),
            "links": links,
            "migs": migs,
            "mig_gpu_memory": err(pynvml.nvmlDeviceGetMemoryInfo, parent),
            "gpm": err(pynvml.nvmlGpmSampleGet, h, pynvml.nvmlGpmSampleAlloc()),
        }}
        """,
    )
    driver = nvml_case.driver
    assert out["driver"] == driver.version
    assert out["exports_temperature_v"] is driver.temperature_v
    assert out["temperature_v"] == (None if driver.temperature_v else "NVMLError_FunctionNotFound")
    assert 25 <= out["temperature"] < 90
    fields = {int(fid): entry for fid, entry in out["fields"].items()}
    assert fields[74][:2] == fields[76][:2] == [0, 3]  # the same in every branch
    # remapped rows are 64 bits wide (a real 580.159.04 driver on an H200)
    assert all(fields[fid][:2] == [0, 3] for fid in (142, 143, 144, 145))
    pcie = [0, 1] if driver.pcie_byte_counters else [3, 1]  # 32 bits wide, from R560
    assert fields[197][:2] == fields[198][:2] == pcie
    # the GPU recovery action (none here), from R565
    assert fields[230] == ([0, 1, 0] if driver.recovery_action else [3, 1, 0])
    for fid in range(251, 274):
        assert tuple(fields[fid][:2]) == expected_field(driver, fid), fid
    preset = driver.smoothing_field(SMOOTHING_ACTIVE_PRESET_PROFILE)
    if preset is not None:
        assert fields[preset][2] == 2  # the preset an administrator chose
    assert out["attributes"] == "NVMLError_NotSupported"  # a full GPU: MIG handles only
    assert out["nvlink_version"] == 6  # NVML_NVLINK_VERSION_4_0, H100
    for gen, util in out["links"]:
        # An idle GPU's link trains down (utilization is NotSupported in MIG mode).
        assert gen == 5 or (gen == 1 and (util == "NVMLError_NotSupported" or util <= 2))
    assert out["migs"] == ([60, 32, 16, 16] if nvml_case.mig else [])
    denied = "NVMLError_NoPermission"
    assert out["mig_gpu_memory"] == (None if nvml_case.privileged or not nvml_case.mig else denied)
    assert out["gpm"] == (None if nvml_case.privileged else denied)


def test_a_profile_of_another_branch_does_not_load(
    fake_nvml_env: FakeNvmlEnv, fake_nvml_libs: FakeNvmlLibs
) -> None:
    env = fake_nvml_env(driver="575")
    env["LD_LIBRARY_PATH"] = str(fake_nvml_libs("580.82").parent)  # exports of branch 580
    proc = subprocess.run(
        [sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "NVMLError_DriverNotLoaded" in proc.stderr
    assert "driver_version 575.57.08 is not branch 580" in proc.stderr


def test_driver_profiles_play_real_driver_versions() -> None:
    def plays(version: str) -> str | None:
        found = driver_profile(version)
        return found.name if found is not None else None

    assert [plays(v) for v in ("535.247.01", "550.163.01", "570.172.08", "575.64")] == [
        "535",
        "550",
        "570",
        "575",
    ]
    assert plays("580.65.06") == plays("580.76.05") == "580.65"
    assert plays("580.82.07") == plays("580.95.05") == plays("590.44.01") == "580.82"
    assert plays("525.147.05") is None and plays("N/A") is None
    with pytest.raises(ValueError, match=r"535, 550, 570, 575, 580\.65, 580\.82"):
        driver_of(DGX_H100, "590")


# -------------------------------------------------------------------------------------------
# Call counts
# -------------------------------------------------------------------------------------------


def test_every_exported_nvml_function_is_counted(
    fake_nvml_env: FakeNvmlEnv, fake_nvml_lib: Path
) -> None:
    out = run_py(
        fake_nvml_env(),
        """
        from gpuconsole.sim.fakenvml import call_counts, reset_call_counts
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        reset_call_counts()
        pynvml.nvmlDeviceGetName(h)
        pynvml.nvmlDeviceGetName(h)
        pynvml.nvmlDeviceGetFieldValues(h, [83, 186])
        err(pynvml.nvmlDeviceGetFanSpeed, h)
        counts = call_counts()
        out = {"counts": counts,
               "exported": [n for n in counts if hasattr(pynvml.nvmlLib, n)]}
        """,
    )
    counts = out["counts"]
    assert sorted(out["exported"]) == sorted(counts)
    assert {k: v for k, v in counts.items() if v} == {
        "nvmlDeviceGetName": 2,
        "nvmlDeviceGetFieldValues": 1,
        "nvmlDeviceGetFanSpeed": 1,
    }
    nm = shutil.which("nm")
    if nm is not None:  # binutils comes with gcc
        symbols = subprocess.run(
            [nm, "-D", "--defined-only", str(fake_nvml_lib)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert sorted(s for s in symbols if s.startswith("nvml")) == sorted(counts)


def test_counts_file_records_a_gpustat_run(fake_nvml_env: FakeNvmlEnv, tmp_path: Path) -> None:
    gpustat = tool("gpustat", "pip install gpustat==1.1.1")
    counts = tmp_path / "counts.txt"
    env = fake_nvml_env(counts=counts)
    subprocess.run([gpustat, "--json"], env=env, capture_output=True, check=True, timeout=60)
    got = read_counts_file(counts)
    assert got["nvmlDeviceGetHandleByIndex_v2"] == 8
    assert got["nvmlDeviceGetMemoryInfo_v2"] == 8
    assert got["nvmlShutdown"] >= 1
    assert all(n > 0 for n in got.values())


# -------------------------------------------------------------------------------------------
# Other programs, unchanged
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", [DGX_H100, DGX_A100, APOLLO_PCIE], ids=lambda p: p.name)
def test_gpustat_json_matches_the_profile(fake_nvml_env: FakeNvmlEnv, profile: NodeProfile) -> None:
    gpustat = tool("gpustat", "pip install gpustat==1.1.1")
    proc = subprocess.run(
        [gpustat, "--json"],
        env=fake_nvml_env(profile, seed=7),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    gpus = report["gpus"]
    assert report["driver_version"] == profile.driver_version
    assert [g["index"] for g in gpus] == [s.index for s in profile.gpus]
    assert [g["name"] for g in gpus] == [profile.gpu_model.name] * len(profile.gpus)
    assert [g["uuid"] for g in gpus] == [gpu_uuid(profile.name, 7, s.index) for s in profile.gpus]
    assert {g["memory.total"] for g in gpus} == {profile.gpu_model.mem_bytes // 2**20}
    assert {g["enforced.power.limit"] for g in gpus} == {profile.gpu_model.tdp_w}
    assert all(g["fan.speed"] is None for g in gpus)  # no fans on these boards
    assert all(0 <= g["utilization.gpu"] <= 100 for g in gpus)


def test_gpustat_marks_a_lost_gpu(fake_nvml_env: FakeNvmlEnv) -> None:
    gpustat = tool("gpustat", "pip install gpustat==1.1.1")
    proc = subprocess.run(
        [gpustat, "--no-color"],
        env=fake_nvml_env(scenarios=["xid79 5"]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()[1:]
    assert "GPU is lost" in lines[5]
    assert all("H100" in line for k, line in enumerate(lines) if k != 5)


@pytest.mark.parametrize(
    ("profile", "scenarios"),
    [(DGX_H100, ["mig 0", "thermal 3"]), (DGX_A100, []), (APOLLO_PCIE, [])],
    ids=["dgx-h100", "dgx-a100", "apollo-pcie"],
)
def test_nvitop_once_shows_every_gpu(
    fake_nvml_env: FakeNvmlEnv, profile: NodeProfile, scenarios: list[str]
) -> None:
    nvitop = tool("nvitop", "pip install nvitop==1.7.2")
    env = {**fake_nvml_env(profile, scenarios=scenarios), "TERM": "xterm-256color"}
    env.update(COLUMNS="160", LINES="60")
    proc = subprocess.run(
        [nvitop, "--once"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "ERROR" not in proc.stderr and "FunctionNotFound" not in proc.stderr, proc.stderr
    assert f"Driver Version: {profile.driver_version}" in proc.stdout
    short = profile.gpu_model.name.removeprefix("NVIDIA ")
    for slot in profile.gpus:
        assert slot.bus_id in proc.stdout
    assert proc.stdout.count(short) == len(profile.gpus)
    if scenarios:
        assert "3g.40gb" in proc.stdout and "1g.10gb" in proc.stdout


@pytest.mark.parametrize("driver", DRIVERS, ids=lambda d: d.name)
def test_gpustat_and_nvitop_run_unchanged_on_every_driver_branch(
    fake_nvml_env: FakeNvmlEnv, driver: DriverProfile
) -> None:
    gpustat = tool("gpustat", "pip install gpustat==1.1.1")
    nvitop = tool("nvitop", "pip install nvitop==1.7.2")
    env = fake_nvml_env(DGX_H100, driver=driver, scenarios=["mig 0"], frozen_time=60.0)
    stat = subprocess.run(
        [gpustat, "--json"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert stat.returncode == 0, stat.stderr
    report = json.loads(stat.stdout)
    assert report["driver_version"] == driver.version
    assert len(report["gpus"]) == 8
    assert all(25 <= g["temperature.gpu"] < 90 for g in report["gpus"])
    env.update(TERM="xterm-256color", COLUMNS="160", LINES="60")
    top = subprocess.run(
        [nvitop, "--once"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert top.returncode == 0, top.stderr
    assert "ERROR" not in top.stderr and "FunctionNotFound" not in top.stderr, top.stderr
    assert f"Driver Version: {driver.version}" in top.stdout
    assert top.stdout.count("H100 80GB HBM3") == 8
    assert "3g.40gb" in top.stdout and "1g.10gb" in top.stdout
    temps = [int(t) for t in re.findall(r"│ N/A\s+(\d+)C ", top.stdout)]
    assert len(temps) == 8 and all(25 <= t < 90 for t in temps)


# -------------------------------------------------------------------------------------------
# The Python glue
# -------------------------------------------------------------------------------------------


def test_build_library_skips_a_fresh_build(fake_nvml_lib: Path) -> None:
    before = fake_nvml_lib.stat().st_mtime_ns
    assert build_library(fake_nvml_lib.parent.parent, driver_of(DGX_H100)) == fake_nvml_lib
    assert fake_nvml_lib.stat().st_mtime_ns == before
    assert not [p for p in fake_nvml_lib.parent.iterdir() if p.name.endswith(".tmp")]


def test_build_library_names_gcc_when_it_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FakeNvmlError, match="gcc"):
        build_library(tmp_path / "out", "580.82")
    assert not (tmp_path / "out" / "r580" / "libnvidia-ml.so.1").exists()


def test_scenarios_parse_in_both_spellings() -> None:
    assert parse_scenario("xid79 5 at 20") == ("xid79", 5, 20.0)
    assert parse_scenario("xid79:5@20") == ("xid79", 5, 20.0)
    assert parse_scenario("  mig   7 ") == ("mig", 7, None)
    assert parse_scenario("thermal:3") == ("thermal", 3, None)
    for bad in ("lava 3", "thermal", "thermal three", "xid 5", "ecc 2 at soon"):
        with pytest.raises(ValueError, match="scenario"):
            parse_scenario(bad)


def test_write_profile_rejects_a_gpu_the_node_lacks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GPU 8"):
        write_profile(DGX_H100, tmp_path / "p", scenarios=["thermal 8"])
    text = write_profile(DGX_H100, tmp_path / "q", scenarios=["xid79:5@20"]).read_text()
    assert "scenario xid79 5 at 20\n" in text
    assert text.count("\ngpu ") == 8


def test_require_peer_skips_or_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    require_peer("present", True, "nothing to do")  # returns quietly
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"gcc.*apt-get install gcc"):
        require_peer("gcc", False, "apt-get install gcc")
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="gcc"):
        require_peer("gcc", False, "apt-get install gcc")


def test_missing_gcc_fails_the_fixture_when_peers_are_required(tmp_path: Path) -> None:
    """The session fixture itself: skip without gcc, fail under GPUCONSOLE_REQUIRE_PEERS=1."""
    (tmp_path / "test_probe.py").write_text(
        "from tests.fakenvml_fixtures import fake_nvml_lib, fake_nvml_libs\n"
        "def test_probe(fake_nvml_lib):\n    pass\n"
    )
    root = Path(__file__).resolve().parent.parent
    base = {**os.environ, "PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(root)}
    if shutil.which("gcc", path=base["PATH"]):
        pytest.skip("gcc sits next to the interpreter; cannot hide it")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(tmp_path)]
    relaxed = {k: v for k, v in base.items() if k != REQUIRE_ENV}
    skipped = subprocess.run(cmd, env=relaxed, capture_output=True, text=True, cwd=tmp_path)
    assert "1 skipped" in skipped.stdout and "gcc" in skipped.stdout, skipped.stdout
    strict = {**base, REQUIRE_ENV: "1"}
    failed = subprocess.run(cmd, env=strict, capture_output=True, text=True, cwd=tmp_path)
    assert failed.returncode != 0 and "gcc" in failed.stdout, failed.stdout
