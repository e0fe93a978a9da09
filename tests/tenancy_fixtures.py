"""Lower layers for the tenancy tests, written by hand from what the kernel, libvirt and the
kubelet document (not by the simulator): a fake sysfs and /proc, a libvirt test-driver node
XML, and a real grpc.aio pod-resources server on a unix socket."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from gpuconsole.sources.tenancy.proto import api_pb2, api_pb2_grpc
from tests.peers import require_peer

BTIME = 1_700_000_000  # the fake node booted at this epoch second
TICKS = os.sysconf("SC_CLK_TCK")
H100 = 0x2330
GPU_CLASS = 0x030200
AUDIO_CLASS = 0x040300
BRIDGE_CLASS = 0x060400


class FakeHost:
    """A sysfs root and a /proc root in a temp dir, built device by device, process by process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sysfs = root / "sys"
        self.proc = root / "proc"
        self.passwd = root / "passwd"
        (self.sysfs / "bus" / "pci" / "devices").mkdir(parents=True)
        self.proc.mkdir()
        (self.proc / "stat").write_text(f"cpu 1 2 3 4\nbtime {BTIME}\n")
        self.passwd.write_text("root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/h:/bin/sh\n")

    @property
    def sysfs_root(self) -> str:
        return str(self.sysfs)

    @property
    def proc_root(self) -> str:
        return str(self.proc)

    def pci(
        self,
        bdf: str,
        *,
        driver: str | None,
        group: int | None,
        vendor: int = 0x10DE,
        device: int = H100,
        pci_class: int = GPU_CLASS,
        override: str | None = None,
    ) -> Path:
        """A PCI function under devices/pci0000:00/, bound to `driver`, in IOMMU `group`."""
        path = self.sysfs / "devices" / "pci0000:00" / bdf
        path.mkdir(parents=True)
        (path / "vendor").write_text(f"0x{vendor:04x}\n")
        (path / "device").write_text(f"0x{device:04x}\n")
        (path / "class").write_text(f"0x{pci_class:06x}\n")
        (path / "numa_node").write_text("0\n")
        (path / "driver_override").write_text(f"{override or '(null)'}\n")
        if driver is not None:
            drivers = self.sysfs / "bus" / "pci" / "drivers" / driver
            drivers.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(drivers, path), path / "driver")
        if group is not None:
            members = self.sysfs / "kernel" / "iommu_groups" / str(group) / "devices"
            members.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(path, members), members / bdf)
            os.symlink(os.path.relpath(members.parent, path), path / "iommu_group")
        link = self.sysfs / "bus" / "pci" / "devices" / bdf
        os.symlink(os.path.relpath(path, link.parent), link)
        return path

    def rebind(self, bdf: str, driver: str) -> None:
        """What `echo BDF > .../unbind; echo BDF > drivers_probe` leaves behind."""
        path = self.sysfs / "devices" / "pci0000:00" / bdf
        (path / "driver").unlink()
        drivers = self.sysfs / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(drivers, path), path / "driver")

    def nvidia_info(
        self, bdf: str, uuid: str, minor: int, model: str = "NVIDIA H100 80GB HBM3"
    ) -> None:
        """/proc/driver/nvidia/gpus/BDF/information as the 535 driver writes it."""
        folder = self.proc / "driver" / "nvidia" / "gpus" / bdf
        folder.mkdir(parents=True)
        (folder / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 312\nGPU UUID: \t {uuid}\n"
            f"Video BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bdf}\nDevice Minor: \t {minor}\n"
            "GPU Firmware: \t 535.183.01\nGPU Excluded:\t No\n"
        )

    def process(
        self,
        pid: int,
        *,
        cgroup: str,
        uid: int = 1000,
        comm: str = "python3",
        argv: Sequence[str] = ("python3", "train.py"),
        fds: Sequence[str] = ("/dev/nvidiactl", "/dev/nvidia0"),
        started_s_after_boot: float = 3600.0,
        environ: dict[str, str] | None = None,
        cgroup_v1: bool = False,
    ) -> None:
        """/proc/PID with cmdline, comm, status, stat, cgroup, environ and fd links."""
        base = self.proc / str(pid)
        (base / "fd").mkdir(parents=True)
        (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (base / "comm").write_text(comm + "\n")
        (base / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        ticks = int(started_s_after_boot * TICKS)
        rest = " ".join(["S", *["0"] * 18, str(ticks), *["0"] * 20])
        (base / "stat").write_text(f"{pid} ({comm}) {rest}\n")
        if cgroup_v1:
            text = f"12:devices:{cgroup}\n11:memory:{cgroup}\n1:name=systemd:/user.slice\n"
        else:
            text = f"0::{cgroup}\n"
        (base / "cgroup").write_text(text)
        env = environ or {}
        (base / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
        for number, target in enumerate(fds, start=3):
            os.symlink(target, base / "fd" / str(number))

    def started_at(self, started_s_after_boot: float) -> float:
        return BTIME + int(started_s_after_boot * TICKS) / TICKS


# --- libvirt's test driver ---------------------------------------------------------------

TEST_NS = "http://libvirt.org/schemas/domain/test/1.0"
RUNSTATE = {"running": 1, "paused": 3, "shut off": 5}


@dataclass
class DomainSpec:
    """A domain for libvirt's test driver: name, state and the PCI functions it holds."""

    name: str
    bus_ids: Sequence[str] = ()
    state: str = "running"
    tenant: str | None = None
    extra_devices: str = ""  # raw XML added under <devices>
    guest_bus_ids: Sequence[str] = ()  # where the guest sees each of bus_ids, in order
    vsock_cid: int | None = None

    def xml(self) -> str:
        hostdevs = []
        for k, bdf in enumerate(self.bus_ids):
            domain, bus, rest = bdf.split(":")
            slot, function = rest.split(".")
            inside = ""
            if k < len(self.guest_bus_ids):
                g_domain, g_bus, g_rest = self.guest_bus_ids[k].split(":")
                g_slot, g_function = g_rest.split(".")
                inside = (
                    f"<address type='pci' domain='0x{g_domain}' bus='0x{g_bus}' "
                    f"slot='0x{g_slot}' function='0x{g_function}'/>"
                )
            hostdevs.append(
                "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
                f"<address domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' "
                f"function='0x{function}'/></source>{inside}</hostdev>"
            )
        if self.vsock_cid is not None:
            hostdevs.append(
                f"<vsock model='virtio'><cid auto='no' address='{self.vsock_cid}'/></vsock>"
            )
        metadata = (
            "<metadata><gc:tenant xmlns:gc='https://gpuconsole.dev/xmlns/tenancy/1'>"
            f"{self.tenant}</gc:tenant></metadata>"
            if self.tenant
            else ""
        )
        return (
            f"<domain type='test' xmlns:test='{TEST_NS}'><name>{self.name}</name>"
            f"<test:runstate>{RUNSTATE[self.state]}</test:runstate>{metadata}"
            "<memory>1048576</memory><os><type>hvm</type></os>"
            f"<devices>{''.join(hostdevs)}{self.extra_devices}</devices></domain>"
        )


def libvirt_node(path: Path, domains: Sequence[DomainSpec]) -> str:
    """Write a test-driver node XML; returns the URI that opens it."""
    require_libvirt()
    path.write_text("<node>" + "".join(d.xml() for d in domains) + "</node>")
    return f"test://{path.resolve()}"


def require_libvirt() -> None:
    try:
        import libvirt  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        require_peer("libvirt test driver", False, "apt libvirt-dev pkg-config; pip libvirt-python")


# --- the kubelet's pod-resources API -----------------------------------------------------


@dataclass
class PodSpec:
    """A pod for the fake kubelet: (container, resource, device IDs) triples."""

    namespace: str
    name: str
    devices: list[tuple[str, str, list[str]]] = field(default_factory=list)
    # DRA: (container, claim name, [(driver, pool, device name)]), the claim in the pod's namespace
    claims: list[tuple[str, str, list[tuple[str, str, str]]]] = field(default_factory=list)


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """Answers List and GetAllocatableResources from what the test put in it."""

    def __init__(self) -> None:
        self.pods: list[PodSpec] = []
        self.allocatable: list[tuple[str, list[str]]] = []
        self.allocatable_implemented = True
        self.list_calls = 0

    async def List(self, request: object, context: grpc.aio.ServicerContext) -> object:
        self.list_calls += 1
        pods = []
        for pod in self.pods:
            containers: dict[str, list[object]] = {}
            claims: dict[str, list[object]] = {}
            for container, resource, ids in pod.devices:
                containers.setdefault(container, []).append(
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                )
            for container, claim, resources in pod.claims:
                containers.setdefault(container, [])
                claims.setdefault(container, []).append(
                    api_pb2.DynamicResource(
                        claim_name=claim,
                        claim_namespace=pod.namespace,
                        claim_resources=[
                            api_pb2.ClaimResource(
                                cdi_devices=[
                                    api_pb2.CDIDevice(name=f"k8s.{driver}/claim={claim}-{device}")
                                ],
                                driver_name=driver,
                                pool_name=pool,
                                device_name=device,
                            )
                            for driver, pool, device in resources
                        ],
                    )
                )
            pods.append(
                api_pb2.PodResources(
                    name=pod.name,
                    namespace=pod.namespace,
                    containers=[
                        api_pb2.ContainerResources(
                            name=name,
                            devices=devices,
                            cpu_ids=[2, 3],
                            dynamic_resources=claims.get(name, []),
                        )
                        for name, devices in containers.items()
                    ],
                )
            )
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    async def GetAllocatableResources(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> object:
        if not self.allocatable_implemented:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "feature gate off")
        return api_pb2.AllocatableResourcesResponse(
            devices=[
                api_pb2.ContainerDevices(resource_name=r, device_ids=ids)
                for r, ids in self.allocatable
            ],
            cpu_ids=[0, 1, 2, 3],
        )


@contextlib.asynccontextmanager
async def kubelet_server(socket: Path) -> AsyncIterator[FakeKubelet]:
    """A real grpc.aio server on a unix socket, serving the project's own proto."""
    kubelet = FakeKubelet()
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    port = server.add_insecure_port(f"unix://{socket}")
    if port == 0:
        pytest.fail(f"could not bind {socket}")
    await server.start()
    try:
        yield kubelet
    finally:
        await server.stop(None)
