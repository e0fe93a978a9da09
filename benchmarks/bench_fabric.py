"""CPU cost of reading 16 RDMA ports with all their counters, per port per round.

The tree is the simulator's sysfs layout (real mlx5 file names and PCI chains) with 16
NDR ports; the parser is the one that reads /sys on a node. Figures are medians of
process CPU time; compare ratios from one run, the machine is shared.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import statistics
import tempfile
import time

from benchmarks.timing import cpu_us
from gpuconsole.counters import RateTracker
from gpuconsole.sim.fabric import SimFabricTree
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.profiles import DGX_H100, NicSlot, NodeProfile
from gpuconsole.sources.fabric import FabricSource

PORTS = 16
ROUNDS = 200


def sixteen_port_profile() -> NodeProfile:
    """DGX H100 with 16 NDR ports: two per PCIe switch."""
    nics = []
    for k in range(PORTS):
        gpu = DGX_H100.gpus[k % 8]
        bus = 0x20 + 8 * k
        nics.append(
            NicSlot(
                f"mlx5_{k}",
                f"ibp{bus}s0",
                f"00000000:{bus:02X}:00.0",
                gpu.numa_node,
                "compute",
                400,
                "InfiniBand",
                (*gpu.pci_path[:-1], f"mlx5_{k}"),
            )
        )
    return dataclasses.replace(DGX_H100, nics=tuple(nics))


def measure() -> dict[str, float]:
    clock = [1000.0]
    node = SimNode("bench", sixteen_port_profile(), clock=lambda: clock[0], start=0.0)
    root = tempfile.mkdtemp(prefix="gpuconsole-bench-fabric-")
    try:
        tree = SimFabricTree(node, root)
        tree.create()
        source = FabricSource("bench", sysfs_root=root, netlink=False)

        def read() -> None:
            devices, peermem = source._read_sysfs()
            source._assemble(devices, peermem, {}, None)

        read()
        reading_us = cpu_us(read, ROUNDS)
        reading = source._assemble(*source._read_sysfs(), {}, None)
        counters = sum(len(p.counters) + len(p.hw_counters) for p in reading.ports)
        tracker = RateTracker()
        tick = [0.0]

        def rates() -> None:
            tick[0] += 1.0
            tracker.update(reading.counters(), tick[0])

        rates_us = cpu_us(rates, ROUNDS)

        def refresh() -> None:
            clock[0] += 1.0
            tree.refresh()

        refresh_us = cpu_us(refresh, ROUNDS)

        async def polls() -> list[float]:
            live = FabricSource("bench", sysfs_root=root, netlink=True)
            await live.start(lambda e: None)
            out = []
            try:
                for _ in range(ROUNDS // 4):
                    began = time.process_time_ns()
                    await live.poll()
                    out.append((time.process_time_ns() - began) / 1000.0)
            finally:
                await live.close()
            return out

        poll_us = asyncio.run(polls())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ports = len(reading.ports)
    read_med = statistics.median(reading_us)
    return {
        "ports": ports,
        "counters_per_port": counters / ports,
        "read_us_per_round": read_med,
        "read_us_per_port": read_med / ports,
        "rates_us_per_port": statistics.median(rates_us) / ports,
        "poll_us_per_port": statistics.median(poll_us) / ports,
        "sim_refresh_us_per_port": statistics.median(refresh_us) / ports,
    }


def main() -> None:
    r = measure()
    print(f"fabric: {r['ports']:.0f} ports, {r['counters_per_port']:.0f} counters each (medians)")
    print(f"  sysfs read + reading, per round     {r['read_us_per_round']:9.0f} us CPU")
    print(f"  sysfs read + reading, per port      {r['read_us_per_port']:9.1f} us CPU")
    print(f"  hub rate derivation, per port       {r['rates_us_per_port']:9.1f} us CPU")
    print(f"  whole poll (worker thread), per port {r['poll_us_per_port']:9.1f} us CPU")
    print(f"  simulator refresh, per port         {r['sim_refresh_us_per_port']:9.1f} us CPU")


if __name__ == "__main__":
    main()
