"""Tenancy readings: what the tenancy source alone knows about who holds each GPU.

The source reports facts from below NVML (PCI drivers and IOMMU groups, libvirt guests,
QEMU command lines, kubelet allocations, the cgroups of processes holding /dev/nvidia*),
with tenants already mapped from the config. Who owns which GPU needs NVML's view as
well (UUIDs, processes, MIG instances, lost GPUs): `gpuconsole.facts.ownership` merges both.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Annotated

import msgspec

from gpuconsole.readings.base import CounterSample, Key, PartStatus
from gpuconsole.readings.nvml import GpuReading

__all__ = [
    "ACTIVE_GUEST_STATES",
    "Guest",
    "GuestGpu",
    "HostProcess",
    "IommuPeer",
    "OwnerKind",
    "PartStatus",
    "PciGpu",
    "PodDevice",
    "TenancyReading",
]


class OwnerKind(enum.StrEnum):
    """What holds a GPU or MIG instance."""

    VM = "vm"  # a KVM guest, through vfio-pci passthrough
    POD = "pod"  # a Kubernetes pod, through the device plugin
    JOB = "job"  # a Slurm job
    PROCESS = "process"  # a process (or a non-Kubernetes container) on the host
    FREE = "free"  # nobody: in the host pool (nvidia) or the passthrough pool (vfio-pci)
    UNAVAILABLE = "unavailable"  # nobody can use it: lost, unbound, or bound elsewhere


class IommuPeer(msgspec.Struct, frozen=True):
    """Another PCI function in a GPU's IOMMU group, and the driver holding it."""

    bus_id: str
    pci_class: int | None
    driver: str | None

    @property
    def bridge(self) -> bool:
        """PCI bridges stay with the host; VFIO does not need them assigned."""
        return self.pci_class is not None and self.pci_class >> 8 == 0x0604


class PciGpu(msgspec.Struct, frozen=True):
    """A GPU as sysfs shows it, whichever driver holds it (NVML cannot see vfio-pci ones)."""

    bus_id: str  # sysfs form, 0000:1b:00.0
    device_id: int | None = None
    driver: str | None = None  # "nvidia", "vfio-pci", or None when no driver is bound
    driver_override: str | None = None
    iommu_group: int | None = None
    iommu_peers: tuple[IommuPeer, ...] = ()
    numa_node: int | None = None
    # From /proc/driver/nvidia/gpus/BDF/information, present while nvidia holds the GPU.
    uuid: str | None = None
    model: str | None = None
    minor: int | None = None  # N of /dev/nvidiaN
    bound_since: float | None = None  # when this source first saw the current driver


# Guests in these states hold their devices (virsh names).
ACTIVE_GUEST_STATES = frozenset({"running", "paused", "blocked", "in shutdown", "pmsuspended"})


class Guest(msgspec.Struct, frozen=True):
    """A KVM guest and the PCI functions it holds, from libvirt or a QEMU command line."""

    name: str
    state: str  # running, paused, shut off, crashed, ... as virsh prints them
    bus_ids: tuple[str, ...]  # <hostdev> PCI addresses (or vfio-pci,host=), sysfs form
    source: str  # "libvirt" or "qemu"
    uuid: str | None = None
    tenant: str | None = None
    pid: int | None = None  # the QEMU process, when known
    since: float | None = None
    since_observed: bool = True  # since is when gpuconsole first saw it, not when it began
    problems: tuple[str, ...] = ()  # e.g. a <hostdev> without an address
    # its virtio-vsock context id (<vsock><cid address=.../>): where a guest agent answers
    vsock_cid: int | None = None
    # (host bus id, the bus id the guest sees it at), both sysfs form, per <hostdev> that
    # names a guest address: how a guest agent's GPU is known on the host
    addresses: tuple[tuple[str, str], ...] = ()

    @property
    def active(self) -> bool:
        """Running guests (and paused or suspended ones) hold their devices."""
        return self.state in ACTIVE_GUEST_STATES


# Kubernetes names, as the API server takes them: a namespace and a container are DNS
# labels (63 characters at most), a pod, a claim, a DRA driver and pool DNS subdomains
# (253). A pod's are labels of every series of its GPU (dcgm-exporter's pod, namespace,
# container): a reading decoded from elsewhere (an agent) with a longer one is refused.
K8sLabel = Annotated[str, msgspec.Meta(max_length=63)]
K8sName = Annotated[str, msgspec.Meta(max_length=253)]


class DraDevice(msgspec.Struct, frozen=True):
    """A device a ResourceClaim gave a container (Kubernetes DRA), as the kubelet names it:
    dcgm-exporter's dra_claim_name, dra_claim_namespace, dra_driver_name, dra_pool_name and
    dra_device_name labels."""

    claim_name: K8sName
    claim_namespace: K8sLabel
    driver: K8sName  # gpu.nvidia.com for NVIDIA's DRA driver
    pool: K8sName  # the driver's pool: the node's name for node-local GPUs
    device: K8sName  # gpu-<minor>, or gpu-<minor>-mig-<profile>-<start>-<size> for a MIG device

    @property
    def claim(self) -> str:
        return f"{self.claim_namespace}/{self.claim_name}"


class PodDevice(msgspec.Struct, frozen=True):
    """One device the kubelet allocated to a container, as its pod-resources API says."""

    namespace: K8sLabel
    pod: K8sName
    container: K8sLabel
    resource: str  # nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...
    device_id: str  # as the device plugin wrote it
    # GPU-... or MIG-... with a time-slicing suffix (::n) or GKE's /vgpuN removed; None
    # when the ID has no UUID (index strategy: see `index`).
    uuid: str | None
    replica: int | None = None
    index: int | None = None  # --device-id-strategy=index
    tenant: str | None = None
    # Through a ResourceClaim (DRA) rather than a device plugin: the claim, and the GPU named
    # by its /dev/nvidiaN minor (with a MIG device's placement start and size) instead of a UUID
    dra: DraDevice | None = None
    minor: int | None = None
    mig_placement: tuple[int, int] | None = None
    # the pod's UID, from the kubelet's device checkpoint: what ties a process's cgroup to
    # this pod where several pods share the GPU
    pod_uid: str | None = None
    since: float | None = None  # when gpuconsole first saw the allocation


class ShareLimits(msgspec.Struct, frozen=True):
    """What one sharer of a GPU may use of it, from its process's environment; None where
    nothing limits it."""

    mem_bytes: int | None = None
    sm_pct: float | None = None
    by: str | None = None  # "hami" (vGPU quotas) or "mps" (an MPS client's limits)


class HostProcess(msgspec.Struct, frozen=True):
    """A process with an NVIDIA device open, and what its cgroup says it belongs to."""

    pid: int
    comm: str
    cgroup: str
    uid: int | None = None
    user: str | None = None
    started_at: float | None = None
    pod_uid: str | None = None
    container_id: str | None = None
    runtime: str | None = None  # containerd, cri-o, docker, podman
    slurm_job: str | None = None
    slurm_account: str | None = None
    tenant: str | None = None
    gpu_minors: tuple[int, ...] = ()  # which /dev/nvidiaN it has open
    limits: ShareLimits | None = None  # a GPU sharer's quota (HAMi, MPS), where it has one


class GuestGpu(msgspec.Struct, frozen=True):
    """A passthrough GPU as its guest's agent reads it with NVML inside the guest: what the
    host's NVML cannot see. Only readings are taken from a guest, never names of the host's."""

    bus_id: str  # the host's, sysfs form: the GPU, as everywhere else
    guest: str  # the libvirt domain
    guest_bus_id: str  # where the guest sees it
    reading: GpuReading | None  # pci_bus_id is the host's; None until the guest first answers
    seen_at: float | None = None  # when the host last had an answer (its clock, not the guest's)
    error: str | None = None  # why the latest ask failed or was refused; the reading is older
    tenant: str | None = None


class TenancyReading(msgspec.Struct, frozen=True):
    """The tenancy source's partial reading of one node."""

    at: float
    simulated: bool = False
    gpus: tuple[PciGpu, ...] = ()
    guests: tuple[Guest, ...] = ()
    pod_devices: tuple[PodDevice, ...] = ()
    # device IDs the kubelet can hand out for GPU resources (GetAllocatableResources)
    allocatable: tuple[str, ...] = ()
    processes: tuple[HostProcess, ...] = ()
    parts: tuple[PartStatus, ...] = ()
    guest_gpus: tuple[GuestGpu, ...] = ()  # passthrough GPUs their guests' agents read

    def part(self, name: str) -> PartStatus | None:
        for part in self.parts:
            if part.part == name:
                return part
        return None

    def counters(self) -> Iterator[CounterSample]:
        return iter(())

    def series(self) -> Iterator[tuple[Key, float]]:
        return iter(())
