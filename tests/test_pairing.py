"""One rule for the NIC a GPU uses for GPUDirect RDMA: the topology view, placement
(`assign --propose`, the console's `p`) and the exporter name the same one, its own rail's
fallback included."""

from __future__ import annotations

from pathlib import Path

import msgspec

from gpuconsole.actions.placement import placements
from gpuconsole.facts.pairing import gpu_nics, nic_order
from gpuconsole.readings.fabric import FabricReading
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sim.tenancy import SimPlan
from gpuconsole.tui.screens.topology import pairings
from tests.assign_fixtures import world
from tests.conftest_tui import FIXED, fleet_with_rail_down
from tests.export_fixtures import one, parse, pick, render

GPU5 = "0000:c3:00.0"  # a DGX H100's GPU 5, whose own rail is mlx5_9


async def _free_node_with_rail_down(tmp_path: Path, nic: str) -> NodeSnapshot:
    """A DGX H100 with every GPU free, its fabric as the real fabric source reads it while
    the rail `nic` is down (the simulator's sysfs: same bus ids and NICs)."""
    node = await world(tmp_path, SimPlan(), "h100").snapshot(fabric=True)
    down = fleet_with_rail_down("dgx-002", nic).node("dgx-002")
    assert down is not None and down.fabric is not None
    return msgspec.structs.replace(node, fabric=down.fabric)


async def test_a_gpu_whose_rail_is_down_falls_back_to_the_same_nic_everywhere(
    tmp_path: Path,
) -> None:
    node = await _free_node_with_rail_down(tmp_path, "mlx5_9")
    # on socket 1, mlx5_6, mlx5_10 and mlx5_11 are equally near (NODE) and each carries one
    # GPU of its own: the first in nvidia-smi's order
    expected = ("mlx5_6", "NODE")
    five = {p.row.bus_id: p for p in pairings(node)}[GPU5]
    assert (five.nic, five.fallback, five.fallback_level) == ("mlx5_9", *expected)
    assert five.words() == ["its rail is down: falls back to mlx5_6 (NODE)"]

    every = placements([node], 8).best
    assert every is not None  # every GPU, GPU 5 among them
    rail = next(r for r in every.rails if r.gpu == GPU5)
    assert (rail.device, rail.level) == expected
    assert rail.flags == ("its own rail mlx5_9 is down",)
    assert "GPU 5 (0000:c3:00.0)  NIC mlx5_6 (NODE)  ! its own rail" in every.describe()

    metrics = parse(render(FleetSnapshot(seq=1, at=FIXED, nodes=(node,))))
    fallback = one(metrics["gpuconsole_gpu_nic_fallback_info"], pci_bus_id=GPU5)
    assert (fallback.labels["nic"], fallback.labels["level"]) == expected
    assert fallback.labels["gpu"] == "5" and fallback.labels["node"] == node.node
    # the pairing itself stays the fabric source's: its own rail, flagged down
    paired = one(metrics["gpuconsole_gpu_nic_affinity_info"], pci_bus_id=GPU5)
    assert paired.labels["nic"] == "mlx5_9"
    flags = pick(metrics["gpuconsole_gpu_gpudirect_flag"], pci_bus_id=GPU5)
    assert [s.labels["flag"] for s in flags] == ["rail_down"]
    assert len(metrics["gpuconsole_gpu_nic_fallback_info"]) == 1  # the others use their own


def _ports_down(fabric: FabricReading, *devices: str) -> FabricReading:
    down = tuple(
        msgspec.structs.replace(
            d, ports=tuple(msgspec.structs.replace(p, state="DOWN") for p in d.ports)
        )
        if d.name in devices
        else d
        for d in fabric.devices
    )
    return msgspec.structs.replace(fabric, devices=down)


async def test_gpus_falling_back_spread_over_the_nearest_rails_still_up(tmp_path: Path) -> None:
    node = await world(tmp_path, SimPlan(), "h100").snapshot(fabric=True)
    assert node.fabric is not None
    used = gpu_nics(_ports_down(node.fabric, "mlx5_9", "mlx5_10"))
    five, six = used[GPU5], used["0000:d1:00.0"]
    assert (five.own, five.nic, five.level) == ("mlx5_9", "mlx5_6", "NODE")
    # mlx5_6 now carries two GPUs, mlx5_11 one: the next to fall back takes mlx5_11
    assert (six.own, six.nic, six.level) == ("mlx5_10", "mlx5_11", "NODE")
    assert five.falls_back and six.falls_back
    assert not any(g.falls_back for bus, g in used.items() if bus not in (GPU5, six.gpu))


def test_nics_go_in_nvidia_smis_order() -> None:
    assert sorted(["mlx5_10", "mlx5_2", "mlx5_1"], key=nic_order) == ["mlx5_1", "mlx5_2", "mlx5_10"]
