"""Topology: the `nvidia-smi topo -m` matrix over GPUs and NICs, the PCIe tree, NVSwitches,
and each GPU's nearest NIC for GPUDirect RDMA."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from rich.tree import Tree
from textual.app import ComposeResult
from textual.containers import Container, ScrollableContainer
from textual.widgets import Static

from gpuconsole.model import FleetSnapshot, Health, NodeSnapshot, RemoteKind
from gpuconsole.sim.profiles import NicSlot, NodeProfile
from gpuconsole.tui.hardware import node_layout
from gpuconsole.tui.screens.base import BaseView
from gpuconsole.tui.themes import Palette

# Lower is closer: what traffic between two devices has to cross.
LEVEL_RANK = {"X": 0, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6}
LEGEND = (
    "X self · NV# bonded NVLinks · PIX ≤1 PCIe bridge · PXB several bridges · "
    "PHB through a host bridge · NODE across host bridges in a NUMA node · "
    "SYS across the socket link"
)


@dataclass(frozen=True, slots=True)
class Pairing:
    """A GPU's nearest compute NIC and the path between them."""

    gpu: int
    nic: str | None
    level: str | None

    @property
    def crosses_sockets(self) -> bool:
        return self.level == "SYS"


def gpu_paths(node: NodeSnapshot, layout: NodeProfile) -> dict[int, tuple[str, ...]]:
    """Each GPU's PCI path, matched by bus id (index as a fallback)."""
    by_bus = {slot.bus_id.upper(): slot for slot in layout.gpus}
    paths = {}
    for gpu in node.gpus:
        slot = by_bus.get(gpu.pci_bus_id.upper())
        if slot is None and gpu.index < len(layout.gpus):
            slot = layout.gpus[gpu.index]
        if slot is not None:
            paths[gpu.index] = slot.pci_path
    return paths


def nic_level(layout: NodeProfile, gpu_path: tuple[str, ...], nic: NicSlot) -> str:
    return layout.pci_level(gpu_path, nic.pci_path)


def pairings(node: NodeSnapshot, layout: NodeProfile) -> list[Pairing]:
    """For each GPU, the compute NIC with the shortest PCIe path (ties: lowest name)."""
    paths = gpu_paths(node, layout)
    compute = [nic for nic in layout.nics if nic.role == "compute"]
    out = []
    for gpu in node.gpus:
        path = paths.get(gpu.index)
        if path is None or not compute:
            out.append(Pairing(gpu.index, None, None))
            continue
        best = min(compute, key=lambda n: (LEVEL_RANK[nic_level(layout, path, n)], n.name))
        out.append(Pairing(gpu.index, best.name, nic_level(layout, path, best)))
    return out


def level_style(code: str, palette: Palette) -> Style:
    """Near is green, through a host bridge amber, across sockets grey; NVLink bold."""
    if code == "X":
        return Style(dim=True)
    if code.startswith("NV"):
        return palette.health[Health.OK] + Style(bold=True)
    if code in ("PIX", "PXB"):
        return palette.health[Health.OK]
    if code in ("PHB", "NODE"):
        return palette.health[Health.WARNING]
    return palette.health[Health.STALE]


def matrix(node: NodeSnapshot, layout: NodeProfile | None, palette: Palette) -> Text:
    """GPU and NIC rows against GPU and NIC columns, with CPU affinity and NUMA node.

    Laid out in fixed columns like `nvidia-smi topo -m`, so it scrolls instead of squeezing.
    """
    gpus = node.gpus
    nics = list(layout.nics) if layout is not None else []
    paths = gpu_paths(node, layout) if layout is not None else {}
    topo = node.nvml.gpu_topology if node.nvml is not None else ()
    names = [f"GPU{g.index}" for g in gpus] + [f"NIC{i}" for i in range(len(nics))]
    width = max([5, *(len(n) for n in names)]) + 1
    text = Text(no_wrap=True)
    text.append(" " * width)
    for name in names:
        text.append(name.ljust(width), style="bold")
    text.append("CPU affinity".ljust(18) + "NUMA", style="bold")

    def level(a: int, b: int) -> str:
        """Topology code between the a-th and b-th device of `names`."""
        n = len(gpus)
        if a < n and b < n:
            row = topo[a] if a < len(topo) else ()
            return row[b] if b < len(row) else "?"
        if layout is None:
            return "?"
        path_a = paths.get(gpus[a].index) if a < n else nics[a - n].pci_path
        path_b = paths.get(gpus[b].index) if b < n else nics[b - n].pci_path
        return layout.pci_level(path_a, path_b) if path_a and path_b else "?"

    for a, name in enumerate(names):
        text.append("\n")
        text.append(name.ljust(width), style="bold")
        for b in range(len(names)):
            code = level(a, b)
            text.append(code.ljust(width), style=level_style(code, palette))
        if a < len(gpus):
            gpu = gpus[a]
            text.append((gpu.cpu_affinity or "-").ljust(18))
            text.append("-" if gpu.numa_node is None else str(gpu.numa_node))
        else:
            text.append(" " * 18 + str(nics[a - len(gpus)].numa_node))
    return text


def nic_legend(layout: NodeProfile | None) -> Text:
    if layout is None:
        return Text("NICs: needs the fabric source ([fabric] enabled = true)", style="dim")
    text = Text()
    for i, nic in enumerate(layout.nics):
        text.append(f"NIC{i}: {nic.name} {nic.netdev} · {nic.role} · {nic.rate_gbps} Gb/s "
                    f"{nic.link_layer}\n")  # fmt: skip
    return text


def _label(part: str, layout: NodeProfile, node: NodeSnapshot) -> str:
    gpu_by_name = {f"gpu{g.index}": g for g in node.gpus}
    if part in gpu_by_name:
        gpu = gpu_by_name[part]
        return f"GPU {gpu.index}  {gpu.pci_bus_id[-7:]}" + ("  LOST" if gpu.lost else "")
    for nic in layout.nics:
        if nic.name == part:
            return f"{nic.name}  {nic.role} {nic.rate_gbps}G"
    if part.startswith("socket"):
        return f"CPU socket {part[6:]}  {layout.cpu_model}"
    if part.startswith("numa"):
        cpus = {g.cpu_affinity for g in node.gpus if g.numa_node == int(part[4:])} - {None}
        return f"NUMA {part[4:]}" + (f"  CPUs {sorted(cpus)[0]}" if cpus else "")
    if part.startswith("rp"):
        return "root port"
    if part.startswith("sw"):
        return "PCIe switch"
    return part


def pci_tree(node: NodeSnapshot, layout: NodeProfile | None) -> RenderableType:
    """Sockets > NUMA nodes > root ports > switches > GPUs and NICs."""
    root = Tree(f"{node.node}" + (f"  {layout.product}" if layout else ""), guide_style="dim")
    if layout is None:
        by_numa: dict[int | None, list[int]] = {}
        for gpu in node.gpus:
            by_numa.setdefault(gpu.numa_node, []).append(gpu.index)
        for numa, indexes in sorted(by_numa.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            branch = root.add(f"NUMA {numa if numa is not None else '?'}")
            for index in indexes:
                branch.add(f"GPU {index}")
        root.add(
            Text(
                "PCIe switches and NICs need the fabric source ([fabric] enabled = true)",
                style="dim",
            )
        )
        return root
    nodes: dict[tuple[str, ...], Tree] = {(): root}
    paths = [*gpu_paths(node, layout).values(), *(nic.pci_path for nic in layout.nics)]
    for path in sorted(paths):
        for depth in range(1, len(path) + 1):
            prefix = path[:depth]
            if prefix not in nodes:
                nodes[prefix] = nodes[prefix[:-1]].add(_label(prefix[-1], layout, node))
    return root


def nvswitch_box(node: NodeSnapshot) -> RenderableType:
    """Links from each GPU to each NVSwitch, counted from the NVLink readings."""
    switches: dict[str, dict[int, int]] = {}
    for gpu in node.gpus:
        for link in gpu.nvlinks:
            if link.active and link.remote_kind is RemoteKind.NVSWITCH and link.remote_pci_bus_id:
                per = switches.setdefault(link.remote_pci_bus_id, {})
                per[gpu.index] = per.get(gpu.index, 0) + 1
    if not switches:
        direct = any(link.remote_kind is RemoteKind.GPU for g in node.gpus for link in g.nvlinks)
        return Text("GPU-to-GPU NVLink bridges" if direct else "no NVSwitch fabric", style="dim")
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    table.add_column("NVSwitch", no_wrap=True)
    for gpu in node.gpus:
        table.add_column(str(gpu.index), justify="right")
    for k, (bus, per) in enumerate(sorted(switches.items())):
        table.add_row(f"{k} {bus[-10:-5]}", *(str(per.get(g.index, 0)) for g in node.gpus))
    return Group(Text("active links, GPU → switch", style="dim"), table)


def gpudirect_box(
    node: NodeSnapshot, layout: NodeProfile | None, palette: Palette
) -> RenderableType:
    if layout is None:
        return Text("needs NIC placement from the fabric source", style="dim")
    lines = Text()
    for pairing in pairings(node, layout):
        lines.append(f"GPU {pairing.gpu} → {pairing.nic or '-'} ({pairing.level or '?'})")
        if pairing.crosses_sockets:
            lines.append("  crosses the socket link", style=palette.health[Health.CRITICAL])
        elif pairing.level in ("PHB", "NODE"):
            lines.append("  through the host bridge", style=palette.health[Health.WARNING])
        lines.append("\n")
    lines.rstrip()
    return lines


class TopologyScreen(BaseView):
    """How a node's GPUs, NICs and CPUs connect."""

    HELP_EXTRA = (("↑ ↓ ← →", "scroll"),)

    def __init__(self, node_name: str) -> None:
        super().__init__()
        self.node_name = node_name

    def crumbs(self) -> list[str]:
        return ["Fleet", self.node_name, "topology"]

    def compose_body(self) -> ComposeResult:
        with ScrollableContainer(classes="scroll-body", id="topo-body"):
            matrix_box = Static(id="topo-matrix", classes="box wide")
            matrix_box.border_title = "topo -m"
            yield matrix_box
            with Container(classes="grid-2"):
                tree = Static(id="topo-tree", classes="box")
                tree.border_title = "PCIe tree"
                yield tree
                with Container(classes="stack"):
                    for box_id, title in (("topo-gpudirect", "GPUDirect RDMA: nearest NIC"),
                                          ("topo-nvswitch", "NVSwitch fabric")):  # fmt: skip
                        box = Static(id=box_id, classes="box")
                        box.border_title = title
                        yield box

    def apply(self, snapshot: FleetSnapshot, *, force: bool = False) -> None:
        node = snapshot.node(self.node_name)
        if node is None:
            self.query_one("#topo-matrix", Static).update(f"{self.node_name}: not in the snapshot")
            return
        if not force and node.nvml is not None and self._applied is not None:
            previous = self._applied.node(self.node_name)
            if (
                previous is not None
                and previous.nvml is not None
                and (
                    previous.nvml.gpu_topology == node.nvml.gpu_topology
                    and [g.state for g in previous.gpus] == [g.state for g in node.gpus]
                )
            ):
                return  # the layout has not changed; skip re-rendering the tables
        layout = node_layout(node)
        palette = self.palette
        source = (Text(f"NIC placement from the {layout.product} profile (simulated node)\n",
                       style="dim") if layout is not None and node.simulated else Text())  # fmt: skip
        grid = matrix(node, layout, palette)
        box = self.query_one("#topo-matrix", Static)
        box.styles.min_width = max(len(line) for line in grid.plain.splitlines()) + 4
        box.update(Group(grid, Text(), nic_legend(layout), source, Text(LEGEND, style="dim")))
        self.query_one("#topo-tree", Static).update(pci_tree(node, layout))
        self.query_one("#topo-gpudirect", Static).update(gpudirect_box(node, layout, palette))
        self.query_one("#topo-nvswitch", Static).update(nvswitch_box(node))
