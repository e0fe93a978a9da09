"""What `snapshot --json` carries beside the raw readings: what the console derives from
them, per node and keyed by each GPU's bus id (sysfs form, as lspci writes it), so that
`jq` answers "who owns GPU X" or "is it healthy" as every view does, without deriving it
again. The readings stay as they are: `codec.loads` reads the document back."""

from __future__ import annotations

from typing import Any

from gpuconsole.codec import encode, snapshot_json
from gpuconsole.facts import summaries
from gpuconsole.facts.inventory import GpuRow, node_gpus
from gpuconsole.facts.ownership import Owner
from gpuconsole.facts.pairing import GpuNic, gpu_nics
from gpuconsole.facts.verdict import finding_json, gpu_verdict
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot

__all__ = ["derived_json", "snapshot_document"]


def snapshot_document(snapshot: FleetSnapshot) -> dict[str, Any]:
    """The snapshot's JSON document with a `derived` object in each node."""
    document = snapshot_json(snapshot)
    for body, node in zip(document["nodes"], snapshot.nodes, strict=True):
        body["derived"] = derived_json(node)
    return document


def derived_json(node: NodeSnapshot) -> dict[str, Any]:
    """Each GPU of the node (NVML's and those only sysfs sees) by bus id: who owns it (and
    its MIG instances and processes), its verdict (health, action, findings), ownership
    that does not add up, the NIC it pairs with."""
    nics = gpu_nics(node.fabric) if node.fabric is not None else {}
    return {row.bus_id: _gpu(node, row, nics.get(row.bus_id)) for row in node_gpus(node)}


def _gpu(node: NodeSnapshot, row: GpuRow, nic: GpuNic | None) -> dict[str, Any]:
    held = row.owner
    verdict = gpu_verdict(node, row)
    return {
        "index": row.index,
        "uuid": row.uuid,
        "model": summaries.row_model(row),
        "owner": row.label,
        "owners": [_owner(o) for o in held.owners] if held is not None else [],
        "migs": [
            {
                "gpu_instance_id": mig.gpu_instance_id,
                "uuid": mig.uuid,
                "profile": mig.profile,
                "owner": ", ".join(o.label for o in mig.owners),
                "owners": [_owner(o) for o in mig.owners],
            }
            for mig in (held.migs if held is not None else ())
        ],
        "processes": [
            {"pid": p.pid, "gpu_instance_id": p.gpu_instance_id, "owner": p.owner.label}
            for p in (held.processes if held is not None else ())
        ],
        "health": verdict.health.value,
        "action": verdict.action.value,
        "findings": [finding_json(f) for f in verdict.findings],
        "problems": _problems(row),
        "nic": _nic(nic),
    }


def _owner(owner: Owner) -> dict[str, Any]:
    """An owner's label and what identifies it; fields it does not have left out."""
    body: dict[str, Any] = encode(owner, sparse=True)
    return {"label": owner.label, **body}


def _problems(row: GpuRow) -> list[dict[str, str]]:
    """Ownership of the GPU (or its MIG instances) that does not add up."""
    return [
        {"kind": p.kind.value, "severity": p.severity.value, "message": p.message}
        for p in (row.owner.all_problems if row.owner is not None else ())
    ]


def _nic(nic: GpuNic | None) -> dict[str, Any] | None:
    """The NIC the GPU uses for GPUDirect RDMA; None where the fabric source did not pair it."""
    if nic is None:
        return None
    return {"nic": nic.nic, "own": nic.own, "level": nic.level, "falls_back": nic.falls_back}
