"""What an XID number means to an operator, and how bad it is."""

from __future__ import annotations

from gpuconsole.readings.base import Severity

# From NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors); only the ones an
# operator of a datacenter GPU meets often. Anything else is shown by number.
XIDS: dict[int, tuple[Severity, str]] = {
    13: (Severity.WARNING, "graphics engine exception (application fault)"),
    31: (Severity.WARNING, "GPU memory page fault (application fault)"),
    43: (Severity.INFO, "GPU stopped processing (application killed)"),
    45: (Severity.INFO, "preemptive cleanup after a prior error"),
    48: (Severity.CRITICAL, "double-bit ECC error"),
    61: (Severity.CRITICAL, "internal micro-controller breakpoint"),
    62: (Severity.CRITICAL, "internal micro-controller halt"),
    63: (Severity.WARNING, "ECC page retirement or row remap recorded"),
    64: (Severity.CRITICAL, "ECC page retirement or row remap failed"),
    74: (Severity.CRITICAL, "NVLink error"),
    79: (Severity.CRITICAL, "GPU has fallen off the bus"),
    92: (Severity.WARNING, "high single-bit ECC error rate"),
    94: (Severity.WARNING, "contained ECC error (application affected)"),
    95: (Severity.CRITICAL, "uncontained ECC error (GPU reset required)"),
    119: (Severity.CRITICAL, "GSP RPC timeout"),
    120: (Severity.CRITICAL, "GSP error"),
    140: (Severity.CRITICAL, "ECC unrecovered error"),
}


def describe_xid(xid: int) -> tuple[Severity, str]:
    """Severity and a short explanation of an XID."""
    return XIDS.get(xid, (Severity.WARNING, "see NVIDIA's XID catalogue"))
