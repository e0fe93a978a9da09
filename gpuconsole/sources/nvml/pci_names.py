"""The bus id and UUID of a GPU NVML counts but cannot open, from the nvidia driver.

A GPU that fell off the bus before NVML started (or one it may not open) has no handle, so
NVML never says its bus id. The nvidia driver still holds its PCI function: sysfs lists it
among the NVIDIA display and 3D controllers bound to `nvidia`, and
/proc/driver/nvidia/gpus/BDF/information gives its UUID.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuconsole.sources.nvml.state import GpuRecord
from gpuconsole.sources.pci import find_gpus

__all__ = ["name_unopened"]


def name_unopened(gpus: Sequence[GpuRecord], sysfs_root: str, proc_root: str) -> None:
    """Give each GPU NVML did not open (no bus id yet) its PCI function's bus id, and its
    UUID and model where the driver's /proc entry says them, in place.

    NVML numbers GPUs in PCI bus order. A GPU is named only where that order holds on this
    node: the nvidia driver holds exactly as many GPUs as NVML counts, and each one NVML
    opened sits at its own number among them; then the function at an unnamed GPU's
    number is that GPU. Anything else (a GPU excluded from NVML, a fake library over
    another machine's sysfs) names none, rather than the wrong one."""
    unnamed = [g for g in gpus if ":" not in g.bus_id]
    if not unnamed:
        return
    # here only: the tenancy package's import (grpc among it) is no cost to a healthy node
    from gpuconsole.sources.tenancy.pci_binding import driver_of, nvidia_info

    held = [d.bus_id for d in find_gpus(sysfs_root) if driver_of(sysfs_root, d.bus_id) == "nvidia"]
    if len(held) != len(gpus) or any(":" in g.bus_id and held[g.index] != g.bus_id for g in gpus):
        return
    for gpu in unnamed:
        gpu.bus_id = held[gpu.index]
        uuid, model, _minor = nvidia_info(proc_root, gpu.bus_id)
        if uuid:
            gpu.uuid = uuid
        if model:
            gpu.name = model
