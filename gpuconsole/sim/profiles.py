"""Server profiles the simulator, the fake libnvidia-ml.so, tests and benchmarks share.

Facts follow ../shared/DOMAIN.md (DGX H100 user guide, published `nvidia-smi topo -m`
outputs for HGX H100 and DGX A100). Where the layout is not published (Apollo 6500
PCIe switches) the profile says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuconsole.hardware import (
    A100_PCIE_40GB,
    A100_SXM4_40GB,
    BEFORE_AMPERE,
    H100_SXM5,
    PRODUCTS,
    V100_SXM2_32GB,
    GpuModel,
)


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """Where one GPU sits in its server."""

    index: int
    bus_id: str  # "00000000:18:00.0"
    module_id: int  # HGX module id (1-based physical SXM position)
    numa_node: int
    cpu_affinity: str  # cpulist, as in /sys/bus/pci/devices/*/local_cpulist
    pci_path: tuple[str, ...]  # socket, root port, switches... (shared prefix = topology)


@dataclass(frozen=True, slots=True)
class NicSlot:
    """One RDMA port (single-port adapters, or one port of a dual-port card)."""

    name: str  # mlx5_0
    netdev: str  # ibp24s0
    bus_id: str
    numa_node: int
    role: str  # compute, storage, management
    rate_gbps: int
    link_layer: str  # InfiniBand or Ethernet
    pci_path: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NvSwitchSlot:
    """An NVSwitch chip on the baseboard."""

    index: int
    bus_id: str
    links_per_gpu: tuple[int, ...]  # links from GPU i to this switch


@dataclass(frozen=True, slots=True)
class NodeProfile:
    """A whole server as the simulator builds it."""

    name: str  # "dgx-h100"
    product: str  # "DGX H100"
    gpu_model: GpuModel
    gpus: tuple[GpuSlot, ...]
    nics: tuple[NicSlot, ...]
    nvswitches: tuple[NvSwitchSlot, ...]
    cpu_model: str
    sockets: int
    cores_per_socket: int
    numa_nodes: int
    driver_version: str
    cuda_driver_version: int  # 12040 = 12.4
    # Published topo matrices show SYS between a GPU and any NIC or GPU not under its
    # own PCIe switch, even on the same socket; profiles that follow them set this.
    cross_switch_level: str | None = None
    notes: str = ""
    # NVLinks joining two GPUs directly (no NVSwitch): (GPU, GPU, links) for each pair
    gpu_nvlinks: tuple[tuple[int, int, int], ...] = ()

    def nvlinks_between(self, a: int, b: int) -> int:
        """Bonded NVLinks between two GPUs as `topo -m` counts them (through NVSwitch, or
        joined directly)."""
        if a == b:
            return 0
        if self.nvswitches:
            return sum(sw.links_per_gpu[a] for sw in self.nvswitches)
        return sum(n for x, y, n in self.gpu_nvlinks if {x, y} == {a, b})

    def reset_together(self, gpus: Iterable[int]) -> frozenset[int]:
        """The GPUs `nvidia-smi -r` must reset in the one command that resets `gpus`: before
        Ampere every GPU NVLink joins to one being reset, and theirs in turn (man
        nvidia-smi, -r); from Ampere on, just those."""
        found = set(gpus)
        if self.gpu_model.architecture not in BEFORE_AMPERE:
            return frozenset(found)
        todo = list(found)
        while todo:
            gpu = todo.pop()
            for peer in self.gpus:
                if peer.index not in found and self.nvlinks_between(gpu, peer.index):
                    found.add(peer.index)
                    todo.append(peer.index)
        return frozenset(found)

    def link_peers(self, gpu: int) -> tuple[int, ...]:
        """The GPU at the far end of each of `gpu`'s NVLinks (by link number), where links
        join GPUs directly: links to the lower-numbered peer first."""
        peers: list[int] = []
        for x, y, n in sorted(self.gpu_nvlinks, key=lambda p: p[1] if p[0] == gpu else p[0]):
            if gpu in (x, y):
                peers += [y if x == gpu else x] * n
        return tuple(peers)

    def pci_level(self, path_a: tuple[str, ...], path_b: tuple[str, ...]) -> str:
        """PIX/PXB/PHB/NODE/SYS between two PCI devices, from their paths.

        A path is (socket, numa, root port, switch, ..., device): the shared prefix of
        the two devices' ancestors says what traffic between them crosses.
        """
        if path_a == path_b:
            return "X"
        up_a, up_b = path_a[:-1], path_b[:-1]
        common = 0
        for x, y in zip(up_a, up_b, strict=False):
            if x != y:
                break
            common += 1
        if common > 3:  # the deepest shared ancestor is a PCIe switch
            return "PIX" if len(up_a) == len(up_b) == common else "PXB"
        if self.cross_switch_level is not None:
            return self.cross_switch_level
        return {3: "PHB", 2: "NODE", 1: "NODE"}.get(common, "SYS")

    def gpu_topology(self) -> tuple[tuple[str, ...], ...]:
        """The GPU-by-GPU part of `nvidia-smi topo -m`."""
        rows = []
        for a in self.gpus:
            row = []
            for b in self.gpus:
                links = self.nvlinks_between(a.index, b.index)
                if a.index == b.index:
                    row.append("X")
                elif links:
                    row.append(f"NV{links}")
                else:
                    row.append(self.pci_level(a.pci_path, b.pci_path))
            rows.append(tuple(row))
        return tuple(rows)


def _bus(bus: int) -> str:
    return f"00000000:{bus:02X}:00.0"


def _dgx_h100() -> NodeProfile:
    # GPU bus ids and NIC pairing from the DGX H100 user guide (GPU i <-> mlx5_x, netdev
    # ibpNs0 gives the NIC's bus in decimal). GPUs sit under the same Broadcom Gen5 switch
    # as their NIC.
    pairs = [
        (0x1B, "mlx5_0", "ibp24s0", 24),
        (0x43, "mlx5_3", "ibp64s0", 64),
        (0x52, "mlx5_4", "ibp79s0", 79),
        (0x61, "mlx5_5", "ibp94s0", 94),
        (0x9D, "mlx5_6", "ibp154s0", 154),
        (0xC3, "mlx5_9", "ibp192s0", 192),
        (0xD1, "mlx5_10", "ibp206s0", 206),
        (0xDF, "mlx5_11", "ibp220s0", 220),
    ]
    module_ids = (2, 4, 3, 1, 7, 5, 8, 6)
    gpus, nics = [], []
    for i, (gbus, rdma, netdev, nbus) in enumerate(pairs):
        socket = 0 if i < 4 else 1
        cpus = "0-55,112-167" if socket == 0 else "56-111,168-223"
        path = (f"socket{socket}", f"numa{socket}", f"rp{i}", f"sw{i}")
        gpus.append(GpuSlot(i, _bus(gbus), module_ids[i], socket, cpus, (*path, f"gpu{i}")))
        nics.append(
            NicSlot(rdma, netdev, _bus(nbus), socket, "compute", 400, "InfiniBand", (*path, rdma))
        )
    # Two dual-port ConnectX-7 for storage and in-band management (the remaining mlx5_1/2/7/8).
    for name, netdev, bus, socket in (
        ("mlx5_1", "enp41s0f0np0", 0x29, 0),
        ("mlx5_2", "enp41s0f1np1", 0x29, 0),
        ("mlx5_7", "enp170s0f0np0", 0xAA, 1),
        ("mlx5_8", "enp170s0f1np1", 0xAA, 1),
    ):
        role = "storage" if name in ("mlx5_1", "mlx5_7") else "management"
        nics.append(
            NicSlot(
                name,
                netdev,
                f"00000000:{bus:02X}:00.{0 if netdev.endswith('np0') else 1}",
                socket,
                role,
                200,
                "Ethernet",
                (f"socket{socket}", f"numa{socket}", f"rps{socket}", name),
            )
        )
    # 4 NVSwitch chips, 4+5+5+4 links from every GPU (18 in all).
    switches = tuple(
        NvSwitchSlot(k, _bus(bus), (links,) * 8)
        for k, (bus, links) in enumerate(((0x05, 4), (0x06, 5), (0x07, 5), (0x08, 4)))
    )
    return NodeProfile(
        name="dgx-h100",
        product=PRODUCTS["dgx-h100"],
        gpu_model=H100_SXM5,
        gpus=tuple(gpus),
        nics=tuple(nics),
        nvswitches=switches,
        cpu_model="Intel Xeon Platinum 8480C",
        sockets=2,
        cores_per_socket=56,
        numa_nodes=2,
        driver_version="550.90.07",
        cuda_driver_version=12040,
        cross_switch_level="SYS",
    )


def _dgx_a100() -> NodeProfile:
    # Published topo for DGX A100 40GB (NPS4): GPU pairs share a switch tree with two
    # compute NICs (PXB); GPUs 0,1 on NUMA 3, 2,3 on 1, 4,5 on 7, 6,7 on 5.
    groups = [
        (3, "48-63,176-191", (0x07, 0x0F), ("mlx5_0", "mlx5_1"), (0x0C, 0x0D)),
        (1, "16-31,144-159", (0x47, 0x4E), ("mlx5_2", "mlx5_3"), (0x4B, 0x54)),
        (7, "112-127,240-255", (0xB7, 0xBD), ("mlx5_6", "mlx5_7"), (0xBA, 0xCC)),
        (5, "80-95,208-223", (0x87, 0x90), ("mlx5_8", "mlx5_9"), (0x8B, 0x93)),
    ]
    module_ids = (7, 5, 8, 6, 3, 1, 4, 2)
    gpus, nics = [], []
    for g, (numa, cpus, gbuses, nic_names, nbuses) in enumerate(groups):
        socket = 0 if numa < 4 else 1
        root = (f"socket{socket}", f"numa{numa}", f"rp{g}", f"sw{g}")
        for k in range(2):
            i = 2 * g + k
            gpus.append(
                GpuSlot(
                    i, _bus(gbuses[k]), module_ids[i], numa, cpus, (*root, f"sw{g}{k}", f"gpu{i}")
                )
            )
            nics.append(
                NicSlot(
                    nic_names[k],
                    f"ibp{nbuses[k]}s0",
                    _bus(nbuses[k]),
                    numa,
                    "compute",
                    200,
                    "InfiniBand",
                    (*root, f"sw{g}{k}n", nic_names[k]),
                )
            )
    for name, port, rate in (("mlx5_4", 0, 200), ("mlx5_5", 1, 100)):
        nics.append(
            NicSlot(
                name,
                f"enp225s0f{port}",
                f"00000000:E1:00.{port}",
                0,
                "storage",
                rate,
                "Ethernet",
                ("socket0", "numa0", "rps0", name),
            )
        )
    switches = tuple(NvSwitchSlot(k, _bus(0xC4 + k), (2,) * 8) for k in range(6))
    return NodeProfile(
        name="dgx-a100",
        product=PRODUCTS["dgx-a100"],
        gpu_model=A100_SXM4_40GB,
        gpus=tuple(gpus),
        nics=tuple(nics),
        nvswitches=switches,
        cpu_model="AMD EPYC 7742",
        sockets=2,
        cores_per_socket=64,
        numa_nodes=8,
        driver_version="535.183.01",
        cuda_driver_version=12020,
        cross_switch_level="SYS",
    )


def _apollo_pcie() -> NodeProfile:
    # Apollo 6500 Gen10 Plus style, XL675d with PCIe GPUs: the exact switch layout is not
    # published; this is the CPU-balanced option, one Gen4 switch per socket with four
    # GPUs and one HDR NIC beneath it.
    gpus, nics = [], []
    for i in range(8):
        socket = i // 4
        cpus = "0-63,128-191" if socket == 0 else "64-127,192-255"
        path = (f"socket{socket}", f"numa{socket}", f"rp{socket}", f"sw{socket}")
        bus = (0x21 + 4 * i) if socket == 0 else (0xA1 + 4 * (i - 4))
        gpus.append(GpuSlot(i, _bus(bus), i + 1, socket, cpus, (*path, f"gpu{i}")))
    for socket in range(2):
        path = (f"socket{socket}", f"numa{socket}", f"rp{socket}", f"sw{socket}")
        bus = 0x31 if socket == 0 else 0xB1
        nics.append(
            NicSlot(
                f"mlx5_{socket}",
                f"ibp{bus}s0",
                _bus(bus),
                socket,
                "compute",
                200,
                "InfiniBand",
                (*path, f"mlx5_{socket}"),
            )
        )
    return NodeProfile(
        name="apollo-pcie",
        product=PRODUCTS["apollo-pcie"],
        gpu_model=A100_PCIE_40GB,
        gpus=tuple(gpus),
        nics=tuple(nics),
        nvswitches=(),
        cpu_model="AMD EPYC 7763",
        sockets=2,
        cores_per_socket=64,
        numa_nodes=2,
        driver_version="535.183.01",
        cuda_driver_version=12020,
        notes="PCIe switch layout assumed (CPU-balanced); HPE does not publish it.",
    )


def _dgx_1v() -> NodeProfile:
    # Published `nvidia-smi topo -m` of a DGX-1 with V100: a hybrid cube mesh of NVLink 2 (NV1
    # and NV2 between neighbours, SYS across the two quads without a link), two GPUs and one
    # EDR NIC under each PCIe switch (PIX). Each switch has a root port of its own: the
    # socket's other switch is NODE here (older published outputs, from before nvidia-smi
    # told NODE from PHB, say PHB). The NICs' bus ids are assumed (the GPUs' are as
    # nvidia-smi lists them).
    quads = [
        (0, "0-19,40-59", ((0x06, 0x07, 0x05, "mlx5_0"), (0x0A, 0x0B, 0x0C, "mlx5_1"))),
        (1, "20-39,60-79", ((0x85, 0x86, 0x84, "mlx5_2"), (0x89, 0x8A, 0x8B, "mlx5_3"))),
    ]
    gpus: list[GpuSlot] = []
    nics: list[NicSlot] = []
    for socket, cpus, switches in quads:
        for k, (gbus_a, gbus_b, nbus, rdma) in enumerate(switches):
            path = (f"socket{socket}", f"numa{socket}", f"rp{socket}{k}", f"sw{socket}{k}")
            for gbus in (gbus_a, gbus_b):
                i = len(gpus)
                gpus.append(GpuSlot(i, _bus(gbus), i + 1, socket, cpus, (*path, f"gpu{i}")))
            nics.append(
                NicSlot(
                    rdma,
                    f"ibp{nbus}s0",
                    _bus(nbus),
                    socket,
                    "compute",
                    100,
                    "InfiniBand",
                    (*path, rdma),
                )
            )
    mesh = (
        (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2), (2, 3, 2),
        (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 2),
    )  # fmt: skip
    return NodeProfile(
        name="dgx-1v",
        product=PRODUCTS["dgx-1v"],
        gpu_model=V100_SXM2_32GB,
        gpus=tuple(gpus),
        nics=tuple(nics),
        nvswitches=(),
        cpu_model="Intel Xeon E5-2698 v4",
        sockets=2,
        cores_per_socket=20,
        numa_nodes=2,
        driver_version="535.183.01",
        cuda_driver_version=12020,
        gpu_nvlinks=mesh,
        notes="NIC bus ids assumed; NVLink numbering within a GPU assumed (peers in order).",
    )


DGX_H100 = _dgx_h100()
DGX_A100 = _dgx_a100()
APOLLO_PCIE = _apollo_pcie()
DGX_1V = _dgx_1v()

PROFILES: dict[str, NodeProfile] = {p.name: p for p in (DGX_H100, DGX_A100, APOLLO_PCIE, DGX_1V)}


def guest_bus_id(k: int) -> str:
    """Where a KVM guest (q35, one pcie-root-port per device) sees its k-th passed GPU."""
    return f"00000000:{6 + k:02X}:00.0"


def guest_profile(host: NodeProfile, gpus: Sequence[int]) -> NodeProfile:
    """What a KVM guest holding some of a host's GPUs through vfio-pci looks like inside:
    those GPUs alone, at the guest's own PCI addresses, with no NVSwitch or NIC of the host."""
    slots = tuple(
        dataclasses.replace(
            host.gpus[i],
            index=k,
            bus_id=guest_bus_id(k),
            numa_node=0,
            cpu_affinity="0-15",
            pci_path=("socket0", f"rp{k}"),
        )
        for k, i in enumerate(gpus)
    )
    return dataclasses.replace(
        host,
        name=f"{host.name}-guest",
        gpus=slots,
        nics=(),
        nvswitches=(),
        sockets=1,
        cores_per_socket=16,  # the guest's vCPUs
        numa_nodes=1,
        cross_switch_level=None,
    )


def get_profile(name: str) -> NodeProfile:
    """Look a profile up by name, with a message that lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown simulator profile {name!r} (known: {known})") from None
