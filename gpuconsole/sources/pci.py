"""PCI devices as sysfs shows them: GPUs found by class and vendor, and how far apart two are.

A device's sysfs path is the chain of bridges from its root complex, e.g.
devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0/0000:1b:00.0; comparing two
chains gives nvidia-smi's PIX/PXB/PHB/NODE/SYS without asking any driver.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuconsole.readings.base import normal_bus_id

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0302, 0x0300)  # 3D controller, VGA controller (class >> 8)

__all__ = [
    "PciDevice",
    "find_gpus",
    "pci_level",
    "read_attribute",
    "read_device",
    "read_path",
    "socket_of_numa",
]


@dataclass(frozen=True, slots=True)
class PciDevice:
    """One PCI function: identity, NUMA node and the bridges above it."""

    bus_id: str  # 0000:1b:00.0
    vendor: int | None
    device: int | None
    pci_class: int | None  # the 24-bit class code, e.g. 0x030200
    numa_node: int | None
    chain: tuple[str, ...]  # ("pci0000:17", "0000:17:00.0", ..., "0000:1b:00.0")


# a sysfs attribute is a line: one that goes on past this is no attribute
_READ_LIMIT = 4096


def read_attribute(path: str) -> str | None:
    """A sysfs attribute's text, stripped; None where it cannot be read, or is not one line
    of printable ASCII (bytes that are not UTF-8, a terminal's escape sequence, a line that
    goes on). The one way sysfs attributes are read: a UnicodeDecodeError is a ValueError,
    which a caller catching OSError alone would miss."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read(_READ_LIMIT + 1)
    except (OSError, ValueError):
        return None
    text = text.strip()
    return text if len(text) <= _READ_LIMIT and text.isprintable() else None


def _read_int(path: str, base: int = 0) -> int | None:
    text = read_attribute(path)
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


def read_path(sysfs_root: str, device_dir: str) -> PciDevice | None:
    """The PCI function behind a sysfs directory (or a link to it), if it is one."""
    real = os.path.realpath(device_dir)
    devices = os.path.realpath(os.path.join(sysfs_root, "devices"))
    rel = os.path.relpath(real, devices)
    if rel.startswith(".."):
        return None
    chain = tuple(part for part in rel.split(os.sep) if part and part != ".")
    if not chain:
        return None
    numa = _read_int(os.path.join(real, "numa_node"), 10)
    return PciDevice(
        bus_id=chain[-1],
        vendor=_read_int(os.path.join(real, "vendor"), 16),
        device=_read_int(os.path.join(real, "device"), 16),
        pci_class=_read_int(os.path.join(real, "class"), 16),
        numa_node=numa if numa is not None and numa >= 0 else None,
        chain=chain,
    )


def read_device(sysfs_root: str, bus_id: str) -> PciDevice | None:
    """A PCI function by bus id (NVML or sysfs form), or None when sysfs has no such one."""
    link = os.path.join(sysfs_root, "bus", "pci", "devices", normal_bus_id(bus_id))
    if not os.path.exists(link):
        return None
    return read_path(sysfs_root, link)


def find_gpus(sysfs_root: str) -> tuple[PciDevice, ...]:
    """Every NVIDIA display or 3D controller on the PCI bus, in bus order."""
    folder = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return ()
    found = []
    for name in names:
        base = os.path.join(folder, name)
        if _read_int(os.path.join(base, "vendor"), 16) != NVIDIA_VENDOR:
            continue
        pci_class = _read_int(os.path.join(base, "class"), 16)
        if pci_class is None or pci_class >> 8 not in GPU_CLASSES:
            continue
        device = read_path(sysfs_root, base)
        if device is not None:
            found.append(device)
    return tuple(found)


def pci_level(a: PciDevice, b: PciDevice) -> str:
    """PIX/PXB/PHB/NODE/SYS between two functions, as nvidia-smi topo -m names them.

    PIX: both hang off one PCIe switch; PXB: through several switches; PHB: through the
    root complex; NODE: between root complexes of one NUMA node; SYS: across NUMA nodes.
    """
    if a.chain == b.chain:
        return "X"
    up_a, up_b = a.chain[:-1], b.chain[:-1]
    common = 0
    for x, y in zip(up_a, up_b, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return "NODE" if a.numa_node == b.numa_node else "SYS"
    if common == 1:  # only the host bridge is shared
        return "PHB"
    # Below a shared port: one hop down each side (a switch's downstream ports) is PIX.
    if len(up_a) - common <= 1 and len(up_b) - common <= 1:
        return "PIX"
    return "PXB"


def socket_of_numa(sysfs_root: str, numa_node: int | None) -> int | None:
    """The CPU package a NUMA node belongs to, from its first CPU's topology."""
    if numa_node is None:
        return None
    base = os.path.join(sysfs_root, "devices", "system")
    text = read_attribute(os.path.join(base, "node", f"node{numa_node}", "cpulist"))
    if text is None:
        return None
    first = text.split(",")[0].split("-")[0]
    if not first.isdigit():
        return None
    return _read_int(
        os.path.join(base, "cpu", f"cpu{first}", "topology", "physical_package_id"), 10
    )
