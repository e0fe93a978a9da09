"""Static hardware facts the views need: GPU model specs and server layouts.

The specs come from the simulator's profiles, which follow published datasheets. A
server layout (PCI paths, NICs, NVSwitches) is only known for a node whose profile is
one of those; a live node gets its layout from the affinity/fabric sources once they
exist, and until then the views say that it is not available.
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
    """The server layout for a node built from a known profile (simulated nodes)."""
    return PROFILES.get(node.profile) if node.profile else None
