"""Which NIC each GPU uses for GPUDirect RDMA: the one rule the topology view, placement and
the exporter share, so that they name the same NIC for a GPU.

The fabric source pairs each GPU with its own rail (`GpuAffinity.best_device`): by `nearest`
over the compute NICs, so that GPUs under one PCIe switch with two NICs take one each, the
way DGX systems pair them. While a port of that rail is up the GPU uses it. When the rail is
down the GPU falls back, by the same `nearest`, to a compute NIC with a port up: the nearest
on PCIe (PIX, then PXB, PHB, NODE, SYS), then the one fewest GPUs use (those on their own
rails, then earlier fallbacks in the fabric source's GPU order), then the first in
nvidia-smi's order. The answer depends on the node alone: not on who asks, nor on which
other GPUs a proposal holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import msgspec

from gpuconsole.readings.fabric import LEVELS, FabricDevice, FabricReading, PortRole

__all__ = ["GpuNic", "compute_up", "gpu_nics", "nearest", "nic_order"]


def nic_order(name: str) -> tuple[str, int]:
    """mlx5_2 before mlx5_10, as nvidia-smi numbers its NICs."""
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return head, int(tail) if tail else -1


def nearest(
    levels: Mapping[str, str], candidates: Iterable[str], load: Mapping[str, int]
) -> str | None:
    """Of the candidate NICs, the nearest by `levels` (nvidia-smi's codes), then the one with
    the least `load`, then the first in nvidia-smi's order; None when none has a level."""
    known = [d for d in candidates if levels.get(d) in LEVELS]
    if not known:
        return None
    return min(known, key=lambda d: (LEVELS.index(levels[d]), load.get(d, 0), nic_order(d)))


def compute_up(device: FabricDevice) -> bool:
    """A NIC a GPU can use for GPUDirect RDMA: one of its ports is up and serves compute."""
    return any(p.active and p.role is PortRole.COMPUTE for p in device.ports)


class GpuNic(msgspec.Struct, frozen=True):
    """The NIC one GPU uses for GPUDirect RDMA, and the rail the fabric source paired it with."""

    gpu: str  # bus id, sysfs form
    own: str | None  # its own rail, as the fabric source paired them
    nic: str | None  # the NIC it uses: its own while that is up; None: no compute NIC is up
    level: str | None  # how near `nic` is: PIX, PXB, PHB, NODE, SYS

    @property
    def falls_back(self) -> bool:
        """It uses another NIC than its own rail (which is down)."""
        return self.nic is not None and self.nic != self.own


def gpu_nics(fabric: FabricReading) -> dict[str, GpuNic]:
    """Each GPU the fabric source found (by bus id, sysfs form) with the NIC it uses."""
    up = {d.name for d in fabric.devices if compute_up(d)}
    own_rail = {
        a.pci_bus_id: a.best_device
        for a in fabric.gpus
        if a.best_device in up and a.best_level in LEVELS
    }
    load = Counter(own_rail.values())
    out = {}
    for affinity in fabric.gpus:
        bus, own = affinity.pci_bus_id, affinity.best_device
        if bus in own_rail:
            out[bus] = GpuNic(bus, own, own, affinity.best_level)
            continue
        levels = {lv.device: lv.level for lv in affinity.levels}
        nic = nearest(levels, up, load)
        if nic is not None:
            load[nic] += 1
        out[bus] = GpuNic(bus, own, nic, levels.get(nic) if nic else None)
    return out
