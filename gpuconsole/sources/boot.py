"""This boot of the machine: the kernel's boot id (a new one at every boot) and when it booted.

What tells a restart of gpuconsole from a reboot of the node: the action journal escalates a
repair by it, the NVML source keeps a GPU's XIDs across a restart and lets a reboot clear them.
"""

from __future__ import annotations

import os


def boot_id(proc_root: str = "/proc") -> str:
    """The kernel's boot id, a new one at every boot of the node; '' where unreadable."""
    try:
        with open(os.path.join(proc_root, "sys", "kernel", "random", "boot_id"), "rb") as f:
            return f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return ""


def boot(proc_root: str = "/proc") -> tuple[str, float | None]:
    """This boot of the node: its boot id and the time it booted (/proc/stat btime); None
    for a time unreadable."""
    booted: float | None = None
    try:
        with open(os.path.join(proc_root, "stat"), "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    booted = float(line.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        booted = None
    return boot_id(proc_root), booted
