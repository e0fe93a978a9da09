"""NVIDIA's XID catalog for Ampere and newer, as data: what each XID means and what to do.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog"
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and its spreadsheet
Xid-Catalog.xlsx: per code its mnemonic, which of A100/H100/B100/GB200 it applies to, the
resolution bucket for the immediate action and the investigatory action. Mnemonics and
immediate buckets as NVIDIA's NVSentinel ships them from that catalog
(xiderrorsmapping.csv); the product columns and investigatory buckets as two published
transcriptions of the spreadsheet give them. Only the codes a datacenter GPU raises are
carried; any other is shown by number and judged "watch", and so is one the catalog lists for
other GPUs only. An empty investigatory column was not recorded here.
"""

from __future__ import annotations

import enum

import msgspec

from gpuconsole.readings.base import Severity


class Bucket(enum.StrEnum):
    """The catalog's resolution buckets (immediate action)."""

    IGNORE = "IGNORE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"  # reboot the bare-metal node
    RESTART_VM = "RESTART_VM"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    UPDATE_SWFW = "UPDATE_SWFW"
    CHECK_UVM = "CHECK_UVM"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"  # solo: restart Fabric Manager; else follow the other
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"  # solo: reset the GPU; with 63/64: drain and reset
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"  # reset the GPU or reboot; decode the link
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    XID_154 = "XID_154"  # follow the driver's recovery action


ALL = ("A100", "H100", "B100", "GB200")
HOPPER_AND_AMPERE = ("A100", "H100")
BLACKWELL = ("B100", "GB200")


class XidEntry(msgspec.Struct, frozen=True):
    """One row of the catalog."""

    code: int
    mnemonic: str
    words: str  # what it means, in an operator's words
    applies_to: tuple[str, ...]
    immediate: Bucket
    investigatory: str = ""

    def applies(self, product: str | None) -> bool:
        """Whether the catalog lists this XID for a GPU of `product` (`catalog_product`); an
        unknown product is given the benefit of the doubt."""
        return product is None or product in self.applies_to

    @property
    def reset_clears(self) -> bool:
        """Whether a reset of the GPU (or a reboot, which it stands in for) is the recovery
        the catalog names for it: not for what asks a person to act (support, the
        mechanicals, the software)."""
        return self.immediate not in _PERSON

    @property
    def severity(self) -> Severity:
        """How much it should worry an operator: by the immediate bucket."""
        if self.immediate is Bucket.IGNORE:
            return Severity.INFO
        if self.immediate in _MILD:
            return Severity.WARNING
        return Severity.CRITICAL


_MILD = frozenset(
    {
        Bucket.RESTART_APP,
        Bucket.UPDATE_SWFW,
        Bucket.CHECK_UVM,
        Bucket.WORKFLOW_XID_45,
        Bucket.XID_154,
    }
)

_PERSON = frozenset({Bucket.CONTACT_SUPPORT, Bucket.CHECK_MECHANICALS, Bucket.UPDATE_SWFW})

B = Bucket
# (code, mnemonic, words, applies to, immediate, investigatory)
_ROWS: tuple[tuple[int, str, str, tuple[str, ...], Bucket, str], ...] = (
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", ALL,
     B.RESTART_APP, "CONTACT_SUPPORT"),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception (application fault)", ALL,
     B.RESTART_APP, "WORKFLOW_XID_13"),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (application fault)",
     ALL, B.RESTART_APP, "WORKFLOW_XID_31"),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "invalid or corrupted push buffer stream", ALL,
     B.RESTART_APP, "CHECK_APP/CUDA"),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (application "
     "killed)", ALL, B.IGNORE, "IGNORE"),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "preemptive cleanup after a prior error", ALL,
     B.WORKFLOW_XID_45, "WORKFLOW_XID_45"),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing (timeout)", ALL,
     B.RESET_GPU, "CONTACT_SUPPORT"),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "double-bit ECC error", ALL, B.WORKFLOW_XID_48,
     "WORKFLOW_XID_48"),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "clocks reduced for power: check the power "
     "supply", ALL, B.CHECK_MECHANICALS, "CONTACT_SUPPORT"),
    (61, "PMU_BREAKPOINT", "internal micro-controller breakpoint", ALL, B.CONTACT_SUPPORT, ""),
    (62, "PMU_HALT_ERROR", "internal micro-controller halt", ALL, B.RESET_GPU,
     "CONTACT_SUPPORT"),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "ECC page retirement or row remap recorded", ALL,
     B.IGNORE, "IGNORE"),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "ECC page retirement or row remap failed", ALL,
     B.RESET_GPU, "CONTACT_SUPPORT"),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "video decoder exception", ALL, B.RESTART_APP,
     "CONTACT_SUPPORT"),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "graphics engine class error", ALL,
     B.RESTART_APP, "CHECK_APP/CUDA"),
    (74, "NVLINK_ERROR", "NVLink error", HOPPER_AND_AMPERE, B.WORKFLOW_NVLINK_ERR,
     "WORKFLOW_NVLINK_ERR"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", ALL,
     B.RESTART_BM, "CONTACT_SUPPORT"),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "push buffer CRC mismatch", HOPPER_AND_AMPERE,
     B.RESTART_APP, "CHECK_APP/CUDA"),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "high single-bit ECC error rate", ALL, B.IGNORE,
     "CONTACT_SUPPORT"),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "contained ECC error (application affected)", ALL,
     B.RESTART_APP, "IGNORE (sympathetic)"),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "uncontained ECC error (GPU reset required)", ALL,
     B.RESET_GPU, "IGNORE (sympathetic)"),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout", ALL, B.RESET_GPU,
     "CONTACT_SUPPORT"),
    (110, "SEC_FAULT_ERROR", "security fault", ALL, B.RESET_GPU, "INVESTIGATE_SW"),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC timeout", ALL, B.RESET_GPU, "INVESTIGATE_SW"),
    (120, "GSP_ERROR", "GSP error", ALL, B.RESET_GPU, "INVESTIGATE_SW"),
    (121, "C2C_ERROR", "chip-to-chip link error", ("GB200",), B.IGNORE, "CONTACT_SUPPORT"),
    (136, "ALI_TRAINING_FAIL", "NVLink training failed", ("H100",), B.RESET_GPU,
     "INVESTIGATE_LINK_SI"),
    (137, "NVLINK_FLA_PRIV_ERR", "NVLink fabric address error", ALL, B.IGNORE, ""),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC unrecovered error", ALL, B.RESET_GPU,
     "CONTACT_SUPPORT"),
    (143, "GPU_INIT_ERROR", "GPU initialization error", ALL, B.RESET_GPU, "CONTACT_SUPPORT"),
    (144, "NVLINK_SAW_ERROR", "NVLink error (SAW)", BLACKWELL, B.WORKFLOW_NVLINK5_ERR,
     "WORKFLOW_NVLINK5_ERR"),
    (145, "NVLINK_RLW_ERROR", "NVLink error (RLW)", BLACKWELL, B.WORKFLOW_NVLINK5_ERR,
     "WORKFLOW_NVLINK5_ERR"),
    (146, "NVLINK_TLW_ERROR", "NVLink error (TLW)", BLACKWELL, B.WORKFLOW_NVLINK5_ERR,
     "WORKFLOW_NVLINK5_ERR"),
    (147, "NVLINK_TREX_ERROR", "NVLink error (TREX)", BLACKWELL, B.WORKFLOW_NVLINK5_ERR,
     "WORKFLOW_NVLINK5_ERR"),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink error (NVLPW control)", BLACKWELL,
     B.WORKFLOW_NVLINK5_ERR, "WORKFLOW_NVLINK5_ERR"),
    (149, "NVLINK_NETIR_ERROR", "NVLink error (NETIR)", BLACKWELL, B.WORKFLOW_NVLINK5_ERR,
     "WORKFLOW_NVLINK5_ERR"),
    (150, "NVLINK_MSE_ERROR", "NVLink error (MSE)", BLACKWELL, B.WORKFLOW_NVLINK5_ERR,
     "WORKFLOW_NVLINK5_ERR"),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "confidential-computing key rotation error",
     ALL, B.RESTART_VM, ""),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "the driver's recovery action changed", ALL,
     B.XID_154, ""),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error", ALL, B.RESET_GPU, ""),
    (156, "RESOURCE_RETIREMENT_EVENT", "resource retirement event", ALL, B.RESET_GPU, ""),
    (157, "RESOURCE_RETIREMENT_FAILURE", "resource retirement failure", ALL, B.IGNORE, ""),
    (158, "GPU_FATAL_TIMEOUT", "GPU fatal timeout", ALL, B.RESET_GPU, ""),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI non-data error", ALL, B.CHECK_UVM, ""),
    (160, "CHANNEL_RETIREMENT_EVENT", "channel retirement event", ALL, B.RESTART_BM, ""),
)  # fmt: skip

XID_CATALOG: dict[int, XidEntry] = {row[0]: XidEntry(*row) for row in _ROWS}


def catalog_product(architecture: str | None, name: str | None = None) -> str | None:
    """The catalog's product column a GPU falls in, by its architecture as NVML names it:
    the A100's for Ampere, the H100's for Hopper, the B100's or the GB200's for Blackwell
    (each column read as its generation's, PCIe boards included: inference). None where the
    catalog has no column for it (before Ampere, Ada) or the architecture is not known."""
    if architecture == "ampere":
        return "A100"
    if architecture == "hopper":
        return "H100"
    if architecture == "blackwell":
        return "GB200" if name and "GB200" in name.upper() else "B100"
    return None


def xid_entry(code: int) -> XidEntry | None:
    """The catalog's row for an XID; None for a code it does not carry."""
    return XID_CATALOG.get(code)


def reset_clears(code: int) -> bool:
    """Whether a GPU's reset (or a reboot) clears an XID it raised; one the catalog does not
    carry is taken as cleared, as it was before the catalog."""
    entry = XID_CATALOG.get(code)
    return entry is None or entry.reset_clears


def describe_xid(code: int) -> tuple[Severity, str]:
    """Severity and a short explanation of an XID, for an event's message."""
    entry = XID_CATALOG.get(code)
    if entry is None:
        return Severity.WARNING, "see NVIDIA's XID catalog"
    return entry.severity, entry.words
