"""Every GPU of a node, whether NVML sees it or not: what a view or an exporter lists.

NVML on a host cannot see a GPU bound to vfio-pci for a guest, but the tenancy source's PCI
inventory can; `node_gpus` joins the two by bus id (through `node_ownership`), so a
passed-through GPU keeps its row, its owner and its driver, with no NVML reading to show.
"""

from __future__ import annotations

import msgspec

from gpuconsole.facts.ownership import GpuOwner, Inconsistency, OwnerKind, node_ownership
from gpuconsole.readings.base import Event
from gpuconsole.readings.nvml import GpuReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import GuestGpu, PciGpu

__all__ = [
    "GpuRow",
    "event_gpu",
    "gpu_and_bus",
    "gpu_name",
    "node_gpus",
    "ownership_problems",
    "short_bus_id",
]


def short_bus_id(bus_id: str) -> str:
    """'1b:00.0': a bus id (sysfs form) as an operator reads it, without the domain."""
    return bus_id.split(":", 1)[1] if bus_id.count(":") == 2 else bus_id


def gpu_name(index: int | None, bus_id: str) -> str:
    """How views and plans name a GPU: 'GPU 3' for one NVML numbers, else 'GPU 1b:00.0'.
    The number is only a label (NVML numbers the GPUs again when one leaves its driver);
    the bus id is what an action acts on."""
    return f"GPU {index}" if index is not None else f"GPU {short_bus_id(bus_id)}"


def gpu_and_bus(index: int | None, bus_id: str | None) -> str:
    """How an event names a GPU, which outlives its number: 'GPU 5 (c3:00.0)'; 'GPU 5' for
    one whose bus id NVML never read, 'GPU c3:00.0' for one NVML does not number."""
    if bus_id is None or ":" not in bus_id:
        return f"GPU {index}" if index is not None else "a GPU"
    name = gpu_name(index, bus_id)
    return f"{name} ({short_bus_id(bus_id)})" if index is not None else name


class GpuRow(msgspec.Struct, frozen=True):
    """One GPU of a node: NVML's reading (None when NVML cannot see it), its owners and what
    sysfs says of it (both None until the tenancy source has read the node)."""

    bus_id: str  # sysfs form, "0000:1b:00.0": the key that survives NVML's renumbering
    reading: GpuReading | None
    owner: GpuOwner | None
    pci: PciGpu | None = None
    # a passthrough GPU as its guest's agent reads it (NVML inside the guest), where one does
    guest: GuestGpu | None = None

    @property
    def seen(self) -> GpuReading | None:
        """What is known of its state: the host's NVML reading, else its guest's."""
        if self.reading is not None:
            return self.reading
        return self.guest.reading if self.guest is not None else None

    @property
    def index(self) -> int | None:
        """NVML's index on this host; None for a GPU NVML cannot see."""
        return self.reading.index if self.reading is not None else None

    @property
    def uuid(self) -> str | None:
        """NVML's UUID; the NVIDIA driver's (from /proc) for a GPU NVML could not read."""
        if self.reading is not None and ":" in self.reading.pci_bus_id:
            return self.reading.uuid
        if self.pci is not None and self.pci.uuid:
            return self.pci.uuid
        if self.owner is not None and self.owner.uuid:
            return self.owner.uuid
        return self.reading.uuid if self.reading is not None else None

    @property
    def model(self) -> str | None:
        if self.reading is not None and self.reading.name != "unknown":
            return self.reading.name
        return self.owner.model if self.owner is not None else None

    @property
    def driver(self) -> str | None:
        """The host driver bound to it: nvidia, vfio-pci, something else, or None."""
        if self.owner is not None:
            return self.owner.driver
        return "nvidia" if self.reading is not None else None

    @property
    def passthrough(self) -> bool:
        """Bound to vfio-pci (for a guest, or waiting for one), so NVML cannot read it."""
        return self.driver == "vfio-pci" and self.reading is None

    @property
    def lost(self) -> bool:
        return self.reading is not None and self.reading.lost

    @property
    def label(self) -> str:
        """Who holds it: 'vm acme-train-vm', 'pod a/b', 'free'; '-' until tenancy has read."""
        return self.owner.label if self.owner is not None else "-"

    @property
    def in_use(self) -> bool:
        """Held by a tenant; without tenancy, running compute processes."""
        if self.owner is not None:
            return self.owner.owner.holds
        return self.reading is not None and bool(self.reading.processes)

    @property
    def free(self) -> bool:
        """In the free pool; without tenancy, an NVML GPU with no process that is not lost."""
        if self.owner is not None:
            return self.owner.kind is OwnerKind.FREE
        reading = self.reading
        return (
            reading is not None
            and not reading.lost
            and not reading.unreadable
            and not reading.processes
        )

    @property
    def short_bus(self) -> str:
        """'1b:00.0': the bus id an operator reads, without the domain."""
        return short_bus_id(self.bus_id)

    @property
    def name(self) -> str:
        """'GPU 3' for one NVML numbers, else its bus id: how a message names it."""
        return gpu_name(self.index, self.bus_id)


def node_gpus(node: NodeSnapshot) -> tuple[GpuRow, ...]:
    """Every GPU of the node, in NVML's order, each GPU NVML cannot see placed by bus id among
    them (a real host numbers its GPUs in PCI order, so that is PCI order there)."""
    ownership = node_ownership(node)
    readings = node.gpus
    if ownership is None:
        return tuple(GpuRow(g.pci_bus_id, g, None) for g in readings)
    pci = {p.bus_id: p for p in node.tenancy.gpus} if node.tenancy else {}
    guests = {g.bus_id: g for g in node.tenancy.guest_gpus} if node.tenancy else {}
    rows: list[GpuRow] = []
    placed: set[int] = set()
    for owner in ownership.gpus:
        reading = node.nvml.gpu(owner.index) if node.nvml and owner.index is not None else None
        if reading is not None:
            placed.add(reading.index)
        guest = guests.get(owner.bus_id) if reading is None else None
        rows.append(GpuRow(owner.bus_id, reading, owner, pci.get(owner.bus_id), guest))
    rows += [GpuRow(g.pci_bus_id, g, None) for g in readings if g.index not in placed]
    seen = sorted((r.bus_id, r.index) for r in rows if r.index is not None)

    def order(row: GpuRow) -> tuple[int, int, str]:
        if row.index is not None:
            return row.index, 0, ""
        before = [index for bus, index in seen if bus < row.bus_id]
        return max(before, default=-1), 1, row.bus_id

    return tuple(sorted(rows, key=order))


def event_gpu(node: NodeSnapshot, event: Event) -> GpuRow | None:
    """The GPU of `node` an event is about, as the node is now: by bus id; else by UUID (an
    agent that sends no bus id); else, for a GPU NVML lost before it could read it, the GPU
    lost since the instant the event told it (it keeps that across NVML's renumbering).
    Never by NVML's number then, which may be another GPU's now."""
    rows = node_gpus(node)
    if event.gpu_bus_id is not None:
        return next((r for r in rows if r.bus_id == event.gpu_bus_id), None)
    if event.gpu_uuid is not None:
        return next((r for r in rows if r.uuid == event.gpu_uuid), None)
    if event.gpu_index is None:
        return None
    unread = [r for r in rows if r.reading is not None and ":" not in r.reading.pci_bus_id]
    return next((r for r in unread if r.reading and r.reading.lost_since == event.at), None)


def ownership_problems(node: NodeSnapshot) -> tuple[Inconsistency, ...]:
    """What does not add up about who owns the node's GPUs; () until tenancy has read."""
    ownership = node_ownership(node)
    return ownership.all_problems if ownership is not None else ()
