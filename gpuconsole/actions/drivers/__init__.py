"""The drivers that carry steps out, one per layer: PCI (vfio through sysfs), guests
(libvirt), Kubernetes (the API server), the GPU (nvidia-smi's reset), Slurm (scontrol), the
BMC (power), and the simulator's, which does them all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpuconsole.actions.plan import Layer, Step

__all__ = ["ClusterDriver", "Drivers", "StepDriver", "StepFailed"]


class StepFailed(Exception):
    """A step did not do what it should; the message says what happened and what to do."""


class StepDriver(Protocol):
    """Carries out steps of one layer. Both methods are idempotent: recovery may repeat them."""

    async def run(self, step: Step) -> str:
        """Do the step; returns what was done, for the journal. Raises StepFailed."""
        ...

    async def undo(self, step: Step) -> str:
        """Put back what the step changed (nothing, if it changed nothing)."""
        ...


class ClusterDriver(StepDriver, Protocol):
    """The Kubernetes layer, which also says which GPUs are cordoned (for planning)."""

    async def cordoned(self) -> frozenset[str]: ...


@dataclass
class Drivers:
    """The drivers of one node's layers; a missing one means that layer is not managed."""

    pci: StepDriver
    guests: StepDriver | None = None
    kubernetes: ClusterDriver | None = None
    gpu: StepDriver | None = None
    slurm: StepDriver | None = None
    bmc: StepDriver | None = None

    def for_layer(self, layer: Layer) -> StepDriver:
        driver = {
            Layer.PCI: self.pci,
            Layer.GUESTS: self.guests,
            Layer.KUBERNETES: self.kubernetes,
            Layer.GPU: self.gpu,
            Layer.SLURM: self.slurm,
            Layer.BMC: self.bmc,
        }[layer]
        if driver is None:
            raise StepFailed(f"no {layer.value} driver is configured for this node")
        return driver
