"""NVML readings: immutable, typed, units in field names.

The NVML source returns an NvmlReading per poll; counters are stored raw and the hub
derives rates from what `counters()` yields, so wrap and reset are handled in one place.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterator
from typing import Annotated

import msgspec

from gpuconsole.readings.base import Key, RawCounter


class GpuState(enum.StrEnum):
    """Whether the GPU answers."""

    OK = "ok"
    LOST = "lost"  # fell off the bus (XID 79 / NVML_ERROR_GPU_IS_LOST)
    ERROR = "error"  # answers, but some readings failed this round
    # NVML counts it but this process cannot open it (no permission, power, interrupts)
    UNREADABLE = "unreadable"


class EccReading(msgspec.Struct, frozen=True):
    """ECC error counts and the row remapper's state."""

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None
    remapped_corrected: int | None = None
    remapped_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    # dynamic page retirement, before Ampere (row remapping replaces it; newer GPUs answer
    # NotSupported: None): pages retired for single- and double-bit errors, and whether a
    # retirement waits for the next GPU reset
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None


# How far back a GPU's PCIe replays are counted (PcieReading.replays_climbed): dcgm's PCIe
# health watch judges replays per minute.
PCIE_REPLAY_WINDOW_S = 60.0


class PcieReading(msgspec.Struct, frozen=True):
    """The GPU's host link: negotiated against maximum, and its counters."""

    gen_current: int | None = None
    gen_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None
    # Whether the GPU was at work when gen_current was read (None: unknown, as in MIG mode).
    busy: bool | None = None
    replay_count: int | None = None
    tx_bytes_total: int | None = None
    rx_bytes_total: int | None = None
    bytes_counter_bits: int = 64  # the byte counters' width: real drivers' wrap at 32 bits
    # The driver's own rate (sampled over 20 ms), where the byte counters are missing or wrap
    # too fast to be read between two polls.
    tx_bytes_per_s: float | None = None
    rx_bytes_per_s: float | None = None
    # How far replay_count climbed within PCIE_REPLAY_WINDOW_S and the seconds that covers:
    # 0 where it did not climb, None where it was not counted so (an older agent's reading:
    # the rate over the last poll is judged then).
    replays_climbed: int = 0
    replays_climbed_s: float | None = None

    @property
    def downtrained(self) -> bool:
        """True when the link runs narrower than it can, or at a lower generation while the GPU
        works: an idle GPU trains its link down to save power (nvidia-smi: the current
        generation "may be reduced when the GPU is not in use")."""
        if self.width_current is not None and self.width_max is not None:
            if self.width_current < self.width_max:
                return True
        if self.gen_current is None or self.gen_max is None or self.busy is not True:
            return False
        return self.gen_current < self.gen_max


class RemoteKind(enum.StrEnum):
    """What sits at the far end of an NVLink."""

    GPU = "gpu"
    NVSWITCH = "nvswitch"
    IBMNPU = "ibmnpu"
    UNKNOWN = "unknown"


class NvLinkReading(msgspec.Struct, frozen=True):
    """One NVLink: state, far end and raw data counters (KiB)."""

    link: int
    active: bool
    version: int | None = None  # the NVLink generation: 4 on H100, 3 on A100
    remote_kind: RemoteKind = RemoteKind.UNKNOWN
    remote_pci_bus_id: str | None = None
    tx_kib_total: int | None = None
    rx_kib_total: int | None = None
    # the data link's error counters since the driver loaded (None: not read, as on a link
    # that is down, or NotSupported, as on Blackwell): replays, recoveries (the link
    # retrained) and CRC errors
    replay_errors_total: int | None = None
    recovery_errors_total: int | None = None
    crc_errors_total: int | None = None


# How far back an NVLink's error counters are watched climbing (GpuReading.nvlink_errors).
NVLINK_ERROR_WINDOW_S = 600.0


class NvLinkErrors(msgspec.Struct, frozen=True):
    """How far one NVLink's error counters climbed over the last `window_s` seconds."""

    link: int
    replay: int = 0
    recovery: int = 0
    crc: int = 0
    window_s: float = NVLINK_ERROR_WINDOW_S


class ProcessReading(msgspec.Struct, frozen=True):
    """A compute process on a GPU (PID in the host namespace)."""

    pid: int
    used_mem_bytes: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class GpmMetrics(msgspec.Struct, frozen=True):
    """Hopper+ GPU performance monitoring, over the last sample interval."""

    graphics_util_pct: float | None = None
    sm_util_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_util_pct: float | None = None
    fp64_util_pct: float | None = None
    fp32_util_pct: float | None = None
    fp16_util_pct: float | None = None
    dram_bw_util_pct: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    nvlink_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None


class MigInstance(msgspec.Struct, frozen=True):
    """A MIG GPU instance (with its first compute instance) carved out of a GPU."""

    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str
    profile_name: str  # as nvidia-smi prints it, e.g. "3g.40gb"
    slice_count: int
    sm_count: int
    mem_total_bytes: int | None = None
    mem_used_bytes: int | None = None
    placement_start: int | None = None
    gpm: GpmMetrics | None = None


# How far back a GPU's XIDs count (GpuReading.xids): NVIDIA's catalog judges repeats within a day.
XID_WINDOW_S = 24 * 3600.0


class XidCount(msgspec.Struct, frozen=True):
    """One XID code as a GPU raised it within the health window, since its last reset."""

    code: int
    count: int
    first_at: float
    last_at: float


# What NVML writes a GPU's UUID and name into is 96 bytes (NVML_DEVICE_UUID_V2_BUFFER_SIZE,
# NVML_DEVICE_NAME_V2_BUFFER_SIZE, nvml.h): a reading decoded from elsewhere (an agent, a
# replay file) with a longer one is refused, as no NVML wrote it. Each is a label of every
# series of its GPU: one of 2 MB made the head's /metrics a thousand times its size.
NVML_TEXT_CHARS = 96
NvmlText = Annotated[str, msgspec.Meta(max_length=NVML_TEXT_CHARS)]


class GpuReading(msgspec.Struct, frozen=True):
    """Everything NVML told us about one GPU in one poll."""

    index: int
    uuid: NvmlText
    name: NvmlText
    pci_bus_id: str
    state: GpuState = GpuState.OK
    serial: str | None = None
    module_id: int | None = None
    architecture: str | None = None
    sm_count: int | None = None
    lost_since: float | None = None
    error: str | None = None

    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    mem_total_bytes: int | None = None
    mem_used_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    temp_gpu_c: float | None = None
    temp_hbm_c: float | None = None
    temp_slowdown_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_mj_total: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    pstate: int | None = None
    # reasons that held the clocks down now or since the previous poll, e.g. "hw_thermal_slowdown"
    throttle_reasons: tuple[str, ...] = ()
    throttle_known: bool = True  # False: neither the bitmask nor a time counter answered
    # since when heat or power has held the clocks down without a break (None: not held now,
    # or not known: already held at the first poll, without the driver's slowdown counters to
    # date it back by)
    slowdown_since: float | None = None

    ecc: EccReading = msgspec.field(default_factory=EccReading)
    pcie: PcieReading = msgspec.field(default_factory=PcieReading)
    nvlinks: tuple[NvLinkReading, ...] = ()
    # the links whose error counters climbed within NVLINK_ERROR_WINDOW_S (most GPUs: none)
    nvlink_errors: tuple[NvLinkErrors, ...] = ()

    numa_node: int | None = None
    cpu_affinity: str | None = None  # "0-55,112-167"
    processes: tuple[ProcessReading, ...] = ()
    mig_enabled: bool | None = None
    mig_pending: bool | None = None
    mig_instances: tuple[MigInstance, ...] = ()
    virtualization_mode: str | None = None
    fabric_state: str | None = None
    # nvmlDeviceGetGpuFabricInfo's status (an nvmlReturn_t): not 0 means it failed to join
    fabric_status: int | None = None
    # the driver's own recovery advice (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    # nvmlDeviceGpuRecoveryAction_t): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
    # 4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot; None unknown
    recovery_action: int | None = None
    # XIDs counted per code over the health window; a GPU reset or a reboot clears those it
    # recovers (all but the ones that ask for a person: support, the mechanicals)
    xids: tuple[XidCount, ...] = ()
    # when NVML last saw this GPU come back from a reset, within the health window: a fault
    # the reset should have cleared that is raised again since asks for what follows a reset
    reset_at: float | None = None
    gpm: GpmMetrics | None = None
    unsupported: tuple[str, ...] = ()  # NVML calls this GPU answered NotSupported
    # readings NVML refuses this user (NO_PERMISSION): "memory", "processes", "mig_placement",
    # "gpm" (the whole GPU's, where only root may read them)
    denied: tuple[str, ...] = ()

    @property
    def lost(self) -> bool:
        return self.state is GpuState.LOST

    @property
    def unreadable(self) -> bool:
        """NVML counts it but this process cannot open it: nothing but its index is known."""
        return self.state is GpuState.UNREADABLE

    @property
    def mem_used_pct(self) -> float | None:
        if not self.mem_total_bytes or self.mem_used_bytes is None:
            return None
        return 100.0 * self.mem_used_bytes / self.mem_total_bytes

    @property
    def nvlinks_active(self) -> int:
        return sum(1 for link in self.nvlinks if link.active)


class NvmlReading(msgspec.Struct, frozen=True):
    """The NVML source's partial reading of one node."""

    at: float
    driver_version: str | None
    nvml_version: str | None
    cuda_driver_version: str | None
    gpus: tuple[GpuReading, ...]
    # topo codes between GPUs as nvidia-smi prints them: "X", "NV18", "PIX", "SYS", ...
    gpu_topology: tuple[tuple[str, ...], ...] = ()
    # the NVIDIA Fabric Manager service on an NVSwitch system: True running, False not
    # running, None where it is not needed or not known
    fabric_manager_running: bool | None = None
    simulated: bool = False

    def gpu(self, index: int) -> GpuReading | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None

    def counters(self) -> Iterator[RawCounter]:
        # Plain tuples of CounterSample's fields: this is the hub's hottest loop.
        for gpu in self.gpus:
            keys = _gpu_keys(gpu.uuid)
            if gpu.energy_mj_total is not None:
                yield keys[0], gpu.energy_mj_total, 64, False, False
            pcie = gpu.pcie
            if pcie.tx_bytes_total is not None:
                yield keys[1], pcie.tx_bytes_total, pcie.bytes_counter_bits, True, False
            if pcie.rx_bytes_total is not None:
                yield keys[2], pcie.rx_bytes_total, pcie.bytes_counter_bits, True, False
            if pcie.replay_count is not None:
                yield keys[3], pcie.replay_count, 64, False, False
            if gpu.nvlinks:
                link_keys = _link_keys(gpu.uuid)
                for link in gpu.nvlinks:
                    tx_key, rx_key = link_keys[link.link]
                    if link.tx_kib_total is not None:
                        yield tx_key, link.tx_kib_total, 64, False, False
                    if link.rx_kib_total is not None:
                        yield rx_key, link.rx_kib_total, 64, False, False

    def series(self) -> Iterator[tuple[Key, float]]:
        """Gauges worth a sparkline."""
        for gpu in self.gpus:
            keys = _series_keys(gpu.uuid)
            for name, key in zip(GAUGE_SERIES, keys, strict=False):
                value = getattr(gpu, name)
                if value is not None:
                    yield key, float(value)
            used = gpu.mem_used_pct
            if used is not None:
                yield keys[-2], used
            if gpu.gpm is not None and gpu.gpm.sm_util_pct is not None:
                yield keys[-1], gpu.gpm.sm_util_pct


GAUGE_SERIES = ("util_gpu_pct", "temp_gpu_c", "power_w", "sm_clock_mhz")


@functools.lru_cache(maxsize=65536)
def _series_keys(uuid: str) -> tuple[Key, ...]:
    """The sparkline keys of a GPU: its gauges, then memory used and GPM SM activity."""
    return tuple(("gpu", uuid, name) for name in (*GAUGE_SERIES, "mem_used_pct", "sm_util_pct"))


@functools.lru_cache(maxsize=65536)
def _gpu_keys(uuid: str) -> tuple[Key, Key, Key, Key]:
    base = ("gpu", uuid)
    return (
        (*base, "energy_mj"),
        (*base, "pcie_tx_bytes"),
        (*base, "pcie_rx_bytes"),
        (
            *base,
            "pcie_replays",
        ),
    )


NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS


@functools.lru_cache(maxsize=4096)
def _link_keys(uuid: str) -> tuple[tuple[Key, Key], ...]:
    """Each link number's (tx, rx) counter keys."""
    return tuple(
        (("gpu", uuid, "nvlink", str(n), "tx_kib"), ("gpu", uuid, "nvlink", str(n), "rx_kib"))
        for n in range(NVLINK_MAX_LINKS)
    )
