"""sysfs attributes and /proc files the repair paths read, as a broken kernel module (or a
hostile root) could leave them: not ASCII, not UTF-8, a control sequence, a line that goes
on. Each reads as unknown; none is a traceback half-way through a plan."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.drivers.vfio import VfioDriver
from gpuconsole.actions.journal import process_alive
from gpuconsole.actions.plan import StepKind
from gpuconsole.sim.actions import SysfsKernel
from gpuconsole.sources.tenancy.pci_binding import driver_of, nvidia_info, read_gpus
from tests.tenancy_fixtures import AUDIO_CLASS, FakeHost
from tests.test_assign_vfio import to_guest

GPU, AUDIO = "0000:1b:00.0", "0000:1b:00.1"

# not UTF-8; UTF-8 but not ASCII; ASCII with a terminal's escape sequence; a line that goes on
ODD_OVERRIDES = [b"nvid\xffia\n", "vfio-pcï\n".encode(), b"\x1b]52;c;aGk=\x07\n", b"x" * 5000]


def _host(tmp_path: Path, override: bytes) -> FakeHost:
    host = FakeHost(tmp_path)
    gpu = host.pci(GPU, driver="nvidia", group=40)
    host.pci(AUDIO, driver="snd_hda_intel", group=40, pci_class=AUDIO_CLASS)
    host.nvidia_info(GPU, "GPU-00000000-0000-0000-0000-000000000001", 0)
    (gpu / "driver_override").write_bytes(override)
    return host


@pytest.mark.parametrize("override", ODD_OVERRIDES)
def test_an_odd_driver_override_reads_as_unknown_not_as_text(
    tmp_path: Path, override: bytes
) -> None:
    host = _host(tmp_path, override)
    gpu = next(g for g in read_gpus(host.sysfs_root, host.proc_root) if g.bus_id == GPU)
    assert gpu.driver_override is None
    assert VfioDriver(host.sysfs_root, host.proc_root).override_of(GPU) is None


@pytest.mark.parametrize("override", ODD_OVERRIDES)
async def test_a_gpu_with_an_odd_driver_override_goes_to_a_guest_and_back(
    tmp_path: Path, override: bytes
) -> None:
    host = _host(tmp_path, override)
    _kernel, driver, plan = await to_guest(host)
    assert driver_of(host.sysfs_root, GPU) == "vfio-pci"
    assert driver.override_of(GPU) == "vfio-pci"

    for kind in (StepKind.PROBE, StepKind.UNBIND, StepKind.OVERRIDE):
        await driver.undo(next(s for s in plan.steps if s.kind is kind))
    assert driver_of(host.sysfs_root, GPU) == "nvidia"
    # what no driver's name could match is not put back: the override is cleared
    assert driver.override_of(GPU) == ""


async def test_a_plan_step_naming_a_driver_that_is_not_ascii_fails_as_a_step(
    tmp_path: Path,
) -> None:
    """A step read back from a journal or a head names the driver to write; one that is not
    ASCII is a step that failed, said so, not an encoding traceback."""
    host = _host(tmp_path, b"(null)\n")
    driver = VfioDriver(host.sysfs_root, host.proc_root, kernel=SysfsKernel(host.sysfs_root))
    with pytest.raises(StepFailed, match="driver_override"):
        driver.set_override(GPU, "vfio-pcï")


def _named(name: bytes) -> subprocess.Popen[bytes]:
    """A process that renames itself (its /proc/PID/comm) to `name`, as any process may."""
    code = (
        "import sys, time\n"
        "open('/proc/self/comm', 'wb').write(bytes.fromhex(sys.argv[1]))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, name.hex()], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


@pytest.mark.skipif(not Path("/proc/self/comm").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("name", [b"\xff\xfe) 1 2", "gpu-ünïcödé".encode()[:14]])
def test_a_lock_whose_pid_went_to_an_oddly_named_process_is_told_apart(name: bytes) -> None:
    """A lock's owner is known by pid and start time; the pid reused by a process whose name
    is not UTF-8 (comm is 15 bytes, cut anywhere) is another process, not a traceback."""
    child = _named(name)
    try:
        assert Path(f"/proc/{child.pid}/comm").read_bytes().rstrip(b"\n") == name
        stat = Path(f"/proc/{child.pid}/stat").read_bytes()
        start = stat.rpartition(b")")[2].split()[19].decode()
        assert process_alive(socket.gethostname(), child.pid, start)
        assert not process_alive(socket.gethostname(), child.pid, str(int(start) + 1))
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("model", ["M" * 97, "\x1b" * 30])
def test_a_model_longer_than_nvmls_buffer_is_not_the_drivers(tmp_path: Path, model: str) -> None:
    """The driver writes a GPU's model and UUID from NVML's 96-byte buffers: a longer one
    (or one whose control characters, written out, run past it) names no GPU, so no
    reading its agent sends is refused for it."""
    host = FakeHost(tmp_path)
    host.pci(GPU, driver="nvidia", group=40)
    host.nvidia_info(GPU, "GPU-00000000-0000-0000-0000-000000000001", 0, model=model)
    assert nvidia_info(host.proc_root, GPU) == (
        "GPU-00000000-0000-0000-0000-000000000001",
        None,
        0,
    )
