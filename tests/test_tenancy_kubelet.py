"""The kubelet's pod-resources API over a real gRPC unix socket, served from our own proto."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuconsole.sources.tenancy.kubelet import KubeletError, KubeletReader, parse_device_id
from tests.tenancy_fixtures import PodSpec, kubelet_server

G0 = "GPU-8a7f1b2c-3d4e-5f60-7182-93a4b5c6d7e8"
G1 = "GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
MIG = "MIG-0c1d2e3f-4a5b-5c6d-7e8f-9a0b1c2d3e4f"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder: unix socket paths may not exceed 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gck-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(
    ("device_id", "uuid", "replica", "index"),
    [
        (G0, G0, None, None),
        (MIG, MIG, None, None),
        (f"{G0}::3", G0, 3, None),
        (f"{G0}/vgpu2", G0, 2, None),
        ("5", None, None, 5),
        ("nvidia0", None, None, None),
        (f"{G0}::x", None, None, None),
    ],
)
def test_device_ids_are_read_as_dcgm_exporter_reads_them(
    device_id: str, uuid: str | None, replica: int | None, index: int | None
) -> None:
    parsed = parse_device_id(device_id)
    assert (parsed.uuid, parsed.replica, parsed.index) == (uuid, replica, index)


async def test_list_maps_gpu_mig_and_replica_ids_to_pod_namespace_container(
    short_dir: Path,
) -> None:
    sock = short_dir / "kubelet.sock"
    async with kubelet_server(sock) as kubelet:
        kubelet.pods = [
            PodSpec("team-nlp", "train-llm-7b-0", [("trainer", "nvidia.com/gpu", [G0, G1])]),
            PodSpec(
                "team-vision",
                "infer-0",
                [
                    ("server", "nvidia.com/mig-1g.10gb", [MIG]),
                    ("server", "example.com/foo", ["foo-1"]),  # not a GPU: ignored
                ],
            ),
            PodSpec("dev", "shell", [("sh", "nvidia.com/gpu.shared", [f"{G1}::1"])]),
        ]
        kubelet.allocatable = [("nvidia.com/gpu", [G0, G1]), ("cpu", ["x"])]
        reader = KubeletReader(str(sock), timeout_s=2.0)
        try:
            devices, allocatable = await reader.read()
        finally:
            await reader.close()
    rows = [(d.namespace, d.pod, d.container, d.resource, d.uuid, d.replica) for d in devices]
    assert rows == [
        ("team-nlp", "train-llm-7b-0", "trainer", "nvidia.com/gpu", G0, None),
        ("team-nlp", "train-llm-7b-0", "trainer", "nvidia.com/gpu", G1, None),
        ("team-vision", "infer-0", "server", "nvidia.com/mig-1g.10gb", MIG, None),
        ("dev", "shell", "sh", "nvidia.com/gpu.shared", G1, 1),
    ]
    assert allocatable == (G0, G1)


async def test_an_old_kubelet_without_allocatable_still_lists(short_dir: Path) -> None:
    sock = short_dir / "kubelet.sock"
    async with kubelet_server(sock) as kubelet:
        kubelet.pods = [PodSpec("a", "b", [("c", "nvidia.com/gpu", [G0])])]
        kubelet.allocatable_implemented = False
        reader = KubeletReader(str(sock), timeout_s=2.0)
        try:
            devices, allocatable = await reader.read()
        finally:
            await reader.close()
    assert [d.uuid for d in devices] == [G0] and allocatable is None


async def test_a_missing_socket_is_named() -> None:
    reader = KubeletReader("/nonexistent/pod-resources/kubelet.sock")
    with pytest.raises(KubeletError, match=r"kubelet socket /nonexistent/.*kubelet.sock not found"):
        await reader.read()


async def test_a_socket_nobody_listens_on_says_it_does_not_answer(short_dir: Path) -> None:
    sock = short_dir / "kubelet.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sock))  # bound, never listening: connection refused
    try:
        reader = KubeletReader(str(sock), timeout_s=1.0)
        with pytest.raises(KubeletError, match="does not answer"):
            await reader.read()
        await reader.close()
    finally:
        dead.close()
        os.unlink(sock)


def test_a_grpcio_older_than_the_stubs_costs_the_kubelet_part_only() -> None:
    """The generated stubs refuse an older grpcio at import (an image with grpcio 1.84 did
    this to `snapshot` on a real GPU node): the tenancy source still loads, and the kubelet
    read says why it cannot ask."""
    import subprocess
    import sys

    script = """
import asyncio, sys, tempfile
import grpc
grpc.__version__ = "1.0.0"  # what an older grpcio reports
from gpuconsole.sources.tenancy import TenancySource  # loads without the stubs
from gpuconsole.sources.tenancy.kubelet import KubeletError, KubeletReader
with tempfile.NamedTemporaryFile() as sock:
    try:
        asyncio.run(KubeletReader(sock.name).read())
    except KubeletError as exc:
        print("refused:", exc)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused: the kubelet's pod-resources API cannot be used here" in proc.stdout
    assert "grpcio>=" in proc.stdout


async def test_dra_claims_are_read_beside_device_plugin_pods(short_dir: Path) -> None:
    """Kubernetes 1.34's kubelet lists ResourceClaims' devices; NVIDIA's GPU driver names them
    by /dev/nvidiaN minor (and MIG placement); other DRA drivers hold no GPU."""
    sock = short_dir / "kubelet.sock"
    async with kubelet_server(sock) as kubelet:
        kubelet.pods = [
            PodSpec("team-nlp", "train-0", [("trainer", "nvidia.com/gpu", [G0])]),
            PodSpec(
                "gpu-test3",
                "pod1",
                claims=[
                    ("ctr", "single-gpu", [("gpu.nvidia.com", "node-7", "gpu-3")]),
                    ("ctr", "slice", [("gpu.nvidia.com", "node-7", "gpu-1-mig-19-4-2")]),
                    ("ctr", "imex", [("compute-domain.nvidia.com", "node-7", "channel-0")]),
                    ("ctr", "nic", [("sriovnetwork.example.com", "node-7", "vf-3")]),
                ],
            ),
        ]
        reader = KubeletReader(str(sock), timeout_s=2.0)
        try:
            devices, _allocatable = await reader.read()
        finally:
            await reader.close()
    assert [(d.pod, d.uuid) for d in devices[:1]] == [("train-0", G0)]
    claimed = devices[1:]
    assert [(d.namespace, d.pod, d.container, d.minor, d.mig_placement) for d in claimed] == [
        ("gpu-test3", "pod1", "ctr", 3, None),
        ("gpu-test3", "pod1", "ctr", 1, (4, 2)),
    ]
    dra = claimed[0].dra
    assert dra is not None
    assert (dra.claim, dra.driver, dra.pool, dra.device) == (
        "gpu-test3/single-gpu",
        "gpu.nvidia.com",
        "node-7",
        "gpu-3",
    )
