"""sysfs and /proc: drivers, IOMMU groups, QEMU command lines, and what cgroups say."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuconsole.sources.tenancy import pci_binding, qemu
from gpuconsole.sources.tenancy.cgroups import ProcessScanner, parse_cgroup
from tests.tenancy_fixtures import AUDIO_CLASS, BRIDGE_CLASS, FakeHost

UUID0 = "GPU-5e1a3f1c-0b4e-7b2c-9d4e-1f2a3b4c5d6e"
POD_UID = "8f3c2a1e-4b5d-4c6e-9f7a-0b1c2d3e4f50"
CID = "a" * 64


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def test_gpus_are_found_in_sysfs_with_driver_group_and_nvidia_identity(host: FakeHost) -> None:
    host.pci("0000:1b:00.0", driver="nvidia", group=30)
    host.nvidia_info("0000:1b:00.0", UUID0, minor=0)
    host.pci("0000:43:00.0", driver="vfio-pci", group=31, override="vfio-pci")
    host.pci("0000:43:00.1", driver="snd_hda_intel", group=31, pci_class=AUDIO_CLASS)
    host.pci("0000:42:00.0", driver="pcieport", group=31, pci_class=BRIDGE_CLASS, vendor=0x1000)
    host.pci("0000:61:00.0", driver=None, group=None)
    host.pci("0000:99:00.0", driver="mlx5_core", group=40, vendor=0x15B3, pci_class=0x020700)

    gpus = {g.bus_id: g for g in pci_binding.read_gpus(host.sysfs_root, host.proc_root)}
    assert sorted(gpus) == ["0000:1b:00.0", "0000:43:00.0", "0000:61:00.0"]
    bound = gpus["0000:1b:00.0"]
    assert (bound.driver, bound.iommu_group, bound.uuid, bound.minor) == ("nvidia", 30, UUID0, 0)
    assert bound.model == "NVIDIA H100 80GB HBM3" and bound.driver_override is None
    passed = gpus["0000:43:00.0"]
    assert (passed.driver, passed.driver_override, passed.uuid) == ("vfio-pci", "vfio-pci", None)
    assert [(p.bus_id, p.driver, p.bridge) for p in passed.iommu_peers] == [
        ("0000:42:00.0", "pcieport", True),
        ("0000:43:00.1", "snd_hda_intel", False),
    ]
    unbound = gpus["0000:61:00.0"]
    assert unbound.driver is None and unbound.iommu_group is None


def test_a_rebind_shows_on_the_next_read(host: FakeHost) -> None:
    host.pci("0000:1b:00.0", driver="nvidia", group=30)
    host.rebind("0000:1b:00.0", "vfio-pci")
    assert pci_binding.driver_of(host.sysfs_root, "00000000:1B:00.0") == "vfio-pci"


@pytest.mark.parametrize(
    ("text", "pod", "container", "runtime", "job"),
    [
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            POD_UID,
            CID,
            "containerd",
            None,
        ),
        (f"0::/kubepods/besteffort/pod{POD_UID}/{CID}\n", POD_UID, CID, None, None),
        (
            f"12:devices:/kubepods/burstable/pod{POD_UID}/crio-{CID}\n1:name=systemd:/x\n",
            POD_UID,
            CID,
            "cri-o",
            None,
        ),
        (
            "0::/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0\n",
            None,
            None,
            None,
            "4711",
        ),
        ("11:devices:/slurm/uid_1001/job_88/step_batch\n", None, None, None, "88"),
        (f"0::/system.slice/docker-{CID}.scope\n", None, CID, "docker", None),
        (
            f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/libpod-{CID}.scope\n",
            None,
            CID,
            "podman",
            None,
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None, None, None, None),
    ],
)
def test_cgroup_paths_name_pods_containers_and_jobs(
    text: str, pod: str | None, container: str | None, runtime: str | None, job: str | None
) -> None:
    owner = parse_cgroup(text)
    assert (owner.pod_uid, owner.container_id, owner.runtime, owner.slurm_job) == (
        pod,
        container,
        runtime,
        job,
    )


def test_only_processes_holding_nvidia_devices_are_scanned(host: FakeHost) -> None:
    host.process(
        100,
        cgroup="/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0",
        uid=1000,
        fds=("/dev/nvidiactl", "/dev/nvidia3", "/dev/nvidia-uvm"),
        environ={"SLURM_JOB_ACCOUNT": "physics", "PATH": "/bin"},
        started_s_after_boot=7200,
    )
    host.process(101, cgroup="/user.slice", uid=4242, fds=("/dev/null", "socket:[1234]"))
    host.process(102, cgroup="/user.slice", uid=4242, fds=("/dev/nvidiactl",))
    scanner = ProcessScanner(host.proc_root, str(host.passwd))
    found = scanner.scan()
    assert [p.pid for p in found] == [100, 102]
    job = found[0]
    assert (job.slurm_job, job.slurm_account, job.user, job.gpu_minors) == (
        "4711",
        "physics",
        "alice",
        (3,),
    )
    assert job.started_at == host.started_at(7200)
    assert found[1].user == "uid 4242" and found[1].gpu_minors == ()
    assert [p.pid for p in scanner.scan()] == [100, 102]  # cached, same answer


def test_the_scanning_process_itself_is_left_out(host: FakeHost) -> None:
    """Its NVML holds every /dev/nvidiaN: it is no owner of a GPU NVML lost."""
    for pid in (100, 200):
        host.process(pid, cgroup="/user.slice/user-1000.slice/session-3.scope", uid=1000,
                     fds=("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"))  # fmt: skip
    assert [p.pid for p in ProcessScanner(host.proc_root, str(host.passwd), 200).scan()] == [100]
    assert ProcessScanner("/proc").own_pid == os.getpid()


def test_qemu_command_lines_name_guests_and_their_vfio_devices(host: FakeHost) -> None:
    argv = (
        "/usr/bin/qemu-system-x86_64",
        "-name",
        "guest=tenant-b-vm7,debug-threads=on",
        "-uuid",
        "0b6f2c4e-1111-2222-3333-444455556666",
        "-device",
        '{"driver":"vfio-pci","host":"0000:1b:00.0","id":"hostdev0","bus":"pci.5","addr":"0x0"}',
        "-device",
        "vfio-pci,host=43:00.0,id=hostdev1",
        "-device",
        "vfio-pci,sysfsdev=/sys/bus/pci/devices/0000:52:00.0",
        "-device",
        "virtio-net-pci,netdev=n0",
    )
    host.process(
        900,
        cgroup="/machine.slice/x.scope",
        uid=64055,
        comm="qemu-system-x86",
        argv=argv,
        fds=("/dev/vfio/vfio",),
    )
    host.process(901, cgroup="/user.slice", argv=("/usr/bin/qemu-system-x86_64", "-name", "plain"))
    (guest,) = qemu.read_guests(host.proc_root)
    assert guest.name == "tenant-b-vm7" and guest.uuid == "0b6f2c4e-1111-2222-3333-444455556666"
    assert guest.bus_ids == ("0000:1b:00.0", "0000:43:00.0", "0000:52:00.0")
    assert guest.state == "running" and guest.pid == 900 and guest.source == "qemu"
    assert guest.since == host.started_at(3600) and not guest.since_observed
