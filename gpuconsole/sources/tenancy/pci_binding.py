"""Which driver holds each GPU, its IOMMU group, and what the nvidia driver calls it.

GPUs are found in sysfs (NVIDIA vendor id, display or 3D class), not through NVML: a GPU
bound to vfio-pci is invisible to NVML but still has an owner. For the ones nvidia holds,
/proc/driver/nvidia/gpus/BDF/information gives the UUID and /dev/nvidiaN minor that join
them to NVML and to the processes holding them.
"""

from __future__ import annotations

import os

from gpuconsole.readings.base import normal_bus_id, safe_text
from gpuconsole.readings.nvml import NVML_TEXT_CHARS
from gpuconsole.readings.tenancy import IommuPeer, PciGpu
from gpuconsole.sources.pci import find_gpus, read_attribute

__all__ = ["driver_of", "iommu_group", "nvidia_info", "read_gpus"]


def _link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path)) or None
    except OSError:
        return None


# the driver's information file is a few hundred bytes: a file that goes on is read this
# far and no further
_READ_LIMIT = 65536


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(_READ_LIMIT)
    except OSError:
        return None


def _read_hex(path: str) -> int | None:
    text = read_attribute(path)
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def _device_dir(sysfs_root: str, bus_id: str) -> str:
    return os.path.join(sysfs_root, "bus", "pci", "devices", normal_bus_id(bus_id))


def driver_of(sysfs_root: str, bus_id: str) -> str | None:
    """The driver bound to a PCI function ("nvidia", "vfio-pci"), or None when unbound."""
    return _link_name(os.path.join(_device_dir(sysfs_root, bus_id), "driver"))


def iommu_group(sysfs_root: str, bus_id: str) -> tuple[int | None, tuple[IommuPeer, ...]]:
    """A function's IOMMU group number and the other functions in it (with their drivers)."""
    group_link = os.path.join(_device_dir(sysfs_root, bus_id), "iommu_group")
    name = _link_name(group_link)
    if name is None or not (name.isascii() and name.isdigit()):
        return None, ()
    members = os.path.join(sysfs_root, "kernel", "iommu_groups", name, "devices")
    try:
        names = sorted(os.listdir(members))
    except OSError:
        try:  # the group link itself, when kernel/iommu_groups is not there
            names = sorted(os.listdir(os.path.join(group_link, "devices")))
        except OSError:
            names = []
    own = normal_bus_id(bus_id)
    peers = tuple(
        IommuPeer(
            bus_id=peer,
            pci_class=_read_hex(os.path.join(_device_dir(sysfs_root, peer), "class")),
            driver=driver_of(sysfs_root, peer),
        )
        for peer in names
        if peer != own
    )
    return int(name), peers


def nvidia_info(proc_root: str, bus_id: str) -> tuple[str | None, str | None, int | None]:
    """(UUID, model, device minor) from /proc/driver/nvidia/gpus/BDF/information."""
    text = _read_text(
        os.path.join(proc_root, "driver", "nvidia", "gpus", normal_bus_id(bus_id), "information")
    )
    if text is None:
        return None, None, None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    minor_text = fields.get("Device Minor", "")
    return (
        _nvml_text(fields.get("GPU UUID", "")),
        _nvml_text(fields.get("Model", "")),
        int(minor_text) if minor_text.isascii() and minor_text.isdigit() else None,
    )


def _nvml_text(text: str) -> str | None:
    """A UUID or model as the driver writes it, made safe; None where there is none, or
    one longer than NVML's buffer for it (not the driver's)."""
    shown = safe_text(text)
    return shown if 0 < len(shown) <= NVML_TEXT_CHARS else None


def read_gpus(sysfs_root: str, proc_root: str) -> tuple[PciGpu, ...]:
    """Every NVIDIA GPU on the PCI bus, with its driver, IOMMU group and nvidia identity."""
    gpus = []
    for device in find_gpus(sysfs_root):
        base = _device_dir(sysfs_root, device.bus_id)
        override = read_attribute(os.path.join(base, "driver_override"))
        group, peers = iommu_group(sysfs_root, device.bus_id)
        driver = driver_of(sysfs_root, device.bus_id)
        uuid, model, minor = (
            nvidia_info(proc_root, device.bus_id) if driver == "nvidia" else (None, None, None)
        )
        gpus.append(
            PciGpu(
                bus_id=device.bus_id,
                device_id=device.device,
                driver=driver,
                driver_override=override if override and override != "(null)" else None,
                iommu_group=group,
                iommu_peers=peers,
                numa_node=device.numa_node,
                uuid=uuid,
                model=model,
                minor=minor,
            )
        )
    return tuple(gpus)
