"""Prometheus metrics rendered from the latest snapshot; a scrape never touches hardware.

The exposition text is rendered once per snapshot and reused by every scrape until the
hub publishes the next one, so scrape cost does not grow with scrape rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gpuconsole.export import names as n
from gpuconsole.model import FleetSnapshot, GpuReading, NodeSnapshot, gpu_health
from gpuconsole.sources.nvml import THROTTLE_BITS

MIB = 1024 * 1024
HEALTH_STATES = ("ok", "warning", "critical", "stale", "unknown")

Labels = tuple[str, ...]


class _Families:
    """Metric families by name, created on first use, in a stable order.

    Samples carry their own label sets: a MIG instance's sample has the GPU's labels
    plus GPU_I_PROFILE and GPU_I_ID, in the same family, as dcgm-exporter emits them.
    """

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def _family(self, name: str, doc: str, kind: str) -> Metric:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = Metric(name, doc, kind)
        return family

    def gauge(self, spec: tuple[str, str], labels: Labels, values: Labels, value: float) -> None:
        family = self._family(spec[0], spec[1], "gauge")
        family.samples.append(Sample(spec[0], dict(zip(labels, values, strict=True)), value))

    def counter(self, spec: tuple[str, str], labels: Labels, values: Labels, value: float) -> None:
        name = spec[0].removesuffix("_total")
        family = self._family(name, spec[1], "counter")
        family.samples.append(
            Sample(f"{name}_total", dict(zip(labels, values, strict=True)), value)
        )

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def _dcgm_labels(node: NodeSnapshot, gpu: GpuReading) -> Labels:
    return (str(gpu.index), gpu.uuid, f"nvidia{gpu.index}", gpu.name, node.node, gpu.pci_bus_id)


def _gpu_metrics(out: _Families, node: NodeSnapshot, gpu: GpuReading) -> None:
    labels = n.DCGM_LABELS
    values = _dcgm_labels(node, gpu)
    own, own_values = n.OWN_LABELS, (node.node, str(gpu.index), gpu.uuid)
    health = gpu_health(gpu).value
    for state in HEALTH_STATES:
        out.gauge(n.GPU_HEALTH, (*own, "state"), (*own_values, state), float(state == health))
    out.gauge(n.GPU_LOST, own, own_values, float(gpu.lost))
    out.gauge(
        n.GPU_INFO,
        (
            "node",
            "gpu",
            "uuid",
            "model",
            "pci_bus_id",
            "serial",
            "architecture",
            "numa_node",
            "module_id",
        ),
        (
            node.node,
            str(gpu.index),
            gpu.uuid,
            gpu.name,
            gpu.pci_bus_id,
            gpu.serial or "",
            gpu.architecture or "",
            "" if gpu.numa_node is None else str(gpu.numa_node),
            "" if gpu.module_id is None else str(gpu.module_id),
        ),
        1.0,
    )
    xid = node.last_xid.get(gpu.uuid)
    out.gauge(n.DCGM_XID, labels, values, float(xid or 0))
    if gpu.lost:
        return

    def put(spec: tuple[str, str], value: float | int | None, scale: float = 1.0) -> None:
        if value is not None:
            out.gauge(spec, labels, values, float(value) * scale)

    put(n.DCGM_GPU_UTIL, gpu.util_gpu_pct)
    put(n.DCGM_MEM_COPY_UTIL, gpu.util_mem_pct)
    if gpu.mem_used_bytes is not None and gpu.mem_total_bytes is not None:
        reserved = gpu.mem_reserved_bytes or 0
        put(n.DCGM_FB_USED, gpu.mem_used_bytes / MIB)
        put(n.DCGM_FB_FREE, (gpu.mem_total_bytes - gpu.mem_used_bytes - reserved) / MIB)
        put(n.DCGM_FB_RESERVED, reserved / MIB)
    put(n.DCGM_GPU_TEMP, gpu.temp_gpu_c)
    put(n.DCGM_MEMORY_TEMP, gpu.temp_hbm_c)
    put(n.DCGM_POWER_USAGE, gpu.power_w)
    put(n.DCGM_POWER_LIMIT, gpu.power_limit_w)
    put(n.DCGM_ENERGY, gpu.energy_mj_total)
    put(n.DCGM_SM_CLOCK, gpu.sm_clock_mhz)
    put(n.DCGM_MEM_CLOCK, gpu.mem_clock_mhz)
    put(n.DCGM_PSTATE, gpu.pstate)
    mask = sum(bit for bit, name in THROTTLE_BITS if name in gpu.throttle_reasons)
    put(n.DCGM_THROTTLE, mask)
    for _bit, reason in THROTTLE_BITS:
        if reason in gpu.throttle_reasons:
            out.gauge(n.GPU_THROTTLE, (*own, "reason"), (*own_values, reason), 1.0)
    pcie = gpu.pcie
    put(n.DCGM_PCIE_REPLAY, pcie.replay_count)
    put(n.DCGM_PCIE_GEN, pcie.gen_current)
    put(n.DCGM_PCIE_WIDTH, pcie.width_current)

    def own_put(spec: tuple[str, str], value: float | int | None) -> None:
        if value is not None:
            out.gauge(spec, own, own_values, float(value))

    own_put(n.GPU_PCIE_MAX_GEN, pcie.gen_max)
    own_put(n.GPU_PCIE_MAX_WIDTH, pcie.width_max)
    own_put(n.GPU_PCIE_DOWNTRAINED, float(pcie.downtrained))
    ecc = gpu.ecc
    put(n.DCGM_ECC_SBE_VOL, ecc.volatile_corrected)
    put(n.DCGM_ECC_DBE_VOL, ecc.volatile_uncorrected)
    put(n.DCGM_ECC_SBE_AGG, ecc.aggregate_corrected)
    put(n.DCGM_ECC_DBE_AGG, ecc.aggregate_uncorrected)
    put(n.DCGM_REMAP_COR, ecc.remapped_corrected)
    put(n.DCGM_REMAP_UNC, ecc.remapped_uncorrected)
    if ecc.remap_failure is not None:
        put(n.DCGM_REMAP_FAILURE, float(ecc.remap_failure))
    if ecc.remap_pending is not None:
        put(n.DCGM_REMAP_PENDING, float(ecc.remap_pending))
    if gpu.nvlinks:
        own_put(n.GPU_NVLINK_ACTIVE, gpu.nvlinks_active)
        totals = [
            (link.tx_kib_total or 0) + (link.rx_kib_total or 0)
            for link in gpu.nvlinks
            if link.tx_kib_total is not None or link.rx_kib_total is not None
        ]
        if totals:
            put(n.DCGM_NVLINK_TOTAL, sum(totals))
        link_labels = (*own, "link", "remote")
        for link in gpu.nvlinks:
            lv = (node.node, str(gpu.index), gpu.uuid, str(link.link), link.remote_kind.value)
            if link.tx_kib_total is not None:
                out.counter(n.NVLINK_TX, link_labels, lv, link.tx_kib_total * 1024.0)
            if link.rx_kib_total is not None:
                out.counter(n.NVLINK_RX, link_labels, lv, link.rx_kib_total * 1024.0)
    if gpu.gpm is not None:
        _gpm(out, labels, values, gpu.gpm)
    for mig in gpu.mig_instances:
        mig_labels = (*labels, *n.MIG_LABELS)
        mig_values = (*values, mig.profile_name, str(mig.gpu_instance_id))
        out.gauge(
            n.MIG_INFO,
            (*own, "gpu_instance", "profile", "mig_uuid", "sm_count"),
            (*own_values, str(mig.gpu_instance_id), mig.profile_name, mig.uuid, str(mig.sm_count)),
            1.0,
        )
        if mig.mem_used_bytes is not None:
            out.gauge(n.DCGM_FB_USED, mig_labels, mig_values, mig.mem_used_bytes / MIB)
        if mig.gpm is not None:
            _gpm(out, mig_labels, mig_values, mig.gpm)


def _gpm(out: _Families, labels: Labels, values: Labels, gpm: Any) -> None:
    ratios = (
        (n.PROF_GR_ENGINE, gpm.sm_util_pct),
        (n.PROF_SM_ACTIVE, gpm.sm_util_pct),
        (n.PROF_SM_OCCUPANCY, gpm.sm_occupancy_pct),
        (n.PROF_TENSOR, gpm.tensor_util_pct),
        (n.PROF_DRAM, gpm.dram_bw_util_pct),
        (n.PROF_FP64, gpm.fp64_util_pct),
        (n.PROF_FP32, gpm.fp32_util_pct),
        (n.PROF_FP16, gpm.fp16_util_pct),
    )
    for spec, pct in ratios:
        if pct is not None:
            out.gauge(spec, labels, values, pct / 100.0)
    for spec, rate in (
        (n.PROF_PCIE_TX, gpm.pcie_tx_bytes_per_s),
        (n.PROF_PCIE_RX, gpm.pcie_rx_bytes_per_s),
        (n.PROF_NVLINK_TX, gpm.nvlink_tx_bytes_per_s),
        (n.PROF_NVLINK_RX, gpm.nvlink_rx_bytes_per_s),
    ):
        if rate is not None:
            out.gauge(spec, labels, values, rate)


def _node_metrics(out: _Families, node: NodeSnapshot, now: float) -> None:
    out.gauge(n.NODE_SIMULATED, ("node",), (node.node,), float(node.simulated))
    for status in node.statuses:
        lv = (node.node, status.source)
        out.gauge(n.SOURCE_UP, ("node", "source"), lv, float(status.ok))
        stale = now - status.stale_since if status.stale_since is not None else 0.0
        out.gauge(n.SOURCE_STALE, ("node", "source"), lv, max(0.0, stale))
        if status.last_ok_at is not None:
            out.gauge(n.SOURCE_LAST_OK, ("node", "source"), lv, status.last_ok_at)
        if status.last_poll_s is not None:
            out.gauge(n.SOURCE_POLL, ("node", "source"), lv, status.last_poll_s)
    if node.nvml is None:
        return
    for gpu in node.nvml.gpus:
        _gpu_metrics(out, node, gpu)
    matrix = node.nvml.gpu_topology
    for i, row in enumerate(matrix):
        for j, code in enumerate(row):
            if i != j:
                out.gauge(
                    n.TOPOLOGY,
                    ("node", "gpu", "peer", "level"),
                    (node.node, str(i), str(j), code),
                    1.0,
                )


def families(snapshot: FleetSnapshot, now: float | None = None) -> Iterator[Metric]:
    """Every metric family for one snapshot."""
    out = _Families()
    at = time.time() if now is None else now
    out.gauge(n.SNAPSHOT_AGE, (), (), snapshot.at)
    for node in snapshot.nodes:
        _node_metrics(out, node, at)
    for node_name, kind, severity, count in snapshot.event_counts:
        out.counter(
            n.EVENTS, ("node", "kind", "severity"), (node_name, kind, severity), float(count)
        )
    return iter(out)


@dataclass
class SnapshotCollector(Collector):
    """A prometheus_client collector over whatever snapshot `latest()` returns."""

    latest: Callable[[], FleetSnapshot | None]

    def collect(self) -> Iterator[Metric]:
        snapshot = self.latest()
        if snapshot is None:
            return iter(())
        return families(snapshot)


class MetricsCache:
    """The exposition text, rendered once per snapshot."""

    def __init__(self, latest: Callable[[], FleetSnapshot | None]) -> None:
        self._collector = SnapshotCollector(latest)
        self._latest = latest
        self._seq: int | None = None
        self._body = b""

    def render(self) -> bytes:
        snapshot = self._latest()
        seq = snapshot.seq if snapshot is not None else None
        if seq != self._seq or not self._body:
            self._body = generate_latest(self._collector)  # type: ignore[arg-type]
            self._seq = seq
        return self._body
