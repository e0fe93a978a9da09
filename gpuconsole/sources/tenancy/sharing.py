"""What ties a shared GPU's processes to their pods, and the limits each sharer runs under.

Several pods on one GPU (time-slicing or MPS replicas, HAMi vGPUs) look alike to NVML and to
the pod-resources API, which names pods but not their UIDs, while a process's cgroup gives
only its pod's UID. The kubelet's device manager checkpoint
(/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint, JSON, root-readable) holds
both: each entry is a pod UID, container, resource and the device IDs it was given.

A sharer's limits are in its processes' environment, set by whoever shares the GPU out:
HAMi's vGPU library reads CUDA_DEVICE_MEMORY_LIMIT[_<i>] ("3000m") and CUDA_DEVICE_SM_LIMIT
(percent); an MPS client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=2G,1=4G") and
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpuconsole.readings.tenancy import ShareLimits

__all__ = ["CheckpointError", "checkpoint_pods", "share_limits"]

# A checkpoint holds one entry per container and resource: a node's is a few hundred KiB
# at most; a bigger file is not the kubelet's.
MAX_CHECKPOINT_BYTES = 16 * 1024 * 1024
_UID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_SIZE = re.compile(r"([0-9]{1,15})\s*([kmgt]?)i?b?", re.ASCII | re.IGNORECASE)
_PERCENT = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,6})?", re.ASCII)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class CheckpointError(Exception):
    """The checkpoint cannot be used: unreadable, not JSON, or not the kubelet's shape."""


def checkpoint_pods(data: bytes) -> dict[tuple[str, str], str]:
    """(resource, device ID) -> pod UID, from the device manager checkpoint's bytes."""
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"larger than {MAX_CHECKPOINT_BYTES >> 20} MiB")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"not JSON ({exc})") from None
    body = doc.get("Data") if isinstance(doc, dict) else None
    entries = body.get("PodDeviceEntries") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        raise CheckpointError("no Data.PodDeviceEntries list")
    out: dict[tuple[str, str], str] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        uid, resource = entry.get("PodUID"), entry.get("ResourceName")
        if not isinstance(uid, str) or not _UID.fullmatch(uid) or not isinstance(resource, str):
            continue
        for device_id in _device_ids(entry.get("DeviceIDs")):
            out[(resource, device_id)] = uid.lower()
    return out


def _device_ids(value: Any) -> list[str]:
    """DeviceIDs: by NUMA node ({"0": [...], "-1": [...]}) since Kubernetes 1.20, a plain
    list before."""
    if isinstance(value, dict):
        lists = list(value.values())
    elif isinstance(value, list):
        lists = [value]
    else:
        return []
    return [i for ids in lists if isinstance(ids, list) for i in ids if isinstance(i, str)]


def _size(text: str) -> int | None:
    m = _SIZE.fullmatch(text.strip())
    if not m:
        return None
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _percent(text: str) -> float | None:
    text = text.strip()
    if not _PERCENT.fullmatch(text):
        return None
    value = float(text)
    return value if 0 < value <= 100 else None


def _mps_memory(text: str) -> int | None:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: "0=2G,1=4G" (per device ordinal) or one size; the
    client's first device's, which is its GPU where one is visible to it."""
    first = text.split(",", 1)[0]
    _, _, value = first.rpartition("=")
    return _size(value)


def share_limits(env: Mapping[str, str]) -> ShareLimits | None:
    """A process's sharing limits from its environment; None when it runs under none."""
    hami_mem = env.get("CUDA_DEVICE_MEMORY_LIMIT_0") or env.get("CUDA_DEVICE_MEMORY_LIMIT")
    hami_sm = env.get("CUDA_DEVICE_SM_LIMIT")
    if hami_mem is not None or hami_sm is not None:
        limits = ShareLimits(
            _size(hami_mem) if hami_mem else None,
            _percent(hami_sm) if hami_sm else None,
            "hami",
        )
    else:
        mps_mem = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
        mps_sm = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        if mps_mem is None and mps_sm is None:
            return None
        limits = ShareLimits(
            _mps_memory(mps_mem) if mps_mem else None,
            _percent(mps_sm) if mps_sm else None,
            "mps",
        )
    return limits if limits.mem_bytes is not None or limits.sm_pct is not None else None
