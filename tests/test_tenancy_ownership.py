"""Ownership merges NVML's view with the tenancy source's, and flags what does not add up."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpuconsole.facts.ownership import OwnerKind, ProblemKind, node_ownership, resolve_owners
from gpuconsole.readings.base import Severity
from gpuconsole.readings.nvml import GpuReading, GpuState, MigInstance, NvmlReading, ProcessReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import (
    DraDevice,
    Guest,
    HostProcess,
    IommuPeer,
    PartStatus,
    PciGpu,
    PodDevice,
    TenancyReading,
)

U0, U1, U2 = (f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(3))
MIG1 = "MIG-11111111-aaaa-bbbb-cccc-dddddddddddd"
MIG2 = "MIG-22222222-aaaa-bbbb-cccc-dddddddddddd"
BUS = ("0000:1b:00.0", "0000:43:00.0", "0000:52:00.0")


def nvml_gpu(i: int, *, pids: tuple[int, ...] = (), **kw: object) -> GpuReading:
    fields: dict[str, object] = {
        "index": i,
        "uuid": (U0, U1, U2)[i],
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": BUS[i],
        "processes": tuple(ProcessReading(pid) for pid in pids),
    }
    fields.update(kw)
    return GpuReading(**fields)  # type: ignore[arg-type]


def nvml(*gpus: GpuReading) -> NvmlReading:
    return NvmlReading(
        at=0.0, driver_version="535", nvml_version="12", cuda_driver_version="12.2", gpus=gpus
    )


def pci(i: int, driver: str | None = "nvidia", **kw: object) -> PciGpu:
    return PciGpu(bus_id=BUS[i], driver=driver, iommu_group=10 + i, **kw)  # type: ignore[arg-type]


def pod(
    ns: str, name: str, device_id: str, uuid: str | None, replica: int | None = None
) -> PodDevice:
    return PodDevice(ns, name, "main", "nvidia.com/gpu", device_id, uuid, replica, tenant=ns)


def test_a_passed_through_gpu_nvml_cannot_see_still_has_its_guest_as_owner() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0), pci(1, "vfio-pci")),
        guests=(Guest("tenant-b-vm7", "running", (BUS[1],), "libvirt", tenant="tenant-b"),),
    )
    own = resolve_owners(nvml(nvml_gpu(0)), tenancy)
    assert [g.bus_id for g in own.gpus] == [BUS[0], BUS[1]]
    held = own.gpu(BUS[1])
    assert held is not None and held.index is None and held.driver == "vfio-pci"
    assert held.label == "vm tenant-b-vm7" and held.owner.tenant == "tenant-b"
    assert held.owner.source == "libvirt" and held.owner.state == "running"
    free = own.gpu(U0)
    assert free is not None and free.kind is OwnerKind.FREE and free.label == "free"
    assert own.all_problems == ()


def test_pods_own_gpus_by_uuid_and_processes_in_their_cgroup_do_not_count_twice() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0), pci(1)),
        pod_devices=(pod("team-nlp", "train-0", U0, U0), pod("team-nlp", "train-0", U1, U1)),
        processes=(
            HostProcess(
                4242,
                "python3",
                "/kubepods/pod1/abc",
                pod_uid="11111111-2222-3333-4444-555555555555",
                started_at=100.0,
            ),
        ),
    )
    own = resolve_owners(nvml(nvml_gpu(0, pids=(4242,)), nvml_gpu(1)), tenancy)
    for gpu in own.gpus:
        assert gpu.label == "pod team-nlp/train-0"
        assert (gpu.owner.namespace, gpu.owner.pod, gpu.owner.container) == (
            "team-nlp",
            "train-0",
            "main",
        )
        assert gpu.problems == ()
    # the pod's process started before gpuconsole first saw the allocation
    first = own.gpu(U0)
    assert first is not None and first.owner.since == 100.0 and not first.owner.since_observed
    assert own.count_by_tenant() == {"team-nlp": 2}


def test_a_slurm_job_and_a_plain_user_are_owners_from_their_processes() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0), pci(1)),
        processes=(
            HostProcess(
                10,
                "python",
                "/slurm/uid_1001/job_4711/step_0",
                user="bob",
                slurm_job="4711",
                slurm_account="physics",
                tenant="physics",
            ),
            HostProcess(
                11, "python", "/slurm/uid_1001/job_4711/step_0", user="bob", slurm_job="4711"
            ),
            HostProcess(20, "jupyter", "/user.slice/user-1000.slice", user="alice"),
        ),
    )
    own = resolve_owners(nvml(nvml_gpu(0, pids=(10, 11)), nvml_gpu(1, pids=(20,))), tenancy)
    job = own.gpu(U0)
    assert job is not None and job.label == "job 4711" and job.owner.pids == (10, 11)
    assert job.owner.tenant == "physics" and job.owner.user == "bob"
    user = own.gpu(U1)
    assert user is not None and user.label == "process alice"


def test_a_gpu_on_vfio_pci_with_host_processes_is_flagged() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0, "vfio-pci"),),
        guests=(Guest("vm1", "running", (BUS[0],), "libvirt"),),
    )
    own = resolve_owners(nvml(nvml_gpu(0, pids=(77,))), tenancy)
    gpu = own.gpus[0]
    assert gpu.label == "vm vm1"  # the guest stays the owner; the processes are the problem
    (problem,) = gpu.problems
    assert problem.kind is ProblemKind.VFIO_WITH_PROCESSES and problem.severity is Severity.CRITICAL
    assert "77" in problem.message and "vm vm1" in problem.message


def test_a_gpu_claimed_by_a_guest_and_a_pod_is_flagged_with_both_names() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0, "vfio-pci"),),
        guests=(Guest("vm1", "running", (BUS[0],), "qemu"),),
        pod_devices=(pod("ns", "p", U0, U0),),
    )
    own = resolve_owners(nvml(nvml_gpu(0)), tenancy)
    gpu = own.gpus[0]
    assert [o.label for o in gpu.owners] == ["vm vm1", "pod ns/p"]
    (problem,) = gpu.problems
    assert problem.kind is ProblemKind.TWO_OWNERS
    assert "vm vm1 (qemu)" in problem.message and "pod ns/p (kubelet)" in problem.message


def test_time_sliced_replicas_share_a_gpu_without_a_conflict() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0),),
        pod_devices=(
            pod("ns", "a", f"{U0}::0", U0, 0),
            pod("ns", "a", f"{U0}::3", U0, 3),
            pod("ns", "b", f"{U0}::1", U0, 1),
        ),
    )
    gpu = resolve_owners(nvml(nvml_gpu(0)), tenancy).gpus[0]
    assert [(o.name, o.replicas) for o in gpu.owners] == [("ns/a", (0, 3)), ("ns/b", (1,))]
    assert gpu.label == "pod ns/a +1" and gpu.problems == ()


def test_a_pod_holding_a_gpu_nvml_reports_lost_is_flagged() -> None:
    lost = nvml_gpu(0, state=GpuState.LOST, lost_since=50.0)
    tenancy = TenancyReading(
        at=0.0, gpus=(pci(0),), pod_devices=(pod("team-nlp", "train-llm-7b-0", U0, U0),)
    )
    gpu = resolve_owners(nvml(lost), tenancy).gpus[0]
    assert gpu.label == "pod team-nlp/train-llm-7b-0"
    (problem,) = gpu.problems
    assert problem.kind is ProblemKind.HELD_BUT_LOST and "NVML reports lost" in problem.message


def test_a_lost_gpu_nobody_holds_is_unavailable() -> None:
    gpu = resolve_owners(nvml(nvml_gpu(0, state=GpuState.LOST)), TenancyReading(at=0.0)).gpus[0]
    assert gpu.kind is OwnerKind.UNAVAILABLE and gpu.label == "unavailable (lost)"


# --- a GPU off the bus: NVML lists no process on it, what still holds it says who owns it ---

LOST1 = nvml_gpu(1, state=GpuState.LOST, lost_since=50.0)
# nvidia-persistenced holds every /dev/nvidiaN and runs nobody's work
PERSISTENCED = HostProcess(
    9, "nvidia-persistenc", "/system.slice/nvidia-persistenced.service", user="root",
    gpu_minors=(0, 1, 2),
)  # fmt: skip


def _held(*processes: HostProcess, pods: tuple[PodDevice, ...] = ()) -> TenancyReading:
    """GPUs 0 and 1 with minors 0 and 1 (the driver's /proc information), processes holding
    them, nvidia-persistenced holding both."""
    return TenancyReading(
        at=0.0,
        gpus=(pci(0, minor=0, uuid=U0), pci(1, minor=1, uuid=U1)),
        pod_devices=pods,
        processes=(*processes, PERSISTENCED),
    )


def test_a_lost_gpu_under_a_slurm_job_is_the_jobs_by_the_ranks_holding_its_device() -> None:
    ranks = (
        HostProcess(
            100 + k, "python", "/system.slice/slurmstepd.scope/job_4801/step_0/user/task_0",
            user="bob", slurm_job="4801", slurm_account="physics", tenant="physics",
            gpu_minors=(k,),
        )
        for k in range(2)
    )  # fmt: skip
    own = resolve_owners(nvml(nvml_gpu(0, pids=(100,)), LOST1), _held(*ranks))
    gpu = own.gpu(BUS[1])
    assert gpu is not None and gpu.label == "job 4801"
    assert gpu.owner.job == "4801" and gpu.owner.pids == (101,) and gpu.owner.tenant == "physics"
    (problem,) = gpu.problems
    assert problem.kind is ProblemKind.HELD_BUT_LOST and BUS[1] in problem.message
    # what NVML lists stays NVML's, and the healthy GPU's owner is as NVML says
    assert gpu.processes == ()
    healthy = own.gpu(BUS[0])
    assert healthy is not None and healthy.label == "job 4801" and healthy.owner.pids == (100,)


def test_a_gpu_lost_before_nvml_named_it_is_held_by_its_minor_too() -> None:
    """NVML never read its bus id (unknown-1): the driver's minor still names the GPU."""
    unnamed = nvml_gpu(1, uuid="unknown-1", pci_bus_id="unknown-1", state=GpuState.LOST)
    rank = HostProcess(101, "python", "/slurm/uid_1001/job_77/step_0", slurm_job="77",
                       gpu_minors=(1,))  # fmt: skip
    gpu = resolve_owners(nvml(nvml_gpu(0), unnamed), _held(rank)).gpu(BUS[1])
    assert gpu is not None and gpu.label == "job 77"


def test_a_lost_gpus_device_is_the_one_its_minor_names_not_its_nvml_index() -> None:
    """/dev/nvidiaN minors need not follow NVML's (bus) order: the driver's /proc information
    ties each minor to a bus id, and that names the GPU."""
    rank = HostProcess(101, "python", "/slurm/uid_1001/job_77/step_0", slurm_job="77",
                       gpu_minors=(0,))  # fmt: skip
    tenancy = TenancyReading(at=0.0, gpus=(pci(0, minor=1), pci(1, minor=0)), processes=(rank,))
    own = resolve_owners(nvml(nvml_gpu(0), LOST1), tenancy)
    assert [(g.bus_id, g.label) for g in own.gpus] == [
        (BUS[0], "free"),
        (BUS[1], "job 77"),
    ]


def test_a_lost_gpu_a_dra_claim_names_by_its_minor_is_the_claims_pod() -> None:
    tenancy = TenancyReading(
        at=0.0, gpus=(pci(0, minor=0), pci(1, minor=1)), pod_devices=(_claimed("gpu-1", 1),)
    )
    gpu = resolve_owners(nvml(nvml_gpu(0), LOST1), tenancy).gpu(BUS[1])
    assert gpu is not None and gpu.label == "pod research/train"
    assert [p.kind for p in gpu.problems] == [ProblemKind.HELD_BUT_LOST]


def test_a_lost_gpu_in_a_pods_container_is_the_pods_once() -> None:
    container = HostProcess(
        101, "python3",
        "/kubepods.slice/kubepods-pod0b7c4a50_1111_2222_3333_444455556666.slice/"
        "cri-containerd-" + "a" * 64 + ".scope",
        pod_uid="0b7c4a50-1111-2222-3333-444455556666", container_id="a" * 64, gpu_minors=(1,),
    )  # fmt: skip
    # the kubelet's assignment and the container's process are the one pod
    device = msgspec.structs.replace(
        pod("team-nlp", "train-0", U1, U1), pod_uid="0b7c4a50-1111-2222-3333-444455556666"
    )
    gpu = resolve_owners(nvml(nvml_gpu(0), LOST1), _held(container, pods=(device,))).gpu(BUS[1])
    assert gpu is not None and [o.label for o in gpu.owners] == ["pod team-nlp/train-0"]
    assert gpu.owner.pids == (101,)
    assert [p.kind for p in gpu.problems] == [ProblemKind.HELD_BUT_LOST]
    # with no kubelet answer, the container's cgroup still names its pod
    gpu = resolve_owners(nvml(nvml_gpu(0), LOST1), _held(container)).gpu(BUS[1])
    assert gpu is not None
    assert gpu.label == "pod pod-uid 0b7c4a50-1111-2222-3333-444455556666"
    # where the kubelet answered and gave it no GPU here, it is a DaemonSet holding every
    # device (dcgm-exporter, the device plugin), not the GPU's owner
    answered = msgspec.structs.replace(
        _held(container), parts=(PartStatus("kubelet", True, "0 GPU devices"),)
    )
    gpu = resolve_owners(nvml(nvml_gpu(0), LOST1), answered).gpu(BUS[1])
    assert gpu is not None and gpu.label == "unavailable (lost)"


def test_a_monitoring_pod_holding_a_lost_gpu_its_pod_holds_too_is_no_second_owner() -> None:
    """The kubelet gave the lost GPU to team-nlp/train-0; dcgm-exporter (a DaemonSet that the
    kubelet gave no GPU) holds every /dev/nvidiaN too. The GPU is train-0's alone: a plan
    that drained its owners would otherwise evict the node's monitoring."""
    uid = "0b7c4a50-1111-2222-3333-444455556666"
    container = HostProcess(
        101, "python3", f"/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/x.scope",
        pod_uid=uid, container_id="a" * 64, gpu_minors=(1,),
    )  # fmt: skip
    exporter_uid = "9d8e7f60-aaaa-bbbb-cccc-ddddeeeeffff"
    exporter = HostProcess(
        202, "dcgm-exporter", f"/kubepods.slice/kubepods-pod{exporter_uid.replace('-', '_')}"
        ".slice/y.scope", pod_uid=exporter_uid, container_id="b" * 64, gpu_minors=(0, 1),
    )  # fmt: skip
    device = msgspec.structs.replace(pod("team-nlp", "train-0", U1, U1), pod_uid=uid)
    held = msgspec.structs.replace(
        _held(container, exporter, pods=(device,)),
        parts=(PartStatus("kubelet", True, "1 GPU device"),),
    )
    gpu = resolve_owners(nvml(nvml_gpu(0), LOST1), held).gpu(BUS[1])
    assert gpu is not None and [o.label for o in gpu.owners] == ["pod team-nlp/train-0"]
    assert gpu.owner.pids == (101,)


def test_a_lost_gpu_held_by_a_process_of_no_scheduler_is_its_users() -> None:
    notebook = HostProcess(
        101, "jupyter", "/user.slice/user-1000.slice/session-3.scope", user="alice",
        gpu_minors=(1,),
    )  # fmt: skip
    gpu = resolve_owners(nvml(nvml_gpu(0), LOST1), _held(notebook)).gpu(BUS[1])
    assert gpu is not None and gpu.label == "process alice" and gpu.owner.pids == (101,)


def test_services_holding_every_gpu_own_no_lost_gpu_nor_a_healthy_one() -> None:
    own = resolve_owners(nvml(nvml_gpu(0), LOST1), _held())
    lost, healthy = own.gpu(BUS[1]), own.gpu(BUS[0])
    assert lost is not None and lost.label == "unavailable (lost)"
    assert healthy is not None and healthy.label == "free"
    # a healthy GPU's owners are NVML's processes: a process holding its device that NVML
    # does not list (a monitor in someone's session) is no owner
    watcher = HostProcess(
        101, "nvtop", "/user.slice/user-1000.slice/session-3.scope", gpu_minors=(0, 1)
    )
    healthy = resolve_owners(nvml(nvml_gpu(0), nvml_gpu(1)), _held(watcher)).gpu(BUS[0])
    assert healthy is not None and healthy.label == "free"


def test_a_guest_holding_part_of_an_iommu_group_is_flagged() -> None:
    peers = (
        IommuPeer("0000:1b:00.1", 0x040300, "snd_hda_intel"),
        IommuPeer("0000:1a:00.0", 0x060400, "pcieport"),  # bridges stay with the host
    )
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0, "vfio-pci", iommu_peers=peers),),
        guests=(Guest("vm1", "running", (BUS[0],), "libvirt"),),
    )
    gpu = resolve_owners(None, tenancy).gpus[0]
    (problem,) = gpu.problems
    assert problem.kind is ProblemKind.PARTIAL_IOMMU_GROUP and problem.severity is Severity.CRITICAL
    assert "0000:1b:00.1 (snd_hda_intel)" in problem.message and "1a:00.0" not in problem.message
    whole = TenancyReading(
        at=0.0,
        gpus=tenancy.gpus,
        guests=(Guest("vm1", "running", (BUS[0], "0000:1b:00.1"), "libvirt"),),
    )
    assert resolve_owners(None, whole).gpus[0].problems == ()


def test_a_shut_off_guest_reserves_a_vfio_gpu_but_yields_to_a_running_holder() -> None:
    reserved = TenancyReading(
        at=0.0,
        gpus=(pci(0, "vfio-pci"),),
        guests=(Guest("vm-off", "shut off", (BUS[0],), "libvirt"),),
    )
    gpu = resolve_owners(None, reserved).gpus[0]
    assert gpu.label == "vm vm-off (shut off)" and gpu.problems == ()
    both = TenancyReading(
        at=0.0,
        gpus=(pci(0, "vfio-pci"),),
        guests=(
            Guest("vm-off", "shut off", (BUS[0],), "libvirt"),
            Guest("vm-on", "running", (BUS[0],), "libvirt"),
        ),
    )
    gpu = resolve_owners(None, both).gpus[0]
    assert [o.label for o in gpu.owners] == ["vm vm-on"] and gpu.problems == ()


def test_mig_instances_have_their_own_owners() -> None:
    migs = (
        MigInstance(1, 0, MIG1, "3g.40gb", 3, 60),
        MigInstance(2, 0, MIG2, "1g.10gb", 1, 16),
    )
    gpu0 = nvml_gpu(
        0, mig_enabled=True, mig_instances=migs, processes=(ProcessReading(9, gpu_instance_id=2),)
    )
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0),),
        pod_devices=(PodDevice("ns", "infer", "srv", "nvidia.com/mig-3g.40gb", MIG1, MIG1),),
        processes=(HostProcess(9, "python", "/user.slice", user="alice"),),
    )
    gpu = resolve_owners(nvml(gpu0), tenancy).gpus[0]
    assert [(m.gpu_instance_id, m.owner.label) for m in gpu.migs] == [
        (1, "pod ns/infer"),
        (2, "process alice"),
    ]
    assert [o.label for o in gpu.owners] == ["pod ns/infer", "process alice"]
    assert gpu.problems == ()


def test_an_allocation_naming_no_gpu_here_is_a_node_problem_not_a_crash() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0),),
        pod_devices=(
            pod(
                "ns",
                "ghost",
                "GPU-ffffffff-0000-0000-0000-000000000000",
                "GPU-ffffffff-0000-0000-0000-000000000000",
            ),
            PodDevice("ns", "weird", "c", "nvidia.com/gpu", "not-a-gpu", None),
        ),
    )
    own = resolve_owners(nvml(nvml_gpu(0)), tenancy)
    assert own.gpus[0].kind is OwnerKind.FREE
    kinds = [p.kind for p in own.problems]
    assert kinds == [ProblemKind.UNKNOWN_DEVICE, ProblemKind.UNKNOWN_DEVICE]
    assert "'not-a-gpu'" in own.problems[1].message


def test_index_strategy_device_ids_map_to_nvml_indices() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0), pci(1)),
        pod_devices=(PodDevice("ns", "p", "c", "nvidia.com/gpu", "1", None, index=1),),
    )
    own = resolve_owners(nvml(nvml_gpu(0), nvml_gpu(1)), tenancy)
    assert [g.label for g in own.gpus] == ["free", "pod ns/p"]


def test_an_index_named_pod_is_not_moved_to_another_gpu_when_nvml_renumbers() -> None:
    """The device plugin's index strategy names a GPU by NVML's number when the container
    started. GPU 0 then left for vfio-pci and NVML numbered the others again: index 1 is
    now 52:00.0, not the pod's 43:00.0. No GPU is said to be the pod's by that number."""
    device = msgspec.structs.replace(pod("ns", "p", "1", None), index=1, since=100.0)
    tenancy = TenancyReading(
        at=300.0,
        gpus=(
            pci(0, "vfio-pci", bound_since=200.0),
            pci(1, bound_since=50.0),
            pci(2, bound_since=50.0),
        ),
        pod_devices=(device,),
    )
    renumbered = nvml(nvml_gpu(1, index=0), nvml_gpu(2, index=1))
    own = resolve_owners(renumbered, tenancy)
    assert [(g.bus_id, g.label) for g in own.gpus] == [
        (BUS[1], "free"),
        (BUS[2], "free"),  # shown as GPU 1 now: not the pod's
        (BUS[0], "free (vfio-pci)"),
    ]
    (problem,) = own.problems
    assert problem.kind is ProblemKind.RENUMBERED_DEVICE and problem.severity is Severity.WARNING
    assert "pod ns/p" in problem.message and BUS[0] in problem.message
    # with no driver change since the pod was first seen, its index is NVML's number now
    steady = msgspec.structs.replace(
        tenancy, gpus=(pci(1, bound_since=50.0), pci(2, bound_since=50.0))
    )
    assert [g.label for g in resolve_owners(renumbered, steady).gpus] == ["free", "pod ns/p"]


def test_unbound_and_foreign_driver_gpus_are_unavailable() -> None:
    tenancy = TenancyReading(at=0.0, gpus=(pci(0, None), pci(1, "nouveau"), pci(2, "vfio-pci")))
    labels = [g.label for g in resolve_owners(None, tenancy).gpus]
    assert labels == [
        "unavailable (no driver bound)",
        "unavailable (bound to nouveau)",
        "free (vfio-pci)",
    ]


def test_a_running_guest_whose_gpu_the_host_driver_holds_is_flagged() -> None:
    tenancy = TenancyReading(
        at=0.0, gpus=(pci(0),), guests=(Guest("vm1", "running", (BUS[0],), "libvirt"),)
    )
    (problem,) = resolve_owners(nvml(nvml_gpu(0)), tenancy).gpus[0].problems
    assert (
        problem.kind is ProblemKind.GUEST_ON_HOST_DRIVER
        and "nvidia driver holds it" in problem.message
    )


def test_processes_nvml_reports_but_proc_does_not_know_are_still_owners() -> None:
    own = resolve_owners(nvml(nvml_gpu(0, pids=(31337,))), TenancyReading(at=0.0, gpus=(pci(0),)))
    owner = own.gpus[0].owner
    assert owner.label == "process pid 31337" and owner.source == "nvml"


def test_each_process_resolves_to_its_own_owner_not_the_gpus() -> None:
    migs = (
        MigInstance(1, 0, MIG1, "3g.40gb", 3, 60),
        MigInstance(2, 0, MIG2, "1g.10gb", 1, 16),
    )
    processes = (ProcessReading(7, gpu_instance_id=1), ProcessReading(9, gpu_instance_id=2))
    gpu0 = nvml_gpu(0, mig_enabled=True, mig_instances=migs, processes=processes)
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0),),
        # the kubelet names the pod by the MIG UUID; its process's cgroup knows only its UID
        pod_devices=(PodDevice("ns", "infer", "srv", "nvidia.com/mig-3g.40gb", MIG1, MIG1),),
        processes=(
            HostProcess(7, "python", "/kubepods/pod-abc", pod_uid="abc", started_at=50.0),
            HostProcess(9, "python", "/slurm/job_4711", user="bob", slurm_job="4711"),
        ),
    )
    gpu = resolve_owners(nvml(gpu0), tenancy).gpus[0]
    assert [(p.pid, p.gpu_instance_id, p.owner.label) for p in gpu.processes] == [
        (7, 1, "pod ns/infer"),
        (9, 2, "job 4711"),
    ]
    one, two = gpu.mig(1), gpu.mig(2)
    assert one is not None and two is not None
    assert (one.owner.label, two.owner.label) == ("pod ns/infer", "job 4711")
    # the pod's own owner record, with the start its process gives it
    assert gpu.process_owner(7) is one.owner and one.owner.since == 50.0
    assert gpu.process_owner(31337) is None


def test_a_process_of_one_of_several_time_sliced_pods_keeps_its_cgroups_pod() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0),),
        pod_devices=(pod("ns", "a", f"{U0}::0", U0, 0), pod("ns", "b", f"{U0}::1", U0, 1)),
        processes=(HostProcess(5, "python", "/kubepods/pod-123", pod_uid="123"),),
    )
    gpu = resolve_owners(nvml(nvml_gpu(0, pids=(5,))), tenancy).gpus[0]
    assert [o.label for o in gpu.owners] == ["pod ns/a", "pod ns/b"]  # no third owner
    owner = gpu.process_owner(5)
    assert owner is not None and (owner.label, owner.source) == ("pod pod-uid 123", "cgroup")


def test_host_processes_on_a_guests_gpu_have_owners_but_claim_nothing() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0, "vfio-pci"),),
        guests=(Guest("vm1", "running", (BUS[0],), "libvirt"),),
        processes=(HostProcess(3, "python", "/user.slice", user="mallory"),),
    )
    gpu = resolve_owners(nvml(nvml_gpu(0, pids=(3,))), tenancy).gpus[0]
    assert [o.label for o in gpu.owners] == ["vm vm1"]
    owner = gpu.process_owner(3)
    assert owner is not None and owner.label == "process mallory"
    assert [p.kind for p in gpu.problems] == [ProblemKind.VFIO_WITH_PROCESSES]


def test_ownership_is_resolved_again_only_when_owner_facts_change() -> None:
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0), pci(1)),
        processes=(HostProcess(10, "python", "/slurm/job_1", slurm_job="1"),),
    )
    first = NodeSnapshot("n", nvml=nvml(nvml_gpu(0, pids=(10,)), nvml_gpu(1)), tenancy=tenancy)
    # a new poll: the load moved, the owners did not
    busy = nvml(nvml_gpu(0, pids=(10,), util_gpu_pct=97.0), nvml_gpu(1, temp_gpu_c=70.0))
    again = msgspec.structs.replace(first, nvml=busy)
    assert node_ownership(again) is node_ownership(first)
    moved = msgspec.structs.replace(first, nvml=nvml(nvml_gpu(0), nvml_gpu(1, pids=(10,))))
    changed = node_ownership(moved)
    assert changed is not node_ownership(first)
    assert changed is not None and [g.label for g in changed.gpus] == ["free", "job 1"]


def test_a_node_left_as_it_was_is_answered_without_reading_its_nvml_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuconsole.facts import ownership

    tenancy = TenancyReading(at=0.0, gpus=(pci(0),))
    node = NodeSnapshot("same-node", nvml=nvml(nvml_gpu(0)), tenancy=tenancy)
    first = node_ownership(node)
    keyed: list[object] = []
    real = ownership._nvml_key
    monkeypatch.setattr(ownership, "_nvml_key", lambda n: keyed.append(n) or real(n))
    # every consumer of every publish asks again about the nodes that did not change
    for _ in range(5):
        assert node_ownership(node) is first
    assert keyed == []
    # a new NVML reading with the same owner facts is read once, and answered alike
    polled = msgspec.structs.replace(node, nvml=nvml(nvml_gpu(0, util_gpu_pct=50.0)))
    assert node_ownership(polled) is first
    assert node_ownership(polled) is first
    assert len(keyed) == 1
    # a new tenancy reading is resolved again
    moved = msgspec.structs.replace(
        polled, tenancy=TenancyReading(at=1.0, gpus=(pci(0, "vfio-pci"),))
    )
    changed = node_ownership(moved)
    assert changed is not None and changed is not first
    assert [g.label for g in changed.gpus] == ["free (vfio-pci)"]


def _claimed(device: str, minor: int | None, placement: tuple[int, int] | None = None) -> PodDevice:
    dra = DraDevice("one-gpu", "research", "gpu.nvidia.com", "node-7", device)
    return PodDevice(
        "research", "train", "main", "gpu.nvidia.com", device, None,
        tenant="research", dra=dra, minor=minor, mig_placement=placement,
    )  # fmt: skip


def test_tenancy_read_again_finding_the_same_is_not_resolved_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tenancy source re-reads every few seconds and mostly finds what it found: the
    same owners, with no resolving (a head does it for a thousand nodes); a reading that
    found something else is resolved."""
    from gpuconsole.facts import ownership

    processes = (HostProcess(10, "python", "/slurm/job_1", slurm_job="1"),)
    tenancy = TenancyReading(at=0.0, gpus=(pci(0), pci(1)), processes=processes)
    node = NodeSnapshot("re-read", nvml=nvml(nvml_gpu(0, pids=(10,)), nvml_gpu(1)), tenancy=tenancy)
    first = node_ownership(node)
    resolved: list[object] = []
    real = ownership.resolve_owners
    monkeypatch.setattr(ownership, "resolve_owners", lambda *a: resolved.append(a) or real(*a))
    for at in (5.0, 10.0, 15.0):
        again = msgspec.structs.replace(node, tenancy=msgspec.structs.replace(tenancy, at=at))
        assert node_ownership(again) is first
    assert resolved == []
    left = msgspec.structs.replace(tenancy, at=20.0, processes=())
    changed = node_ownership(msgspec.structs.replace(node, tenancy=left))
    assert len(resolved) == 1 and changed is not first
    assert changed is not None and [g.label for g in changed.gpus] == ["process pid 10", "free"]


def test_a_dra_claim_owns_the_gpu_its_minor_names_not_the_nvml_index() -> None:
    # NVML numbers GPUs by bus order; /dev/nvidiaN minors need not follow it
    tenancy = TenancyReading(
        at=0.0, gpus=(pci(0, minor=1), pci(1, minor=0)), pod_devices=(_claimed("gpu-0", 0),)
    )
    own = resolve_owners(nvml(nvml_gpu(0), nvml_gpu(1)), tenancy)
    assert [g.label for g in own.gpus] == ["free", "pod research/train"]
    owner = own.gpus[1].owners[0]
    assert owner.dra is not None and owner.dra.claim == "research/one-gpu"
    assert owner.tenant == "research" and own.problems == ()


def test_a_dra_mig_device_owns_the_instance_at_its_placement() -> None:
    migs = (
        MigInstance(1, 0, MIG1, "3g.40gb", 3, 60, placement_start=0),
        MigInstance(2, 0, MIG2, "1g.10gb", 1, 16, placement_start=6),
    )
    gpu0 = nvml_gpu(0, mig_enabled=True, mig_instances=migs)
    tenancy = TenancyReading(
        at=0.0,
        gpus=(pci(0, minor=4),),
        pod_devices=(
            _claimed("gpu-4-mig-19-6-1", 4, (6, 1)),
            _claimed("gpu-4-mig-9-2-2", 4, (2, 2)),  # no instance there
            _claimed("gpu-9", 9),  # no such minor here
            _claimed("gpu-two", None),  # a name NVIDIA's driver does not write
        ),
    )
    own = resolve_owners(nvml(gpu0), tenancy)
    assert [(m.gpu_instance_id, m.owner.label) for m in own.gpus[0].migs] == [
        (1, "free"),
        (2, "pod research/train"),
    ]
    assert [p.kind for p in own.problems] == [ProblemKind.UNKNOWN_DEVICE] * 3
    assert "'gpu-two'" in own.problems[2].message


def test_a_fleet_of_ten_thousand_nodes_is_resolved_once_not_on_every_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wallboard or fleet view asks about every node of a 10,000-node fleet in turn, each
    snapshot: each node's owners are resolved once, and asked again they are the answer
    kept (a cache smaller than the fleet would evict each node just before it is asked)."""
    from gpuconsole.facts import ownership
    from gpuconsole.facts.summaries import gpu_counts

    tenancy = TenancyReading(at=0.0, gpus=(pci(0),))
    reading = nvml(nvml_gpu(0))
    fleet = [NodeSnapshot(f"node-{i:05d}", nvml=reading, tenancy=tenancy) for i in range(10_000)]
    first = [node_ownership(node) for node in fleet]
    counts = [gpu_counts(node) for node in fleet]
    resolved: list[object] = []
    real = ownership.resolve_owners

    def resolve(*args: Any) -> ownership.Ownership:
        resolved.append(args)
        return real(*args)

    monkeypatch.setattr(ownership, "resolve_owners", resolve)
    again = [node_ownership(node) for node in fleet]
    assert len(resolved) == 0
    assert all(a is b for a, b in zip(again, first, strict=True))
    assert all(a is b for a, b in zip(map(gpu_counts, fleet), counts, strict=True))
