"""The vfio driver on a fake sysfs tree: the files it writes, in the order the kernel expects,
and what it leaves when refused."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.drivers import Drivers, StepFailed
from gpuconsole.actions.drivers.vfio import VfioDriver
from gpuconsole.actions.executor import Executor
from gpuconsole.actions.journal import Journal
from gpuconsole.actions.plan import Plan, StepKind, Target, make_plan
from gpuconsole.actions.roles import ActionRefused, Actor, Role
from gpuconsole.readings.nvml import GpuReading, NvmlReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import Guest, TenancyReading
from gpuconsole.sim.actions import SysfsKernel
from gpuconsole.sources.tenancy.pci_binding import driver_of, read_gpus
from tests.assign_fixtures import tree_picture
from tests.tenancy_fixtures import AUDIO_CLASS, FakeHost

GPU, AUDIO = "0000:1b:00.0", "0000:1b:00.1"


def _host(tmp_path: Path) -> FakeHost:
    host = FakeHost(tmp_path)
    host.pci(GPU, driver="nvidia", group=40)
    host.pci(AUDIO, driver="snd_hda_intel", group=40, pci_class=AUDIO_CLASS)
    host.nvidia_info(GPU, "GPU-00000000-0000-0000-0000-000000000001", 0)
    return host


def _node(host: FakeHost) -> NodeSnapshot:
    gpus = read_gpus(host.sysfs_root, host.proc_root)
    guest = Guest("vm1", "shut off", (), "libvirt")
    return NodeSnapshot("n1", tenancy=TenancyReading(at=0.0, gpus=gpus, guests=(guest,)))


async def to_guest(host: FakeHost) -> tuple[SysfsKernel, VfioDriver, Plan]:
    """GPU's PCI steps of a plan to give it to guest vm1, run on `host`'s tree."""
    kernel = SysfsKernel(host.sysfs_root)
    driver = VfioDriver(host.sysfs_root, host.proc_root, kernel=kernel, settle_s=0.5)
    plan = make_plan(_node(host), [GPU], Target.parse("vm:vm1"))
    for step in plan.steps:
        if step.layer is not None and step.layer.value == "pci":
            await driver.run(step)
    return kernel, driver, plan


async def test_binding_to_vfio_writes_override_unbind_probe_reset_in_order(
    tmp_path: Path,
) -> None:
    host = _host(tmp_path)
    kernel, driver, plan = await to_guest(host)
    dev = "bus/pci/devices"
    assert kernel.writes == [
        (f"{dev}/{GPU}/driver_override", "vfio-pci\n"),
        (f"{dev}/{AUDIO}/driver_override", "vfio-pci\n"),
        ("bus/pci/drivers/nvidia/unbind", GPU),
        ("bus/pci/drivers/snd_hda_intel/unbind", AUDIO),
        ("bus/pci/drivers_probe", GPU),
        ("bus/pci/drivers_probe", AUDIO),
        (f"{dev}/{GPU}/reset", "1\n"),
    ]
    assert driver_of(host.sysfs_root, GPU) == driver_of(host.sysfs_root, AUDIO) == "vfio-pci"

    # and back: the driver each function had, and the override cleared
    unbind = next(s for s in plan.steps if s.kind is StepKind.UNBIND)
    await driver.undo(unbind)
    assert driver_of(host.sysfs_root, GPU) == "nvidia"
    assert driver_of(host.sysfs_root, AUDIO) == "snd_hda_intel"
    assert (Path(host.sysfs_root) / dev / GPU / "driver_override").read_text() == "(null)\n"


async def test_a_process_holding_the_device_fails_the_idle_check_by_pid(tmp_path: Path) -> None:
    host = _host(tmp_path)
    host.process(4242, cgroup="/user.slice/user-1000.slice", fds=("/dev/nvidia0",))
    plan = make_plan(_node(host), [GPU], Target.parse("drained"))
    check = next(s for s in plan.steps if s.kind is StepKind.CHECK_IDLE)
    with pytest.raises(StepFailed, match=r"held by 4242 \(python3\)"):
        await VfioDriver(host.sysfs_root, host.proc_root).run(check)


async def test_a_refused_plan_leaves_the_sysfs_tree_as_it_was(tmp_path: Path) -> None:
    host = _host(tmp_path)
    kernel = SysfsKernel(host.sysfs_root)
    before = tree_picture(host.sysfs_root)
    node = _node(host)

    async def read() -> NodeSnapshot:
        return node

    executor = Executor(
        "n1",
        Drivers(pci=VfioDriver(host.sysfs_root, host.proc_root, kernel=kernel)),
        Journal(tmp_path / "state" / "actions.db"),
        AuditLog(tmp_path / "state" / "audit.jsonl"),
        reader=read,
    )
    plan = make_plan(node, [GPU], Target.parse("drained"))
    with pytest.raises(ActionRefused, match="viewer may not act"):
        await executor.execute(plan, Actor("val", Role.VIEWER), "n1")
    with pytest.raises(ActionRefused, match="does not match"):
        await executor.execute(plan, Actor("ops", Role.OPERATOR), "n2")
    assert kernel.writes == []
    assert tree_picture(host.sysfs_root) == before
    assert executor.journal.plans() == []


async def test_the_idle_check_looks_at_the_gpus_own_device_not_nvmls_number(
    tmp_path: Path,
) -> None:
    # NVML numbers the GPU 0 (another left for a guest), but its device is /dev/nvidia3;
    # the sysfs reading the plan came from had no minor for it yet
    host = FakeHost(tmp_path)
    host.pci(GPU, driver="nvidia", group=40)
    node = _node(host)
    gpu = GpuReading(0, "GPU-1", "NVIDIA H100", GPU)
    nvml = NvmlReading(
        at=0.0, driver_version=None, nvml_version=None, cuda_driver_version=None, gpus=(gpu,)
    )
    plan = make_plan(msgspec.structs.replace(node, nvml=nvml), [GPU], Target.parse("drained"))
    check = next(s for s in plan.steps if s.kind is StepKind.CHECK_IDLE)
    driver = VfioDriver(host.sysfs_root, host.proc_root)
    with pytest.raises(StepFailed, match="cannot tell which /dev/nvidiaN"):
        await driver.run(check)  # nothing known: never taken for idle
    host.nvidia_info(GPU, "GPU-1", 3)
    host.process(4242, cgroup="/user.slice/user-1000.slice", fds=("/dev/nvidia3",))
    host.process(4343, cgroup="/user.slice/user-1000.slice", fds=("/dev/nvidia0",))
    with pytest.raises(StepFailed, match=r"/dev/nvidia3 is held by 4242 \(python3\)"):
        await driver.run(check)
