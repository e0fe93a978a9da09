"""Simulated tenants, so the demo runs the real tenancy source over believable lower layers.

Per node, `plan_for` (gpuconsole.sim.plans) decides deterministically who holds what: KVM
guests (one GPU, or all eight with the NVSwitches), pods (one, two, four GPUs, MIG
instances, time-sliced replicas), Slurm jobs, free GPUs. `SimTenancyTree` lays that out as
a sysfs tree (driver and IOMMU group links, vfio-pci bindings) and a /proc tree (the NVIDIA
driver's GPU information; for every process the NVML simulator reports, its cgroup, user,
start time and open /dev/nvidiaN; QEMU command lines) under a temporary root. libvirt is
replaced by an object shaped like a libvirt connection that serves generated domain XML,
and the kubelet by one shaped like the generated gRPC stub that returns real pod-resources
messages, so the XML parser and the device-ID mapping are the ones that ship.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
import uuid as uuid_mod
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuconsole.hub import Hub
from gpuconsole.readings.tenancy import Guest, TenancyReading
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.nvml import SimNvml
from gpuconsole.sim.plans import SimGuest, SimJob, SimPlan, SimPod, plan_for
from gpuconsole.sim.profiles import guest_profile
from gpuconsole.sim.trees import new_tree
from gpuconsole.sources.base import EmitEvent
from gpuconsole.sources.nvml.source import NvmlSource
from gpuconsole.sources.tenancy.guest_agent import REQUEST, guest_answer
from gpuconsole.sources.tenancy.libvirt import TENANT_XMLNS
from gpuconsole.sources.tenancy.proto import api_pb2
from gpuconsole.sources.tenancy.source import TenancySource
from gpuconsole.sources.tenancy.tenants import TenantRules

__all__ = [
    "SIM_RULES",
    "SimGuest",
    "SimJob",
    "SimPlan",
    "SimPod",
    "SimTenancySource",
    "SimTenancyTree",
    "add_sim_tenancy_sources",
    "plan_for",
]

# Each simulated node writes its own small tree; past this many nodes the rest go without.
SIM_TENANCY_MAX_NODES = 64
TREE_PREFIX = "gpuconsole-tenancy-"
BOOTED_S_BEFORE_START = 6 * 86400.0  # the simulated nodes booted six days before the demo

# The tenants a site would write in [tenancy]: namespaces, guest names, accounts, users.
SIM_RULES = TenantRules.from_tables(
    namespaces={"team-nlp": "nlp", "team-vision": "vision"},
    domains={"tenant-b-*": "tenant-b", "tenant-c-*": "tenant-c"},
    accounts={"physics": "physics", "chem": "chemistry"},
    users={"alice": "research"},
)
USERS = {0: "root", 1000: "alice", 1001: "bob", 1002: "carol", 64055: "libvirt-qemu"}
# A SimNode built without its plan runs processes on GPUs the plan leaves free (build_sim_nodes
# gives it the plan, so they stay idle): those belong to alice's notebook.
HOST_USER = 1000


# --- the lower layers ------------------------------------------------------------------


def _bdf(bus_id: str) -> str:
    parts = bus_id.lower().split(":")
    return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"


def _write(path: str, text: str | bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    with open(path, "wb") as f:
        f.write(data)


def _stable_uuid(*parts: str) -> str:
    return str(uuid_mod.UUID(hashlib.sha256("/".join(parts).encode()).hexdigest()[:32]))


_GPU_DEV = re.compile(r"^/dev/nvidia\d+$")
_HOST_CGROUP = f"/user.slice/user-{HOST_USER}.slice/session-3.scope"


def _pod_cgroup(pod: SimPod) -> str:
    uid = _stable_uuid(pod.namespace, pod.pod).replace("-", "_")
    cid = hashlib.sha256(f"{pod.pod}/{pod.container}".encode()).hexdigest()
    return (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid}.slice/cri-containerd-{cid}.scope"
    )


def _job_cgroup(job: SimJob) -> str:
    return f"/system.slice/slurmstepd.scope/job_{job.job}/step_0/user/task_0"


@dataclass
class _Owner:
    """What the /proc tree says about one simulated process."""

    cgroup: str
    uid: int
    comm: str
    started_h: float
    environ: dict[str, str] = field(default_factory=dict)


class SimTenancyTree:
    """The sysfs and /proc trees of one simulated node's tenants, under `root`, with what its
    Kubernetes keeps cordoned and the NVSwitches its guests of partial partitions hold."""

    def __init__(self, node: SimNode, root: str, plan: SimPlan | None = None) -> None:
        self.node = node
        self.root = root
        self.plan = plan if plan is not None else plan_for(node.name, node.profile)
        self.cordoned: set[str] = set()  # GPU UUIDs out of Kubernetes scheduling
        # guest -> NVSwitch bus ids of a partial partition (an A100 guest with 2 or 4 GPUs
        # holds 1 or 3 of the 6), which a SimGuest, holding all of them or none, cannot say
        self.switches: dict[str, list[str]] = {}
        # the hub's tenancy poll and an executor's fresh reading may lay out /proc at once
        self._lock = threading.Lock()
        self.sysfs_root = os.path.join(root, "sys")
        self.proc_root = os.path.join(root, "proc")
        self.passwd_file = os.path.join(root, "etc", "passwd")
        self.booted_at = node.t0 - BOOTED_S_BEFORE_START
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._pids: set[int] = set()
        self._boot = ""  # the boot id last written to /proc

    # --- layout --------------------------------------------------------------------

    def create(self) -> None:
        """Lay out sysfs, /proc and /etc/passwd; processes follow in `refresh`."""
        with self._lock:
            self._create()
        self.refresh()

    def _create(self) -> None:
        profile = self.node.profile
        vfio = self.plan.vfio_gpus
        passed_switches = any(g.nvswitches and g.state == 1 for g in self.plan.guests)
        for gpu in profile.gpus:
            driver = "vfio-pci" if gpu.index in vfio else "nvidia"
            self._device(gpu.bus_id, profile.gpu_model.pci_device_id >> 16, 0x030200, driver)
            _write(
                os.path.join(
                    self.sysfs_root, "bus", "pci", "devices", _bdf(gpu.bus_id), "numa_node"
                ),
                f"{gpu.numa_node}\n",
            )
            if driver == "nvidia":
                info = (
                    f"Model: \t\t {profile.gpu_model.name}\n"
                    f"IRQ:   \t\t {200 + gpu.index}\n"
                    f"GPU UUID: \t {self.node.uuids[gpu.index]}\n"
                    f"Video BIOS: \t 96.00.99.00.01\n"
                    f"Bus Type: \t PCIe\n"
                    f"DMA Size: \t 52 bits\n"
                    f"Bus Location: \t {_bdf(gpu.bus_id)}\n"
                    f"Device Minor: \t {gpu.index}\n"
                )
                _write(
                    os.path.join(
                        self.proc_root, "driver", "nvidia", "gpus", _bdf(gpu.bus_id), "information"
                    ),
                    info,
                )
        for switch in profile.nvswitches:
            driver = "vfio-pci" if passed_switches else "nvidia"
            self._device(switch.bus_id, 0x22A3, 0x068000, driver)
        _write(os.path.join(self.proc_root, "stat"), f"cpu 0 0 0 0\nbtime {int(self.booted_at)}\n")
        _write(
            self.passwd_file,
            "".join(f"{n}:x:{u}:{u}::/home/{n}:/bin/bash\n" for u, n in USERS.items()),
        )
        for k, guest in enumerate(self.plan.guests):
            if guest.state == 1:
                self._qemu(4000 + k, guest)

    def _device(self, bus_id: str, device: int, pci_class: int, driver: str) -> None:
        bdf = _bdf(bus_id)
        group = int(bdf.split(":")[1], 16)
        path = os.path.join(self.sysfs_root, "devices", f"pci{bdf[:7]}", bdf)
        _write(os.path.join(path, "vendor"), "0x10de\n")
        _write(os.path.join(path, "device"), f"0x{device:04x}\n")
        _write(os.path.join(path, "class"), f"0x{pci_class:06x}\n")
        _write(
            os.path.join(path, "driver_override"),
            "vfio-pci\n" if driver == "vfio-pci" else "(null)\n",
        )
        drivers = os.path.join(self.sysfs_root, "bus", "pci", "drivers", driver)
        os.makedirs(drivers, exist_ok=True)
        os.symlink(os.path.relpath(drivers, path), os.path.join(path, "driver"))
        members = os.path.join(self.sysfs_root, "kernel", "iommu_groups", str(group), "devices")
        os.makedirs(members, exist_ok=True)
        os.symlink(os.path.relpath(path, members), os.path.join(members, bdf))
        os.symlink(
            os.path.relpath(os.path.dirname(members), path), os.path.join(path, "iommu_group")
        )
        link = os.path.join(self.sysfs_root, "bus", "pci", "devices", bdf)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(path, os.path.dirname(link)), link)

    def _process(
        self, pid: int, argv: Sequence[str], owner: _Owner, devices: Sequence[str]
    ) -> None:
        base = os.path.join(self.proc_root, str(pid))
        _write(os.path.join(base, "cmdline"), "\0".join(argv) + "\0")
        _write(os.path.join(base, "comm"), owner.comm + "\n")
        _write(os.path.join(base, "cgroup"), f"0::{owner.cgroup}\n")
        uid = owner.uid
        _write(
            os.path.join(base, "status"), f"Name:\t{owner.comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        )
        started = self.node.t0 - owner.started_h * 3600 - self.booted_at
        ticks = max(0, int(started * self.ticks))
        fields = ["S"] + ["0"] * 18 + [str(ticks)] + ["0"] * 10
        _write(os.path.join(base, "stat"), f"{pid} ({owner.comm}) " + " ".join(fields) + "\n")
        env = "".join(f"{k}={v}\0" for k, v in owner.environ.items())
        _write(os.path.join(base, "environ"), env)
        fd = os.path.join(base, "fd")
        os.makedirs(fd, exist_ok=True)
        for number, target in enumerate(devices, start=3):
            os.symlink(target, os.path.join(fd, str(number)))
        self._pids.add(pid)

    def _qemu(self, pid: int, guest: SimGuest) -> None:
        profile = self.node.profile
        buses = [profile.gpus[i].bus_id for i in guest.gpus]
        if guest.nvswitches:
            buses += [s.bus_id for s in profile.nvswitches]
        argv = ["/usr/bin/qemu-system-x86_64", "-name", f"guest={guest.name},debug-threads=on"]
        argv += ["-uuid", _stable_uuid(self.node.name, guest.name)]
        for k, bus in enumerate(buses):
            device = {"driver": "vfio-pci", "host": _bdf(bus), "id": f"hostdev{k}"}
            argv += ["-device", json.dumps(device, separators=(",", ":"))]
        owner = _Owner(
            f"/machine.slice/machine-qemu\\x2d{pid % 100}\\x2d{guest.name}.scope/libvirt/emulator",
            64055,
            "qemu-system-x86",
            guest.started_h,
        )
        self._process(pid, argv, owner, ["/dev/vfio/vfio"])

    # --- processes -------------------------------------------------------------------

    def _owner_of(self, gpu: int, gi: int | None, nth: int = 0) -> _Owner | None:
        """The cgroup, user and environment the plan gives a process on this GPU (the nth
        process of a time-sliced GPU is its nth sharer's)."""
        if gpu in self.plan.vfio_gpus:
            return None  # a guest's GPU has no host processes; NVML should not see it at all
        slot = None
        if gi is not None:
            slices = self.node.migs.get(gpu, ())
            slot = next((k for k, s in enumerate(slices) if s.gpu_instance_id == gi), None)
        holders = [
            pod
            for pod in self.plan.pods
            if gpu in pod.gpus or (gpu, slot) in pod.mig or any(g == gpu for g, _ in pod.replicas)
        ]
        if holders:
            pod = holders[nth] if nth < len(holders) else holders[0]
            return _Owner(_pod_cgroup(pod), 0, "python3", pod.started_h)
        for job in self.plan.jobs:
            if gpu in job.gpus:
                env = {
                    "SLURM_JOB_ID": job.job,
                    "SLURM_JOB_ACCOUNT": job.account,
                    "SLURM_JOB_USER": USERS.get(job.uid, str(job.uid)),
                }
                return _Owner(_job_cgroup(job), job.uid, "python", job.started_h, env)
        return _Owner(_HOST_CGROUP, HOST_USER, "jupyter", 0.75)

    def _cgroups_on(self, gpu: int) -> set[str]:
        """The cgroups whose processes may hold this GPU as the plan has it now: its pods'
        (whole GPUs, MIG slots, replicas), its job's, else the host user's."""
        plan = self.plan
        found = {
            _pod_cgroup(pod)
            for pod in plan.pods
            if gpu in pod.gpus or any(g == gpu for g, _ in pod.mig + pod.replicas)
        }
        found |= {_job_cgroup(job) for job in plan.jobs if gpu in job.gpus}
        return found or {_HOST_CGROUP}

    def _reap(self) -> None:
        """Processes whose pod, job or user no longer holds their GPU have ended (a pod
        evicted, a job that ran to its end): their /proc entries go. A GPU's /proc entry
        outlives its NVML listing (a GPU off the bus lists nothing), so this follows the
        tenants, not NVML."""
        for pid in sorted(self._pids):
            base = os.path.join(self.proc_root, str(pid))
            try:
                targets = [
                    os.readlink(os.path.join(base, "fd", n))
                    for n in os.listdir(os.path.join(base, "fd"))
                ]
                with open(os.path.join(base, "cgroup"), encoding="utf-8") as f:
                    cgroup = f.read().strip().removeprefix("0::")
            except OSError:
                continue
            gpus = [int(t[len("/dev/nvidia") :]) for t in targets if _GPU_DEV.match(t)]
            if gpus and not any(cgroup in self._cgroups_on(g) for g in gpus):
                shutil.rmtree(base, ignore_errors=True)
                self._pids.discard(pid)

    def refresh(self) -> None:
        """Write /proc entries for processes the NVML simulator reports that are new, and
        the node's boot id (new after a power cycle)."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        self._checkpoint()
        self.write_boot()
        self._reap()
        for gpu in self.node.profile.gpus:
            # a GPU off the bus lists no process, yet its tenant's process, started before
            # it fell, still holds its /dev/nvidiaN
            for nth, (pid, _used, gi) in enumerate(self.node.processes(gpu.index)):
                if pid in self._pids:
                    continue
                owner = self._owner_of(gpu.index, gi, nth if gi is None else 0)
                if owner is None:
                    continue
                devices = ["/dev/nvidiactl", "/dev/nvidia-uvm", f"/dev/nvidia{gpu.index}"]
                self._process(pid, [owner.comm, "train.py"], owner, devices)

    def write_boot(self) -> None:
        """/proc's boot id, where the node has a new one (after a power cycle)."""
        if self._boot != self.node.boot_id:
            self._boot = self.node.boot_id
            _write(
                os.path.join(self.proc_root, "sys", "kernel", "random", "boot_id"),
                self._boot + "\n",
            )

    # --- libvirt and kubelet -----------------------------------------------------------

    def domain_xml(self, guest: SimGuest) -> str:
        profile = self.node.profile
        buses = [profile.gpus[i].bus_id for i in guest.gpus]
        if guest.nvswitches:
            buses += [s.bus_id for s in profile.nvswitches]
        # where the guest sees each device: its own bus behind a pcie-root-port, as libvirt
        # lays out a q35 guest
        hostdevs = "".join(
            "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
            f"<address domain='0x0000' bus='0x{_bdf(b)[5:7]}' slot='0x00' function='0x0'/>"
            f"</source><address type='pci' domain='0x0000' bus='0x{6 + k:02x}' slot='0x00' "
            "function='0x0'/></hostdev>"
            for k, b in enumerate(buses)
        )
        if guest.agent:
            cid = 3 + [g.name for g in self.plan.guests].index(guest.name)
            hostdevs += f"<vsock model='virtio'><cid auto='yes' address='{cid}'/></vsock>"
        metadata = (
            f"<metadata><gc:tenant xmlns:gc='{TENANT_XMLNS}'>{guest.tenant}</gc:tenant></metadata>"
            if guest.tenant
            else ""
        )
        return (
            f"<domain type='kvm'><name>{guest.name}</name>"
            f"<uuid>{_stable_uuid(self.node.name, guest.name)}</uuid>{metadata}"
            f"<memory unit='KiB'>{len(guest.gpus) * 128 * 1024 * 1024}</memory>"
            f"<devices>{hostdevs}{self._partial_switches(guest)}</devices></domain>"
        )

    def _partial_switches(self, guest: SimGuest) -> str:
        extra = self.switches.get(guest.name, [])
        if guest.nvswitches or not extra:
            return ""
        return "".join(
            "<hostdev mode='subsystem' type='pci' managed='yes'><source><address "
            f"domain='0x{b[:4]}' bus='0x{b[5:7]}' slot='0x{b[8:10]}' function='0x{b[11]}'/>"
            "</source></hostdev>"
            for b in extra
        )

    def libvirt(self) -> SimLibvirtConnection:
        return SimLibvirtConnection(self)

    def kubelet(self) -> SimPodResources:
        return SimPodResources(self)

    @property
    def checkpoint_file(self) -> str:
        return os.path.join(self.root, "kubelet", "kubelet_internal_checkpoint")

    def _checkpoint(self) -> None:
        """The kubelet's device checkpoint: each pod's UID and the device IDs it was given."""
        entries = []
        for pod in self.plan.pods:
            gpus, migs = self.device_ids(pod)
            uid = _stable_uuid(pod.namespace, pod.pod)
            for resource, ids in (("nvidia.com/gpu", gpus), *migs.items()):
                if ids:
                    entries.append(
                        {
                            "PodUID": uid,
                            "ContainerName": pod.container,
                            "ResourceName": resource,
                            "DeviceIDs": {"-1": ids},
                            "AllocResp": "",
                        }
                    )
        doc = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 0}
        _write(self.checkpoint_file, json.dumps(doc))

    def device_ids(self, pod: SimPod) -> tuple[list[str], dict[str, list[str]]]:
        """(nvidia.com/gpu device IDs, MIG device IDs by resource name) of a pod."""
        uuids = self.node.uuids
        whole = [] if pod.claim is not None else [uuids[g] for g in pod.gpus]
        gpus = whole + [f"{uuids[g]}::{n}" for g, n in pod.replicas]
        migs: dict[str, list[str]] = {}
        for gpu, slot in pod.mig:
            slices = self.node.migs.get(gpu, ())
            if slot < len(slices):
                resource = f"nvidia.com/mig-{slices[slot].profile.name}"
                migs.setdefault(resource, []).append(slices[slot].uuid)
        return gpus, migs


class _SimDomain:
    def __init__(self, tree: SimTenancyTree, guest: SimGuest) -> None:
        self._tree, self._guest = tree, guest

    def name(self) -> str:
        return self._guest.name

    def state(self) -> list[int]:
        return [self._guest.state, 1]

    def XMLDesc(self, flags: int = 0) -> str:
        return self._tree.domain_xml(self._guest)


class SimLibvirtConnection:
    """Shaped like libvirt.virConnect, for the calls LibvirtReader makes."""

    def __init__(self, tree: SimTenancyTree) -> None:
        self._tree = tree

    def listAllDomains(self, flags: int = 0) -> list[_SimDomain]:
        return [_SimDomain(self._tree, g) for g in self._tree.plan.guests]

    def close(self) -> int:
        return 0


class SimGuestAgents:
    """The guest agents of a simulated node's guests. Each is a real NVML source over a
    simulated guest (its GPUs alone, at the guest's addresses) answering the host with the
    guest agent's own answer, through a socket pair where a real host uses vsock."""

    def __init__(self, tree: SimTenancyTree) -> None:
        self._tree = tree
        self._sources: dict[str, NvmlSource] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def connect(self, guest: Guest) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        plan = next((g for g in self._tree.plan.guests if g.name == guest.name), None)
        if plan is None or not plan.agent or not plan.gpus:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "no guest agent listens")
        source = self._sources.get(guest.name)
        if source is None:
            node = self._tree.node
            inside = SimNode(
                f"{node.name}/{guest.name}",
                guest_profile(node.profile, plan.gpus),
                seed=node.seed,
                clock=node.clock,
                start=node.t0,
            )
            source = NvmlSource(guest.name, lib=SimNvml(inside), events=False, clock=node.clock)
            await source.start(lambda _event: None)
            self._sources[guest.name] = source
        host_end, guest_end = socket.socketpair()
        task = asyncio.create_task(self._answer(guest_end, source))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.open_connection(sock=host_end)

    async def _answer(self, sock: socket.socket, source: NvmlSource) -> None:
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            if await reader.readuntil(b"\n") == REQUEST:
                writer.write(guest_answer(await source.poll()))
                await writer.drain()
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        for source in self._sources.values():
            await source.close()
        self._sources.clear()


class SimPodResources:
    """Shaped like the generated PodResourcesListerStub on a grpc.aio channel."""

    def __init__(self, tree: SimTenancyTree) -> None:
        self._tree = tree

    async def List(self, request: Any, timeout: float | None = None) -> Any:
        pods = []
        for pod in self._tree.plan.pods:
            gpus, migs = self._tree.device_ids(pod)
            devices = []
            if gpus:
                devices.append(
                    api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=gpus)
                )
            for resource, ids in migs.items():
                devices.append(api_pb2.ContainerDevices(resource_name=resource, device_ids=ids))
            container = api_pb2.ContainerResources(
                name=pod.container, devices=devices, dynamic_resources=self._claims(pod)
            )
            pods.append(
                api_pb2.PodResources(name=pod.pod, namespace=pod.namespace, containers=[container])
            )
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    def _claims(self, pod: SimPod) -> list[Any]:
        """A DRA pod's claim as the kubelet lists it: NVIDIA's driver names each GPU by its
        /dev/nvidiaN minor (the simulated driver numbers minors as NVML indexes)."""
        if pod.claim is None or not pod.gpus:
            return []
        resources = [
            api_pb2.ClaimResource(
                driver_name="gpu.nvidia.com", pool_name=self._tree.node.name, device_name=f"gpu-{g}"
            )
            for g in pod.gpus
        ]
        return [
            api_pb2.DynamicResource(
                claim_name=pod.claim, claim_namespace=pod.namespace, claim_resources=resources
            )
        ]

    async def GetAllocatableResources(self, request: Any, timeout: float | None = None) -> Any:
        vfio = self._tree.plan.vfio_gpus
        node = self._tree.node
        ids = [
            node.uuids[g.index]
            for g in node.profile.gpus
            if g.index not in vfio and g.index not in node.migs
        ]
        devices = [api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids)]
        for slices in node.migs.values():
            for s in slices:
                devices.append(
                    api_pb2.ContainerDevices(
                        resource_name=f"nvidia.com/mig-{s.profile.name}", device_ids=[s.uuid]
                    )
                )
        return api_pb2.AllocatableResourcesResponse(devices=devices)


# --- the source ------------------------------------------------------------------------


class SimTenancySource(TenancySource):
    """The real TenancySource over a simulated node's trees, libvirt and kubelet."""

    def __init__(
        self,
        node: SimNode,
        *,
        plan: SimPlan | None = None,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # the folder now (cheap), its contents at start: a hub that never starts writes nothing
        root = new_tree(TREE_PREFIX, node.name)
        tree = SimTenancyTree(node, root, plan)
        agents = SimGuestAgents(tree)
        super().__init__(
            node.name,
            sysfs_root=tree.sysfs_root,
            proc_root=tree.proc_root,
            libvirt_uri="sim:///" + node.name,
            libvirt_connect=lambda _uri: tree.libvirt(),
            kubelet_stub=tree.kubelet(),
            kubelet_checkpoint=tree.checkpoint_file,
            guest_connect=agents.connect,
            rules=SIM_RULES,
            interval_s=interval_s,
            passwd_file=tree.passwd_file,
            simulated=True,
            clock=clock,
        )
        self.sim = node
        self.tree = tree
        self.agents = agents
        self._created = False
        # removed by close(); at interpreter exit if close() never ran
        self._cleanup = weakref.finalize(self, shutil.rmtree, root, True)

    def _ensure_tree(self) -> None:
        if not self._created:
            self.tree.create()
            self._created = True
        else:
            self.tree.refresh()

    async def start(self, emit: EmitEvent) -> None:
        await asyncio.to_thread(self._ensure_tree)
        await super().start(emit)

    async def poll(self) -> TenancyReading:
        await asyncio.to_thread(self._ensure_tree)
        return await super().poll()

    async def close(self) -> None:
        await super().close()
        await self.agents.close()
        self._cleanup()


def add_sim_tenancy_sources(
    hub: Hub,
    nodes: Sequence[SimNode],
    *,
    interval_s: float = 5.0,
    clock: Callable[[], float] = time.time,
) -> None:
    """Give the hub a tenancy source per simulated node (the first SIM_TENANCY_MAX_NODES),
    and a reader of the journal that plans on the node write (how its GPUs' last repairs
    went is part of their verdict, on every console of the hub)."""
    from gpuconsole.actions.journal_events import JournalEvents
    from gpuconsole.actions.store import JOURNAL_FILE
    from gpuconsole.sim.actions import live_actions

    for node in nodes[:SIM_TENANCY_MAX_NODES]:
        hub.add_node(node.name, simulated=True, profile=node.profile.name)
        source = SimTenancySource(node, interval_s=interval_s, clock=clock)
        hub.add_source(source)
        journal = live_actions(source.tree) / JOURNAL_FILE
        hub.add_source(
            JournalEvents(node.name, journal, clock=clock, proc_root=source.tree.proc_root)
        )
