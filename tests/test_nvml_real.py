"""The NVML source on a real GPU node, as whichever user runs the tests (root or not).

Runs only where asked, with GPUCONSOLE_REAL_NVML=1, and then fails rather than skips when no
real driver answers: a run on a GPU node must not pass by skipping. Every check reads one
`gpuconsole doctor --json` run: what the real driver answered beside what the source made of it.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REQUESTED = os.environ.get("GPUCONSOLE_REAL_NVML", "") not in ("", "0")
pytestmark = pytest.mark.skipif(
    not REQUESTED, reason="a real GPU node only: set GPUCONSOLE_REAL_NVML=1 there"
)

BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
GIB = 1 << 30
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCONSOLE_FAKE_NVML_")}
    proc = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"NVML did not answer (exit {proc.returncode}): {proc.stderr.strip()}")
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def hidden_by_permission(report: dict[str, Any], bus_id: str, reading: str) -> bool:
    return any(
        h["why"] == "permission" and h["reading"] == reading and (h["gpu"] or "").startswith(bus_id)
        for h in report["hidden"]
    )


def test_a_real_driver_answers_in_under_a_minute(report: dict[str, Any]) -> None:
    library = report["identity"]["library"]
    assert library and Path(library).exists()
    assert not hasattr(ctypes.CDLL(library), "fake_nvml_function_count"), "this is the fake"
    assert re.fullmatch(r"\d+\.\d+(\.\d+)*", report["driver_version"] or "")
    assert report["cuda_driver_version"]
    assert report["gpus"], "NVML answered but counted no GPU"
    assert report["seconds"] < 60
    assert report["identity"]["uid"] == os.getuid()


def test_each_gpu_names_itself(report: dict[str, Any]) -> None:
    pci = [a for a in report["answers"] if a["function"] == "nvmlDeviceGetPciInfo"]
    for gpu in report["gpus"]:
        assert gpu["name"].startswith("NVIDIA"), gpu["name"]
        assert UUID.match(gpu["uuid"]), gpu["uuid"]
        assert BUS_ID.match(gpu["pci_bus_id"]), gpu["pci_bus_id"]
        assert gpu["pci_bus_id"] in {a["gpu"] for a in pci}
        vendor = Path("/sys/bus/pci/devices", gpu["pci_bus_id"], "vendor")
        if vendor.exists():  # a sandbox (gVisor) may show no PCI devices at all
            assert vendor.read_text().strip() == "0x10de", vendor


def test_no_gpu_is_marked_error_or_lost(report: dict[str, Any]) -> None:
    bad = {g["pci_bus_id"]: (g["state"], g["error"]) for g in report["gpus"] if g["state"] != "ok"}
    assert not bad, bad


def test_readings_hidden_by_permissions_are_said_so_not_faults(report: dict[str, Any]) -> None:
    denied = [a for a in report["answers"] if a["code_name"] == "NO_PERMISSION"]
    denied += [
        {**a, "function": f"field {e['field_id']}"}
        for a in report["answers"]
        for e in a["fields"]
        if e["code_name"] == "NO_PERMISSION"
    ]
    if ROOT:
        assert not denied, [(a["function"], a["arguments"]) for a in denied]
        return
    permission = [h for h in report["hidden"] if h["why"] == "permission"]
    assert {a["function"] for a in denied if a["phase"] != "probe"} <= {
        h["call"] for h in permission
    }
    for h in permission:
        assert "root" in h["explanation"], h
    for gpu in report["gpus"]:
        assert gpu["state"] == "ok", (gpu["pci_bus_id"], gpu["error"])


def test_memory_temperature_and_power_are_sane(report: dict[str, Any]) -> None:
    for gpu in report["gpus"]:
        bus = gpu["pci_bus_id"]
        if gpu["mem_total_bytes"] is None:
            assert not ROOT and hidden_by_permission(report, bus, "memory used/total"), bus
        else:
            assert GIB < gpu["mem_total_bytes"] <= 512 * GIB
            assert 0 <= gpu["mem_used_bytes"] <= gpu["mem_total_bytes"]
        assert gpu["temp_gpu_c"] is not None and 5 <= gpu["temp_gpu_c"] <= 110, bus
        assert gpu["power_w"] is not None and 5 <= gpu["power_w"] <= 1500, bus
        assert gpu["power_limit_w"] is not None and gpu["power_limit_w"] > 50, bus


def test_sm_count_and_pcie_link_are_known(report: dict[str, Any]) -> None:
    for gpu in report["gpus"]:
        assert gpu["sm_count"] and gpu["sm_count"] > 0, gpu["pci_bus_id"]
        pcie = gpu["pcie"]
        assert pcie["gen_max"] and pcie["width_max"], gpu["pci_bus_id"]
        assert pcie["gen_current"] is not None and pcie["gen_current"] <= pcie["gen_max"]


def test_nvlink_version_is_a_generation(report: dict[str, Any]) -> None:
    links = [link for g in report["gpus"] for link in g["nvlinks"] if link["active"]]
    if not links:
        pytest.skip("no active NVLink on this node")
    assert {link["version"] for link in links} <= {1, 2, 3, 4, 5}
