"""The GPU series an agent exports from NVML on the fake libnvidia-ml.so.1: a series NVML did
not answer is left out, never exported as 0."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client.samples import Sample

from gpuconsole.sim.profiles import DGX_H100
from tests.export_fixtures import parse
from tests.fakenvml_fixtures import FakeNvmlEnv

METRICS = """
import asyncio, time
from gpuconsole.export.collector import MetricsCache
from gpuconsole.hub import Hub
from gpuconsole.sources.nvml.source import NvmlSource
hub = Hub()
hub.add_source(NvmlSource("n", events=False, detail_every=1))
snapshot = asyncio.run(hub.poll_once(rounds=2, between=lambda: time.sleep(0.15)))
print(MetricsCache(lambda: snapshot).render().decode())
"""


def scrape(env: dict[str, str]) -> dict[str, list[Sample]]:
    proc = subprocess.run(
        [sys.executable, "-c", METRICS], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return parse(proc.stdout)


def of_gpu(samples: dict[str, list[Sample]], gpu: int) -> dict[str, list[Sample]]:
    """The samples of one GPU (MIG instances' included), by name."""
    out: dict[str, list[Sample]] = {}
    for name, found in samples.items():
        mine = [s for s in found if s.labels.get("gpu") == str(gpu)]
        if mine:
            out[name] = mine
    return out


def node_env(fake_nvml_env: FakeNvmlEnv) -> dict[str, str]:
    """An unprivileged reader of a DGX H100: GPU 7 in MIG mode, GPU 2 that cannot be opened,
    GPU 3 that answers nothing but its name, GPU 1 on a driver without memory v2."""
    return fake_nvml_env(
        DGX_H100,
        scenarios=["mig 7", "notsupported 3"],
        privileged=False,
        open_errors={2: 4},
        faults=["1 nvmlDeviceGetMemoryInfo_v2 13"],
    )


def test_a_gpu_nvml_cannot_open_is_exported_as_there_not_as_zeros(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    unread = of_gpu(scrape(node_env(fake_nvml_env)), 2)
    assert set(unread) == {"gpuconsole_gpu_health", "gpuconsole_gpu_lost", "gpuconsole_gpu_info"}
    assert [s.value for s in unread["gpuconsole_gpu_lost"]] == [0.0]
    health = {s.labels["state"]: s.value for s in unread["gpuconsole_gpu_health"]}
    assert health["unknown"] == 1.0


def test_series_nvml_did_not_answer_are_left_out(fake_nvml_env: FakeNvmlEnv) -> None:
    samples = scrape(node_env(fake_nvml_env))
    # memory v1 has no reservation: used and free, no reserved
    v1 = of_gpu(samples, 1)
    assert "DCGM_FI_DEV_FB_USED" in v1 and "DCGM_FI_DEV_FB_FREE" in v1
    assert "DCGM_FI_DEV_FB_RESERVED" not in v1
    # a GPU that answers nothing but its name has no link state to be downtrained from
    assert "gpuconsole_gpu_pcie_downtrained" not in of_gpu(samples, 3)
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in of_gpu(samples, 3)
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" in of_gpu(samples, 0)
    assert "gpuconsole_gpu_pcie_downtrained" in of_gpu(samples, 0)


def test_what_only_root_may_read_is_not_exported_to_anyone_else(fake_nvml_env: FakeNvmlEnv) -> None:
    samples = scrape(node_env(fake_nvml_env))
    # the MIG GPU's own memory is root's to read; its instances' is anyone's
    fb = of_gpu(samples, 7)["DCGM_FI_DEV_FB_USED"]
    assert sorted(s.labels.get("GPU_I_ID", "whole GPU") for s in fb) == ["1", "2", "3", "4"]
    # GPM is admin-only: no profiling ratio for any GPU
    assert "DCGM_FI_PROF_SM_ACTIVE" not in samples
