"""MIG layout and GPM sampling: the instances a GPU is split into (read each inventory
round) and the GPM figures of the GPU and each instance (a new sample every detail poll,
measured against the one before)."""

from __future__ import annotations

import logging
import math
from typing import Any

from gpuconsole.readings.nvml import GpmMetrics, MigInstance
from gpuconsole.sources.nvml.lib import GPU_IS_LOST, OK, GpuLostError, call, text
from gpuconsole.sources.nvml.state import GpuRecord, MigRecord

log = logging.getLogger(__name__)

# GPM metric ids and where they land
GPM_METRICS: tuple[tuple[int, str, float], ...] = (
    (1, "graphics_util_pct", 1.0),
    (2, "sm_util_pct", 1.0),
    (3, "sm_occupancy_pct", 1.0),
    (5, "tensor_util_pct", 1.0),
    (11, "fp64_util_pct", 1.0),
    (12, "fp32_util_pct", 1.0),
    (13, "fp16_util_pct", 1.0),
    (10, "dram_bw_util_pct", 1.0),
    (20, "pcie_tx_bytes_per_s", 1024.0 * 1024.0),
    (21, "pcie_rx_bytes_per_s", 1024.0 * 1024.0),
    (61, "nvlink_tx_bytes_per_s", 1024.0 * 1024.0),
    (60, "nvlink_rx_bytes_per_s", 1024.0 * 1024.0),
)

# NVML_GPU_INSTANCE_PROFILE_COUNT in nvidia-ml-py 13.615; a library shaped like pynvml
# that names its own count is asked for that many instead.
MIG_PROFILE_INDEXES = 0x12


# --- MIG -------------------------------------------------------------------------------


def read_mig(lib: Any, gpu: GpuRecord) -> None:
    """MIG mode and the instances that exist now; known ones are kept with their samples."""
    h = gpu.handle
    mode = call(lib, gpu, "mig_mode", lib.nvmlDeviceGetMigMode, h)
    if mode is None:
        gpu.mig_enabled = gpu.mig_pending = None
        _drop_migs(lib, gpu)
        return
    enabled = bool(mode[0])
    if gpu.mig_enabled is not None and enabled != gpu.mig_enabled:
        # Utilization and per-process figures come and go with MIG mode.
        gpu.unsupported -= {"utilization", "processes"}
    gpu.mig_enabled, gpu.mig_pending = enabled, bool(mode[1])
    if not gpu.mig_enabled:
        _drop_migs(lib, gpu)
        return
    known = {m.uuid: m for m in gpu.migs}
    migs: list[MigRecord] = []
    count = call(lib, gpu, "mig_max", lib.nvmlDeviceGetMaxMigDeviceCount, h) or 0
    for slot in range(count):
        try:
            mh = lib.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) == GPU_IS_LOST:
                raise GpuLostError(str(exc)) from None
            continue  # NOT_FOUND: an empty slot
        uuid = call(lib, gpu, f"mig_uuid {slot}", lib.nvmlDeviceGetUUID, mh)
        if uuid is None:
            continue  # noted on the GPU; asked again next round
        uuid = text(uuid)
        if uuid in known:
            migs.append(known[uuid])
            continue
        mig = _identify_mig(lib, gpu, mh, uuid, slot)
        if mig is not None:
            migs.append(mig)
    for gone in set(known) - {m.uuid for m in migs}:
        free_gpm(lib, known[gone])
    gpu.migs = migs


def _drop_migs(lib: Any, gpu: GpuRecord) -> None:
    for mig in gpu.migs:
        free_gpm(lib, mig)
    gpu.migs = []


def _identify_mig(lib: Any, gpu: GpuRecord, mh: Any, uuid: str, slot: int) -> MigRecord | None:
    """A new MIG device; None while NVML does not say which GPU instance it is (GPM, owners
    and processes all go by that id). What NVML remembers of one slot's answers is that slot's:
    one MIG device that fails costs only itself."""
    gi = call(lib, gpu, f"mig_gi {slot}", lib.nvmlDeviceGetGpuInstanceId, mh)
    if gi is None:
        return None
    ci = call(lib, gpu, f"mig_ci {slot}", lib.nvmlDeviceGetComputeInstanceId, mh)
    attrs = call(lib, gpu, f"mig_attributes {slot}", lib.nvmlDeviceGetAttributes, mh)
    slices = int(attrs.gpuInstanceSliceCount) if attrs is not None else 0
    mem_mb = int(attrs.memorySizeMB) if attrs is not None else None
    name, start = None, None
    instance = call(lib, gpu, "gi_by_id", lib.nvmlDeviceGetGpuInstanceById, gpu.handle, gi)
    if instance is not None:
        info = call(lib, gpu, "gi_info", lib.nvmlGpuInstanceGetInfo, instance)
        if info is not None:
            start = int(info.placement.start)
            name = _profile_names(lib, gpu).get(int(info.profileId))
    if name is None:
        # Only root may open the GPU instance; the MIG device's own name carries the profile
        # ("NVIDIA H100 80GB HBM3 MIG 3g.40gb").
        device_name = call(lib, gpu, f"mig_name {slot}", lib.nvmlDeviceGetName, mh)
        name = text(device_name).partition(" MIG ")[2] if device_name is not None else None
    if not name:
        name = f"{slices}g.{round((mem_mb or 0) / 1024)}gb"
    return MigRecord(
        handle=mh,
        gpu_instance_id=int(gi),
        compute_instance_id=ci,
        uuid=uuid,
        profile_name=name,
        slice_count=slices,
        sm_count=int(attrs.multiprocessorCount) if attrs is not None else 0,
        mem_total_bytes=mem_mb * 1024 * 1024 if mem_mb is not None else None,
        placement_start=start,
    )


def _profile_names(lib: Any, gpu: GpuRecord) -> dict[int, str]:
    """Profile id (as nvmlGpuInstanceGetInfo reports it) to name, e.g. 9 -> "3g.40gb".

    NVML's profile-info call takes the profile *index*, so walk the indexes once.
    """
    if gpu.mig_profile_names is None:
        names: dict[int, str] = {}
        count = getattr(lib, "NVML_GPU_INSTANCE_PROFILE_COUNT", MIG_PROFILE_INDEXES)
        for index in range(count):
            try:
                info = lib.nvmlDeviceGetGpuInstanceProfileInfo(gpu.handle, index)
            except lib.NVMLError:
                continue
            names[int(info.id)] = text(info.name).removeprefix("MIG ")
        gpu.mig_profile_names = names
    return gpu.mig_profile_names


def read_mig_memory(lib: Any, gpu: GpuRecord) -> None:
    for mig in gpu.migs:
        key = f"mig_memory {mig.gpu_instance_id}"
        mem = call(lib, gpu, key, lib.nvmlDeviceGetMemoryInfo, mig.handle)
        mig.mem_used_bytes = int(mem.used) if mem is not None else None


def mig_readings(gpu: GpuRecord) -> tuple[MigInstance, ...]:
    return tuple(
        MigInstance(
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
            uuid=m.uuid,
            profile_name=m.profile_name,
            slice_count=m.slice_count,
            sm_count=m.sm_count,
            mem_total_bytes=m.mem_total_bytes,
            mem_used_bytes=m.mem_used_bytes,
            placement_start=m.placement_start,
            gpm=m.gpm,
        )
        for m in gpu.migs
    )


# --- GPM -------------------------------------------------------------------------------


def read_gpm(lib: Any, gpu: GpuRecord) -> None:
    """GPM for the GPU and each MIG instance: one new sample each, against the last."""
    gpu.gpm = _gpm_step(lib, gpu, gpu, None)
    for mig in gpu.migs:
        mig.gpm = _gpm_step(lib, gpu, mig, mig.gpu_instance_id)


def _gpm_step(
    lib: Any, gpu: GpuRecord, holder: GpuRecord | MigRecord, instance: int | None
) -> GpmMetrics | None:
    if holder.gpm_sample is None:
        first = call(lib, gpu, "gpm_alloc", lib.nvmlGpmSampleAlloc)
        second = call(lib, gpu, "gpm_alloc", lib.nvmlGpmSampleAlloc) if first is not None else None
        holder.gpm_sample, holder.gpm_spare = first, second
        if second is None:
            free_gpm(lib, holder)
            if instance is None:
                gpu.gpm_supported = False
            return None
        _gpm_sample(lib, gpu, instance, holder.gpm_sample)  # the interval starts here
        return None
    if not _gpm_sample(lib, gpu, instance, holder.gpm_spare):
        return holder.gpm
    metrics = _gpm_metrics(lib, gpu, instance, holder.gpm_sample, holder.gpm_spare)
    holder.gpm_sample, holder.gpm_spare = holder.gpm_spare, holder.gpm_sample
    return metrics


def free_gpm(lib: Any, holder: GpuRecord | MigRecord) -> None:
    """Give a holder's two GPM sample buffers back to NVML (they are malloc'd there)."""
    for sample in (holder.gpm_sample, holder.gpm_spare):
        if sample is not None:
            try:
                lib.nvmlGpmSampleFree(sample)
            except lib.NVMLError as exc:
                log.debug("GPM sample free: %s", exc)
    holder.gpm_sample = holder.gpm_spare = None
    holder.gpm = None


# What one GPU instance answers is its own: its NotSupported leaves the GPU's GPM and its
# siblings' alone, so each instance's calls are remembered under keys of their own.


def _gpm_sample(lib: Any, gpu: GpuRecord, instance: int | None, sample: Any) -> bool:
    if instance is None:
        got = call(lib, gpu, "gpm_sample", lib.nvmlGpmSampleGet, gpu.handle, sample)
    else:
        key = f"gpm_mig_sample {instance}"
        got = call(lib, gpu, key, lib.nvmlGpmMigSampleGet, gpu.handle, instance, sample)
    return got is not None


def _gpm_metrics(
    lib: Any, gpu: GpuRecord, instance: int | None, first: Any, second: Any
) -> GpmMetrics | None:
    request = lib.c_nvmlGpmMetricsGet_t()
    request.version = lib.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_METRICS)
    request.sample1 = first
    request.sample2 = second
    for i, (metric_id, _name, _scale) in enumerate(GPM_METRICS):
        request.metrics[i].metricId = metric_id
    key = "gpm_metrics" if instance is None else f"gpm_mig_metrics {instance}"
    result = call(lib, gpu, key, lib.nvmlGpmMetricsGet, request)
    if result is None:
        return None
    values: dict[str, float] = {}
    for i, (_metric_id, name, scale) in enumerate(GPM_METRICS):
        metric = result.metrics[i]
        value = float(metric.value)
        # NaN (a rate over an empty interval) or infinity is no figure at all
        if metric.nvmlReturn == OK and math.isfinite(value):
            values[name] = value * scale
    return GpmMetrics(**values) if values else None
