"""GPU-NIC affinity and port roles, derived from PCI paths in sysfs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuconsole.readings.fabric import AffinityFlag, FabricReading, PortRole
from gpuconsole.sim.fabric import SimFabricSource
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.profiles import DGX_A100, DGX_H100
from gpuconsole.sources.fabric import FabricSource
from gpuconsole.sources.pci import find_gpus, pci_level, read_device
from tests.fabric_fixtures import FakeSysfs, dgx_h100_slice


async def read(root: Path, **kw: object) -> FabricReading:
    src = FabricSource("node-a", sysfs_root=str(root), netlink=False, **kw)  # type: ignore[arg-type]
    await src.start(lambda e: None)
    try:
        return await src.poll()
    finally:
        await src.close()


def test_gpus_are_found_by_vendor_and_class_and_levels_follow_the_bridges(
    tmp_path: Path,
) -> None:
    dgx_h100_slice(tmp_path)
    root = str(tmp_path)
    gpus = find_gpus(root)
    assert [g.bus_id for g in gpus] == ["0000:1b:00.0", "0000:9d:00.0"]  # no NVSwitch, no Intel
    nic0, nic6, storage = (read_device(root, b) for b in ("18:00.0", "0000:9a:00.0", "29:00.0"))
    assert nic0 is not None and nic6 is not None and storage is not None
    assert read_device(root, "00000000:1B:00.0") == gpus[0]  # NVML's form
    assert pci_level(gpus[0], nic0) == "PIX"
    assert pci_level(gpus[0], storage) == "NODE"
    assert pci_level(gpus[0], nic6) == "SYS"
    assert pci_level(gpus[0], gpus[0]) == "X"


def test_pxb_and_phb_from_deeper_and_shared_host_bridges(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    top = ("pci0000:00", "0000:00:01.0", "0000:01:00.0")  # root port, switch upstream port
    gpu = fs.gpu((*top, "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0"), numa=0)
    fs.hca("mlx5_0", (*top, "0000:02:04.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"), numa=0)
    fs.hca("mlx5_1", ("pci0000:00", "0000:00:03.0", "0000:09:00.0"), numa=0)
    root = str(tmp_path)
    g = read_device(root, "0000:05:00.0")
    assert g is not None and g.chain[-1] == gpu.name
    assert pci_level(g, read_device(root, "0000:08:00.0")) == "PXB"  # type: ignore[arg-type]
    assert pci_level(g, read_device(root, "0000:09:00.0")) == "PHB"  # type: ignore[arg-type]


async def test_roles_come_from_pcie_neighbours_then_the_config(tmp_path: Path) -> None:
    fs = dgx_h100_slice(tmp_path)
    # an HDR HCA on a root port of its own (a storage or admin IB fabric), and a 25G port
    fs.hca("mlx5_3", ("pci0000:40", "0000:40:01.0", "0000:41:00.0"), numa=0,
           rate="200 Gb/sec (4X HDR)")  # fmt: skip
    fs.hca("mlx5_9", ("pci0000:60", "0000:60:01.0", "0000:61:00.0"), numa=0,
           link_layer="Ethernet", rate="25 Gb/sec (1X EDR)", netdev="eno1")  # fmt: skip
    reading = await read(tmp_path)
    roles = {p.device: (p.role, p.role_from) for p in reading.ports}
    assert roles["mlx5_0"] == (PortRole.COMPUTE, "under a GPU's PCIe switch")
    assert roles["mlx5_1"] == (PortRole.STORAGE, "Ethernet at 100 Gb/s or more")
    assert roles["mlx5_3"] == (PortRole.STORAGE, "InfiniBand, no GPU beneath its switch")
    assert roles["mlx5_9"] == (PortRole.MANAGEMENT, "Ethernet below 100 Gb/s")
    configured = await read(tmp_path, roles={"enp41s0f0np0": "management", "mlx5_6/1": "storage"})
    roles = {p.device: (p.role, p.role_from) for p in configured.ports}
    assert roles["mlx5_1"] == (PortRole.MANAGEMENT, "config")
    assert roles["mlx5_6"] == (PortRole.STORAGE, "config")
    with pytest.raises(ValueError, match="'mlx5_0' is 'fast'"):
        FabricSource("n", roles={"mlx5_0": "fast"})


async def test_each_gpu_gets_its_switch_local_nic_and_flags_what_is_wrong(
    tmp_path: Path,
) -> None:
    dgx_h100_slice(tmp_path)
    reading = await read(tmp_path)
    assert reading.peermem_loaded is True
    pairs = [(g.pci_bus_id, g.best_device, g.best_level, g.socket, g.flags) for g in reading.gpus]
    assert pairs == [
        ("0000:1b:00.0", "mlx5_0", "PIX", 0, ()),
        ("0000:9d:00.0", "mlx5_6", "PIX", 1, ()),
    ]
    # Without socket 1's rail as a compute NIC, GPU 1's pairing crosses the socket link;
    # without nvidia-peermem no GPU can do GPUDirect RDMA.
    (tmp_path / "module" / "nvidia_peermem").rmdir()
    reading = await read(tmp_path, roles={"mlx5_6": "storage"})
    gpu1 = reading.gpu("0000:9d:00.0")
    assert gpu1 is not None and gpu1.best_device == "mlx5_0" and gpu1.best_level == "SYS"
    assert gpu1.flags == (
        AffinityFlag.CROSS_SOCKET,
        AffinityFlag.NO_NEAR_NIC,
        AffinityFlag.NO_PEERMEM,
    )
    assert reading.peermem_loaded is False


async def test_each_nic_has_its_distance_to_every_nic_as_nvidia_smi_rows_show_it(
    tmp_path: Path,
) -> None:
    dgx_h100_slice(tmp_path)
    reading = await read(tmp_path)
    names = [d.name for d in reading.devices]
    table = {d.name: {lv.device: lv.level for lv in d.levels} for d in reading.devices}
    for a in names:
        assert table[a][a] == "X"
        assert all(table[a][b] == table[b][a] for b in names)  # the matrix is symmetric
    assert table["mlx5_0"]["mlx5_6"] == "SYS"  # one per socket
    assert table["mlx5_0"]["mlx5_1"] == "NODE"  # rail and storage NIC, one socket
    # what a GPU sees of a NIC, the NIC under its switch sees of the other NICs
    gpu0 = reading.gpu("0000:1b:00.0")
    assert gpu0 is not None
    assert {lv.device: lv.level for lv in gpu0.levels}["mlx5_6"] == table["mlx5_0"]["mlx5_6"]


async def test_a_downtrained_rail_is_flagged_on_the_gpu_that_pairs_with_it(
    tmp_path: Path,
) -> None:
    fs = dgx_h100_slice(tmp_path)
    # an NDR rail that trained at two lanes: up, but half the rate of its sibling
    rail_dir = fs.root / "class/infiniband/mlx5_6/ports/1"
    (rail_dir / "rate").write_text("200 Gb/sec (2X NDR)\n")
    reading = await read(tmp_path)
    rail = reading.port("mlx5_6")
    assert rail is not None and rail.active and rail.downtrained
    assert (rail.width, rail.expected_rate_gbps) == (2, 400.0)
    gpu1, gpu0 = reading.gpu("0000:9d:00.0"), reading.gpu("0000:1b:00.0")
    assert gpu1 is not None and gpu1.flags == (AffinityFlag.RAIL_DOWNTRAINED,)
    assert gpu0 is not None and gpu0.flags == ()


@pytest.mark.parametrize("profile", [DGX_H100, DGX_A100], ids=lambda p: p.name)
async def test_simulated_dgx_pairs_every_gpu_with_its_own_rail(profile: object) -> None:
    from gpuconsole.sim.profiles import NodeProfile

    assert isinstance(profile, NodeProfile)
    node = SimNode("dgx-x", profile, clock=lambda: 500.0, start=0.0)
    src = SimFabricSource(node, netlink=False, clock=lambda: 500.0)
    await src.start(lambda e: None)
    try:
        reading = await src.poll()
    finally:
        await src.close()
    compute = [n for n in profile.nics if n.role == "compute"]
    expected_level = "PIX" if profile is DGX_H100 else "PXB"
    for slot, nic in zip(profile.gpus, compute, strict=True):  # GPU i <-> compute NIC i
        gpu = reading.gpu(slot.bus_id)
        assert gpu is not None
        assert (gpu.best_device, gpu.best_level) == (nic.name, expected_level)
    assert all(not g.flags for g in reading.gpus)
    by_role = {p.device: p.role.value for p in reading.ports}
    assert by_role == {n.name: n.role for n in profile.nics}
