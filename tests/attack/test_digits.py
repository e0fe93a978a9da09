"""Numbers read from text that a kernel, a device plugin or an operator wrote: "²" passes
str.isdigit() and int() refuses it, int() reads "\u0661" (Arabic-Indic one) as 1. One odd
entry is one entry skipped, never a source down or a wrong GPU."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuconsole.actions.plan import find_gpu
from gpuconsole.readings.nvml import GpuReading, NvmlReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.tenancy import TenancySource
from gpuconsole.sources.tenancy.kubelet import ParsedDeviceId, parse_device_id
from gpuconsole.sources.tenancy.pci_binding import iommu_group, nvidia_info
from gpuconsole.sources.tenancy.procfs import pids, real_uid, users
from gpuconsole.tui.screens.events import EventFilter
from tests.tenancy_fixtures import FakeHost, PodSpec, kubelet_server

ODD = ["²", "\u0661", "1²"]
GPU = "GPU-1a7f1b2c-3d4e-5f60-7182-93a4b5c6d7e8"
BUS = "0000:43:00.0"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gct-"))  # a unix socket path must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("odd", ODD)
def test_a_device_plugin_id_with_odd_digits_names_no_gpu(odd: str) -> None:
    assert parse_device_id(f"{GPU}::{odd}") == ParsedDeviceId(None)
    assert parse_device_id(odd) == ParsedDeviceId(None)
    assert parse_device_id(f"{GPU}/vgpu{odd}").replica is None
    assert parse_device_id("9" * 5000) == ParsedDeviceId(None)
    assert parse_device_id(f"{GPU}::3") == ParsedDeviceId(GPU, 3)  # what plugins do write


@pytest.mark.parametrize("odd", ODD)
def test_proc_and_passwd_entries_with_odd_digits_are_skipped(tmp_path: Path, odd: str) -> None:
    host = FakeHost(tmp_path)
    host.process(500, cgroup="/user.slice", uid=1000)
    (host.proc / odd).mkdir()
    (host.proc / odd / "status").write_text(f"Uid:\t{odd}\t{odd}\n")
    with host.passwd.open("a") as passwd:
        passwd.write(f"mallory:x:{odd}:0::/:/bin/sh\n")
    assert list(pids(host.proc_root)) == [500]
    assert real_uid(host.proc_root, 500) == 1000
    assert users(str(host.passwd)) == {0: "root", 1000: "alice"}


async def test_one_odd_device_id_leaves_every_other_owner_read(short_dir: Path) -> None:
    host = FakeHost(short_dir / "node")
    host.pci(BUS, driver="nvidia", group=31)
    host.nvidia_info(BUS, GPU, minor=1)
    sock = short_dir / "kubelet.sock"
    async with kubelet_server(sock) as kubelet:
        kubelet.pods = [
            PodSpec("team-nlp", "train-0", [("trainer", "nvidia.com/gpu", [GPU])]),
            PodSpec("rogue", "odd-0", [("x", "nvidia.com/gpu", [f"{GPU}::²", "\u0661"])]),
        ]
        source = TenancySource(
            "node-1",
            sysfs_root=host.sysfs_root,
            proc_root=host.proc_root,
            libvirt_uri="",
            kubelet_socket=str(sock),
            passwd_file=str(host.passwd),
        )
        await source.start(lambda _e: None)
        try:
            reading = await source.poll()
        finally:
            await source.close()
    kubelet_part = reading.part("kubelet")
    assert kubelet_part is not None and kubelet_part.ok, kubelet_part
    held = {(d.namespace, d.pod, d.uuid, d.index) for d in reading.pod_devices}
    assert ("team-nlp", "train-0", GPU, None) in held
    assert all(index is None for *_, index in held)  # "\u0661" is not GPU index 1


@pytest.mark.parametrize("odd", ODD)
def test_a_sysfs_iommu_group_or_device_minor_with_odd_digits_is_unknown(
    tmp_path: Path, odd: str
) -> None:
    host = FakeHost(tmp_path)
    path = host.pci(BUS, driver="nvidia", group=None)
    groups = Path(host.sysfs_root) / "kernel" / "iommu_groups" / odd / "devices"
    groups.mkdir(parents=True)
    os.symlink(os.path.relpath(groups.parent, path), path / "iommu_group")
    assert iommu_group(host.sysfs_root, BUS) == (None, ())
    folder = host.proc / "driver" / "nvidia" / "gpus" / BUS
    folder.mkdir(parents=True)
    (folder / "information").write_text(f"GPU UUID: \t {GPU}\nDevice Minor: \t {odd}\n")
    assert nvidia_info(host.proc_root, BUS) == (GPU, None, None)


@pytest.mark.parametrize("odd", ODD)
def test_an_operator_typing_odd_digits_names_no_gpu(odd: str) -> None:
    node = NodeSnapshot(
        node="dgx-017",
        nvml=NvmlReading(
            0.0, "535", "12", "12.2", (GpuReading(index=1, uuid=GPU, name="H100", pci_bus_id=BUS),)
        ),
    )
    assert find_gpu(node, "1") is not None
    assert find_gpu(node, odd) is None  # `gpuconsole assign ²` is no GPU, not a traceback
    flt = EventFilter.parse(f"gpu:{odd} xid", EventFilter())  # the Events view's / filter
    assert flt.gpu is None and flt.words == f"gpu:{odd} xid".lower()
