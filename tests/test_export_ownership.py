"""Who holds each GPU, exported: dcgm-exporter's pod labels and gpuconsole's owner series."""

from __future__ import annotations

from gpuconsole.facts.inventory import node_gpus
from gpuconsole.facts.ownership import OwnerKind, node_ownership
from gpuconsole.readings.base import SourceStatus
from gpuconsole.readings.nvml import GpuReading, GpuState, NvmlReading
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.readings.tenancy import Guest, PciGpu, PodDevice, TenancyReading
from tests.export_fixtures import FIXED, frozen_body, frozen_fleet, one, parse, pick, render

POD_LABELS = {"pod", "namespace", "container"}


def test_a_pod_held_gpu_carries_dcgm_exporters_pod_labels_and_no_other_gpu_does() -> None:
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    xid = metrics["DCGM_FI_DEV_XID_ERRORS"]  # every GPU has one, MIG and lost ones too
    labelled = 0
    for node in snapshot.nodes:
        ownership = node_ownership(node)
        assert ownership is not None, node.node
        for row in node_gpus(node):
            if row.reading is None:
                continue
            # NVML's UUID; the nvidia driver's for the GPU NVML lost before reading it
            assert row.uuid is not None
            sample = one(xid, Hostname=node.node, UUID=row.uuid)
            owner = ownership.gpu(row.uuid)
            assert owner is not None
            pods = [o for o in owner.owners if o.kind is OwnerKind.POD and o.pod]
            if pods and not owner.migs:
                assert sample.labels["pod"] == pods[0].pod
                assert sample.labels["namespace"] == pods[0].namespace
                assert sample.labels["container"] == pods[0].container
                labelled += 1
            else:
                assert not POD_LABELS & set(sample.labels), sample
    assert labelled >= 4  # the demo's training pods


def test_a_gpu_nvml_lost_before_reading_it_is_exported_by_the_drivers_uuid_and_bus_id() -> None:
    """dgx-003's GPU 5 fell off the bus before NVML could read it: NVML calls it 'unknown-5'
    at 'unknown', which name no GPU (and the 5 is NVML's number, which changes when it
    renumbers). Its series carry what sysfs and the nvidia driver say of it instead."""
    body = frozen_body()
    assert "unknown-" not in body
    node = frozen_fleet().node("dgx-003")
    assert node is not None and node.tenancy is not None
    lost = next(p for p in node.tenancy.gpus if p.bus_id == "0000:c3:00.0")
    assert lost.uuid is not None
    metrics = parse(body)
    xid = one(metrics["DCGM_FI_DEV_XID_ERRORS"], Hostname="dgx-003", gpu="5")
    assert (xid.labels["UUID"], xid.labels["pci_bus_id"]) == (lost.uuid, "00000000:C3:00.0")
    assert xid.labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert xid.labels["pod"] == "train-llm-7b-0"  # its pod's labels, found by that UUID
    assert one(metrics["gpuconsole_gpu_lost"], node="dgx-003", uuid=lost.uuid).value == 1.0
    owner = one(metrics["gpuconsole_gpu_owner_info"], node="dgx-003", gpu="5")
    assert owner.labels["uuid"] == lost.uuid


def test_a_gpu_nvml_never_read_and_sysfs_never_named_is_exported_lost_with_empty_ids() -> None:
    gpu = GpuReading(5, "unknown-5", "unknown", "unknown", state=GpuState.LOST)
    node = NodeSnapshot("n1", nvml=NvmlReading(FIXED, None, None, None, (gpu,)))
    metrics = parse(render(FleetSnapshot(1, FIXED, (node,))))
    lost = one(metrics["gpuconsole_gpu_lost"], node="n1", gpu="5")
    assert lost.value == 1.0 and lost.labels["uuid"] == ""  # still said: it is lost
    xid = one(metrics["DCGM_FI_DEV_XID_ERRORS"], Hostname="n1")
    assert (xid.labels["UUID"], xid.labels["pci_bus_id"], xid.labels["modelName"]) == ("", "", "")


def test_mig_instances_carry_their_own_pod_and_the_parent_gpu_none() -> None:
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    found = 0
    for node in snapshot.nodes:
        ownership = node_ownership(node)
        assert ownership is not None
        for owner in ownership.gpus:
            for mig in owner.migs:
                fb = one(
                    metrics["DCGM_FI_DEV_FB_USED"],
                    Hostname=node.node,
                    UUID=owner.uuid or "",
                    GPU_I_ID=str(mig.gpu_instance_id),
                )
                if mig.owner.kind is OwnerKind.POD:
                    assert fb.labels["pod"] == mig.owner.pod
                    assert fb.labels["namespace"] == mig.owner.namespace
                    found += 1
                else:
                    assert not POD_LABELS & set(fb.labels)
            if owner.migs:
                whole = one(metrics["DCGM_FI_DEV_XID_ERRORS"], UUID=owner.uuid or "")
                assert not POD_LABELS & set(whole.labels)
    assert found >= 2  # dgx-004's MIG GPU: two instances held by pods


def test_every_gpu_has_an_owner_row_and_tenants_add_up() -> None:
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    for node in snapshot.nodes:
        ownership = node_ownership(node)
        assert ownership is not None
        rows = pick(metrics["gpuconsole_gpu_owner_info"], node=node.node)
        assert len(rows) == sum(len(g.owners) for g in ownership.gpus), node.node
        for gpu in ownership.gpus:
            mine = pick(rows, pci_bus_id=gpu.bus_id)
            assert {r.labels["owner"] for r in mine} == {o.name for o in gpu.owners}
            assert {r.labels["gpu"] for r in mine} == {"" if gpu.index is None else str(gpu.index)}
        counted: dict[tuple[str, str], int] = {}
        for gpu in ownership.gpus:
            for key in {(o.tenant or "", o.kind.value) for o in gpu.owners}:
                counted[key] = counted.get(key, 0) + 1
        exported = {
            (s.labels["tenant"], s.labels["kind"]): int(s.value)
            for s in pick(metrics["gpuconsole_tenant_gpus"], node=node.node)
        }
        assert exported == counted, node.node
        problems = pick(metrics.get("gpuconsole_ownership_problem", []), node=node.node)
        assert sum(p.value for p in problems) == len(ownership.all_problems), node.node


def _tenancy_node() -> FleetSnapshot:
    """GPU 0 held by a pod, GPU 1 lost under another pod, a third passed through to a VM
    (NVML cannot see it), and an allocation naming no GPU here."""
    nvml = NvmlReading(
        at=FIXED,
        driver_version=None,
        nvml_version=None,
        cuda_driver_version=None,
        gpus=(
            GpuReading(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "0000:1b:00.0", util_gpu_pct=50.0),
            GpuReading(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", "0000:43:00.0", state=GpuState.LOST),
        ),
    )
    tenancy = TenancyReading(
        at=FIXED,
        gpus=(
            PciGpu("0000:1b:00.0", driver="nvidia", uuid="GPU-aaaa"),
            PciGpu("0000:43:00.0", driver="nvidia", uuid="GPU-bbbb"),
            PciGpu("0000:61:00.0", driver="vfio-pci"),
        ),
        guests=(Guest("vm7", "running", ("0000:61:00.0",), "libvirt", tenant="tenant-b"),),
        pod_devices=(
            PodDevice(
                "team-nlp",
                "train-0",
                "trainer",
                "nvidia.com/gpu",
                "GPU-aaaa",
                "GPU-aaaa",
                tenant="nlp",
            ),
            PodDevice(
                "team-nlp",
                "train-1",
                "trainer",
                "nvidia.com/gpu",
                "GPU-bbbb",
                "GPU-bbbb",
                tenant="nlp",
            ),
            PodDevice("team-cv", "ghost", "main", "nvidia.com/gpu", "GPU-zzzz", "GPU-zzzz"),
        ),
    )
    statuses = tuple(
        SourceStatus(node="n1", source=s, ok=True, last_ok_at=FIXED, polls=1)
        for s in ("nvml", "tenancy")
    )
    node = NodeSnapshot(node="n1", nvml=nvml, tenancy=tenancy, statuses=statuses)
    return FleetSnapshot(seq=1, at=FIXED, nodes=(node,))


def test_owners_problems_and_passthrough_gpus_of_a_hand_made_node() -> None:
    metrics = parse(render(_tenancy_node()))
    util = one(metrics["DCGM_FI_DEV_GPU_UTIL"], UUID="GPU-aaaa")
    assert (util.labels["pod"], util.labels["namespace"], util.labels["container"]) == (
        "train-0",
        "team-nlp",
        "trainer",
    )
    vm = one(metrics["gpuconsole_gpu_owner_info"], pci_bus_id="0000:61:00.0")
    assert vm.labels == {
        "node": "n1",
        "gpu": "",
        "uuid": "",
        "pci_bus_id": "0000:61:00.0",
        "kind": "vm",
        "tenant": "tenant-b",
        "owner": "vm7",
        "source": "libvirt",
    }
    tenants = metrics["gpuconsole_tenant_gpus"]
    assert one(tenants, tenant="nlp", kind="pod").value == 2.0
    assert one(tenants, tenant="tenant-b", kind="vm").value == 1.0
    problems = metrics["gpuconsole_ownership_problem"]
    lost = one(problems, kind="held_but_lost")
    assert lost.labels["gpu"] == "1" and lost.labels["severity"] == "critical"
    unknown = one(problems, kind="unknown_device")
    assert unknown.labels["gpu"] == "" and unknown.labels["severity"] == "warning"


def test_a_dra_claimed_gpu_carries_dcgm_exporters_dra_labels_and_no_other_gpu_does() -> None:
    """dgxa-002's GPU 1 came to its pod through a ResourceClaim (DRA): dcgm-exporter adds the
    claim's dra_* labels beside pod, namespace and container; device-plugin GPUs get none."""
    metrics = parse(frozen_body())
    util = metrics["DCGM_FI_DEV_GPU_UTIL"]
    claimed = one(util, Hostname="dgxa-002", gpu="1")
    assert {k: v for k, v in claimed.labels.items() if k.startswith("dra_") or k in POD_LABELS} == {
        "pod": "dra-train-0",
        "namespace": "team-research",
        "container": "main",
        "dra_claim_name": "one-gpu",
        "dra_claim_namespace": "team-research",
        "dra_device_name": "gpu-1",
        "dra_driver_name": "gpu.nvidia.com",
        "dra_pool_name": "dgxa-002",
    }
    others = [s for s in util if s is not claimed]
    assert others and not any(k.startswith("dra_") for s in others for k in s.labels)
