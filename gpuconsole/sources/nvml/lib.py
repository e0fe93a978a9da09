"""NVML itself: the library to load, its return codes and field ids, and the one call wrapper
that turns an NVML error into a value (None, a remembered NotSupported or NoPermission) or
GpuLostError.

The codes and ids are the ABI, so the same for pynvml, the fake library and the simulator.
"""

from __future__ import annotations

import ctypes
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gpuconsole.readings.base import safe_text
from gpuconsole.readings.nvml import RemoteKind
from gpuconsole.sources.base import SourceUnavailable

# nvmlReturn_t values
OK = 0
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
INSUFFICIENT_POWER = 8
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
IRQ_ISSUE = 11
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
UNSUPPORTED_CODES = (NOT_SUPPORTED, FUNCTION_NOT_FOUND)
# Why NVML counts a GPU this process cannot open (a cgroup that hides its device file, an
# unplugged power cable, a broken interrupt): the GPU is there, not lost.
OPEN_ERRORS = {
    NO_PERMISSION: "no permission to open it (device cgroup or /dev/nvidia* permissions)",
    INSUFFICIENT_POWER: "insufficient external power (check its power cables)",
    IRQ_ISSUE: "an interrupt request issue (see the kernel log)",
}
# The readings a call refused with NO_PERMISSION hides, by the call's key (its first word).
DENIED_READINGS = {
    "memory_v2": "memory",
    "memory": "memory",
    "processes": "processes",
    "gi_by_id": "mig_placement",
    "gpm_sample": "gpm",
    "gpm_mig_sample": "gpm",
}

# nvmlFieldValue ids (pynvml NVML_FI_DEV_*)
FI_ECC_SBE_VOL = 3
FI_ECC_DBE_VOL = 4
FI_ECC_SBE_AGG = 5
FI_ECC_DBE_AGG = 6
FI_PERF_POLICY_POWER = 74  # = NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
FI_PERF_POLICY_SYNC_BOOST = 76  # = NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST
# dynamic page retirement (before Ampere): pages retired for single- and double-bit errors,
# and 1 while a retirement waits for the next reset
FI_RETIRED_SBE = 29
FI_RETIRED_DBE = 30
FI_RETIRED_PENDING = 31
RETIRED_PAGE_FIELDS = (FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING)
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY = 83
FI_NVLINK_LINK_COUNT = 91
FI_PCIE_REPLAY = 94
FI_NVLINK_TX = 138
FI_NVLINK_RX = 139
FI_REMAPPED_COR = 142
FI_REMAPPED_UNC = 143
FI_REMAPPED_PENDING = 144
FI_REMAPPED_FAILURE = 145
FI_NVSWITCH_LINK_COUNT = 147  # links that reach an NVSwitch
# scoped by link: the data link's replay, recovery and CRC error counters since the driver
# loaded (NVML_FI_DEV_NVLINK_ERROR_DL_*; NotSupported on Blackwell)
FI_NVLINK_ERROR_REPLAY = 161
FI_NVLINK_ERROR_RECOVERY = 162
FI_NVLINK_ERROR_CRC = 163
NVLINK_ERROR_FIELDS = (FI_NVLINK_ERROR_REPLAY, FI_NVLINK_ERROR_RECOVERY, FI_NVLINK_ERROR_CRC)
FI_NVLINK_STATE = 165  # scoped by link: 1 active
FI_NVLINK_VERSION = 166  # scoped by link: nvmlNvlinkVersion_t
FI_POWER_INSTANT = 186
FI_POWER_LIMIT = 190  # the limit the driver enforces now (mW), as nvmlDeviceGetEnforcedPowerLimit
FI_TEMP_SLOWDOWN = 194  # as nvmlDeviceGetTemperatureThreshold(SLOWDOWN), from R535
FI_PCIE_TX_BYTES = 197  # from R560; 32 bits wide: it wraps
FI_PCIE_RX_BYTES = 198
# nvmlDeviceGpuRecoveryAction_t, the driver's own advice after a fault: from R565 only (older
# branches know no field 230, see `recovery_action_field`)
FI_RECOVERY_ACTION = 230
RECOVERY_ACTION_SINCE = (565, 0)
# Clock-event reasons the driver also counts (nanoseconds held, since driver load): these two
# in every branch; SW thermal, HW thermal and HW power brake (in this order) where
# `throttle_counters` finds them.
STABLE_THROTTLE_COUNTERS: tuple[tuple[int, str], ...] = (
    (FI_PERF_POLICY_POWER, "sw_power_cap"),
    (FI_PERF_POLICY_SYNC_BOOST, "sync_boost"),
)
MOVED_THROTTLE_COUNTERS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
BASE_FIELDS = (
    FI_POWER_INSTANT,
    FI_TOTAL_ENERGY,
    FI_MEMORY_TEMP,
    FI_ECC_SBE_VOL,
    FI_ECC_DBE_VOL,
    FI_ECC_SBE_AGG,
    FI_ECC_DBE_AGG,
    FI_REMAPPED_COR,
    FI_REMAPPED_UNC,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_FAILURE,
    FI_PCIE_REPLAY,
    FI_PCIE_TX_BYTES,
    FI_PCIE_RX_BYTES,
    FI_POWER_LIMIT,
)

# nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value
FIELD_VALUE = struct.Struct("<II16xII8s")
# nvmlValueType_t to the union member it fills
VALUE_TYPES = {
    kind: struct.Struct(fmt)
    for kind, fmt in {0: "<d", 1: "<I4x", 2: "<Q", 3: "<Q", 4: "<q", 5: "<i4x", 6: "<H6x"}.items()
}

# nvmlClocksEventReason bits, in the words the UI shows
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}
VIRTUALIZATION = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
FABRIC_COMPLETED = 3  # nvmlGpuFabricState_t
REMOTE_KINDS = {0: RemoteKind.GPU, 1: RemoteKind.IBMNPU, 2: RemoteKind.NVSWITCH}
TOPO_CODES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
PCIE_UTIL_TX, PCIE_UTIL_RX = 0, 1  # nvmlPcieUtilCounter_t
NA_ID = 0xFFFFFFFF  # a process's GPU or compute instance where it has none
# nvmlNvlinkVersion_t (what nvmlDeviceGetNvLinkVersion answers) to the NVLink generation:
# 1.0, 2.0, 2.2, 3.0, 3.1, 4.0, 5.0.
NVLINK_GENERATIONS = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5}

_VERSION = re.compile(r"\s*(\d+)(?:\.(\d+))?")


def driver_release(version: str | None) -> tuple[int, int] | None:
    """ "580.82.07" -> (580, 82); None when the driver did not say or said something else."""
    m = _VERSION.match(version or "")
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def throttle_counters(driver_version: str | None) -> tuple[tuple[int, str], ...]:
    """The clock-event time counters a driver keeps, as (field id, reason).

    Fields 74 and 76 hold in every branch. The SW-thermal, HW-thermal and HW-power-brake
    counters do not exist up to 570; on 575 and 580 before 580.82 they are 251-253 (269-271 there
    are power-smoothing settings, whose change must not read as time held); from 580.82 they
    are 269-271. A driver that does not say its version gets the stable two only.
    """
    release = driver_release(driver_version)
    if release is None or release < (575, 0):
        return STABLE_THROTTLE_COUNTERS
    first = 251 if release < (580, 82) else 269
    moved = tuple((first + k, reason) for k, reason in enumerate(MOVED_THROTTLE_COUNTERS))
    return STABLE_THROTTLE_COUNTERS + moved


def recovery_action_field(driver_version: str | None) -> int | None:
    """The field that holds the driver's recovery action, where its branch has one (R565 on):
    asked of an older driver it would only be NotSupported, listed on every GPU."""
    release = driver_release(driver_version)
    return FI_RECOVERY_ACTION if release is not None and release >= RECOVERY_ACTION_SINCE else None


def counter_bits(value_type: int) -> int:
    """Width of a field value's counter from its nvmlValueType_t: 32 for the (unsigned) int."""
    return {1: 32, 5: 32, 6: 16}.get(value_type, 64)


class GpuLostError(Exception):
    """NVML said GPU_IS_LOST for this GPU."""


class _NeverRaised(Exception):
    """Stands in for pynvml's NVMLLibraryMismatchError in a library that has none."""


def load_pynvml(library: str) -> Any:
    """pynvml bound to a particular libnvidia-ml.so (instead of the system's)."""
    import pynvml

    try:
        pynvml.nvmlLib = ctypes.CDLL(library)
    except OSError as exc:
        raise SourceUnavailable(f"NVML library {library} cannot be loaded: {exc}") from None
    return pynvml


def system_pynvml() -> Any:
    """pynvml as installed, on the system's libnvidia-ml.so."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - it is a dependency
        raise SourceUnavailable("nvidia-ml-py is not installed") from exc
    return pynvml


# Processes one call has room for: most GPUs run a few, so one trip into the driver answers
# (pynvml's wrapper asks the count first, then the list: two).
PROCESS_SLOTS = 64
NOT_AVAILABLE_U64 = 0xFFFFFFFFFFFFFFFF


def running_processes(lib: Any, handle: Any) -> list[Any]:
    """The compute processes on a GPU (or MIG device), in one NVML call where `lib` is pynvml;
    a library shaped like it (the simulator) through its own call."""
    pointer = getattr(lib, "_nvmlGetFunctionPointer", None)
    info = getattr(lib, "c_nvmlProcessInfo_v3_t", None)
    if pointer is None or info is None:
        return list(lib.nvmlDeviceGetComputeRunningProcesses(handle))
    fn = pointer("nvmlDeviceGetComputeRunningProcesses_v3")
    slots = PROCESS_SLOTS
    for _ in range(4):  # the list grew between two calls: ask again with more room
        count = ctypes.c_uint(slots)
        found = (info * slots)()
        ret = fn(handle, ctypes.byref(count), found)
        if ret == INSUFFICIENT_SIZE:
            slots = count.value * 2 + 5
            continue
        if ret != OK:
            raise lib.NVMLError(ret)
        return list(found[: count.value])
    raise lib.NVMLError(INSUFFICIENT_SIZE)


def field_values(lib: Any, handle: Any, asked: Sequence[int | tuple[int, int]]) -> Any:
    """nvmlDeviceGetFieldValues of `asked` (field ids, or (field id, scope id) pairs): the
    array of nvmlFieldValue_t the driver filled. Where `lib` is pynvml the array is packed in
    one go: its wrapper sets each id through a Python attribute hook, with a TypeError raised
    and caught per plain id, several times the cost of the trip into the driver."""
    pointer = getattr(lib, "_nvmlGetFunctionPointer", None)
    entry = getattr(lib, "c_nvmlFieldValue_t", None)
    if pointer is None or entry is None:  # a library shaped like pynvml (the simulator)
        return lib.nvmlDeviceGetFieldValues(handle, list(asked))
    fn = pointer("nvmlDeviceGetFieldValues")
    ids = [f if isinstance(f, tuple) else (f, 0) for f in asked]
    values = (entry * len(ids)).from_buffer_copy(
        b"".join([FIELD_VALUE.pack(field, scope, 0, 0, b"") for field, scope in ids])
    )
    ret = fn(handle, ctypes.c_int32(len(ids)), ctypes.byref(values))
    if ret != OK:
        raise lib.NVMLError(ret)
    return values


def text(value: Any) -> str:
    """An NVML string (bytes from older pynvml), or an NVML error's words, as str safe to
    show: every string the driver gives passes here."""
    return safe_text(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))


class Answers(Protocol):
    """What `call` remembers of one GPU's answers."""

    unsupported: set[str]
    denied: set[str]
    reprobe: set[str]
    errors: list[str]


def denied_readings(keys: set[str]) -> tuple[str, ...]:
    """The readings the calls NVML refused (NO_PERMISSION) leave out, in the readings' words."""
    return tuple(sorted({DENIED_READINGS.get(k.split()[0], k) for k in keys}))


def call(
    lib: Any, gpu: Answers, key: str, fn: Callable[..., Any] | None, *args: Any, **kwargs: Any
) -> Any:
    """Call NVML for one GPU; NotSupported and NoPermission are remembered (and asked once
    more after each inventory round), another error is noted on the GPU, GPU_IS_LOST raises."""
    if key in gpu.unsupported or key in gpu.denied:
        if key not in gpu.reprobe:
            return None
        gpu.reprobe.discard(key)
        gpu.unsupported.discard(key)  # added again below if still NotSupported
        gpu.denied.discard(key)
    if fn is None:
        gpu.unsupported.add(key)
        return None
    try:
        return fn(*args, **kwargs)
    except lib.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code in UNSUPPORTED_CODES:
            gpu.unsupported.add(key)
            return None
        if code == NO_PERMISSION:  # this user may not see it: the GPU is fine
            gpu.denied.add(key)
            return None
        if code == GPU_IS_LOST:
            raise GpuLostError(str(exc)) from None
        gpu.errors.append(f"{key}: {text(exc)}")
        return None
    except getattr(lib, "NVMLLibraryMismatchError", _NeverRaised):
        # pynvml's unversioned wrappers raise it (not an NVMLError) where the driver lacks
        # the versioned symbol they call: the call is not there, as with FUNCTION_NOT_FOUND
        gpu.unsupported.add(key)
        return None
