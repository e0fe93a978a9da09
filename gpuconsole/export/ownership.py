"""Who holds each GPU, for Prometheus: dcgm-exporter's pod labels and gpuconsole_*owner* series.

dcgm-exporter adds pod, namespace and container to a GPU's (or GPU instance's) samples
only when the kubelet's pod-resources API names a pod for that device; other samples
carry no such labels at all, not empty ones. `PodLabels` does the same from ownership.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpuconsole.export import names
from gpuconsole.export.families import Families, Labels
from gpuconsole.facts.ownership import Owner, OwnerKind, Ownership
from gpuconsole.readings.snapshot import NodeSnapshot

_OWNER = ("kind", "tenant", "owner", "source")
_GPU_OWNER = ("node", "gpu", "uuid", "pci_bus_id", *_OWNER)
_MIG_OWNER = ("node", "gpu", "uuid", "gpu_instance", "mig_uuid", "profile", *_OWNER)
_PROBLEM = ("node", "kind", "severity", "gpu", "pci_bus_id", "gpu_instance")


@dataclass(frozen=True, slots=True)
class PodLabels:
    """(label names, values) by GPU UUID and by MIG instance UUID, for pod-held ones: pod,
    namespace and container, and the dra_* labels where a ResourceClaim gave the device."""

    gpus: dict[str, tuple[Labels, Labels]] = field(default_factory=dict)
    migs: dict[str, tuple[Labels, Labels]] = field(default_factory=dict)


_NO_PODS = PodLabels()


def _pod(owners: tuple[Owner, ...]) -> tuple[Labels, Labels] | None:
    """The first pod the kubelet names among the owners (dcgm-exporter knows no others)."""
    for owner in owners:
        if owner.kind is OwnerKind.POD and owner.pod and owner.namespace is not None:
            values = (owner.pod, owner.namespace, owner.container or "")
            dra = owner.dra
            if dra is None:
                return names.OWNER_LABELS, values
            claim = (dra.claim_name, dra.claim_namespace, dra.device, dra.driver, dra.pool)
            return names.DRA_OWNER_LABELS, (*values, *claim)
    return None


def pod_labels(ownership: Ownership | None) -> PodLabels:
    """What dcgm-exporter would add to each GPU's and MIG instance's samples."""
    if ownership is None:
        return _NO_PODS
    out = PodLabels()
    for gpu in ownership.gpus:
        # A MIG GPU's owners are its instances' holders; dcgm-exporter labels only the
        # instance a pod was given, never the parent GPU.
        if gpu.uuid and not gpu.migs:
            labels = _pod(gpu.owners)
            if labels is not None:
                out.gpus[gpu.uuid] = labels
        for mig in gpu.migs:
            labels = _pod(mig.owners)
            if labels is not None:
                out.migs[mig.uuid] = labels
    return out


def _owner_values(owner: Owner) -> Labels:
    return (owner.kind.value, owner.tenant or "", owner.name, owner.source)


_OWNERSHIP_SPECS = (
    names.GPU_OWNER_INFO,
    names.GPU_OWNER_MEM_USED,
    names.GPU_OWNER_MEM_LIMIT,
    names.GPU_OWNER_SM_LIMIT,
    names.MIG_OWNER_INFO,
    names.TENANT_GPUS,
    names.OWNERSHIP_PROBLEM,
)


def ownership_metrics(out: Families, node: NodeSnapshot, ownership: Ownership) -> None:
    """Owner info per GPU and MIG instance, GPUs per tenant, and inconsistencies."""
    if not out.wants(*_OWNERSHIP_SPECS):
        return  # none of them read (an evaluation of alert rules)
    name = node.node
    tenants: Counter[tuple[str, str]] = Counter()
    problems: Counter[Labels] = Counter()
    for gpu in ownership.gpus:
        index = "" if gpu.index is None else str(gpu.index)
        uuid = gpu.uuid or ""
        for owner in gpu.owners:
            values = (name, index, uuid, gpu.bus_id, *_owner_values(owner))
            out.gauge(names.GPU_OWNER_INFO, _GPU_OWNER, values, 1.0)
            if owner.mem_used_bytes is not None:
                out.gauge(names.GPU_OWNER_MEM_USED, _GPU_OWNER, values, owner.mem_used_bytes)
            limits = owner.limits
            if limits is not None and limits.mem_bytes is not None:
                out.gauge(names.GPU_OWNER_MEM_LIMIT, _GPU_OWNER, values, limits.mem_bytes)
            if limits is not None and limits.sm_pct is not None:
                out.gauge(names.GPU_OWNER_SM_LIMIT, _GPU_OWNER, values, limits.sm_pct / 100.0)
        for key in {(o.tenant or "", o.kind.value) for o in gpu.owners}:
            tenants[key] += 1
        for mig in gpu.migs:
            gi = str(mig.gpu_instance_id)
            for owner in mig.owners:
                values = (name, index, uuid, gi, mig.uuid, mig.profile, *_owner_values(owner))
                out.gauge(names.MIG_OWNER_INFO, _MIG_OWNER, values, 1.0)
            for problem in mig.problems:
                kind, severity = problem.kind.value, problem.severity.value
                problems[(name, kind, severity, index, gpu.bus_id, gi)] += 1
        for problem in gpu.problems:
            kind, severity = problem.kind.value, problem.severity.value
            problems[(name, kind, severity, index, gpu.bus_id, "")] += 1
    for problem in ownership.problems:
        problems[(name, problem.kind.value, problem.severity.value, "", "", "")] += 1
    for (tenant, kind), count in sorted(tenants.items()):
        out.gauge(names.TENANT_GPUS, ("node", "tenant", "kind"), (name, tenant, kind), float(count))
    for values, count in problems.items():
        out.gauge(names.OWNERSHIP_PROBLEM, _PROBLEM, values, float(count))
