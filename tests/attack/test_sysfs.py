"""sysfs as a broken or hostile kernel module could lay it out: one odd entry is one odd
entry, never the whole source."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest

from gpuconsole.hub import Hub
from gpuconsole.sources.fabric import FabricSource
from tests.fabric_fixtures import dgx_h100_slice


# "²" passes str.isdigit() and int() refuses it; int() reads "\u0661" (Arabic-Indic one) as 1.
@pytest.mark.parametrize("folder", ["²", "\u0661", "01", "1\x1b]52;c;aGk=\x07"])
def test_an_odd_port_folder_is_skipped_and_said_once_while_every_hca_still_reads(
    tmp_path: Path, folder: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "sys"
    dgx_h100_slice(root)
    ports = root / "class" / "infiniband" / "mlx5_0" / "ports"
    shutil.copytree(ports / "1", ports / folder, symlinks=True)
    hub = Hub()
    hub.add_source(FabricSource("dgx-017", sysfs_root=str(root), netlink=False, rescan_every=1))
    with caplog.at_level(logging.WARNING):
        node = asyncio.run(hub.poll_once(3)).nodes[0]
    status = node.status("fabric")
    assert status is not None and status.ok, status
    assert node.fabric is not None
    assert sorted((p.device, p.port) for p in node.fabric.ports) == [
        ("mlx5_0", 1),
        ("mlx5_1", 1),
        ("mlx5_6", 1),
    ]
    said = [r.getMessage() for r in caplog.records if "port folder" in r.getMessage()]
    assert len(said) == 1 and "mlx5_0" in said[0] and "\x1b" not in said[0], said


@pytest.mark.parametrize("cpulist", [b"\xff\xfe0-55\n", b"0-55" * 100_000])
def test_an_odd_numa_cpulist_leaves_the_socket_unknown_and_the_fabric_read(
    tmp_path: Path, cpulist: bytes
) -> None:
    root = tmp_path / "sys"
    dgx_h100_slice(root)
    for path in (root / "devices" / "system" / "node").glob("node*/cpulist"):
        path.write_bytes(cpulist)
    hub = Hub()
    hub.add_source(FabricSource("dgx-017", sysfs_root=str(root), netlink=False, rescan_every=1))
    node = asyncio.run(hub.poll_once(3)).nodes[0]
    status = node.status("fabric")
    assert status is not None and status.ok, status
    assert node.fabric is not None and len(node.fabric.ports) == 3
