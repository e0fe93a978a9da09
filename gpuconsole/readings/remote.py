"""A node read through its agent: the agent's own NodeSnapshot, as it sent it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from gpuconsole.model import GpuReading, Key, NodeSnapshot
from gpuconsole.readings.base import CounterSample

# The NodeSnapshot fields a remote node supplies in place of local sources.
REMOTE_PARTS = ("nvml", "bmc", "fabric", "tenancy")


@dataclass(frozen=True, slots=True)
class RemoteReading:
    """What the remote source returns: the node as its agent sees it.

    Rates come computed by the agent (it saw every counter); the head only keeps history.
    """

    at: float
    url: str
    node: NodeSnapshot
    summary: bool = False  # the agent sent the fleet-view summary, not every detail

    def counters(self) -> Iterator[CounterSample]:
        return iter(())

    def series(self) -> Iterator[tuple[Key, float]]:
        for part in REMOTE_PARTS:
            reading = getattr(self.node, part)
            if reading is not None:
                yield from reading.series()


def _summary_gpu(gpu: GpuReading) -> GpuReading:
    return dataclasses.replace(
        gpu,
        nvlinks=(),
        processes=(),
        unsupported=(),
        gpm=dataclasses.replace(gpu.gpm, pcie_tx_bytes_per_s=None, pcie_rx_bytes_per_s=None)
        if gpu.gpm is not None
        else None,
        mig_instances=tuple(dataclasses.replace(m, gpm=None) for m in gpu.mig_instances),
    )


def summarize(node: NodeSnapshot) -> NodeSnapshot:
    """What the fleet view needs of a node, small enough for a thousand nodes a second.

    Per-link NVLink readings, process lists, the topology matrix and per-counter rates
    are left out; the drill-down into one node asks its agent for everything.
    """
    nvml = node.nvml
    if nvml is not None:
        nvml = dataclasses.replace(
            nvml, gpus=tuple(_summary_gpu(g) for g in nvml.gpus), gpu_topology=()
        )
    rates: dict[Key, float] = {k: v for k, v in node.rates.items() if len(k) == 3}
    return dataclasses.replace(node, nvml=nvml, rates=rates, history=None)
