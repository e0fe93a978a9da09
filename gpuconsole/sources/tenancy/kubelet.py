"""Kubernetes: which pod and container each GPU (or MIG instance, or replica) belongs to.

Asks the kubelet's pod-resources API v1 (List, GetAllocatableResources) on its unix
socket, over grpc.aio on the hub's loop. Device IDs are read as dcgm-exporter reads them:
`GPU-<uuid>` and `MIG-<uuid>` name a GPU or MIG device, `<uuid>::<n>` is replica n of a
time-sliced GPU, GKE writes `<uuid>/vgpu<n>`, and `--device-id-strategy=index` gives a
bare index. Only NVIDIA resources (nvidia.com/gpu, nvidia.com/mig-*) are kept.

Devices a ResourceClaim allocated (Kubernetes DRA; listed by default from 1.34, the
KubeletPodResourcesDynamicResources gate) come as each container's dynamic resources. NVIDIA's
DRA driver (gpu.nvidia.com) names a GPU `gpu-<minor>` after its /dev/nvidia<minor> and a MIG
device `gpu-<minor>-mig-<profile id>-<placement start>-<placement size>`; other drivers
(compute-domain.nvidia.com's IMEX channels, NICs) hold no GPU and are left out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from gpuconsole.config import DEFAULTS
from gpuconsole.readings.tenancy import DraDevice, PodDevice

__all__ = [
    "DRA_GPU_DRIVER",
    "KubeletError",
    "KubeletReader",
    "ParsedDeviceId",
    "gpu_resource",
    "parse_device_id",
    "pod_devices",
]

# dcgm-exporter's filter: the GPU resource and every MIG resource of the mixed strategy
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
DRA_GPU_DRIVER = "gpu.nvidia.com"
_DRA_GPU = re.compile(r"gpu-([0-9]{1,9})", re.ASCII)
_DRA_MIG = re.compile(r"gpu-([0-9]{1,9})-mig-([0-9]{1,9})-([0-9]{1,9})-([0-9]{1,9})", re.ASCII)
_GKE_VGPU = re.compile(r"^(.*)/vgpu([0-9]{1,9})$", re.ASCII)
# A device plugin's numbers are ASCII decimals: str.isdigit() also takes "²" (which int()
# refuses) and int() reads "\u0661" as 1 and raises on 5,000 digits.
_DECIMAL = re.compile(r"[0-9]{1,9}", re.ASCII)


class KubeletError(Exception):
    """The kubelet cannot be asked: socket missing, refused, or the call failed; says which."""


@dataclass(frozen=True, slots=True)
class ParsedDeviceId:
    """A device plugin's device ID, taken apart."""

    uuid: str | None  # GPU-... or MIG-...
    replica: int | None = None
    index: int | None = None


def gpu_resource(name: str) -> bool:
    """True for the NVIDIA GPU resources dcgm-exporter maps (shared ones included)."""
    return (
        name == GPU_RESOURCE
        or name.startswith(GPU_RESOURCE + ".")  # renamed shared resources: nvidia.com/gpu.shared
        or name.startswith(MIG_RESOURCE_PREFIX)
    )


def parse_device_id(device_id: str) -> ParsedDeviceId:
    """'GPU-x', 'MIG-x', 'GPU-x::3', 'GPU-x/vgpu3' or '5'; anything else has no UUID."""
    text = device_id.strip()
    replica: int | None = None
    base, sep, rest = text.partition("::")
    if sep:
        if not _DECIMAL.fullmatch(rest):
            return ParsedDeviceId(None)
        text, replica = base, int(rest)
    gke = _GKE_VGPU.match(text)
    if gke:
        text, replica = gke.group(1), int(gke.group(2))
    if text.startswith(("GPU-", "MIG-")) and len(text) > 4:
        return ParsedDeviceId(text, replica)
    if _DECIMAL.fullmatch(text) and replica is None:
        return ParsedDeviceId(None, index=int(text))
    return ParsedDeviceId(None)


def dra_target(device: str) -> tuple[int | None, tuple[int, int] | None]:
    """(the GPU's minor, (MIG placement start, size) or None) that NVIDIA's DRA driver
    names by `device`; (None, None) for a name it does not write."""
    mig = _DRA_MIG.fullmatch(device)
    if mig:
        return int(mig.group(1)), (int(mig.group(3)), int(mig.group(4)))
    gpu = _DRA_GPU.fullmatch(device)
    return (int(gpu.group(1)), None) if gpu else (None, None)


def _claimed(pod: Any, container: Any) -> list[PodDevice]:
    """The GPUs a container holds through ResourceClaims (DRA)."""
    out = []
    for claim in getattr(container, "dynamic_resources", ()):
        for resource in claim.claim_resources:
            if resource.driver_name != DRA_GPU_DRIVER:
                continue
            minor, placement = dra_target(resource.device_name)
            out.append(
                PodDevice(
                    namespace=pod.namespace,
                    pod=pod.name,
                    container=container.name,
                    resource=resource.driver_name,
                    device_id=resource.device_name,
                    uuid=None,
                    dra=DraDevice(
                        claim_name=claim.claim_name,
                        claim_namespace=claim.claim_namespace,
                        driver=resource.driver_name,
                        pool=resource.pool_name,
                        device=resource.device_name,
                    ),
                    minor=minor,
                    mig_placement=placement,
                )
            )
    return out


def pod_devices(response: Any) -> tuple[PodDevice, ...]:
    """The NVIDIA devices of a ListPodResourcesResponse: one entry per device plugin ID,
    then one per device a ResourceClaim gave the container."""
    out = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    parsed = parse_device_id(device_id)
                    out.append(
                        PodDevice(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            resource=devices.resource_name,
                            device_id=device_id,
                            uuid=parsed.uuid,
                            replica=parsed.replica,
                            index=parsed.index,
                        )
                    )
            out += _claimed(pod, container)
    return tuple(out)


def allocatable_ids(response: Any) -> tuple[str, ...]:
    """The NVIDIA device IDs of an AllocatableResourcesResponse."""
    return tuple(
        device_id
        for devices in response.devices
        if gpu_resource(devices.resource_name)
        for device_id in devices.device_ids
    )


def _describe(exc: grpc.aio.AioRpcError, socket: str) -> str:
    code = exc.code()
    detail = exc.details() or ""
    if code is grpc.StatusCode.UNAVAILABLE:
        return f"kubelet socket {socket} does not answer: {detail}".rstrip(": ")
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return f"kubelet at {socket} does not offer this call ({detail or 'unimplemented'})"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"kubelet at {socket} did not answer in time"
    return f"kubelet at {socket}: {code.name.lower()}: {detail}"


def _api() -> tuple[Any, Any]:
    """The generated pod-resources modules (api_pb2, api_pb2_grpc), imported on first use: the
    generated code refuses, at import, a grpcio or protobuf older than the one that made it,
    and that must cost the kubelet part only, not the whole source (or `snapshot`)."""
    try:
        from gpuconsole.sources.tenancy.proto import api_pb2, api_pb2_grpc
    except Exception as exc:  # RuntimeError, protobuf's VersionError, ImportError
        raise KubeletError(f"the kubelet's pod-resources API cannot be used here: {exc}") from None
    return api_pb2, api_pb2_grpc


class KubeletReader:
    """One grpc.aio channel to the kubelet's pod-resources socket, opened on first use."""

    def __init__(
        self,
        socket: str = DEFAULTS.tenancy.kubelet_socket,
        *,
        timeout_s: float = 5.0,
        stub: Any = None,
    ) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = stub  # given: an object shaped like the generated stub (simulator)
        self._fixed = stub is not None

    def _ensure(self) -> Any:
        if self._fixed:
            return self._stub
        if not os.path.exists(self.socket):
            raise KubeletError(f"kubelet socket {self.socket} not found")
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{os.path.abspath(self.socket)}")
            self._stub = _api()[1].PodResourcesListerStub(self._channel)
        return self._stub

    async def read(self) -> tuple[tuple[PodDevice, ...], tuple[str, ...] | None]:
        """(allocated devices, allocatable device IDs or None when the kubelet lacks that)."""
        stub = self._ensure()
        api_pb2 = _api()[0]
        try:
            listed = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            await self.close()  # a restarted kubelet means a new socket inode
            raise KubeletError(_describe(exc, self.socket)) from None
        allocatable: tuple[str, ...] | None
        try:
            response = await stub.GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self.timeout_s
            )
            allocatable = allocatable_ids(response)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise KubeletError(_describe(exc, self.socket)) from None
            allocatable = None  # kubelets before 1.21 (or with the feature gate off)
        return pod_devices(listed), allocatable

    async def close(self) -> None:
        if self._fixed:
            return
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()


def unknown_ids(devices: Iterable[PodDevice]) -> tuple[str, ...]:
    """Device IDs that name no UUID and no index: a plugin strategy this does not know."""
    return tuple(d.device_id for d in devices if d.uuid is None and d.index is None)
