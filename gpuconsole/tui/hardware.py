"""Static hardware facts the views need: GPU model specs and server layouts.

The specs come from the simulator's profiles, which follow published datasheets. Where a
node's GPUs, NICs and switches sit is not taken from here: the topology view draws it from
the snapshot's readings (NVML, and the fabric source's PCIe levels, sockets and pairings);
a profile only names the product of a simulated node.
"""

from __future__ import annotations

from gpuconsole.model import NodeSnapshot
from gpuconsole.sim.profiles import PROFILES, GpuModel, NodeProfile


def _models() -> dict[str, GpuModel]:
    models: dict[str, GpuModel] = {}
    for profile in PROFILES.values():
        models[profile.gpu_model.name] = profile.gpu_model
    return models


_MODELS = _models()


def model_spec(gpu_name: str | None) -> GpuModel | None:
    """The datasheet of a GPU model by the name NVML reports, if known."""
    return None if gpu_name is None else _MODELS.get(gpu_name)


def model_for_pci_device(device_id: int | None) -> GpuModel | None:
    """The datasheet of a GPU by its PCI device id (0x2330), for one NVML cannot name."""
    if device_id is None:
        return None
    for model in _MODELS.values():
        if model.pci_device_id >> 16 == device_id:
            return model
    return None


def short_model(gpu_name: str | None) -> str:
    """A narrow name for a GPU model: 'H100', 'A100'; '-' when unknown."""
    spec = model_spec(gpu_name)
    if spec is not None:
        return spec.short
    if not gpu_name or gpu_name == "unknown":
        return "-"
    words = [w for w in gpu_name.replace("NVIDIA", "").split() if w]
    return words[0][:6] if words else "-"


def node_layout(node: NodeSnapshot) -> NodeProfile | None:
    """The profile a simulated node was built from (its product name), else None."""
    return PROFILES.get(node.profile) if node.profile else None
