"""TenancySource end to end over its real peers, its failures as values, and the demo's tenants."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuconsole import codec
from gpuconsole.config import parse
from gpuconsole.facts.ownership import OwnerKind, ProblemKind, node_ownership, resolve_owners
from gpuconsole.readings.base import Event
from gpuconsole.readings.nvml import GpuReading, NvmlReading, ProcessReading
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sources.base import SourceUnavailable
from gpuconsole.sources.tenancy import TenancySource, TenantRules
from gpuconsole.wiring import node_hub
from tests.tenancy_fixtures import DomainSpec, FakeHost, PodSpec, kubelet_server, libvirt_node

G = [f"GPU-{i}a7f1b2c-3d4e-5f60-7182-93a4b5c6d7e8" for i in range(4)]
BUS = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0"]
RULES = TenantRules.from_tables(
    namespaces={"team-*": "research"}, domains={"acme-*": "acme"}, accounts={"physics": "phys"}
)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gct-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def node_host(root: Path) -> FakeHost:
    """GPU 0 passed through to a guest, 1 in a pod, 2 in a Slurm job, 3 idle."""
    host = FakeHost(root)
    host.pci(BUS[0], driver="vfio-pci", group=30, override="vfio-pci")
    for i in (1, 2, 3):
        host.pci(BUS[i], driver="nvidia", group=30 + i)
        host.nvidia_info(BUS[i], G[i], minor=i)
    host.process(
        500,
        cgroup="/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0",
        fds=("/dev/nvidiactl", "/dev/nvidia2"),
        environ={"SLURM_JOB_ACCOUNT": "physics"},
    )
    return host


def host_nvml(*, job_pid: int = 500) -> NvmlReading:
    """NVML's view of that node: it cannot see the vfio-pci GPU."""
    gpus = tuple(
        GpuReading(
            index=i - 1,
            uuid=G[i],
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id=BUS[i],
            processes=(ProcessReading(job_pid),) if i == 2 else (),
        )
        for i in (1, 2, 3)
    )
    return NvmlReading(0.0, "535", "12", "12.2", gpus)


async def test_every_part_read_from_its_real_peer_and_merged(short_dir: Path) -> None:
    host = node_host(short_dir / "node")
    uri = libvirt_node(short_dir / "libvirt.xml", [DomainSpec("acme-train-vm", [BUS[0]])])
    sock = short_dir / "kubelet.sock"
    async with kubelet_server(sock) as kubelet:
        kubelet.pods = [PodSpec("team-nlp", "train-0", [("trainer", "nvidia.com/gpu", [G[1]])])]
        source = TenancySource(
            "node-1",
            sysfs_root=host.sysfs_root,
            proc_root=host.proc_root,
            libvirt_uri=uri,
            kubelet_socket=str(sock),
            kubelet_checkpoint=str(short_dir / "no-checkpoint"),
            passwd_file=str(host.passwd),
            rules=RULES,
            clock=lambda: 1000.0,
        )
        await source.start(lambda _e: None)
        try:
            reading = await source.poll()
        finally:
            await source.close()
    assert [(p.part, p.ok) for p in reading.parts] == [
        ("pci", True),
        ("libvirt", True),
        ("qemu", True),
        ("kubelet", True),
        ("processes", True),
    ]
    assert reading.part("pci") is not None
    assert reading.part("pci").detail == "4 GPUs in sysfs, 1 bound to vfio-pci"  # type: ignore[union-attr]
    owners = resolve_owners(host_nvml(), reading)
    rows = [(g.bus_id, g.index, g.label, g.owner.tenant) for g in owners.gpus]
    assert rows == [
        (BUS[1], 0, "pod team-nlp/train-0", "research"),
        (BUS[2], 1, "job 4711", "phys"),
        (BUS[3], 2, "free", None),
        (BUS[0], None, "vm acme-train-vm", "acme"),
    ]
    assert owners.gpu(G[1]).owner.since == 1000.0  # type: ignore[union-attr]
    assert owners.all_problems == ()


async def test_a_checkpoint_that_is_not_the_kubelets_is_named_and_pods_still_own(
    short_dir: Path,
) -> None:
    host = node_host(short_dir / "node")
    checkpoint = short_dir / "kubelet_internal_checkpoint"
    checkpoint.write_bytes(b'{"Data": "[2J"}')
    sock = short_dir / "kubelet.sock"
    async with kubelet_server(sock) as kubelet:
        kubelet.pods = [PodSpec("team-nlp", "train-0", [("trainer", "nvidia.com/gpu", [G[1]])])]
        source = TenancySource(
            "node-1",
            sysfs_root=host.sysfs_root,
            proc_root=host.proc_root,
            libvirt_uri="",
            kubelet_socket=str(sock),
            kubelet_checkpoint=str(checkpoint),
            passwd_file=str(host.passwd),
        )
        await source.start(lambda _e: None)
        try:
            reading = await source.poll()
        finally:
            await source.close()
    part = reading.part("kubelet")
    assert part is not None and part.ok
    assert part.detail == (
        f"1 GPU device allocated to 1 pod; device checkpoint {checkpoint}: "
        "no Data.PodDeviceEntries list"
    )
    owners = resolve_owners(host_nvml(), reading)
    assert owners.gpu(G[1]).label == "pod team-nlp/train-0"  # type: ignore[union-attr]


async def test_broken_parts_say_why_and_leave_the_rest(short_dir: Path) -> None:
    host = node_host(short_dir / "node")
    source = TenancySource(
        "node-1",
        sysfs_root=host.sysfs_root,
        proc_root=host.proc_root,
        libvirt_uri="qemu+unix:///system?socket=/nonexistent/sock",
        kubelet_socket=str(short_dir / "missing.sock"),
        passwd_file=str(host.passwd),
    )
    await source.start(lambda _e: None)
    try:
        reading = await source.poll()
    finally:
        await source.close()
    libvirt, kubelet = reading.part("libvirt"), reading.part("kubelet")
    assert libvirt is not None and not libvirt.ok
    assert "cannot connect to qemu+unix:///system" in libvirt.detail
    assert kubelet is not None and not kubelet.ok
    assert kubelet.detail == f"kubelet socket {short_dir / 'missing.sock'} not found"
    assert len(reading.gpus) == 4 and [p.pid for p in reading.processes] == [500]


async def test_a_sysfs_without_a_pci_bus_makes_the_source_unavailable(tmp_path: Path) -> None:
    source = TenancySource("n", sysfs_root=str(tmp_path), libvirt_uri="", kubelet_socket="")
    with pytest.raises(SourceUnavailable, match="no PCI bus under"):
        await source.poll()


async def test_a_node_with_nothing_to_own_says_why(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.pci("0000:99:00.0", driver="mlx5_core", group=4, vendor=0x15B3, pci_class=0x020700)
    source = TenancySource(
        "n",
        sysfs_root=host.sysfs_root,
        proc_root=host.proc_root,
        libvirt_uri="",
        kubelet_socket=str(tmp_path / "kubelet.sock"),
    )
    with pytest.raises(SourceUnavailable) as caught:
        await source.poll()
    assert str(caught.value) == (
        f"no NVIDIA GPUs under {host.sysfs_root}/bus/pci/devices "
        f"(kubelet socket {tmp_path}/kubelet.sock not found)"
    )


async def test_a_rebind_and_a_new_guest_are_posted_as_ownership_events(tmp_path: Path) -> None:
    host = node_host(tmp_path / "node")
    events: list[Event] = []
    source = TenancySource(
        "node-1",
        sysfs_root=host.sysfs_root,
        proc_root=host.proc_root,
        libvirt_uri="",
        kubelet_socket="",
        passwd_file=str(host.passwd),
    )
    await source.start(events.append)
    await source.poll()
    assert events == []
    host.rebind(BUS[3], "vfio-pci")
    host.process(
        900,
        cgroup="/machine.slice/qemu.scope",
        argv=("qemu-system-x86_64", "-name", "guest=vm9", "-device", f"vfio-pci,host={BUS[3]}"),
        fds=("/dev/vfio/vfio",),
    )
    reading = await source.poll()
    await source.close()
    assert [e.message for e in events] == [
        f"{BUS[3]}: driver nvidia -> vfio-pci",
        f"{BUS[3]}: now held by vm vm9",
    ]
    assert {e.kind for e in events} == {"ownership"}
    gpu = resolve_owners(host_nvml(), reading).gpu(BUS[3])
    assert gpu is not None and gpu.label == "vm vm9" and gpu.owner.source == "qemu"


async def test_the_reading_survives_the_json_snapshot_and_resolves_the_same(tmp_path: Path) -> None:
    host = node_host(tmp_path / "node")
    source = TenancySource(
        "node-1",
        sysfs_root=host.sysfs_root,
        proc_root=host.proc_root,
        libvirt_uri="",
        kubelet_socket="",
        passwd_file=str(host.passwd),
    )
    reading = await source.poll()
    node = NodeSnapshot("node-1", nvml=host_nvml(), tenancy=reading)
    back = codec.loads(codec.dumps(FleetSnapshot(1, 0.0, (node,))))
    restored = back.node("node-1")
    assert restored is not None and restored.tenancy == reading
    mine, theirs = node_ownership(node), node_ownership(restored)
    assert mine is not None and theirs is not None
    assert [g.label for g in mine.gpus] == [g.label for g in theirs.gpus]
    assert node_ownership(node) is mine  # remembered per reading pair


def test_the_config_puts_a_tenancy_source_with_its_rules_on_the_node() -> None:
    cfg = parse(
        '[host]\nname = "n1"\n[nvml]\nenabled = false\n[fabric]\nenabled = false\n'
        '[tenancy]\nlibvirt_uri = ""\ninterval_s = 7\n'
        '[tenancy.namespaces]\n"team-*" = "research"\n'
    )
    (source,) = [s for s in node_hub(cfg).sources if s.kind == "tenancy"]
    assert isinstance(source, TenancySource)
    assert source.interval_s == 7.0 and source.rules.namespace("team-nlp") == "research"


async def test_the_demo_has_guests_pods_a_job_free_gpus_and_a_flagged_lost_gpu() -> None:
    from gpuconsole.sim.cluster import build_sim_nodes, demo_cluster
    from gpuconsole.sim.nvml import SimNvml
    from gpuconsole.sim.tenancy import SimTenancySource
    from gpuconsole.sources.nvml.source import NvmlSource

    now = [1000.0]
    sims = build_sim_nodes(demo_cluster(), clock=lambda: now[0], start=1000.0)
    owners = {}
    readings = {}
    for sim in sims:
        now[0] = 1000.0
        nvml = NvmlSource(sim.name, lib=SimNvml(sim), events=False, clock=lambda: now[0])
        tenancy = SimTenancySource(sim, clock=lambda: now[0])
        await nvml.start(lambda _e: None)
        await tenancy.start(lambda _e: None)
        try:
            now[0] = 1010.0
            await nvml.poll()
            now[0] = 1060.0  # dgx-003's GPU 5 falls off the bus 45 s in
            readings[sim.name] = await tenancy.poll()
            owners[sim.name] = resolve_owners(await nvml.poll(), readings[sim.name])
        finally:
            await nvml.close()
            await tenancy.close()
            assert tenancy.tree is not None and not Path(tenancy.tree.root).exists()

    def held(node: str, kind: OwnerKind) -> dict[str, int]:
        counts: dict[str, int] = {}
        for gpu in owners[node].gpus:
            for owner in gpu.owners:
                if owner.kind is kind:
                    counts[owner.name] = counts.get(owner.name, 0) + 1
        return counts

    assert held("dgx-001", OwnerKind.VM) == {"acme-train-vm": 8}
    assert held("dgx-004", OwnerKind.VM) == {"tenant-b-vm7": 1}
    # tenant-b-vm7 runs the guest agent: its passthrough GPU is read from inside the guest
    inside = readings["dgx-004"].guest_gpus
    assert [(g.bus_id, g.guest, g.guest_bus_id, g.error) for g in inside] == [
        ("0000:52:00.0", "tenant-b-vm7", "0000:06:00.0", None)
    ]
    assert inside[0].reading is not None and inside[0].reading.util_gpu_pct is not None
    assert held("dgx-003", OwnerKind.POD) == {
        "team-nlp/train-llm-7b-0": 4,
        "team-vision/resnet-ft-1": 2,
        "team-nlp/notebook-alice": 1,
    }
    assert held("dgx-002", OwnerKind.JOB) == {"4711": 8}
    assert any(g.kind is OwnerKind.FREE for g in owners["dgxa-001"].gpus)
    lost = owners["dgx-003"].gpu(BUS_DGX_H100_GPU5)
    assert lost is not None and lost.label == "pod team-nlp/train-llm-7b-0"
    assert [p.kind for p in lost.problems] == [ProblemKind.HELD_BUT_LOST]
    # time-sliced replicas and MIG instances have pod owners too
    # time-sliced: three pods on one GPU; a fourth holds a GPU through a ResourceClaim (DRA)
    assert held("dgxa-002", OwnerKind.POD) == {
        "team-nlp/dev-a": 1,
        "team-nlp/dev-b": 1,
        "team-nlp/dev-c": 1,
        "team-research/dra-train-0": 1,
    }
    shared = owners["dgxa-002"].gpus[0]
    assert sorted(o.replicas for o in shared.owners) == [(0,), (1,), (2,)]
    # each sharer's process is its own pod's (the kubelet's device checkpoint ties the UIDs)
    assert [p.owner.label for p in shared.processes] == [
        "pod team-nlp/dev-a",
        "pod team-nlp/dev-b",
        "pod team-nlp/dev-c",
    ]
    assert all(o.mem_used_bytes for o in shared.owners)
    claimed = owners["dgxa-002"].gpus[1]
    assert [o.dra.claim if o.dra else None for o in claimed.owners] == ["team-research/one-gpu"]
    assert claimed.owners[0].dra is not None and claimed.owners[0].dra.device == "gpu-1"
    mig_gpu = owners["dgx-004"].gpu(BUS_DGX_H100_GPU7)
    assert mig_gpu is not None and mig_gpu.index == 6  # NVML's 6: GPU 2 is in tenant-b-vm7
    mig = mig_gpu.migs
    assert [m.owner.label for m in mig[:2]] == ["pod team-vision/infer-0", "pod team-nlp/embed-1"]


BUS_DGX_H100_GPU5 = "0000:c3:00.0"
BUS_DGX_H100_GPU7 = "0000:df:00.0"
