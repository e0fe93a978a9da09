"""A simulated sysfs tree of a node's RDMA ports, so the demo runs the real fabric parser.

`SimFabricTree` lays out, under a temporary root, what a real node shows:
class/infiniband/mlx5_N (a link into devices/pci.../BDF/infiniband/mlx5_N) with fw_ver,
board_id, node_guid and ports/1/{state, rate, counters/*, hw_counters/*}; bus/pci/devices
links for NICs and GPUs whose paths follow the profile's PCIe tree; NUMA and CPU topology;
and /sys/module/nvidia_peermem. `refresh` rewrites only the counters that moved, from the
SimNode's GPU activity. The netdevs named there do not exist: netlink says so per port.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import shutil
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuconsole.hub import Hub
from gpuconsole.readings.fabric import FabricReading
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.profiles import NicSlot, NodeProfile
from gpuconsole.sim.trees import new_tree
from gpuconsole.sources.base import EmitEvent
from gpuconsole.sources.fabric.infiniband import EXTENDED, EXTENDED_PMA_DRIVERS, PMA_WIDTHS
from gpuconsole.sources.fabric.source import FabricSource

FABRIC_SCENARIO_KINDS = ("flap", "congestion", "downtrain")

LEGACY_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
)
HW_COUNTERS = (
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "rx_read_requests",
    "rx_write_requests",
    "rx_atomic_requests",
    "req_cqe_error",
    "resp_cqe_error",
    "req_transport_retries_exceeded",
)
ROCE_HW_COUNTERS = (
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "roce_adp_retrans",
    "roce_slow_restart",
)
SPEEDS = {400: "4X NDR", 200: "4X HDR", 100: "4X EDR", 50: "2X HDR", 25: "1X EDR"}
# A RoCE port under healthy load sees the odd ECN mark (and answers with a CNP): one per
# this many bytes it carries, a few a second at storage load, far below a congestion alarm.
ECN_MARK_EVERY_BYTES = 1 << 26
# A congested port: ECN marks and transmit-wait ticks a second (on top of the above).
CONGESTED_ECN_PER_S = 2500
CONGESTED_XMIT_WAIT_PER_S = 3_000_000
# Each simulated node writes its own small tree; past this many nodes the rest go without.
SIM_FABRIC_MAX_NODES = 64
FLAP_PERIOD_S = 90.0
FLAP_DOWN_S = 10.0


@dataclass(frozen=True, slots=True)
class FabricScenario:
    """Something going wrong on one port from `at_s` seconds on: flap, congestion, downtrain."""

    kind: str
    nic: str
    at_s: float = 0.0


def demo_fabric_scenarios(node: str, profile: NodeProfile) -> tuple[FabricScenario, ...]:
    """The demo cluster's fabric trouble: a flapping rail, a congested one (its transmit wait
    climbing, and on the same node a RoCE storage port marking ECN and sending CNPs), a
    downtrained one."""
    compute = [n.name for n in profile.nics if n.role == "compute"]
    roce = [n.name for n in profile.nics if n.role == "storage" and n.link_layer == "Ethernet"]
    if not compute:
        return ()
    if node in ("dgx-002", "dgxa-002"):
        return (FabricScenario("flap", compute[2 % len(compute)], 20.0),)
    if node == "dgx-004":
        rail = FabricScenario("congestion", compute[5 % len(compute)], 10.0)
        return (rail, *(FabricScenario("congestion", name, 10.0) for name in roce[-1:]))
    if node == "dgx-003":
        return (FabricScenario("downtrain", compute[-1]),)
    return ()


def _bdf(bus_id: str) -> str:
    parts = bus_id.lower().split(":")
    return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


class SimFabricTree:
    """The sysfs tree of one simulated node's fabric, under `root`."""

    def __init__(
        self,
        node: SimNode,
        root: str,
        *,
        scenarios: Sequence[FabricScenario] = (),
        peermem: bool = True,
    ) -> None:
        self.node = node
        self.root = root
        self.scenarios = tuple(scenarios)
        for s in self.scenarios:
            if s.kind not in FABRIC_SCENARIO_KINDS:
                raise ValueError(f"unknown fabric scenario {s.kind!r}")
        self.peermem = peermem
        self._ports: dict[str, str] = {}  # NIC name -> its ports/1 folder
        self._written: dict[str, int] = {}
        self._states: dict[str, str] = {}
        self._lost: dict[str, float] = {}  # bytes a down link did not carry
        self._last: tuple[float, dict[str, float]] | None = None
        self._free_bus = 0x01
        self._used: set[int] = set()
        self._bridges: dict[tuple[str, ...], str] = {}

    @property
    def profile(self) -> NodeProfile:
        return self.node.profile

    # --- layout --------------------------------------------------------------------

    def create(self) -> None:
        """Lay the whole tree out (idempotent only on an empty root)."""
        profile = self.profile
        buses = [g.bus_id for g in profile.gpus] + [n.bus_id for n in profile.nics]
        self._used = {int(bus.split(":")[1], 16) for bus in buses}
        for gpu in profile.gpus:
            path = self._device_dir(gpu.pci_path, gpu.bus_id)
            self._pci_files(path, 0x10DE, profile.gpu_model.pci_device_id >> 16, 0x030200)
            _write(os.path.join(path, "numa_node"), f"{gpu.numa_node}\n")
        for nic in profile.nics:
            self._nic(nic)
        for numa in sorted(
            {g.numa_node for g in profile.gpus} | {n.numa_node for n in profile.nics}
        ):
            self._numa(numa)
        if self.peermem:
            os.makedirs(os.path.join(self.root, "module", "nvidia_peermem"), exist_ok=True)
        else:
            os.makedirs(os.path.join(self.root, "module", "nvidia"), exist_ok=True)
        self.refresh()

    def _bridge(self, key: tuple[str, ...]) -> str:
        name = self._bridges.get(key)
        if name is None:
            while self._free_bus in self._used:
                self._free_bus += 1
            name = f"0000:{self._free_bus:02x}:00.0"
            self._free_bus += 1
            self._bridges[key] = name
        return name

    def _device_dir(self, pci_path: tuple[str, ...], bus_id: str) -> str:
        # (socket, numa, root port, switch..., device) -> pciDDDD:BB/rp/[usp/dsp]*/BDF
        root_port = pci_path[:3]
        rp = self._bridge(("rp", *root_port))
        chain = [f"pci0000:{rp.split(':')[1]}", rp]
        for depth in range(3, len(pci_path) - 1):
            chain.append(self._bridge(("usp", *pci_path[: depth + 1])))
            chain.append(self._bridge(("dsp", *pci_path[: depth + 2])))
        bdf = _bdf(bus_id)
        path = os.path.join(self.root, "devices", *chain, bdf)
        os.makedirs(path, exist_ok=True)
        link = os.path.join(self.root, "bus", "pci", "devices", bdf)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.islink(link):
            os.symlink(os.path.relpath(path, os.path.dirname(link)), link)
        return path

    def _pci_files(self, path: str, vendor: int, device: int, pci_class: int) -> None:
        _write(os.path.join(path, "vendor"), f"0x{vendor:04x}\n")
        _write(os.path.join(path, "device"), f"0x{device:04x}\n")
        _write(os.path.join(path, "class"), f"0x{pci_class:06x}\n")

    def _nic(self, nic: NicSlot) -> None:
        ib = nic.link_layer == "InfiniBand"
        path = self._device_dir(nic.pci_path, nic.bus_id)
        self._pci_files(path, 0x15B3, 0x1021, 0x020700 if ib else 0x020000)
        _write(os.path.join(path, "numa_node"), f"{nic.numa_node}\n")
        os.makedirs(os.path.join(path, "net", nic.netdev), exist_ok=True)
        dev = os.path.join(path, "infiniband", nic.name)
        os.makedirs(dev, exist_ok=True)
        os.symlink(
            os.path.join("..", "..", "..", os.path.basename(path)), os.path.join(dev, "device")
        )
        guid = hashlib.sha256(f"{self.node.name}/{nic.name}".encode()).hexdigest()[:16]
        _write(
            os.path.join(dev, "node_guid"), ":".join(guid[i : i + 4] for i in (0, 4, 8, 12)) + "\n"
        )
        _write(os.path.join(dev, "fw_ver"), "28.39.1002\n")
        _write(os.path.join(dev, "board_id"), "MT_0000000838\n" if ib else "MT_0000000970\n")
        _write(os.path.join(dev, "hca_type"), "MT4129\n")
        port = os.path.join(dev, "ports", "1")
        for folder in ("counters", "hw_counters", "gid_attrs/ndevs"):
            os.makedirs(os.path.join(port, folder), exist_ok=True)
        _write(os.path.join(port, "link_layer"), f"{nic.link_layer}\n")
        lid = (int(nic.bus_id.split(":")[1], 16) + sum(self.node.name.encode())) % 0xBFFF + 1
        _write(os.path.join(port, "lid"), f"0x{lid if ib else 0:x}\n")
        _write(os.path.join(port, "sm_lid"), f"0x{1 if ib else 0:x}\n")
        _write(os.path.join(port, "gid_attrs", "ndevs", "0"), "\n" if ib else f"{nic.netdev}\n")
        _write(os.path.join(port, "hw_counters", "lifespan"), "10\n")
        names = LEGACY_COUNTERS
        for name in names:
            _write(os.path.join(port, "counters", name), "0\n")
        for name in HW_COUNTERS + (() if ib else ROCE_HW_COUNTERS):
            _write(os.path.join(port, "hw_counters", name), "0\n")
        self._ports[nic.name] = port
        link = os.path.join(self.root, "class", "infiniband", nic.name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(dev, os.path.dirname(link)), link)

    def _numa(self, numa: int) -> None:
        p = self.profile
        per_numa = p.cores_per_socket * p.sockets // max(1, p.numa_nodes)
        first = numa * per_numa
        base = os.path.join(self.root, "devices", "system")
        node_dir = os.path.join(base, "node", f"node{numa}")
        os.makedirs(node_dir, exist_ok=True)
        _write(os.path.join(node_dir, "cpulist"), f"{first}-{first + per_numa - 1}\n")
        topo = os.path.join(base, "cpu", f"cpu{first}", "topology")
        os.makedirs(topo, exist_ok=True)
        socket = numa // max(1, p.numa_nodes // p.sockets)
        _write(os.path.join(topo, "physical_package_id"), f"{socket}\n")

    # --- counters --------------------------------------------------------------------

    def _scenario(self, kind: str, nic: str, t: float) -> FabricScenario | None:
        for s in self.scenarios:
            if s.kind == kind and s.nic == nic and t >= s.at_s:
                return s
        return None

    def refresh(self) -> None:
        """Rewrite the counters and states that moved since the last refresh."""
        node = self.node
        t = node.elapsed()
        activity = [node.gpu(g.index).activity_s for g in self.profile.gpus]
        compute = [n for n in self.profile.nics if n.role == "compute"]
        previous = self._last
        current: dict[str, float] = {}
        for nic in self.profile.nics:
            if nic.name not in self._ports:
                continue
            rate_bps = nic.rate_gbps * 1e9 / 8
            if nic.role == "compute" and compute:
                k = compute.index(nic)
                mine = [a for g, a in enumerate(activity) if g * len(compute) // len(activity) == k]
                moved = sum(mine) * rate_bps * 0.3 + t * 2e6
            elif nic.role == "storage":
                moved = sum(activity) / max(1, len(activity)) * rate_bps * 0.04 + t * 5e6
            else:
                moved = t * 2e5
            down_since, cycles = self._flap(nic.name, t)
            if self._scenario("downtrain", nic.name, t):
                moved *= 0.5
            current[nic.name] = moved
            if down_since is not None and previous is not None:
                self._lost[nic.name] = self._lost.get(nic.name, 0.0) + max(
                    0.0, moved - previous[1].get(nic.name, moved)
                )
            self._write_port(nic, t, moved - self._lost.get(nic.name, 0.0), down_since, cycles)
        self._last = (t, current)

    def _flap(self, nic: str, t: float) -> tuple[float | None, int]:
        """(seconds into the current outage or None, outages so far) of a flapping port."""
        s = self._scenario("flap", nic, t)
        if s is None:
            return None, 0
        since = t - s.at_s
        cycles, into = divmod(since, FLAP_PERIOD_S)
        down = into < FLAP_DOWN_S
        return (into if down else None), int(cycles) + 1

    def _write_port(
        self, nic: NicSlot, t: float, moved: float, down_since: float | None, flaps: int
    ) -> None:
        port = self._ports[nic.name]
        ib = nic.link_layer == "InfiniBand"
        down = down_since is not None
        rate = nic.rate_gbps
        lanes = SPEEDS.get(rate, "4X")
        if self._scenario("downtrain", nic.name, t):
            rate //= 2
            lanes = "2X " + SPEEDS.get(nic.rate_gbps, "4X").split(" ")[-1]
        state = "1: DOWN" if down else "4: ACTIVE"
        phys = "2: Polling" if down else "5: LinkUp"
        rate_text = f"{rate} Gb/sec ({lanes})"
        for name, text in (("state", state), ("phys_state", phys), ("rate", rate_text)):
            key = f"{nic.name}/{name}"
            if self._states.get(key) != text:
                _write(os.path.join(port, name), text + "\n")
                self._states[key] = text
        tx = max(0.0, moved)
        rx = tx * 0.97
        mtu = 4096 if ib else 4200
        congested = self._scenario("congestion", nic.name, t)
        since = t - congested.at_s if congested else 0.0
        values = {
            "counters/port_xmit_data": int(tx) // 4,
            "counters/port_rcv_data": int(rx) // 4,
            "counters/port_xmit_packets": int(tx) // mtu,
            "counters/port_rcv_packets": int(rx) // mtu,
            "counters/unicast_xmit_packets": int(tx) // mtu,
            "counters/unicast_rcv_packets": int(rx) // mtu,
            "counters/port_xmit_wait": int(tx / 1e7) + int(since * CONGESTED_XMIT_WAIT_PER_S),
            "counters/link_downed": flaps,
            "counters/link_error_recovery": 2 * flaps,
            "counters/symbol_error": 37 * flaps,
            "hw_counters/rx_write_requests": int(rx) // (1 << 20),
            "hw_counters/out_of_sequence": int(since * 40),
        }
        if not ib:
            # As the notification point this port marks what it receives and sends a CNP per
            # mark; as the reaction point it handles the CNPs its own sending provoked.
            marked = int(rx) // ECN_MARK_EVERY_BYTES + int(since * CONGESTED_ECN_PER_S)
            values["hw_counters/np_ecn_marked_roce_packets"] = marked
            values["hw_counters/np_cnp_sent"] = marked
            values["hw_counters/rp_cnp_handled"] = int(tx) // ECN_MARK_EVERY_BYTES + int(
                since * CONGESTED_ECN_PER_S * 0.96
            )
        written = self._written
        extended = nic.name.startswith(EXTENDED_PMA_DRIVERS)
        for rel, value in values.items():
            folder, _, name = rel.partition("/")
            if folder == "hw_counters":
                value &= 0xFFFFFFFF  # mlx5 Q counters are 32-bit and wrap
            elif not (extended and name in EXTENDED):
                # PortCounters saturate at their width's maximum, as the HCA's PMA keeps
                # them: a port that flapped 300 times reads link_downed 255
                value = min(value, (1 << PMA_WIDTHS.get(name, 32)) - 1)
            key = f"{nic.name}/{rel}"
            if written.get(key) != value:
                _write(os.path.join(port, rel), f"{value}\n")
                written[key] = value


TREE_PREFIX = "gpuconsole-fabric-"
_TREE_WRITER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sim fabric tree")


class SimFabricSource(FabricSource):
    """The real FabricSource over a simulated sysfs tree it creates at start and removes."""

    def __init__(
        self,
        node: SimNode,
        *,
        interval_s: float = 2.0,
        scenarios: Sequence[FabricScenario] | None = None,
        netlink: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        profile = node.profile
        # The rules find compute rails from PCIe and storage from Ethernet speed; the
        # management ports are what a site names in its config.
        roles = {n.name: n.role for n in profile.nics if n.role == "management"}
        super().__init__(
            node.name,
            sysfs_root="",
            interval_s=interval_s,
            roles=roles,
            netlink=netlink,
            simulated=True,
            clock=clock,
        )
        self.sim = node
        self.sim_scenarios = (
            demo_fabric_scenarios(node.name, profile) if scenarios is None else tuple(scenarios)
        )
        self.tree: SimFabricTree | None = None

    def _ensure_tree(self) -> None:
        if self.tree is None:
            root = new_tree(TREE_PREFIX, self.sim.name)
            # removed by close(); at interpreter exit if close() never ran
            weakref.finalize(self, shutil.rmtree, root, True)
            tree = SimFabricTree(
                self.sim,
                root,
                scenarios=self.sim_scenarios,
                peermem=self.sim.profile.name != "apollo-pcie",
            )
            tree.create()
            self.tree = tree
            self.sysfs_root = root
            self._prepare = tree.refresh

    async def start(self, emit: EmitEvent) -> None:
        # Off the loop, which draws a console's frames and polls the other sources: a
        # tree is ~800 files, one tree at a time in a thread of their own, so that a
        # whole cluster's trees neither queue before the polls in the shared pool nor
        # take every core.
        await asyncio.get_running_loop().run_in_executor(_TREE_WRITER, self._ensure_tree)
        await super().start(emit)

    async def poll(self) -> FabricReading:
        self._ensure_tree()
        return await super().poll()

    async def close(self) -> None:
        await super().close()
        tree, self.tree = self.tree, None
        if tree is not None:
            shutil.rmtree(tree.root, ignore_errors=True)


def add_sim_fabric_sources(
    hub: Hub,
    nodes: Sequence[SimNode],
    *,
    interval_s: float = 2.0,
    netlink: bool = True,
    clock: Callable[[], float] = time.time,
) -> None:
    """Give the hub a fabric source per simulated node (the first SIM_FABRIC_MAX_NODES)."""
    for node in nodes[:SIM_FABRIC_MAX_NODES]:
        hub.add_node(node.name, simulated=True, profile=node.profile.name)
        hub.add_source(SimFabricSource(node, interval_s=interval_s, netlink=netlink, clock=clock))
