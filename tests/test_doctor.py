"""`gpuconsole doctor` on the fake libnvidia-ml.so.1: every NVML call the source makes, what
the driver answered, what the source made of it, and what this user cannot see.

Each run is a child process that finds the library as on a GPU node (LD_LIBRARY_PATH or
--library), so the fake's own call counts say which C functions the source really called.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuconsole.readings.base import normal_bus_id
from gpuconsole.sim.fakenvml import read_counts_file
from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_H100
from gpuconsole.sources.nvml.doctor import profiling_admin_only
from tests.fakenvml_fixtures import FakeNvmlEnv


def doctor(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuconsole", "doctor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def doctor_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = doctor(env, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def source_field_answers(report: dict[str, Any], bus_id: str) -> list[dict[str, Any]]:
    """The entries of the source's own table batch (not the doctor's probe) for one GPU."""
    batches = [
        a
        for a in report["answers"]
        if a["function"] == "nvmlDeviceGetFieldValues"
        and a["phase"] != "probe"
        and a["gpu"] == bus_id
        and any(f["field_id"] == 186 for f in a["fields"])  # power: the table's, not links'
    ]
    assert batches, f"no table batch for {bus_id}"
    entries: list[dict[str, Any]] = batches[0]["fields"]
    return entries


def test_doctor_names_every_nvml_function_the_source_called(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    counts = tmp_path / "counts.txt"
    env = fake_nvml_env(DGX_H100, scenarios=["mig 7"], counts=counts)
    report = doctor_json(env)
    called = {name for name, n in read_counts_file(counts).items() if n}
    named = {s for a in report["answers"] for s in a["symbols"] if not s.endswith("(missing)")}
    # Every C function the library counted is in the report, and nothing it did not count.
    assert named == called
    assert {"nvmlDeviceGetFieldValues", "nvmlGpmMetricsGet", "nvmlGpuInstanceGetInfo"} <= called
    text = doctor(env)
    assert text.returncode == 0, text.stderr
    for function in {a["function"] for a in report["answers"]} | called:
        assert function in text.stdout, function
    total = sum(a["times"] for a in report["answers"])
    assert total == report["calls"]


def test_doctor_shows_what_the_driver_answered_beside_what_the_source_made_of_it(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    report = doctor_json(fake_nvml_env(DGX_H100, missing_fields=[82]))
    first = normal_bus_id(DGX_H100.gpus[0].bus_id)
    assert [g["pci_bus_id"] for g in report["gpus"]] == [
        normal_bus_id(s.bus_id) for s in DGX_H100.gpus
    ]
    assert report["driver_version"] == DGX_H100.driver_version
    gpu = report["gpus"][0]
    assert gpu["state"] == "ok" and gpu["temp_gpu_c"] is not None
    assert gpu["temp_hbm_c"] is None  # the driver has no field 82
    entries = {e["field_id"]: e for e in source_field_answers(report, first)}
    assert entries[82]["code_name"] == "NOT_SUPPORTED" and entries[82]["value"] is None
    power = entries[186]
    assert power["code_name"] == "SUCCESS" and power["value_type_name"] in VALUE_TYPE_NAMES
    assert gpu["power_w"] == pytest.approx(power["value"] / 1000.0, rel=0.2)
    temps = [  # 550 has no nvmlDeviceGetTemperatureV: the source asks the older call
        a
        for a in report["answers"]
        if a["function"] == "nvmlDeviceGetTemperature" and a["gpu"] == first
    ]
    assert temps[0]["code_name"] == "SUCCESS" and temps[0]["value_type"] == "int"
    hidden = [h for h in report["hidden"] if h["gpu"] == first]
    assert {
        "gpu": first,
        "reading": "HBM temperature",
        "call": "field 82",
        "code_name": "NOT_SUPPORTED",
        "why": "unsupported",
        "explanation": "not supported by this GPU or driver",
    } in hidden
    assert not [h for h in report["hidden"] if h["why"] == "permission"]  # root sees all


def test_doctor_reads_the_field_ids_that_moved_between_drivers(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    report = doctor_json(fake_nvml_env(APOLLO_PCIE))
    probes = [a for a in report["answers"] if a["phase"] == "probe"]
    assert [p["gpu"] for p in probes] == [normal_bus_id(s.bus_id) for s in APOLLO_PCIE.gpus]
    for probe in probes:
        ids = {e["field_id"] for e in probe["fields"]}
        assert {74, 76, 251, 252, 253, 269, 270, 271} <= ids
        for entry in probe["fields"]:
            assert (entry["value"] is None) == (entry["code_name"] != "SUCCESS"), entry


def test_doctor_names_mig_instances_by_their_gpu(fake_nvml_env: FakeNvmlEnv) -> None:
    report = doctor_json(fake_nvml_env(DGX_H100, scenarios=["mig 7"]))
    parent = normal_bus_id(DGX_H100.gpus[7].bus_id)
    memory = [
        a
        for a in report["answers"]
        if a["function"] == "nvmlDeviceGetMemoryInfo" and "MIG slot" in a["arguments"][0]
    ]
    assert [a["arguments"][0] for a in memory] == [f"{parent} MIG slot {n}" for n in range(4)]
    assert all(a["gpu"] == parent and a["code_name"] == "SUCCESS" for a in memory)
    gpu = report["gpus"][7]
    assert [m["mem_used_bytes"] for m in gpu["mig_instances"]] == [
        a["value"]["used"] for a in memory
    ]


def test_without_a_driver_doctor_says_so_and_exits_1(fake_nvml_env: FakeNvmlEnv) -> None:
    env = {k: v for k, v in fake_nvml_env().items() if k != "GPUCONSOLE_FAKE_NVML_PROFILE"}
    proc = doctor(env, "--json")
    assert proc.returncode == 1
    assert "NVIDIA kernel driver is not loaded" in proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert report["answers"][0]["function"] == "nvmlInit"
    assert report["answers"][0]["code_name"] == "DRIVER_NOT_LOADED"
    text = doctor(env)
    assert text.returncode == 1 and "FAILED" in text.stdout and "Traceback" not in text.stderr


def test_a_library_that_cannot_load_is_named(tmp_path: Path) -> None:
    absent = tmp_path / "libnvidia-ml.so.1"
    proc = doctor(dict(os.environ), "--library", str(absent))
    assert proc.returncode == 1
    assert str(absent) in proc.stderr and "cannot be loaded" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)
def test_without_libnvidia_ml_doctor_says_so_and_exits_1() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    proc = doctor(env)
    assert proc.returncode == 1
    assert "libnvidia-ml.so.1 not found" in proc.stderr and "Traceback" not in proc.stderr


def test_doctor_loads_the_library_it_is_given(
    fake_nvml_env: FakeNvmlEnv, fake_nvml_lib: Path
) -> None:
    # on the driver fake_nvml_lib is built for
    env = fake_nvml_env(APOLLO_PCIE, driver="550")
    env = {k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
    report = doctor_json(env, "--library", str(fake_nvml_lib))
    assert Path(report["identity"]["library"]).resolve() == fake_nvml_lib.resolve()
    assert len(report["gpus"]) == len(APOLLO_PCIE.gpus)
    assert report["identity"]["uid"] == os.getuid()


def test_a_gpu_name_never_reaches_the_terminal_raw(fake_nvml_env: FakeNvmlEnv) -> None:
    hostile = "H100\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J"
    model = msgspec.structs.replace(DGX_H100.gpu_model, name=hostile)
    env = fake_nvml_env(dataclasses.replace(DGX_H100, gpu_model=model))
    proc = doctor(env)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "H100\\x1b]52;c;cm0gLXJmIH4K\\x07\\x1b[2J" in proc.stdout
    report = doctor_json(env)
    assert hostile in [a["value"] for a in report["answers"]]  # the driver's answer, exact
    # what the source made of it: written out where it entered, as every output shows it
    assert report["gpus"][0]["name"] == "H100\\x1b]52;c;cm0gLXJmIH4K\\x07\\x1b[2J"


def test_doctor_gives_up_on_a_driver_that_does_not_answer_in_time(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    proc = doctor(fake_nvml_env(DGX_H100), "--timeout", "0.001")
    assert proc.returncode == 3
    assert "the driver did not answer within 0.001 s" in proc.stderr
    assert proc.stdout.startswith("gpuconsole doctor: NVML as")
    assert "Traceback" not in proc.stderr


def test_a_closed_pipe_ends_doctor_quietly(fake_nvml_env: FakeNvmlEnv) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "gpuconsole", "doctor"],
        env=fake_nvml_env(DGX_H100),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith("gpuconsole doctor")
        proc.stdout.close()
        stderr = proc.stderr.read()
        assert proc.wait(timeout=60) == 0
    assert "Traceback" not in stderr


def test_profiling_switch_is_read_from_the_driver_parameters(tmp_path: Path) -> None:
    params = tmp_path / "params"
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\nRmLogonRC: 1\n")
    assert profiling_admin_only(params) == (True, f"{params}: RmProfilingAdminOnly: 1")
    params.write_text("RmProfilingAdminOnly: 0\n")
    assert profiling_admin_only(params)[0] is False
    assert profiling_admin_only(tmp_path / "absent")[0] is None


VALUE_TYPE_NAMES = {
    "DOUBLE",
    "UNSIGNED_INT",
    "UNSIGNED_LONG",
    "UNSIGNED_LONG_LONG",
    "SIGNED_LONG_LONG",
    "SIGNED_INT",
    "UNSIGNED_SHORT",
}


def test_doctor_says_what_a_user_without_root_cannot_see(fake_nvml_env: FakeNvmlEnv) -> None:
    report = doctor_json(fake_nvml_env(DGX_H100, scenarios=["mig 7"], privileged=False))
    parent = normal_bus_id(DGX_H100.gpus[7].bus_id)
    denied = {(h["gpu"], h["reading"]) for h in report["hidden"] if h["why"] == "permission"}
    assert {
        (parent, "memory used/total"),
        (parent, "processes"),
        (parent, "MIG instance placement and profile"),
    } <= denied
    refused = {
        (a["gpu"], a["function"]) for a in report["answers"] if a["code_name"] == "NO_PERMISSION"
    }
    assert {(gpu, call) for gpu, call in refused} <= {
        (h["gpu"].split(" MIG")[0], h["call"]) for h in report["hidden"] if h["why"] == "permission"
    }
    assert all(
        "needs root" in h["explanation"] for h in report["hidden"] if h["why"] == "permission"
    )
    text = doctor(fake_nvml_env(DGX_H100, scenarios=["mig 7"], privileged=False)).stdout
    assert "Readings this user cannot see: none" not in text
    assert f"{parent}" in text.split("Not supported here")[0]
