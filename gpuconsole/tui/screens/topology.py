"""Topology: each GPU's NIC for GPUDirect RDMA and its owner, the `nvidia-smi topo -m` matrix
over GPUs and NICs, the PCIe tree and the NVSwitch fabric.

Everything here comes from the snapshot's readings: GPU-to-GPU paths from NVML, GPU-to-NIC
paths, sockets, NUMA nodes, rails and the pairing itself from the fabric source (which
measured them on PCI), owners from tenancy. A simulated node is drawn the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from rich.tree import Tree
from textual.app import ComposeResult
from textual.containers import Container, ScrollableContainer
from textual.widgets import Static

from gpuconsole import format as fmt
from gpuconsole.facts import summaries
from gpuconsole.facts.inventory import GpuRow
from gpuconsole.facts.pairing import gpu_nics, nic_order
from gpuconsole.hardware import short_model
from gpuconsole.readings.base import Health, nvml_bus_id
from gpuconsole.readings.fabric import (
    AffinityFlag,
    FabricDevice,
    FabricReading,
    GpuAffinity,
    PortRole,
)
from gpuconsole.readings.nvml import RemoteKind
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.tui.screens.base import BaseView
from gpuconsole.tui.themes import Palette

NEAR = ("PIX", "PXB")  # under the GPU's own PCIe switch (tree): what GPUDirect RDMA wants
LEGEND = (
    "X self · NV# bonded NVLinks · PIX ≤1 PCIe bridge · PXB several bridges · "
    "PHB through a host bridge · NODE across host bridges in a NUMA node · "
    "SYS across the socket link · - NVML cannot see the GPU"
)
# How much each flag the fabric source raises matters; peermem is said once per node.
FLAG_HEALTH = {
    AffinityFlag.RAIL_DOWN: Health.CRITICAL,
    AffinityFlag.CROSS_SOCKET: Health.CRITICAL,
    AffinityFlag.NO_NEAR_NIC: Health.WARNING,
    AffinityFlag.RAIL_DOWNTRAINED: Health.WARNING,
    AffinityFlag.NO_PEERMEM: Health.WARNING,
}


def nics(fabric: FabricReading | None) -> list[FabricDevice]:
    """The node's RDMA devices in nvidia-smi's NIC order."""
    return sorted(fabric.devices, key=lambda d: nic_order(d.name)) if fabric is not None else []


def rail_up(device: FabricDevice) -> bool:
    return any(p.active for p in device.ports)


@dataclass(frozen=True, slots=True)
class Pairing:
    """A GPU's NIC for GPUDirect RDMA as the fabric source chose it, and what is wrong with it.

    When that NIC's rail is down, `fallback` is the NIC `facts.pairing` says the GPU uses
    instead (placement and the exporter name the same), and `fallback_level` its path.
    """

    row: GpuRow
    affinity: GpuAffinity | None
    fallback: str | None = None
    fallback_level: str | None = None

    @property
    def nic(self) -> str | None:
        return self.affinity.best_device if self.affinity is not None else None

    @property
    def level(self) -> str | None:
        return self.affinity.best_level if self.affinity is not None else None

    @property
    def flags(self) -> tuple[AffinityFlag, ...]:
        """The fabric source's flags, less peermem (a node-wide fact, said once)."""
        if self.affinity is None:
            return ()
        return tuple(f for f in self.affinity.flags if f is not AffinityFlag.NO_PEERMEM)

    @property
    def crosses_sockets(self) -> bool:
        """Its traffic crosses the socket link: chosen so, or falling back so."""
        if AffinityFlag.CROSS_SOCKET in self.flags or self.level == "SYS":
            return True
        return AffinityFlag.RAIL_DOWN in self.flags and self.fallback_level == "SYS"

    @property
    def health(self) -> Health:
        """Critical when its rail is down or it crosses sockets; a warning for the rest."""
        if self.affinity is None:
            return Health.UNKNOWN
        worst = Health.OK
        for flag in self.flags:
            if FLAG_HEALTH[flag] is Health.CRITICAL:
                return Health.CRITICAL
            worst = Health.WARNING
        return Health.CRITICAL if self.crosses_sockets else worst

    def words(self) -> list[str]:
        """What is wrong, one phrase per flag, in the fabric source's words."""
        out = []
        for flag in self.flags:
            if flag is AffinityFlag.RAIL_DOWN:
                if self.fallback is None:
                    out.append(f"{flag.value}: no other compute rail is up")
                else:
                    where = " across the socket link" if self.fallback_level == "SYS" else ""
                    out.append(f"{flag.value}: falls back to {self.fallback} "
                               f"({self.fallback_level}){where}")  # fmt: skip
            else:
                out.append(flag.value)
        if self.level == "SYS" and AffinityFlag.CROSS_SOCKET not in self.flags:
            out.append(AffinityFlag.CROSS_SOCKET.value)
        return out


def pairings(node: NodeSnapshot) -> list[Pairing]:
    """Every GPU of the node (a guest's too: the fabric source finds it on PCI) with its NIC."""
    fabric = node.fabric
    used = gpu_nics(fabric) if fabric is not None else {}
    out = []
    for row in summaries.gpu_rows(node):
        affinity = fabric.gpu(row.bus_id) if fabric is not None and ":" in row.bus_id else None
        choice = used.get(affinity.pci_bus_id) if affinity is not None else None
        if choice is not None and choice.falls_back:
            out.append(Pairing(row, affinity, choice.nic, choice.level))
        else:
            out.append(Pairing(row, affinity))
    return out


def level_style(code: str, palette: Palette) -> Style:
    """Near is green, through a host bridge amber, across sockets grey; NVLink bold."""
    if code in ("X", "-", "?"):
        return Style(dim=True)
    if code.startswith("NV"):
        return palette.health[Health.OK] + Style(bold=True)
    if code in NEAR:
        return palette.health[Health.OK]
    if code in ("PHB", "NODE"):
        return palette.health[Health.WARNING]
    return palette.health[Health.STALE]


def gpu_name(row: GpuRow) -> str:
    """'GPU3', or the bus id of a GPU NVML does not number (a guest's)."""
    return f"GPU{row.index}" if row.index is not None else row.short_bus[:5]


def matrix(node: NodeSnapshot, palette: Palette) -> Text:
    """GPU and NIC rows against GPU and NIC columns, with CPU affinity and NUMA node.

    Laid out in fixed columns like `nvidia-smi topo -m`, so it scrolls instead of squeezing.
    """
    rows = summaries.gpu_rows(node)
    fabric = node.fabric
    devices = nics(fabric)
    topo = node.nvml.gpu_topology if node.nvml is not None else ()
    position = {g.index: k for k, g in enumerate(node.gpus)}  # NVML's rows are in its order
    names = [gpu_name(r) for r in rows] + [f"NIC{i}" for i in range(len(devices))]
    width = max([5, *(len(n) for n in names)]) + 1
    text = Text(no_wrap=True)
    text.append(" " * width)
    for k, name in enumerate(names):
        down = k >= len(rows) and not rail_up(devices[k - len(rows)])
        text.append(name.ljust(width), style=palette.health[Health.CRITICAL] if down else "bold")
    text.append("CPU affinity".ljust(18) + "NUMA", style="bold")

    def gpu_level(a: GpuRow, b: GpuRow) -> str:
        if a.bus_id == b.bus_id:
            return "X"
        if a.index is None or b.index is None:
            return "-"  # NVML cannot see one of them (a guest's)
        pa, pb = position.get(a.index), position.get(b.index)
        if pa is None or pb is None:
            return "-"
        line = topo[pa] if pa < len(topo) else ()
        return line[pb] if pb < len(line) else "?"

    for row in rows:
        affinity = fabric.gpu(row.bus_id) if fabric is not None and ":" in row.bus_id else None
        by_device = {lv.device: lv.level for lv in affinity.levels} if affinity else {}
        text.append("\n")
        text.append(gpu_name(row).ljust(width), style="bold")
        for other in rows:
            code = gpu_level(row, other)
            text.append(code.ljust(width), style=level_style(code, palette))
        for device in devices:
            code = by_device.get(device.name, "?")
            style = level_style(code, palette)
            if affinity is not None and device.name == affinity.best_device:
                style += Style(underline=True)  # the NIC the fabric source pairs it with
            text.append(code.ljust(width), style=style)
        reading = row.reading
        numa = reading.numa_node if reading is not None else None
        if numa is None and affinity is not None:
            numa = affinity.numa_node
        text.append(((reading.cpu_affinity if reading else None) or "-").ljust(18))
        text.append(fmt.number(numa))
    # a NIC's row: GPUs as they see it, the other NICs by the fabric source's levels
    seen_by = {
        row.bus_id: {lv.device: lv.level for lv in affinity.levels}
        for row in rows
        if fabric is not None and ":" in row.bus_id and (affinity := fabric.gpu(row.bus_id))
    }
    for k, device in enumerate(devices):
        down = not rail_up(device)
        name_style = palette.health[Health.CRITICAL] if down else "bold"
        text.append("\n")
        text.append(names[len(rows) + k].ljust(width), style=name_style)
        for row in rows:
            code = seen_by.get(row.bus_id, {}).get(device.name, "?")
            text.append(code.ljust(width), style=level_style(code, palette))
        levels = {lv.device: lv.level for lv in device.levels}
        for peer in devices:
            code = levels.get(peer.name, "X" if peer is device else "?")
            text.append(code.ljust(width), style=level_style(code, palette))
        text.append("-".ljust(18))
        text.append(fmt.number(device.numa_node))
    return text


def nic_legend(node: NodeSnapshot, palette: Palette) -> Text:
    """NIC# to device, netdev, role, rate and state, as the fabric source read them."""
    fabric = node.fabric
    if fabric is None:
        return Text(summaries.pending_panel(node, "fabric") or fmt.NA, style=palette.dim)
    text = Text()
    for i, device in enumerate(nics(fabric)):
        text.append(f"NIC{i}: {device.name}")
        for port in device.ports:
            rate = port.rate_text or (f"{port.rate_gbps:g} Gb/s" if port.rate_gbps else fmt.NA)
            text.append(f" {port.netdev or '-'} · {port.role.value} · {rate} {port.link_layer}")
            if not port.active:
                text.append(f" · {port.state} ({port.phys_state})",
                            style=palette.health[Health.CRITICAL])  # fmt: skip
            elif port.downtrained:
                text.append(" · downtrained", style=palette.health[Health.WARNING])
        text.append(f" · NUMA {fmt.number(device.numa_node)}\n")
    text.rstrip()
    return text


def _gpu_label(row: GpuRow, palette: Palette) -> Text:
    text = Text()
    if row.index is None:
        glyph = summaries.PASSTHROUGH_GLYPH if row.passthrough else summaries.UNSEEN_GLYPH
        text.append(f"{glyph} ", style=palette.passthrough_fg if row.passthrough else palette.dim)
        text.append(f"GPU {row.short_bus}  {row.driver or 'no driver'}")
        return text
    text.append(f"GPU {row.index}  {row.short_bus}")
    if row.lost:
        text.append("  LOST", style=palette.health[Health.CRITICAL])
    return text


def _nic_label(device: FabricDevice, palette: Palette) -> Text:
    roles = sorted({p.role.value for p in device.ports})
    rates = sorted({f"{p.rate_gbps:g}G" for p in device.ports if p.rate_gbps})
    text = Text(f"{device.name}  {'/'.join(roles)} {' '.join(rates)}".rstrip())
    if not rail_up(device):
        text.append("  DOWN", style=palette.health[Health.CRITICAL])
    elif any(p.downtrained for p in device.ports):
        text.append("  downtrained", style=palette.health[Health.WARNING])
    return text


def pci_tree(node: NodeSnapshot, palette: Palette) -> RenderableType:
    """Sockets > NUMA nodes > PCIe switches > GPUs and NICs, from the fabric source's levels.

    GPUs and NICs one or a few bridges apart (PIX, PXB) share a switch; the reading has no
    bridge addresses, so each switch (or switch tree) is one branch.
    """
    rows = summaries.gpu_rows(node)
    root = Tree(f"{node.node}  {len(rows)}\u00d7 {short_model(summaries.node_model(node))}",
                guide_style="dim")  # fmt: skip
    fabric = node.fabric
    if fabric is None:
        by_numa: dict[int | None, list[GpuRow]] = {}
        for row in rows:
            numa = row.reading.numa_node if row.reading is not None else None
            if numa is None and row.pci is not None:
                numa = row.pci.numa_node
            by_numa.setdefault(numa, []).append(row)
        for numa, members in sorted(by_numa.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            branch = root.add(f"NUMA {fmt.number(numa)}")
            for row in members:
                branch.add(_gpu_label(row, palette))
        root.add(Text("PCIe switches and NICs: " + (summaries.pending_panel(node, "fabric") or fmt.NA),
                      style=palette.dim))  # fmt: skip
        return root

    devices = nics(fabric)
    affinities = {r.bus_id: fabric.gpu(r.bus_id) for r in rows if ":" in r.bus_id}
    # Union GPUs with the NICs near them: each group is one switch (or switch tree).
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    deepest: dict[str, str] = {}
    for bus, affinity in affinities.items():
        for lv in affinity.levels if affinity is not None else ():
            if lv.level in NEAR:
                a, b = find(f"gpu:{bus}"), find(f"nic:{lv.device}")
                parent[a] = b
    for affinity in affinities.values():
        for lv in affinity.levels if affinity is not None else ():
            if lv.level in NEAR:
                group = find(f"nic:{lv.device}")
                if lv.level == "PXB" or deepest.get(group) != "PXB":
                    deepest[group] = lv.level

    # place: (socket, numa) -> group -> members
    places: dict[tuple[int | None, int | None], dict[str, list[Text]]] = {}
    for row in rows:
        affinity = affinities.get(row.bus_id)
        socket = affinity.socket if affinity is not None else None
        numa = affinity.numa_node if affinity is not None else None
        key = f"gpu:{row.bus_id}"
        group = find(key) if key in parent else key
        places.setdefault((socket, numa), {}).setdefault(group, []).append(_gpu_label(row, palette))
    for device in devices:
        key = f"nic:{device.name}"
        group = find(key) if key in parent else key
        places.setdefault((device.socket, device.numa_node), {}).setdefault(group, []).append(
            _nic_label(device, palette)
        )
    cpus: dict[int | None, set[str]] = {}
    for row in rows:
        if row.reading is not None and row.reading.cpu_affinity:
            cpus.setdefault(row.reading.numa_node, set()).add(row.reading.cpu_affinity)
    sockets: dict[int | None, Tree] = {}

    def order(kv: tuple[tuple[int | None, int | None], object]) -> tuple[int, int]:
        (socket, numa), _ = kv
        return (-1 if socket is None else socket, -1 if numa is None else numa)

    for (socket, numa), groups in sorted(places.items(), key=order):
        if socket not in sockets:
            sockets[socket] = root.add(f"CPU socket {fmt.number(socket)}")
        numa_label = f"NUMA {fmt.number(numa)}"
        if cpus.get(numa):
            numa_label += f"  CPUs {sorted(cpus[numa])[0]}"
        branch = sockets[socket].add(numa_label)
        for group, labels in groups.items():
            if len(labels) == 1 and group not in deepest:
                branch.add(labels[0])  # nothing shares its switch: straight off the root port
                continue
            switch = branch.add(
                "PCIe switch" if deepest.get(group) == "PIX" else "PCIe switches (PXB)"
            )
            for label in labels:
                switch.add(label)
    return root


def nvswitch_box(node: NodeSnapshot) -> RenderableType:
    """Links from each GPU to each NVSwitch, counted from the NVLink readings."""
    switches: dict[str, dict[int, int]] = {}
    for gpu in node.gpus:
        for link in gpu.nvlinks:
            if link.active and link.remote_kind is RemoteKind.NVSWITCH and link.remote_pci_bus_id:
                per = switches.setdefault(link.remote_pci_bus_id, {})
                per[gpu.index] = per.get(gpu.index, 0) + 1
    if not node.gpus:
        return Text("NVML sees no GPU on this host (a guest's GPUs are the guest's to read): "
                    "no NVLink readings", style="dim")  # fmt: skip
    if not switches:
        direct = any(link.remote_kind is RemoteKind.GPU for g in node.gpus for link in g.nvlinks)
        return Text("GPU-to-GPU NVLink bridges" if direct else "no NVSwitch fabric", style="dim")
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    table.add_column("NVSwitch", no_wrap=True)
    for gpu in node.gpus:  # GPUs across, named as topo -m names them: not switch numbers
        table.add_column(f"GPU{gpu.index}", justify="right")
    for k, (bus, per) in enumerate(sorted(switches.items())):
        table.add_row(
            f"{k} {nvml_bus_id(bus)[-10:-5]}", *(str(per.get(g.index, 0)) for g in node.gpus)
        )
    return Group(Text("active NVLinks from each GPU (across) to each NVSwitch (down)",
                      style="dim"), table)  # fmt: skip


def rails_line(fabric: FabricReading, palette: Palette) -> Text:
    """'compute rails: 8/8 up at 400 Gb/sec (4X NDR)', then whether nvidia-peermem is loaded."""
    compute = [p for p in fabric.ports if p.role is PortRole.COMPUTE]
    up = [p for p in compute if p.active]
    text = Text()
    style = palette.health[Health.OK if len(up) == len(compute) else Health.CRITICAL]
    text.append(f"compute rails: {len(up)}/{len(compute)} up", style=style)
    rates = Counter(p.rate_text or f"{p.rate_gbps:g} Gb/s" for p in up if p.rate_gbps)
    if rates:
        text.append(f" at {rates.most_common(1)[0][0]}")
    slow = sum(1 for p in up if p.downtrained)
    if slow:
        text.append(f", {slow} downtrained", style=palette.health[Health.WARNING])
    if fabric.peermem_loaded is True:
        text.append("\nnvidia-peermem loaded")
    elif fabric.peermem_loaded is False:
        text.append("\nnvidia-peermem NOT loaded: no GPUDirect RDMA",
                    style=palette.health[Health.WARNING])  # fmt: skip
    return text


def gpudirect_box(node: NodeSnapshot, palette: Palette) -> RenderableType:
    """Each GPU → its NIC (path), its owner, and what is wrong with the pairing, in colour."""
    fabric = node.fabric
    if fabric is None:
        return Text(summaries.pending_panel(node, "fabric") or fmt.NA, style=palette.dim)
    found = pairings(node)
    lines = Text()
    stale = summaries.stale_words(node, "fabric")
    if stale is not None:
        lines.append(stale + "\n", style=palette.health[Health.STALE])
    lines.append_text(rails_line(fabric, palette))
    if not found:
        lines.append("\nno GPUs", style=palette.dim)
        return lines
    labels = [p.row.name for p in found]
    nic_width = max(len(p.nic or "-") for p in found)
    label_width = max(len(label) for label in labels)
    for pairing, label in zip(found, labels, strict=True):
        lines.append("\n")
        health = pairing.health
        colour = palette.health[health] if health is not Health.OK else Style()
        if pairing.affinity is None:
            lines.append(f"{label.ljust(label_width)}   not found on PCI by the fabric source",
                         style=palette.dim)  # fmt: skip
            continue
        lines.append(f"{label.ljust(label_width)} → ")
        lines.append((pairing.nic or "-").ljust(nic_width), style=colour)
        level = pairing.level or "?"
        lines.append(f" {level.ljust(4)} ", style=level_style(level, palette))
        lines.append(pairing.row.label, style=palette.dim if not pairing.row.in_use else "")
        for words in pairing.words():
            lines.append(f"\n{' ' * (label_width + 1)}✖ " if health is Health.CRITICAL
                         else f"\n{' ' * (label_width + 1)}▲ ", style=colour)  # fmt: skip
            lines.append(words, style=colour)
    return lines


def _key(node: NodeSnapshot) -> Hashable:
    """Everything the view draws, less the counters that move every poll."""
    fabric = node.fabric
    devices = tuple(
        (d.name, d.numa_node, d.socket, tuple(
            (p.port, p.state, p.phys_state, p.role, p.rate_gbps, p.rate_text, p.netdev,
             p.downtrained, p.link_layer) for p in d.ports))
        for d in nics(fabric)
    )  # fmt: skip
    gpus = tuple(
        (r.bus_id, r.index, r.label, r.in_use, r.lost, r.driver,
         r.reading.cpu_affinity if r.reading else None,
         r.reading.numa_node if r.reading else None,
         tuple((lk.active, lk.remote_kind, lk.remote_pci_bus_id) for lk in r.reading.nvlinks)
         if r.reading else ())
        for r in summaries.gpu_rows(node)
    )  # fmt: skip
    status = node.status("fabric")
    return (
        gpus,
        devices,
        fabric.gpus if fabric is not None else None,
        fabric.peermem_loaded if fabric is not None else None,
        node.nvml.gpu_topology if node.nvml is not None else None,
        (status.ok, status.stale_since, status.error) if status is not None else None,
    )


class TopologyScreen(BaseView):
    """How a node's GPUs, NICs and CPUs connect, and who owns each GPU."""

    HELP_EXTRA = (("↑ ↓ ← →", "scroll"),)
    node_name: str

    def __init__(self, node_name: str) -> None:
        super().__init__()
        self.node_name = node_name
        self._drawn: Hashable = None

    def crumbs(self) -> list[str]:
        return ["Fleet", self.node_name, "topology"]

    def compose_body(self) -> ComposeResult:
        with ScrollableContainer(classes="scroll-body", id="topo-body"):
            with Container(classes="grid-2"):
                pairing = Static(id="topo-gpudirect", classes="box")
                pairing.border_title = "GPUDirect RDMA: each GPU's NIC and owner"
                yield pairing
                nvswitch = Static(id="topo-nvswitch", classes="box")
                nvswitch.border_title = "NVSwitch fabric"
                yield nvswitch
            matrix_box = Static(id="topo-matrix", classes="box wide")
            matrix_box.border_title = "topo -m"
            yield matrix_box
            tree = Static(id="topo-tree", classes="box")
            tree.border_title = "PCIe tree"
            yield tree

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        node = snapshot.node(self.node_name)
        if node is None:
            self.query_one("#topo-gpudirect", Static).update(
                f"{self.node_name}: not in the snapshot"
            )
            self._drawn = None
            return
        key = _key(node)
        if not force and key == self._drawn:
            return  # nothing the view draws has changed; skip re-rendering
        self._drawn = key
        palette = self.palette
        grid = matrix(node, palette)
        box = self.query_one("#topo-matrix", Static)
        box.styles.min_width = max(len(line) for line in grid.plain.splitlines()) + 4
        underline = Text("underlined: the NIC the fabric source pairs the GPU with",
                         style=palette.dim)  # fmt: skip
        box.update(Group(grid, Text(), nic_legend(node, palette), Text(), underline,
                         Text(LEGEND, style=palette.dim)))  # fmt: skip
        self.query_one("#topo-tree", Static).update(pci_tree(node, palette))
        self.query_one("#topo-gpudirect", Static).update(gpudirect_box(node, palette))
        self.query_one("#topo-nvswitch", Static).update(nvswitch_box(node))
