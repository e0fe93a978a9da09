"""Deterministic identities for simulated GPUs, shared by the simulator and the fake NVML."""

from __future__ import annotations

import hashlib


def _digest(node: str, seed: int, index: int, what: str) -> str:
    return hashlib.sha256(f"{what}/{node}/{seed}/{index}".encode()).hexdigest()


def gpu_uuid(node: str, seed: int, index: int) -> str:
    """A UUID in NVML's form, GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = _digest(node, seed, index, "uuid")
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_serial(node: str, seed: int, index: int) -> str:
    """A 13-digit board serial, as NVML reports for datacenter GPUs."""
    return "1" + str(int(_digest(node, seed, index, "serial")[:12], 16))[:12].zfill(12)


def boot_id(node: str, seed: int, boots: int) -> str:
    """The kernel's boot id of the node's `boots`-th boot since the simulation began (a new
    one at every power cycle), as /proc/sys/kernel/random/boot_id has it."""
    h = _digest(node, seed, boots, "boot")
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def mig_uuid(node: str, seed: int, index: int, slot: int) -> str:
    """The UUID of the MIG device in MIG slot `slot` (0-based) of GPU `index`: MIG-xxxxxxxx-…."""
    return gpu_uuid(f"{node}/mig{index}", seed, slot).replace("GPU-", "MIG-")
