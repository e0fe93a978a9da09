"""Shared GPUs: which pod each process of a time-sliced GPU works for, each sharer's quota and
use, and a GPU whose sharers' quotas add up to more than it has."""

from __future__ import annotations

import json

import pytest

from gpuconsole.facts.ownership import OwnerKind, ProblemKind, resolve_owners
from gpuconsole.readings.nvml import GpuReading, NvmlReading, ProcessReading
from gpuconsole.readings.tenancy import HostProcess, PciGpu, PodDevice, ShareLimits, TenancyReading
from gpuconsole.sources.tenancy.sharing import CheckpointError, checkpoint_pods, share_limits

G0 = "GPU-8a7f1b2c-3d4e-5f60-7182-93a4b5c6d7e8"
UID_A = "0f9a3c1e-6b7d-4e52-9c01-2a3b4c5d6e7f"
UID_B = "1e2d3c4b-5a69-4788-9a0b-1c2d3e4f5a6b"
GIB = 1 << 30


def _checkpoint(entries: list[dict[str, object]]) -> bytes:
    return json.dumps({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}}).encode()


def test_the_kubelets_checkpoint_gives_each_replica_its_pods_uid() -> None:
    data = _checkpoint(
        [
            # since Kubernetes 1.20: device IDs by NUMA node
            {"PodUID": UID_A, "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
             "DeviceIDs": {"0": [f"{G0}::0"], "-1": [f"{G0}::3"]}, "AllocResp": "e30="},
            # before: a plain list
            {"PodUID": UID_B.upper(), "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
             "DeviceIDs": [f"{G0}::1"]},
            {"PodUID": "../../etc", "ResourceName": "nvidia.com/gpu", "DeviceIDs": ["x"]},
            {"PodUID": UID_A, "ResourceName": 7, "DeviceIDs": ["y"]},
            "not an entry",
        ]
    )  # fmt: skip
    assert checkpoint_pods(data) == {
        ("nvidia.com/gpu", f"{G0}::0"): UID_A,
        ("nvidia.com/gpu", f"{G0}::3"): UID_A,
        ("nvidia.com/gpu", f"{G0}::1"): UID_B,
    }


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\x00\xff{", "not JSON"),
        (b"[1, 2]", "no Data.PodDeviceEntries"),
        (b'{"Data": {"PodDeviceEntries": 3}}', "no Data.PodDeviceEntries"),
        (b'{"Data": "x"}', "no Data.PodDeviceEntries"),
        (b"[" * 100_000, "not JSON"),
        (b" " * (17 << 20), "larger than 16 MiB"),
    ],
)
def test_a_checkpoint_that_is_not_the_kubelets_is_refused_with_a_reason(
    data: bytes, says: str
) -> None:
    with pytest.raises(CheckpointError, match=says):
        checkpoint_pods(data)


@pytest.mark.parametrize(
    ("env", "limits"),
    [
        ({"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_SM_LIMIT": "30"},
         ShareLimits(3000 << 20, 30.0, "hami")),
        ({"CUDA_DEVICE_MEMORY_LIMIT": "20g"}, ShareLimits(20 * GIB, None, "hami")),
        ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10G,1=20G",
          "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}, ShareLimits(10 * GIB, 25.0, "mps")),
        ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "12.5"}, ShareLimits(None, 12.5, "mps")),
        ({"PATH": "/usr/bin"}, None),
        # what a tenant may write that means nothing: no quota, not a crash
        ({"CUDA_DEVICE_MEMORY_LIMIT_0": "lots", "CUDA_DEVICE_SM_LIMIT": "250"}, None),
        ({"CUDA_DEVICE_MEMORY_LIMIT_0": "9" * 5000}, None),
        ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "\u0665\u0660"}, None),
    ],
)  # fmt: skip
def test_a_sharers_quota_is_read_from_its_environment(
    env: dict[str, str], limits: ShareLimits | None
) -> None:
    assert share_limits(env) == limits


def _shared(limits: tuple[ShareLimits | None, ...], total: int = 80 * GIB) -> TenancyReading:
    """One GPU, replicas 0..n-1 to pods p0..pn-1, each with one process under `limits`."""
    uids = [f"0000000{k}-aaaa-bbbb-cccc-dddddddddddd" for k in range(len(limits))]
    pods = tuple(
        PodDevice("ns", f"p{k}", "main", "nvidia.com/gpu", f"{G0}::{k}", G0, k, pod_uid=uids[k])
        for k in range(len(limits))
    )
    processes = tuple(
        HostProcess(
            100 + k,
            "python3",
            f"/kubepods.slice/kubepods-pod{uids[k].replace('-', '_')}.slice/cri-containerd-"
            + "ab" * 32
            + ".scope",
            pod_uid=uids[k],
            limits=lim,
        )
        for k, lim in enumerate(limits)
    )
    return TenancyReading(
        at=0.0,
        gpus=(PciGpu(bus_id="0000:1b:00.0", driver="nvidia", uuid=G0, minor=0),),
        pod_devices=pods,
        processes=processes,
    )


def _nvml(count: int, total: int = 80 * GIB) -> NvmlReading:
    gpu = GpuReading(
        index=0,
        uuid=G0,
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id="00000000:1B:00.0",
        mem_total_bytes=total,
        processes=tuple(ProcessReading(100 + k, (k + 1) * GIB) for k in range(count)),
    )
    return NvmlReading(
        at=0.0, driver_version="550", nvml_version="12", cuda_driver_version="12.4", gpus=(gpu,)
    )


def test_each_sharers_processes_are_its_own_with_their_memory_and_quota() -> None:
    hami = ShareLimits(20 * GIB, 30.0, "hami")
    gpu = resolve_owners(_nvml(3), _shared((hami, hami, hami))).gpus[0]
    assert [(o.label, o.pids, o.mem_used_bytes, o.limits) for o in gpu.owners] == [
        ("pod ns/p0", (100,), 1 * GIB, hami),
        ("pod ns/p1", (101,), 2 * GIB, hami),
        ("pod ns/p2", (102,), 3 * GIB, hami),
    ]
    assert [p.owner.label for p in gpu.processes] == ["pod ns/p0", "pod ns/p1", "pod ns/p2"]
    assert gpu.problems == ()  # 60 GiB and 90 % of SMs: within what it has


def test_sharers_whose_quotas_exceed_the_gpu_are_flagged() -> None:
    big = ShareLimits(32 * GIB, 40.0, "hami")
    gpu = resolve_owners(_nvml(3), _shared((big, big, big))).gpus[0]
    assert [p.kind for p in gpu.problems] == [ProblemKind.OVERSUBSCRIBED]
    message = gpu.problems[0].message
    assert "pod ns/p0, pod ns/p1, pod ns/p2" in message
    assert "memory quotas add up to 96.0 GiB, the GPU has 80.0 GiB" in message
    assert "SM quotas add up to 120 %" in message


def test_without_the_checkpoint_a_shared_gpus_processes_stay_by_pod_uid() -> None:
    tenancy = _shared((None, None))
    blind = TenancyReading(
        at=0.0,
        gpus=tenancy.gpus,
        pod_devices=tuple(
            PodDevice(d.namespace, d.pod, d.container, d.resource, d.device_id, d.uuid, d.replica)
            for d in tenancy.pod_devices
        ),
        processes=tenancy.processes,
    )
    gpu = resolve_owners(_nvml(2), blind).gpus[0]
    assert [o.label for o in gpu.owners] == ["pod ns/p0", "pod ns/p1"]
    assert all(p.owner.kind is OwnerKind.POD for p in gpu.processes)
    assert [p.owner.name for p in gpu.processes] == [
        "pod-uid 00000000-aaaa-bbbb-cccc-dddddddddddd",
        "pod-uid 00000001-aaaa-bbbb-cccc-dddddddddddd",
    ]
