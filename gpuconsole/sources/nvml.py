"""The NVML source: every GPU of this node through nvidia-ml-py (or a library shaped like it).

The same code runs against the real libnvidia-ml.so, the fake one built from C in this
repo, and the in-process simulator (`gpuconsole.sim.nvml.SimNvml`): only `lib` differs.

Cost matters (every NVML call is a trip into the kernel driver), so readings are tiered:
- identity, limits and PCI topology: once;
- the table's metrics, every poll: one batched nvmlDeviceGetFieldValues plus
  utilization, memory and temperature (4 calls per GPU). The batch carries the driver's
  clock-event time counters too: a reason whose counter moved since the last poll held the
  clocks down in between, so a throttle shows at the poll after it starts;
- the SM clock, P-state, the throttle bitmask (for reasons without a counter), processes
  and GPM: every `detail_every` polls (NVML has no field for the current clock);
- PCIe link state, NVLink state, MIG layout, fabric state: every `inventory_every` polls.
A call a GPU answers NotSupported is remembered for that GPU and asked again only once
per inventory round (a fault can pass); a GPU that is lost (XID 79) is marked so while
the others keep polling.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuconsole.format import THROTTLE_WORDS
from gpuconsole.readings.base import Event, Severity
from gpuconsole.readings.nvml import (
    EccReading,
    GpmMetrics,
    GpuReading,
    GpuState,
    MigInstance,
    NvLinkReading,
    NvmlReading,
    PcieReading,
    ProcessReading,
    RemoteKind,
)
from gpuconsole.sources.base import EmitEvent, SourceUnavailable
from gpuconsole.sources.xid import describe_xid

log = logging.getLogger(__name__)

# nvmlReturn_t values (the ABI, so the same for pynvml and the simulator)
OK = 0
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
UNSUPPORTED_CODES = (NOT_SUPPORTED, FUNCTION_NOT_FOUND)

# nvmlFieldValue ids (pynvml NVML_FI_DEV_*)
FI_ECC_SBE_VOL = 3
FI_ECC_DBE_VOL = 4
FI_ECC_SBE_AGG = 5
FI_ECC_DBE_AGG = 6
FI_PERF_POLICY_POWER = 74  # = NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
FI_PERF_POLICY_SYNC_BOOST = 76  # = NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY = 83
FI_PCIE_REPLAY = 94
FI_NVLINK_TX = 138
FI_NVLINK_RX = 139
FI_REMAPPED_COR = 142
FI_REMAPPED_UNC = 143
FI_REMAPPED_PENDING = 144
FI_REMAPPED_FAILURE = 145
FI_POWER_INSTANT = 186
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198
FI_SW_THERMAL_NS = 269
FI_HW_THERMAL_NS = 270
FI_HW_POWER_BRAKE_NS = 271
# Clock-event reasons the driver also counts (nanoseconds held, since driver load).
THROTTLE_COUNTERS: tuple[tuple[int, str], ...] = (
    (FI_PERF_POLICY_POWER, "sw_power_cap"),
    (FI_PERF_POLICY_SYNC_BOOST, "sync_boost"),
    (FI_SW_THERMAL_NS, "sw_thermal_slowdown"),
    (FI_HW_THERMAL_NS, "hw_thermal_slowdown"),
    (FI_HW_POWER_BRAKE_NS, "hw_power_brake_slowdown"),
)
TABLE_FIELDS = (
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
    *(fid for fid, _reason in THROTTLE_COUNTERS),
)

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
REMOTE_KINDS = {0: RemoteKind.GPU, 1: RemoteKind.IBMNPU, 2: RemoteKind.NVSWITCH}
TOPO_CODES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

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
PCIE_UTIL_TX, PCIE_UTIL_RX = 0, 1  # nvmlPcieUtilCounter_t

# Reasons that are not a slowdown worth an event, and the ones that mean heat or power trouble.
BENIGN_THROTTLE = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting"})
HOT_THROTTLE = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)

# How long one event wait blocks: also how long close() may wait for the watcher, which
# a one-shot `gpuconsole snapshot` pays in full.
EVENT_WAIT_MS = 100
EVENT_XID = 0x8
EVENT_SBE = 0x1
EVENT_DBE = 0x2


class GpuLostError(Exception):
    """NVML said GPU_IS_LOST for this GPU."""


def cpulist(words: Sequence[int]) -> str:
    """Bitmask words (64 bits each, lowest CPU first) to a cpulist like '0-55,112-167'."""
    cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]
    parts: list[str] = []
    start = prev = None
    for cpu in cpus:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if start != prev else f"{start}")
        start = prev = cpu
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(parts)


def load_pynvml(library: str) -> Any:
    """pynvml bound to a particular libnvidia-ml.so (instead of the system's)."""
    import pynvml

    try:
        pynvml.nvmlLib = ctypes.CDLL(library)
    except OSError as exc:
        raise SourceUnavailable(f"NVML library {library} cannot be loaded: {exc}") from None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Link:
    link: int
    active: bool
    version: int | None = None
    remote_kind: RemoteKind = RemoteKind.UNKNOWN
    remote_pci_bus_id: str | None = None


@dataclass
class _Mig:
    handle: Any
    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str
    profile_name: str
    slice_count: int
    sm_count: int
    mem_total_bytes: int | None
    placement_start: int | None
    mem_used_bytes: int | None = None
    gpm: GpmMetrics | None = None
    gpm_sample: Any = None
    gpm_spare: Any = None


@dataclass
class _Gpu:
    """What the source keeps between polls for one GPU."""

    index: int
    handle: Any
    uuid: str
    name: str
    bus_id: str
    serial: str | None = None
    module_id: int | None = None
    architecture: str | None = None
    sm_count: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    temp_slowdown_c: float | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    gpm_supported: bool = False
    nvlink_count: int = 0
    unsupported: set[str] = field(default_factory=set)
    # NotSupported is not forever (a fault can pass): each inventory round asks every such
    # call once more, when it next comes up
    reprobe: set[str] = field(default_factory=set)
    fields: list[int | tuple[int, int]] = field(default_factory=list)
    lost_since: float | None = None
    errors: list[str] = field(default_factory=list)
    # detail tier
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    pstate: int | None = None
    throttle: tuple[str, ...] = ()
    throttle_mask: tuple[str, ...] = ()  # as the bitmask said at the last detail poll
    throttle_ns: dict[int, int] = field(default_factory=dict)  # counters at the last poll
    pcie_tx_bytes_per_s: float | None = None  # sampled, where the byte counters are missing
    pcie_rx_bytes_per_s: float | None = None
    processes: tuple[ProcessReading, ...] = ()
    gpm: GpmMetrics | None = None
    gpm_sample: Any = None
    gpm_spare: Any = None
    # inventory tier
    power_limit_w: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    links: list[_Link] = field(default_factory=list)
    mig_enabled: bool | None = None
    mig_pending: bool | None = None
    migs: list[_Mig] = field(default_factory=list)
    mig_profile_names: dict[int, str] | None = None
    virtualization: str | None = None
    fabric_state: str | None = None


class NvmlSource:
    """Reads every GPU of one node through NVML."""

    kind: ClassVar[str] = "nvml"

    def __init__(
        self,
        node: str,
        *,
        lib: Any = None,
        interval_s: float = 1.0,
        timeout_s: float = 5.0,
        detail_every: int = 2,
        inventory_every: int = 30,
        events: bool = True,
        simulated: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.detail_every = max(1, detail_every)
        self.inventory_every = max(1, inventory_every)
        self.simulated = simulated
        self._want_events = events
        self._lib = lib
        self._clock = clock
        self._initialized = False
        self._gpus: list[_Gpu] = []
        self._pci_topology: list[list[str]] = []
        self._gpu_topology: tuple[tuple[str, ...], ...] = ()  # changes with the inventory tier
        self._versions: tuple[str | None, str | None, str | None] = (None, None, None)
        self._round = 0
        self._emit: EmitEvent | None = None
        self._stop = threading.Event()
        self._event_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._rediscover = threading.Event()

    # --- lifecycle -------------------------------------------------------------------

    async def start(self, emit: EmitEvent) -> None:
        self._emit = emit
        await asyncio.to_thread(self._ensure_init)

    async def poll(self) -> NvmlReading:
        return await asyncio.to_thread(self.collect)

    async def close(self) -> None:
        await asyncio.to_thread(self._shutdown)

    def rediscover(self) -> None:
        """Enumerate the GPUs again before the next poll. NVML numbers the GPUs the nvidia
        driver holds when it starts, so after a GPU is bound to or from it (an assign)
        only a restart of NVML shows the change."""
        self._rediscover.set()

    def _shutdown(self) -> None:
        self._stop.set()
        thread = self._event_thread
        if thread is not None:
            thread.join(5.0)
            self._event_thread = None
        # A later start() discovers afresh: tiers count from the first poll again.
        self._round = 0
        if self._initialized:
            for gpu in self._gpus:
                self._free_gpm(gpu)
                for mig in gpu.migs:
                    self._free_gpm(mig)
            try:
                self._lib.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown: %s", exc)
            self._initialized = False

    # --- init ------------------------------------------------------------------------

    def _load(self) -> Any:
        if self._lib is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - it is a dependency
                raise SourceUnavailable("nvidia-ml-py is not installed") from exc
            self._lib = pynvml
        return self._lib

    def _ensure_init(self) -> None:
        with self._lock:
            if self._initialized:
                return
            lib = self._load()
            try:
                lib.nvmlInit()
            except lib.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == LIBRARY_NOT_FOUND:
                    raise SourceUnavailable(
                        "NVML not available: libnvidia-ml.so.1 not found "
                        "(is the NVIDIA driver installed?)"
                    ) from None
                if code == DRIVER_NOT_LOADED:
                    raise SourceUnavailable(
                        "NVML not available: the NVIDIA kernel driver is not loaded"
                    ) from None
                if code == NO_PERMISSION:
                    raise SourceUnavailable("NVML not available: no permission") from None
                raise SourceUnavailable(f"NVML init failed: {exc}") from None
            self._initialized = True
            try:
                self._discover()
            except Exception:
                self._initialized = False
                try:
                    lib.nvmlShutdown()
                except Exception as exc:
                    log.debug("nvmlShutdown after failed discovery: %s", exc)
                raise
        if self._want_events and self._event_thread is None and self._gpus:
            self._stop.clear()
            self._event_thread = threading.Thread(
                target=self._watch_events, name=f"nvml-events {self.node}", daemon=True
            )
            self._event_thread.start()

    def _discover(self) -> None:
        lib = self._lib
        driver = self._try(lambda: _text(lib.nvmlSystemGetDriverVersion()))
        nvml = self._try(lambda: _text(lib.nvmlSystemGetNVMLVersion()))
        cuda_raw = self._try(lib.nvmlSystemGetCudaDriverVersion)
        cuda = f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}" if isinstance(cuda_raw, int) else None
        self._versions = (driver, nvml, cuda)
        gpus: list[_Gpu] = []
        for index in range(lib.nvmlDeviceGetCount()):
            try:
                gpus.append(self._identify(index))
            except lib.NVMLError as exc:
                # A GPU that cannot even name itself is still a GPU the operator must see.
                log.warning("GPU %d unreadable at start: %s", index, exc)
                gpu = _Gpu(index, None, f"unknown-{index}", "unknown", "unknown", errors=[str(exc)])
                gpus.append(gpu)
                self._mark_lost(gpu, str(exc))
        self._gpus = gpus
        self._pci_topology = self._read_pci_topology()

    def _try(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._lib.NVMLError:
            return None

    def _identify(self, index: int) -> _Gpu:
        lib = self._lib
        h = lib.nvmlDeviceGetHandleByIndex(index)
        gpu = _Gpu(
            index=index,
            handle=h,
            uuid=_text(lib.nvmlDeviceGetUUID(h)),
            name=_text(lib.nvmlDeviceGetName(h)),
            bus_id=_text(lib.nvmlDeviceGetPciInfo(h).busId),
        )
        call = self._call
        serial = call(gpu, "serial", lib.nvmlDeviceGetSerial, h)
        gpu.serial = _text(serial) if serial is not None else None
        gpu.module_id = call(gpu, "module_id", lib.nvmlDeviceGetModuleId, h)
        arch = call(gpu, "architecture", lib.nvmlDeviceGetArchitecture, h)
        gpu.architecture = ARCHITECTURES.get(arch, f"arch{arch}") if arch is not None else None
        attrs = call(gpu, "attributes", lib.nvmlDeviceGetAttributes, h)
        gpu.sm_count = attrs.multiprocessorCount if attrs is not None else None
        gpu.sm_clock_max_mhz = call(gpu, "max_clock_sm", lib.nvmlDeviceGetMaxClockInfo, h, 1)
        gpu.mem_clock_max_mhz = call(gpu, "max_clock_mem", lib.nvmlDeviceGetMaxClockInfo, h, 2)
        slowdown = call(gpu, "temp_slowdown", lib.nvmlDeviceGetTemperatureThreshold, h, 1)
        gpu.temp_slowdown_c = float(slowdown) if slowdown is not None else None
        gpu.numa_node = call(gpu, "numa_node", lib.nvmlDeviceGetNumaNodeId, h)
        words = call(gpu, "cpu_affinity", lib.nvmlDeviceGetCpuAffinity, h, 16)
        gpu.cpu_affinity = cpulist(list(words)) if words is not None else None
        gpu.pcie_gen_max = call(gpu, "pcie_gen_max", lib.nvmlDeviceGetMaxPcieLinkGeneration, h)
        gpu.pcie_width_max = call(gpu, "pcie_width_max", lib.nvmlDeviceGetMaxPcieLinkWidth, h)
        support = call(gpu, "gpm_support", lib.nvmlGpmQueryDeviceSupport, h)
        gpu.gpm_supported = bool(support is not None and support.isSupportedDevice)
        fields = call(gpu, "fields_linkcount", lib.nvmlDeviceGetFieldValues, h, [91])
        if fields is not None and fields[0].nvmlReturn == OK:
            gpu.nvlink_count = int(fields[0].value.uiVal)
        gpu.fields = [*TABLE_FIELDS]
        gpu.errors.clear()
        return gpu

    def _read_pci_topology(self) -> list[list[str]]:
        lib, gpus = self._lib, self._gpus
        matrix = [["X" if a is b else "?" for b in gpus] for a in gpus]
        for i, a in enumerate(gpus):
            for j in range(i + 1, len(gpus)):
                b = gpus[j]
                if a.handle is None or b.handle is None:
                    continue
                try:
                    level = lib.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle)
                except lib.NVMLError:
                    level = None
                code = TOPO_CODES.get(level, "?") if level is not None else "?"
                matrix[i][j] = matrix[j][i] = code
        return matrix

    # --- calls -----------------------------------------------------------------------

    def _call(
        self, gpu: _Gpu, key: str, fn: Callable[..., Any] | None, *args: Any, **kwargs: Any
    ) -> Any:
        """Call NVML for one GPU; NotSupported is remembered (and asked once more after
        each inventory round), GPU_IS_LOST raises."""
        if key in gpu.unsupported:
            if key not in gpu.reprobe:
                return None
            gpu.reprobe.discard(key)
            gpu.unsupported.discard(key)  # added again below if still NotSupported
        if fn is None:
            gpu.unsupported.add(key)
            return None
        try:
            return fn(*args, **kwargs)
        except self._lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in UNSUPPORTED_CODES:
                gpu.unsupported.add(key)
                return None
            if code == GPU_IS_LOST:
                raise GpuLostError(str(exc)) from None
            gpu.errors.append(f"{key}: {exc}")
            return None

    # --- polling ---------------------------------------------------------------------

    def collect(self) -> NvmlReading:
        """One reading of every GPU (blocking; the hub runs it in a worker thread)."""
        if self._rediscover.is_set():
            self._rediscover.clear()
            log.info("NVML restarted to enumerate the GPUs again")
            self._shutdown()
        self._ensure_init()
        self._round += 1
        first = self._round == 1
        detail = first or self._round % self.detail_every == 0
        inventory = first or self._round % self.inventory_every == 0
        gpus = tuple(self._read_gpu(gpu, detail, inventory) for gpu in self._gpus)
        if inventory:
            self._gpu_topology = self._topology()
        driver, nvml, cuda = self._versions
        return NvmlReading(
            at=self._clock(),
            driver_version=driver,
            nvml_version=nvml,
            cuda_driver_version=cuda,
            gpus=gpus,
            gpu_topology=self._gpu_topology,
            simulated=self.simulated,
        )

    def _read_gpu(self, gpu: _Gpu, detail: bool, inventory: bool) -> GpuReading:
        gpu.errors.clear()
        if gpu.lost_since is not None and not (inventory and self._revived(gpu)):
            return self._lost_reading(gpu)
        try:
            return self._read_live(gpu, detail, inventory)
        except GpuLostError as exc:
            self._mark_lost(gpu, str(exc))
            return self._lost_reading(gpu)

    def _revived(self, gpu: _Gpu) -> bool:
        if gpu.handle is None:
            return False
        try:
            self._lib.nvmlDeviceGetUUID(gpu.handle)
        except self._lib.NVMLError:
            return False
        log.warning("GPU %d answers again", gpu.index)
        gpu.lost_since = None
        self._post(
            Event(
                self._clock(),
                self.node,
                self.kind,
                "gpu_recovered",
                Severity.INFO,
                f"GPU {gpu.index} answers again",
                gpu.index,
                gpu.uuid,
            )
        )
        return True

    def _mark_lost(self, gpu: _Gpu, why: str) -> None:
        gpu.lost_since = self._clock()
        self._post(
            Event(
                gpu.lost_since,
                self.node,
                self.kind,
                "gpu_lost",
                Severity.CRITICAL,
                f"GPU {gpu.index} is lost ({why})",
                gpu.index,
                gpu.uuid,
                79,
            )
        )

    def _lost_reading(self, gpu: _Gpu) -> GpuReading:
        return GpuReading(
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.bus_id,
            state=GpuState.LOST,
            serial=gpu.serial,
            module_id=gpu.module_id,
            architecture=gpu.architecture,
            sm_count=gpu.sm_count,
            lost_since=gpu.lost_since,
            numa_node=gpu.numa_node,
            cpu_affinity=gpu.cpu_affinity,
            error="GPU is lost: it fell off the bus or needs a reset",
        )

    def _read_live(self, gpu: _Gpu, detail: bool, inventory: bool) -> GpuReading:
        lib, h, call = self._lib, gpu.handle, self._call
        if inventory:
            gpu.reprobe = set(gpu.unsupported)
            self._read_inventory(gpu)
        values = self._read_fields(gpu)
        util = call(gpu, "utilization", lib.nvmlDeviceGetUtilizationRates, h)
        mem = call(gpu, "memory_v2", lib.nvmlDeviceGetMemoryInfo, h, version=lib.nvmlMemory_v2)
        if mem is None and "memory_v2" in gpu.unsupported:
            mem = call(gpu, "memory", lib.nvmlDeviceGetMemoryInfo, h)
        temp = call(gpu, "temperature", lib.nvmlDeviceGetTemperatureV, h, 0)
        if detail:
            self._read_detail(gpu)
        self._update_throttle(gpu, values)

        def field(fid: int, scope: int = 0) -> Any:
            return values.get((fid, scope))

        power_mw = field(FI_POWER_INSTANT)
        if power_mw is None and FI_POWER_INSTANT not in gpu.fields:
            power_mw = call(gpu, "power_usage", lib.nvmlDeviceGetPowerUsage, h)
        links = tuple(
            NvLinkReading(
                link=link.link,
                active=link.active,
                version=link.version,
                remote_kind=link.remote_kind,
                remote_pci_bus_id=link.remote_pci_bus_id,
                tx_kib_total=field(FI_NVLINK_TX, link.link),
                rx_kib_total=field(FI_NVLINK_RX, link.link),
            )
            for link in gpu.links
        )
        pending, failure = field(FI_REMAPPED_PENDING), field(FI_REMAPPED_FAILURE)
        return GpuReading(
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.bus_id,
            state=GpuState.ERROR if gpu.errors else GpuState.OK,
            serial=gpu.serial,
            module_id=gpu.module_id,
            architecture=gpu.architecture,
            sm_count=gpu.sm_count,
            error="; ".join(gpu.errors) or None,
            util_gpu_pct=float(util.gpu) if util is not None else None,
            util_mem_pct=float(util.memory) if util is not None else None,
            mem_total_bytes=int(mem.total) if mem is not None else None,
            mem_used_bytes=int(mem.used) if mem is not None else None,
            mem_reserved_bytes=int(getattr(mem, "reserved", 0)) if mem is not None else None,
            temp_gpu_c=float(temp) if temp is not None else None,
            temp_hbm_c=_float(field(FI_MEMORY_TEMP)),
            temp_slowdown_c=gpu.temp_slowdown_c,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=gpu.power_limit_w,
            energy_mj_total=field(FI_TOTAL_ENERGY),
            sm_clock_mhz=gpu.sm_clock_mhz,
            mem_clock_mhz=gpu.mem_clock_mhz,
            sm_clock_max_mhz=gpu.sm_clock_max_mhz,
            mem_clock_max_mhz=gpu.mem_clock_max_mhz,
            pstate=gpu.pstate,
            throttle_reasons=gpu.throttle,
            ecc=EccReading(
                volatile_corrected=field(FI_ECC_SBE_VOL),
                volatile_uncorrected=field(FI_ECC_DBE_VOL),
                aggregate_corrected=field(FI_ECC_SBE_AGG),
                aggregate_uncorrected=field(FI_ECC_DBE_AGG),
                remapped_corrected=field(FI_REMAPPED_COR),
                remapped_uncorrected=field(FI_REMAPPED_UNC),
                remap_pending=bool(pending) if pending is not None else None,
                remap_failure=bool(failure) if failure is not None else None,
            ),
            pcie=PcieReading(
                gen_current=gpu.pcie_gen,
                gen_max=gpu.pcie_gen_max,
                width_current=gpu.pcie_width,
                width_max=gpu.pcie_width_max,
                replay_count=field(FI_PCIE_REPLAY),
                tx_bytes_total=field(FI_PCIE_TX_BYTES),
                rx_bytes_total=field(FI_PCIE_RX_BYTES),
                tx_bytes_per_s=gpu.pcie_tx_bytes_per_s,
                rx_bytes_per_s=gpu.pcie_rx_bytes_per_s,
            ),
            nvlinks=links,
            numa_node=gpu.numa_node,
            cpu_affinity=gpu.cpu_affinity,
            processes=gpu.processes,
            mig_enabled=gpu.mig_enabled,
            mig_pending=gpu.mig_pending,
            mig_instances=tuple(
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
            ),
            virtualization_mode=gpu.virtualization,
            fabric_state=gpu.fabric_state,
            gpm=gpu.gpm,
            unsupported=tuple(sorted(gpu.unsupported)),
        )

    def _read_fields(self, gpu: _Gpu) -> dict[tuple[int, int], Any]:
        """The batched call: every field this GPU supports, in one trip."""
        if not gpu.fields:
            return {}
        lib = self._lib
        result = self._call(
            gpu, "field_values", lib.nvmlDeviceGetFieldValues, gpu.handle, gpu.fields
        )
        if result is None:
            return {}
        values: dict[tuple[int, int], Any] = {}
        dropped: list[int | tuple[int, int]] = []
        # Unpacked from the array's bytes: pynvml's per-attribute wrapper costs more than
        # the trip into the driver.
        for requested, (fid, scope, kind, ret, raw) in zip(
            gpu.fields, _FIELD_VALUE.iter_unpack(bytes(result)), strict=False
        ):
            if ret == OK:
                values[(fid, scope)] = _VALUE_TYPES.get(kind, _VALUE_TYPES[3]).unpack(raw)[0]
            elif ret == GPU_IS_LOST:
                raise GpuLostError("field values: GPU is lost")
            elif ret in UNSUPPORTED_CODES:
                dropped.append(requested)
        if dropped:
            gpu.fields = [f for f in gpu.fields if f not in dropped]
            gpu.unsupported.update(f"field {f}" for f in dropped)
        return values

    def _read_detail(self, gpu: _Gpu) -> None:
        lib, h, call = self._lib, gpu.handle, self._call
        gpu.sm_clock_mhz = call(gpu, "clock_sm", lib.nvmlDeviceGetClockInfo, h, 1)
        gpu.pstate = call(gpu, "pstate", lib.nvmlDeviceGetPerformanceState, h)
        mask = call(gpu, "clocks_event_reasons", lib.nvmlDeviceGetCurrentClocksEventReasons, h)
        gpu.throttle_mask = (
            tuple(name for bit, name in THROTTLE_BITS if mask & bit) if mask is not None else ()
        )
        if FI_PCIE_TX_BYTES not in gpu.fields:
            self._read_pcie_throughput(gpu)
        procs = call(gpu, "processes", lib.nvmlDeviceGetComputeRunningProcesses, h)
        if procs is not None:
            gpu.processes = tuple(_process(p) for p in procs)
        for mig in gpu.migs:
            mem = call(gpu, "mig_memory", lib.nvmlDeviceGetMemoryInfo, mig.handle)
            mig.mem_used_bytes = int(mem.used) if mem is not None else None
        if gpu.gpm_supported:
            self._read_gpm(gpu)

    def _read_pcie_throughput(self, gpu: _Gpu) -> None:
        """Where the driver has no PCIe byte counters: its own rate, sampled over 20 ms."""
        lib, h, call = self._lib, gpu.handle, self._call
        fn = getattr(lib, "nvmlDeviceGetPcieThroughput", None)
        tx = call(gpu, "pcie_throughput", fn, h, PCIE_UTIL_TX)
        rx = call(gpu, "pcie_throughput", fn, h, PCIE_UTIL_RX)
        gpu.pcie_tx_bytes_per_s = tx * 1024.0 if tx is not None else None  # KB/s
        gpu.pcie_rx_bytes_per_s = rx * 1024.0 if rx is not None else None

    def _update_throttle(self, gpu: _Gpu, values: dict[tuple[int, int], Any]) -> None:
        """Reasons that held the clocks down: the last bitmask, plus every reason whose
        time counter moved since the previous poll (so a slowdown that starts between two
        bitmask reads shows at once; one that ends shows at the next bitmask read).
        """
        moved: set[str] = set()
        for fid, reason in THROTTLE_COUNTERS:
            now = values.get((fid, 0))
            if now is None:
                continue
            before = gpu.throttle_ns.get(fid)
            gpu.throttle_ns[fid] = int(now)
            if before is not None and now > before:  # went back: a driver reload, not heat
                moved.add(reason)
        reasons = moved.union(gpu.throttle_mask)
        throttle = tuple(name for _bit, name in THROTTLE_BITS if name in reasons)
        self._throttle_changed(gpu, gpu.throttle, throttle)
        gpu.throttle = throttle

    def _throttle_changed(self, gpu: _Gpu, before: tuple[str, ...], now: tuple[str, ...]) -> None:
        """An event when the reasons that slow a GPU down start or stop (idle is not one)."""
        old, new = set(before) - BENIGN_THROTTLE, set(now) - BENIGN_THROTTLE
        if old == new:
            return
        if new:
            words = ", ".join(THROTTLE_WORDS.get(r, r) for r in sorted(new))
            severity = Severity.WARNING if new & HOT_THROTTLE else Severity.INFO
            message = f"GPU {gpu.index} throttled: {words}"
        else:
            severity, message = Severity.INFO, f"GPU {gpu.index} no longer throttled"
        self._post(
            Event(
                self._clock(),
                self.node,
                self.kind,
                "throttle",
                severity,
                message,
                gpu.index,
                gpu.uuid,
            )
        )

    def _read_gpm(self, gpu: _Gpu) -> None:
        """GPM for the GPU and each MIG instance: one new sample each, against the last."""
        gpu.gpm = self._gpm_step(gpu, gpu, None)
        for mig in gpu.migs:
            mig.gpm = self._gpm_step(gpu, mig, mig.gpu_instance_id)

    def _gpm_step(self, gpu: _Gpu, holder: _Gpu | _Mig, instance: int | None) -> GpmMetrics | None:
        lib, call = self._lib, self._call
        if holder.gpm_sample is None:
            first = call(gpu, "gpm_alloc", lib.nvmlGpmSampleAlloc)
            second = call(gpu, "gpm_alloc", lib.nvmlGpmSampleAlloc) if first is not None else None
            holder.gpm_sample, holder.gpm_spare = first, second
            if second is None:
                self._free_gpm(holder)
                gpu.gpm_supported = False
                return None
            self._gpm_sample(gpu, instance, holder.gpm_sample)  # the interval starts here
            return None
        if not self._gpm_sample(gpu, instance, holder.gpm_spare):
            return holder.gpm
        metrics = self._gpm_metrics(gpu, holder.gpm_sample, holder.gpm_spare)
        holder.gpm_sample, holder.gpm_spare = holder.gpm_spare, holder.gpm_sample
        return metrics

    def _free_gpm(self, holder: _Gpu | _Mig) -> None:
        """Give a holder's two GPM sample buffers back to NVML (they are malloc'd there)."""
        for sample in (holder.gpm_sample, holder.gpm_spare):
            if sample is not None:
                try:
                    self._lib.nvmlGpmSampleFree(sample)
                except self._lib.NVMLError as exc:
                    log.debug("GPM sample free: %s", exc)
        holder.gpm_sample = holder.gpm_spare = None
        holder.gpm = None

    def _gpm_sample(self, gpu: _Gpu, instance: int | None, sample: Any) -> bool:
        lib = self._lib
        if instance is None:
            got = self._call(gpu, "gpm_sample", lib.nvmlGpmSampleGet, gpu.handle, sample)
        else:
            got = self._call(
                gpu, "gpm_mig_sample", lib.nvmlGpmMigSampleGet, gpu.handle, instance, sample
            )
        return got is not None

    def _gpm_metrics(self, gpu: _Gpu, first: Any, second: Any) -> GpmMetrics | None:
        lib = self._lib
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = lib.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = first
        request.sample2 = second
        for i, (metric_id, _name, _scale) in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric_id
        result = self._call(gpu, "gpm_metrics", lib.nvmlGpmMetricsGet, request)
        if result is None:
            return None
        values: dict[str, float] = {}
        for i, (_metric_id, name, scale) in enumerate(GPM_METRICS):
            metric = result.metrics[i]
            if metric.nvmlReturn == OK:
                values[name] = float(metric.value) * scale
        return GpmMetrics(**values)

    def _read_inventory(self, gpu: _Gpu) -> None:
        lib, h, call = self._lib, gpu.handle, self._call
        limit = call(gpu, "power_limit", lib.nvmlDeviceGetEnforcedPowerLimit, h)
        gpu.power_limit_w = limit / 1000.0 if limit is not None else None
        gpu.mem_clock_mhz = call(gpu, "clock_mem", lib.nvmlDeviceGetClockInfo, h, 2)
        gpu.pcie_gen = call(gpu, "pcie_gen", lib.nvmlDeviceGetCurrPcieLinkGeneration, h)
        gpu.pcie_width = call(gpu, "pcie_width", lib.nvmlDeviceGetCurrPcieLinkWidth, h)
        mode = call(gpu, "virtualization", lib.nvmlDeviceGetVirtualizationMode, h)
        gpu.virtualization = VIRTUALIZATION.get(mode, str(mode)) if mode is not None else None
        gpu.fabric_state = self._fabric_state(gpu)
        self._read_links(gpu)
        self._read_mig(gpu)

    def _fabric_state(self, gpu: _Gpu) -> str | None:
        lib = self._lib
        info_type = getattr(lib, "c_nvmlGpuFabricInfo_t", None)
        if info_type is None:
            return None
        info = info_type()
        if (
            self._call(
                gpu, "fabric_info", lib.nvmlDeviceGetGpuFabricInfo, gpu.handle, ctypes.byref(info)
            )
            is None
            and "fabric_info" in gpu.unsupported
        ):
            return None
        return FABRIC_STATES.get(int(info.state), str(info.state))

    def _read_links(self, gpu: _Gpu) -> None:
        lib, h, call = self._lib, gpu.handle, self._call
        known = {link.link: link for link in gpu.links}
        # Every link of a GPU speaks one NVLink generation: asked once, of the first link up.
        version = next((link.version for link in gpu.links if link.version is not None), None)
        links: list[_Link] = []
        for n in range(gpu.nvlink_count):
            state = call(gpu, "nvlink_state", lib.nvmlDeviceGetNvLinkState, h, n)
            if state is None:
                continue
            link = known.get(n) or _Link(n, bool(state))
            link.active = bool(state)
            if link.active and link.remote_pci_bus_id is None:
                if version is None:
                    version = call(gpu, "nvlink_version", lib.nvmlDeviceGetNvLinkVersion, h, n)
                link.version = version
                kind = call(
                    gpu, "nvlink_remote_type", lib.nvmlDeviceGetNvLinkRemoteDeviceType, h, n
                )
                link.remote_kind = REMOTE_KINDS.get(kind, RemoteKind.UNKNOWN)
                pci = call(gpu, "nvlink_remote_pci", lib.nvmlDeviceGetNvLinkRemotePciInfo, h, n)
                link.remote_pci_bus_id = _text(pci.busId) if pci is not None else None
            links.append(link)
        gpu.links = links
        # Every field, those once NotSupported too: asked again in the same batched call, and
        # marked again by _read_fields where still NotSupported.
        scoped: list[int | tuple[int, int]] = [*TABLE_FIELDS]
        for link in links:
            if link.active:
                scoped += [(FI_NVLINK_TX, link.link), (FI_NVLINK_RX, link.link)]
        gpu.fields = scoped
        gpu.unsupported.difference_update(f"field {f}" for f in scoped)

    def _read_mig(self, gpu: _Gpu) -> None:
        lib, h, call = self._lib, gpu.handle, self._call
        mode = call(gpu, "mig_mode", lib.nvmlDeviceGetMigMode, h)
        if mode is None:
            gpu.mig_enabled = gpu.mig_pending = None
            for mig in gpu.migs:
                self._free_gpm(mig)
            gpu.migs = []
            return
        enabled = bool(mode[0])
        if gpu.mig_enabled is not None and enabled != gpu.mig_enabled:
            # Utilization and per-process figures come and go with MIG mode.
            gpu.unsupported -= {"utilization", "processes"}
        gpu.mig_enabled, gpu.mig_pending = enabled, bool(mode[1])
        if not gpu.mig_enabled:
            for mig in gpu.migs:
                self._free_gpm(mig)
            gpu.migs = []
            return
        known = {m.uuid: m for m in gpu.migs}
        migs: list[_Mig] = []
        count = call(gpu, "mig_max", lib.nvmlDeviceGetMaxMigDeviceCount, h) or 0
        for slot in range(count):
            try:
                mh = lib.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) == GPU_IS_LOST:
                    raise GpuLostError(str(exc)) from None
                continue  # NOT_FOUND: an empty slot
            uuid = _text(lib.nvmlDeviceGetUUID(mh))
            if uuid in known:
                migs.append(known[uuid])
                continue
            migs.append(self._identify_mig(gpu, mh, uuid))
        for gone in set(known) - {m.uuid for m in migs}:
            self._free_gpm(known[gone])
        gpu.migs = migs

    def _identify_mig(self, gpu: _Gpu, mh: Any, uuid: str) -> _Mig:
        lib, call = self._lib, self._call
        gi = call(gpu, "mig_gi", lib.nvmlDeviceGetGpuInstanceId, mh)
        ci = call(gpu, "mig_ci", lib.nvmlDeviceGetComputeInstanceId, mh)
        attrs = call(gpu, "mig_attributes", lib.nvmlDeviceGetAttributes, mh)
        slices = int(attrs.gpuInstanceSliceCount) if attrs is not None else 0
        mem_mb = int(attrs.memorySizeMB) if attrs is not None else None
        name, start = None, None
        instance = call(gpu, "gi_by_id", lib.nvmlDeviceGetGpuInstanceById, gpu.handle, gi)
        if instance is not None:
            info = call(gpu, "gi_info", lib.nvmlGpuInstanceGetInfo, instance)
            if info is not None:
                start = int(info.placement.start)
                name = self._mig_profile_names(gpu).get(int(info.profileId))
        if name is None:
            name = f"{slices}g.{round((mem_mb or 0) / 1024)}gb"
        return _Mig(
            handle=mh,
            gpu_instance_id=int(gi or 0),
            compute_instance_id=ci,
            uuid=uuid,
            profile_name=name,
            slice_count=slices,
            sm_count=int(attrs.multiprocessorCount) if attrs is not None else 0,
            mem_total_bytes=mem_mb * 1024 * 1024 if mem_mb is not None else None,
            placement_start=start,
        )

    def _mig_profile_names(self, gpu: _Gpu) -> dict[int, str]:
        """Profile id (as nvmlGpuInstanceGetInfo reports it) to name, e.g. 9 -> "3g.40gb".

        NVML's profile-info call takes the profile *index*, so walk the indexes once.
        """
        if gpu.mig_profile_names is None:
            names: dict[int, str] = {}
            count = getattr(self._lib, "NVML_GPU_INSTANCE_PROFILE_COUNT", MIG_PROFILE_INDEXES)
            for index in range(count):
                try:
                    info = self._lib.nvmlDeviceGetGpuInstanceProfileInfo(gpu.handle, index)
                except self._lib.NVMLError:
                    continue
                names[int(info.id)] = _text(info.name).removeprefix("MIG ")
            gpu.mig_profile_names = names
        return gpu.mig_profile_names

    def _topology(self) -> tuple[tuple[str, ...], ...]:
        """PCI levels from NVML, with NV# where NVLinks join two GPUs (or both reach NVSwitch)."""
        gpus = self._gpus
        rows: list[tuple[str, ...]] = []
        for i, a in enumerate(gpus):
            row = list(self._pci_topology[i]) if i < len(self._pci_topology) else []
            for j, b in enumerate(gpus):
                if i == j or j >= len(row):
                    continue
                links = _nvlinks_between(a, b)
                if links:
                    row[j] = f"NV{links}"
            rows.append(tuple(row))
        return tuple(rows)

    # --- events ----------------------------------------------------------------------

    def _post(self, event: Event) -> None:
        if self._emit is not None:
            self._emit(event)

    def _watch_events(self) -> None:
        """Wait on an NVML event set in this thread; XIDs and ECC events become hub events."""
        lib = self._lib
        try:
            event_set = lib.nvmlEventSetCreate()
        except lib.NVMLError as exc:
            log.info("NVML events unavailable: %s", exc)
            return
        try:
            registered = []
            for gpu in self._gpus:
                if gpu.handle is None:
                    continue
                try:
                    supported = lib.nvmlDeviceGetSupportedEventTypes(gpu.handle)
                    mask = supported & (EVENT_XID | EVENT_DBE | EVENT_SBE)
                    if mask:
                        lib.nvmlDeviceRegisterEvents(gpu.handle, mask, event_set)
                        registered.append(gpu)
                except lib.NVMLError as exc:
                    log.info("GPU %d: events not registered: %s", gpu.index, exc)
            if not registered:
                return
            while not self._stop.is_set():
                try:
                    data = lib.nvmlEventSetWait(event_set, EVENT_WAIT_MS)
                except lib.NVMLError as exc:
                    if getattr(exc, "value", None) != TIMEOUT:
                        log.debug("event wait: %s", exc)
                        self._stop.wait(1.0)
                    continue
                self._post(self._event_from(data, registered))
        finally:
            try:
                lib.nvmlEventSetFree(event_set)
            except Exception as exc:
                log.debug("event set free: %s", exc)

    def _event_from(self, data: Any, gpus: list[_Gpu]) -> Event:
        gpu = _match_handle(data.device, gpus)
        index = gpu.index if gpu is not None else None
        uuid = gpu.uuid if gpu is not None else None
        where = f"GPU {index}" if index is not None else "a GPU"
        now = self._clock()
        if data.eventType & EVENT_XID:
            xid = int(data.eventData)
            severity, meaning = describe_xid(xid)
            return Event(
                now,
                self.node,
                self.kind,
                "xid",
                severity,
                f"XID {xid} on {where}: {meaning}",
                index,
                uuid,
                xid,
            )
        if data.eventType & EVENT_DBE:
            return Event(
                now,
                self.node,
                self.kind,
                "ecc",
                Severity.CRITICAL,
                f"double-bit ECC error on {where}",
                index,
                uuid,
            )
        return Event(
            now,
            self.node,
            self.kind,
            "ecc",
            Severity.INFO,
            f"single-bit ECC error on {where}",
            index,
            uuid,
        )


def _nvlinks_between(a: _Gpu, b: _Gpu) -> int:
    active_a = [link for link in a.links if link.active]
    direct = sum(1 for link in active_a if link.remote_pci_bus_id == b.bus_id)
    if direct:
        return direct
    active_b = [link for link in b.links if link.active]
    if any(link.remote_kind is RemoteKind.NVSWITCH for link in active_a) and any(
        link.remote_kind is RemoteKind.NVSWITCH for link in active_b
    ):
        return min(
            sum(1 for link in active_a if link.remote_kind is RemoteKind.NVSWITCH),
            sum(1 for link in active_b if link.remote_kind is RemoteKind.NVSWITCH),
        )
    return 0


def _address(handle: Any) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _match_handle(handle: Any, gpus: list[_Gpu]) -> _Gpu | None:
    for gpu in gpus:
        if gpu.handle is handle:
            return gpu
    address = _address(handle)
    if address is None:
        return None
    for gpu in gpus:
        if _address(gpu.handle) == address:
            return gpu
    return None


# nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value
_FIELD_VALUE = struct.Struct("<II16xII8s")
# nvmlValueType_t to the union member it fills
_VALUE_TYPES = {
    kind: struct.Struct(fmt)
    for kind, fmt in {0: "<d", 1: "<I4x", 2: "<Q", 3: "<Q", 4: "<q", 5: "<i4x", 6: "<H6x"}.items()
}


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


NA_ID = 0xFFFFFFFF


def _process(p: Any) -> ProcessReading:
    gi = getattr(p, "gpuInstanceId", NA_ID)
    ci = getattr(p, "computeInstanceId", NA_ID)
    used = getattr(p, "usedGpuMemory", None)
    return ProcessReading(
        pid=int(p.pid),
        used_mem_bytes=int(used) if used is not None else None,
        gpu_instance_id=None if gi in (None, NA_ID) else int(gi),
        compute_instance_id=None if ci in (None, NA_ID) else int(ci),
    )
