"""The nvidia driver's /proc/driver/nvidia/gpus/BDF/information file names a GPU NVML could
not open (and a GPU a tenant holds): what it says reaches the operator's terminal, so it is
read as any file from outside is, bounded and with its control characters written out."""

from __future__ import annotations

from pathlib import Path

from gpuconsole.sources.nvml.pci_names import name_unopened
from gpuconsole.sources.nvml.state import GpuRecord
from gpuconsole.sources.tenancy.pci_binding import nvidia_info
from tests.tenancy_fixtures import FakeHost

OPENED, LOST = "0000:18:00.0", "0000:2a:00.0"


def test_a_lost_gpu_named_from_a_hostile_information_file_shows_no_escape(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    for k, bdf in enumerate((OPENED, LOST)):
        host.pci(bdf, driver="nvidia", group=k)
    host.nvidia_info(OPENED, "GPU-0", 0)
    host.nvidia_info(LOST, "GPU-\x1b]0;owned\x07", 1, model="NVIDIA \x1b[2J\x1b[31mH100")
    gpus = [GpuRecord(0, object(), "GPU-0", "NVIDIA H100", OPENED), GpuRecord(1, None, "", "", "")]
    name_unopened(gpus, host.sysfs_root, host.proc_root)
    lost = gpus[1]
    assert lost.bus_id == LOST
    assert "\x1b" not in lost.name and "\x07" not in lost.uuid
    assert lost.name == "NVIDIA \\x1b[2J\\x1b[31mH100"  # written out: the operator sees it odd


def test_an_endless_information_file_is_read_only_so_far(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.pci(OPENED, driver="nvidia", group=0)
    host.nvidia_info(OPENED, "GPU-0", 0, model="X" * 10_000_000)
    uuid, model, _minor = nvidia_info(host.proc_root, OPENED)
    assert uuid is None  # its line, after the model's, is past what is read
    assert model is None  # longer than NVML writes: not the driver's
