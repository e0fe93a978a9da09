"""Which network each port serves, and which NIC each GPU should use for GPUDirect RDMA.

Roles come from the config first (`roles = { mlx5_1 = "storage" }`, by device, device/port
or netdev name), else from rules: a port under a GPU's PCIe switch is a compute rail.
A GPU's best NIC is the nearest compute NIC on PCIe, balanced so that GPUs sharing a
switch with two NICs take one each, the way DGX systems pair them: `facts.pairing.nearest`,
the rule that also picks the NIC a GPU falls back to when its rail is down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuconsole.facts.pairing import nearest
from gpuconsole.readings.fabric import (
    AffinityFlag,
    FabricPort,
    GpuAffinity,
    NicLevel,
    PortRole,
)
from gpuconsole.sources.fabric.infiniband import IbDevice, IbPort
from gpuconsole.sources.pci import PciDevice, pci_level

NEAR = ("PIX", "PXB")
STORAGE_MIN_GBPS = 100.0


@dataclass(frozen=True, slots=True)
class GpuPlace:
    """A GPU as affinity sees it: its PCI function and socket."""

    pci: PciDevice
    socket: int | None


def parse_roles(roles: Mapping[str, str]) -> dict[str, PortRole]:
    """Config role names to PortRole; ValueError names a bad one."""
    out = {}
    for key, value in roles.items():
        try:
            out[key] = PortRole(value.strip().lower())
        except ValueError:
            known = ", ".join(r.value for r in PortRole)
            raise ValueError(f"role of {key!r} is {value!r}, not one of {known}") from None
    return out


def port_role(
    device: IbDevice,
    port: IbPort,
    gpus: Sequence[GpuPlace],
    configured: Mapping[str, PortRole],
) -> tuple[PortRole, str]:
    """The role of one port and why: ("compute", "config") or a rule in words."""
    for key in (f"{device.name}/{port.port}", device.name, port.netdev or ""):
        role = configured.get(key)
        if role is not None:
            return role, "config"
    if device.pci is not None:
        for gpu in gpus:
            if pci_level(gpu.pci, device.pci) in NEAR:
                return PortRole.COMPUTE, "under a GPU's PCIe switch"
    if port.link_layer == "InfiniBand":
        if not gpus:
            return PortRole.COMPUTE, "InfiniBand (no GPU found on PCI)"
        return PortRole.STORAGE, "InfiniBand, no GPU beneath its switch"
    if (port.rate_gbps or 0.0) >= STORAGE_MIN_GBPS:
        return PortRole.STORAGE, f"Ethernet at {STORAGE_MIN_GBPS:g} Gb/s or more"
    return PortRole.MANAGEMENT, f"Ethernet below {STORAGE_MIN_GBPS:g} Gb/s"


def gpu_affinity(
    gpus: Sequence[GpuPlace],
    devices: Sequence[tuple[IbDevice, int | None]],
    ports: Sequence[FabricPort],
    peermem_loaded: bool | None,
) -> tuple[GpuAffinity, ...]:
    """Each GPU's distance to every RDMA device, its best compute NIC, and flags.

    `devices` pairs each device with its socket; `ports` carries the roles and states.
    """
    compute = {p.device for p in ports if p.role is PortRole.COMPUTE}
    candidates = [(d, s) for d, s in devices if d.pci is not None and d.name in compute]
    if not candidates:
        candidates = [(d, s) for d, s in devices if d.pci is not None]
    by_device: dict[str, list[FabricPort]] = {}
    for port in ports:
        by_device.setdefault(port.device, []).append(port)
    taken: dict[str, int] = {}
    out = []
    for gpu in gpus:
        levels = tuple(
            NicLevel(d.name, pci_level(gpu.pci, d.pci)) for d, _s in devices if d.pci is not None
        )
        level_of = {n.device: n.level for n in levels}
        pick = nearest(level_of, (d.name for d, _s in candidates), taken)
        best = next((c for c in candidates if c[0].name == pick), None)
        flags: list[AffinityFlag] = []
        best_level = None
        if best is not None:
            device, socket = best
            taken[device.name] = taken.get(device.name, 0) + 1
            best_level = level_of[device.name]
            if socket is not None and gpu.socket is not None and socket != gpu.socket:
                flags.append(AffinityFlag.CROSS_SOCKET)
            if best_level not in NEAR:
                flags.append(AffinityFlag.NO_NEAR_NIC)
            rails = by_device.get(device.name, [])
            if rails and not any(p.active for p in rails):
                flags.append(AffinityFlag.RAIL_DOWN)
            elif any(p.downtrained for p in rails):
                flags.append(AffinityFlag.RAIL_DOWNTRAINED)
        if peermem_loaded is False:
            flags.append(AffinityFlag.NO_PEERMEM)
        out.append(
            GpuAffinity(
                pci_bus_id=gpu.pci.bus_id,
                numa_node=gpu.pci.numa_node,
                socket=gpu.socket,
                levels=levels,
                best_device=best[0].name if best is not None else None,
                best_level=best_level,
                flags=tuple(flags),
            )
        )
    return tuple(out)


def nic_levels(devices: Sequence[IbDevice]) -> dict[str, tuple[NicLevel, ...]]:
    """Each RDMA device's distance to every one of them (nvidia-smi's NIC rows)."""
    placed = [(d.name, d.pci) for d in devices if d.pci is not None]
    return {
        name: tuple(NicLevel(other, pci_level(pci, to)) for other, to in placed)
        for name, pci in placed
    }
