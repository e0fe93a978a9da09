"""The NVML source: every GPU of this node through nvidia-ml-py (or a library shaped like it).

The same code runs against the real libnvidia-ml.so, the fake one built from C in this
repo, and the in-process simulator (`gpuconsole.sim.nvml.SimNvml`): only `lib` differs.

Cost matters (every NVML call is a trip into the kernel driver), so readings are tiered:
- identity, limits and PCI topology: once;
- the table's metrics, every poll: one batched nvmlDeviceGetFieldValues plus
  utilization, memory and temperature (4 calls per GPU). The batch carries the driver's
  clock-event time counters too (which ones, and at which field ids, depends on the driver
  branch): a reason whose counter moved since the last poll held the clocks down in between,
  so a throttle shows at the poll after it starts;
- the SM clock, P-state, the throttle bitmask (for reasons without a counter), processes
  and GPM: every `detail_every` polls (NVML has no field for the current clock);
- PCIe link state, NVLink state, MIG layout, fabric state: every `inventory_every` polls;
- the PCI level between two GPUs: once, only for pairs no NVLink joins (NV# stands there).
A one-shot reader (`one_shot`) watches for no events and takes no GPM sample: it ends before
either could tell anything.
A call a GPU answers NotSupported is remembered for that GPU and asked again only once
per inventory round (a fault can pass); so is one NVML refuses this user (NO_PERMISSION),
which leaves its readings out and the GPU OK. A GPU that is lost (XID 79) is marked so
while the others keep polling; one NVML counts but cannot open is shown as unreadable.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from gpuconsole.config import DEFAULTS
from gpuconsole.format import THROTTLE_WORDS
from gpuconsole.hardware import BEFORE_AMPERE, model_spec
from gpuconsole.readings.base import Event, Severity, known_bus_id, normal_bus_id
from gpuconsole.readings.nvml import (
    EccReading,
    GpuReading,
    GpuState,
    NvLinkReading,
    NvmlReading,
    PcieReading,
    ProcessReading,
    RemoteKind,
    XidCount,
)
from gpuconsole.sources.base import DaemonThread, EmitEvent, SourceUnavailable
from gpuconsole.sources.boot import boot_id
from gpuconsole.sources.nvml import mig_gpm
from gpuconsole.sources.nvml.events import event_from, gpu_words, watch_events
from gpuconsole.sources.nvml.lib import (
    ARCHITECTURES,
    BASE_FIELDS,
    DRIVER_NOT_LOADED,
    FABRIC_COMPLETED,
    FABRIC_STATES,
    FI_ECC_DBE_AGG,
    FI_ECC_DBE_VOL,
    FI_ECC_SBE_AGG,
    FI_ECC_SBE_VOL,
    FI_MEMORY_TEMP,
    FI_NVLINK_ERROR_CRC,
    FI_NVLINK_ERROR_RECOVERY,
    FI_NVLINK_ERROR_REPLAY,
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_RX,
    FI_NVLINK_STATE,
    FI_NVLINK_TX,
    FI_NVLINK_VERSION,
    FI_NVSWITCH_LINK_COUNT,
    FI_PCIE_REPLAY,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    FI_POWER_INSTANT,
    FI_POWER_LIMIT,
    FI_RECOVERY_ACTION,
    FI_REMAPPED_COR,
    FI_REMAPPED_FAILURE,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_UNC,
    FI_RETIRED_DBE,
    FI_RETIRED_PENDING,
    FI_RETIRED_SBE,
    FI_TEMP_SLOWDOWN,
    FI_TOTAL_ENERGY,
    FIELD_VALUE,
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    LIBRARY_NOT_FOUND,
    NA_ID,
    NO_PERMISSION,
    NOT_AVAILABLE_U64,
    NOT_SUPPORTED,
    NVLINK_ERROR_FIELDS,
    NVLINK_GENERATIONS,
    OK,
    OPEN_ERRORS,
    PCIE_UTIL_RX,
    PCIE_UTIL_TX,
    REMOTE_KINDS,
    RETIRED_PAGE_FIELDS,
    THROTTLE_BITS,
    TOPO_CODES,
    UNSUPPORTED_CODES,
    VALUE_TYPES,
    VIRTUALIZATION,
    GpuLostError,
    call,
    counter_bits,
    denied_readings,
    field_values,
    recovery_action_field,
    running_processes,
    system_pynvml,
    text,
    throttle_counters,
)
from gpuconsole.sources.nvml.state import GpuRecord, LinkRecord
from gpuconsole.sources.nvml.xids import XidHistory

if TYPE_CHECKING:  # asyncio only where a loop runs: a one-shot reads blocking
    import asyncio
    from concurrent.futures import Future

log = logging.getLogger(__name__)
# What a source said of a GPU it could not open, by node and index: said once a process
# (a command that reads the node again and again, waiting on a lost GPU, says it once)
_SAID: set[tuple[str, int, str]] = set()
_SAID_MOST = 4096


def _say_once(node: str, index: int, message: str) -> None:
    said = (node, index, message)
    if said in _SAID:
        log.debug("%s: %s", node, message)
        return
    if len(_SAID) >= _SAID_MOST:
        _SAID.clear()
    _SAID.add(said)
    log.warning("%s: %s", node, message)


T = TypeVar("T")

# How long a close waits for the event watch to stop (it wakes every EVENT_WAIT_MS).
EVENT_STOP_S = 5.0

# Reasons that are not a slowdown worth an event, and the ones that mean heat or power trouble.
BENIGN_THROTTLE = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting"})
HOT_THROTTLE = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)
# An idle GPU trains its PCIe link down to save power; below this utilization a lower
# generation than the link's best is that, not a fault.
BUSY_UTIL_PCT = 10
# Bytes per second one PCIe lane carries, by generation (8b/10b coding to Gen2, 128b/130b on).
PCIE_LANE_BYTES_PER_S = {1: 250e6, 2: 500e6, 3: 984.6e6, 4: 1969.2e6, 5: 3938.5e6, 6: 7877e6}
# Calls with a stand-in: listed as unsupported only when the stand-in is too.
STAND_INS = {
    "temperature": "temperature_legacy",
    "field 197": "pcie_throughput",
    "field 198": "pcie_throughput",
    f"field {FI_POWER_LIMIT}": "power_limit",
}
# /proc/PID/comm holds a name's first 15 bytes: nv-fabricmanager's is this
FABRIC_MANAGER_COMM = "nv-fabricmanager"[:15]
# Where the nvidia-fabricmanager service (its systemd unit's PIDFile=) and NVIDIA's driver
# container write the daemon's pid
FABRIC_MANAGER_PID_FILE = "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"


def fabric_manager_running(proc_root: str, pid_file: str = FABRIC_MANAGER_PID_FILE) -> bool:
    """Whether an nv-fabricmanager process runs, by the process table under `proc_root` (a
    container that watches its host reads the host's /proc mounted elsewhere).

    The pid file its service writes is read first: where it names a live nv-fabricmanager,
    two small reads answer. Elsewhere (no file, a stale one a crash left, a Fabric Manager
    started by hand) every process's name is read, a cost that grows with the node's
    processes. Read here rather than through sources.tenancy.procfs: importing that package
    loads the kubelet's gRPC client, a tenth of a second a one-shot reading of NVML has no
    use for. Raises OSError where it cannot tell: `proc_root` cannot be listed, or hides
    other users' processes (procfs mounted with hidepid, to a user other than root).
    """
    pid = _pid_in(pid_file)
    if pid is not None and _comm(os.path.join(proc_root, str(pid))) == FABRIC_MANAGER_COMM:
        return True
    hidden = False
    for name in os.listdir(proc_root):
        if not (name.isascii() and name.isdigit()):
            continue
        try:
            comm = _comm(os.path.join(proc_root, name))
        except PermissionError:  # hidepid=1: listed, not readable
            hidden = True
            continue
        if comm == FABRIC_MANAGER_COMM:
            return True
    # hidepid=2 lists a user its own processes only: every table has a pid 1
    if hidden or not os.path.isdir(os.path.join(proc_root, "1")):
        raise PermissionError(
            f"{proc_root} hides other users' processes (mounted with hidepid): "
            "only root can see whether nv-fabricmanager runs"
        )
    return False


def _pid_in(pid_file: str) -> int | None:
    """The pid a pid file holds; None where there is no such file or it holds no pid."""
    try:  # not blocking: a FIFO in its place would hold the poll for ever
        fd = os.open(pid_file, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        words = os.read(fd, 32).split()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(words[0]) if words and words[0].isdigit() and len(words[0]) <= 10 else None


def _comm(process: str) -> str | None:
    """A process's name (/proc/PID/comm); None where it is gone. PermissionError where it
    is hidden from this user."""
    try:  # a descriptor, not a file object: a busy node has thousands of processes to read
        fd = os.open(os.path.join(process, "comm"), os.O_RDONLY)
    except PermissionError:
        raise
    except OSError:  # gone since the listing, or never there
        return None
    try:
        return os.read(fd, 64).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


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


class NvmlSource:
    """Reads every GPU of one node through NVML."""

    kind: ClassVar[str] = "nvml"

    def __init__(
        self,
        node: str,
        *,
        lib: Any = None,
        interval_s: float = DEFAULTS.nvml.interval_s,
        timeout_s: float = DEFAULTS.nvml.timeout_s,
        detail_every: int = DEFAULTS.nvml.detail_every,
        inventory_every: int = DEFAULTS.nvml.inventory_every,
        events: bool = DEFAULTS.nvml.events,
        one_shot: bool = False,
        simulated: bool = False,
        clock: Callable[[], float] = time.time,
        proc_root: str = "/proc",
        fabric_manager: Callable[[], bool | None] | None = None,
        sysfs_root: str = "/sys",
        state_dir: Path | None = None,
    ) -> None:
        """`state_dir`: where the GPUs' XIDs are kept across restarts within one boot of the
        node (None: in this process only)."""
        self.node = node
        # where the nvidia driver's PCI functions name a GPU NVML cannot open
        self._sysfs_root, self._proc_root = sysfs_root, proc_root
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.detail_every = max(1, detail_every)
        self.inventory_every = max(1, inventory_every)
        self.simulated = simulated
        self._one_shot = one_shot
        self._want_events = events and not one_shot
        self._lib = lib
        self._clock = clock
        self._initialized = False
        self._gpus: list[GpuRecord] = []
        # PCI levels asked so far, by pair of indexes (lower first); NVML's answer never changes
        self._pci_levels: dict[tuple[int, int], str] = {}
        self._gpu_topology: tuple[tuple[str, ...], ...] = ()  # changes with the inventory tier
        self._versions: tuple[str | None, str | None, str | None] = (None, None, None)
        self._throttle_counters = throttle_counters(None)  # known once the driver says its version
        self._round = 0
        self._emit: EmitEvent | None = None
        # every call into NVML but the event watch, in turn on one daemon thread: a call a
        # bad GPU leaves in the kernel never holds the process at exit, and NVML is never
        # shut down under a poll still using its handles
        self._thread: DaemonThread | None = None
        self._stop = threading.Event()
        self._event_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._rediscover = threading.Event()
        self._xids = (
            XidHistory(path=state_dir / f"xids-{_file_safe(node)}.json", boot=boot_id(proc_root))
            if state_dir is not None and not one_shot
            else XidHistory()
        )
        self._recovery_field: int | None = None  # known once the driver says its version
        # whether Fabric Manager runs: asked of the process table unless the caller knows
        self._fabric_manager = fabric_manager or functools.partial(
            fabric_manager_running, proc_root
        )
        self._fabric_manager_running: bool | None = None
        self._fabric_manager_unknown = False  # said why once

    # --- lifecycle -------------------------------------------------------------------

    async def start(self, emit: EmitEvent) -> None:
        self._emit = emit
        await self._call(self._ensure_init)

    async def poll(self) -> NvmlReading:
        return await self._call(self.collect)

    async def close(self) -> None:
        import asyncio

        thread, shutdown = self._begin_close()
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(shutdown)), self._close_s)
        except TimeoutError:
            self._left_blocked()
        thread.shutdown(wait=False, cancel_futures=True)

    # the same, with no event loop (a one-shot reading: Hub.read_once)

    def start_blocking(self, emit: EmitEvent) -> Future[None]:
        self._emit = emit
        return self._submit(self._ensure_init)

    def poll_blocking(self) -> Future[NvmlReading]:
        return self._submit(self.collect)

    def close_blocking(self) -> None:
        thread, shutdown = self._begin_close()
        try:
            shutdown.result(self._close_s)
        except TimeoutError:
            self._left_blocked()
        thread.shutdown(wait=False, cancel_futures=True)

    def _begin_close(self) -> tuple[DaemonThread, Future[None]]:
        thread, self._thread = self._thread or self._new_thread(), None
        self._stop.set()  # the event watch ends even if the shutdown below cannot run
        # The shutdown queues behind a poll that may be stuck in the driver: it is waited for
        # no longer than a poll may take and the event watch's stop (_close_s), then the
        # thread is let go.
        return thread, thread.submit(self._shutdown)

    @property
    def _close_s(self) -> float:
        return self.timeout_s + EVENT_STOP_S

    def _left_blocked(self) -> None:
        log.warning(
            "%s: NVML did not close within %g s: a call is still blocked in the driver; "
            "leaving it", self.node, self._close_s,
        )  # fmt: skip

    def _call(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        import asyncio

        return asyncio.wrap_future(self._submit(fn))

    def _submit(self, fn: Callable[[], T]) -> Future[T]:
        if self._thread is None:
            self._thread = self._new_thread()
        return self._thread.submit(fn)

    def _new_thread(self) -> DaemonThread:
        return DaemonThread(f"nvml-{self.node}")

    def rediscover(self) -> None:
        """Enumerate the GPUs again before the next poll. NVML numbers the GPUs the nvidia
        driver holds when it starts, so after a GPU is bound to or from it (an assign)
        only a restart of NVML shows the change."""
        self._rediscover.set()

    def _shutdown(self) -> None:
        self._stop.set()
        thread = self._event_thread
        if thread is not None:
            thread.join(EVENT_STOP_S)
            self._event_thread = None
        self._xids.flush()  # what the event watcher added since the last poll
        # A later start() discovers afresh: tiers count from the first poll again.
        self._round = 0
        if self._initialized:
            for gpu in self._gpus:
                mig_gpm.free_gpm(self._lib, gpu)
                for mig in gpu.migs:
                    mig_gpm.free_gpm(self._lib, mig)
            try:
                self._lib.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown: %s", exc)
            self._initialized = False

    # --- init ------------------------------------------------------------------------

    def _ensure_init(self) -> None:
        with self._lock:
            if self._initialized:
                return
            if self._lib is None:
                self._lib = system_pynvml()
            lib = self._lib
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
                target=watch_events,
                args=(self._lib, self._gpus, self._stop, self._post_nvml_event),
                name=f"nvml-events {self.node}",
                daemon=True,
            )
            self._event_thread.start()

    def _discover(self) -> None:
        lib = self._lib
        driver = self._try(lambda: text(lib.nvmlSystemGetDriverVersion()))
        nvml = self._try(lambda: text(lib.nvmlSystemGetNVMLVersion()))
        cuda_raw = self._try(lib.nvmlSystemGetCudaDriverVersion)
        cuda = f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}" if isinstance(cuda_raw, int) else None
        self._versions = (driver, nvml, cuda)
        self._throttle_counters = throttle_counters(driver)
        self._recovery_field = recovery_action_field(driver)
        gpus: list[GpuRecord] = []
        unreadable: list[GpuRecord] = []
        for index in range(lib.nvmlDeviceGetCount()):
            try:
                gpu = self._open(index)
            except lib.NVMLError as exc:
                gpus.append(self._unopened(index, exc, unreadable))
                continue
            try:
                self._identify(gpu)
            except GpuLostError as exc:  # it fell off the bus after it opened
                self._mark_lost(gpu, str(exc))
            gpus.append(gpu)
        # NVML started again (a GPU was rebound): one lost before stays the GPU it was, lost
        # since then, its event already told
        former = _former_records(gpus, self._gpus) if unreadable else {}
        for gpu in unreadable:
            before = former.get(gpu.index)
            if before is not None:
                _keep_identity(gpu, before)
        if len(gpus) > sum(":" in g.bus_id for g in gpus):  # one NVML never named
            # here only: sysfs's PCI reader is no cost to a node whose every GPU opens
            from gpuconsole.sources.nvml.pci_names import name_unopened

            name_unopened(gpus, self._sysfs_root, self._proc_root)
        for gpu in unreadable:
            if gpu.lost_since is None:
                self._mark_lost(gpu, gpu.errors[0])
        # A GPU that comes back to NVML (lost before, or gone from its list) was reset by the
        # driver on its way back: its XIDs are history. In a new process, lost before is what
        # the node's last one kept of it.
        seen = {_xid_key(g): g for g in self._gpus}
        for gpu in gpus:
            if gpu.lost_since is not None:
                continue
            key = _xid_key(gpu)
            old = seen.get(key)
            if old is not None:
                back = old.lost_since is not None
            else:  # gone from NVML's list before; or, at this process's start, kept lost
                back = bool(seen) or self._xids.was_lost(key)
            if back:
                self._xids.clear(key, self._clock())
        # and a throttle told before is not news again: each GPU by bus id, not by number
        told = {g.bus_id: g.throttle for g in self._gpus if ":" in g.bus_id}
        for gpu in gpus:
            gpu.throttle = told.get(gpu.bus_id, gpu.throttle)
        self._gpus = gpus
        self._pci_levels = {}

    def _try(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._lib.NVMLError:
            return None

    def _open(self, index: int) -> GpuRecord:
        """A handle to the GPU and what names it: its UUID, model and bus id."""
        lib = self._lib
        h = lib.nvmlDeviceGetHandleByIndex(index)
        return GpuRecord(
            index=index,
            handle=h,
            uuid=text(lib.nvmlDeviceGetUUID(h)),
            name=text(lib.nvmlDeviceGetName(h)),
            bus_id=normal_bus_id(text(lib.nvmlDeviceGetPciInfo(h).busId)),
        )

    def _unopened(self, index: int, exc: Exception, lost: list[GpuRecord]) -> GpuRecord:
        """A GPU NVML counts but did not open: still a GPU the operator must see. One it may
        not open (or that lacks power) is unreadable; any other is added to `lost`."""
        gpu = GpuRecord(index, None, f"unknown-{index}", "unknown", "unknown", errors=[str(exc)])
        reason = OPEN_ERRORS.get(getattr(exc, "value", -1))
        if reason is not None:
            _say_once(self.node, index, f"GPU {index} cannot be opened: {exc}")
            gpu.unopened = reason
        else:
            _say_once(self.node, index, f"GPU {index} unreadable at start: {exc}")
            lost.append(gpu)
        return gpu

    def _identify(self, gpu: GpuRecord) -> None:
        lib, h = self._lib, gpu.handle
        serial = call(lib, gpu, "serial", lib.nvmlDeviceGetSerial, h)
        gpu.serial = text(serial) if serial is not None else None
        gpu.module_id = call(lib, gpu, "module_id", lib.nvmlDeviceGetModuleId, h)
        arch = call(lib, gpu, "architecture", lib.nvmlDeviceGetArchitecture, h)
        gpu.architecture = ARCHITECTURES.get(arch, f"arch{arch}") if arch is not None else None
        # NVML answers the attributes of a MIG device only (nvml.h): a full GPU's SMs are the
        # datasheet's, asked of NVML only for a model the datasheets do not know.
        spec = model_spec(gpu.name)
        if spec is not None:
            gpu.sm_count = spec.sm_count
        else:
            attrs = call(lib, gpu, "attributes", lib.nvmlDeviceGetAttributes, h)
            gpu.sm_count = int(attrs.multiprocessorCount) if attrs is not None else None
        gpu.sm_clock_max_mhz = call(lib, gpu, "max_clock_sm", lib.nvmlDeviceGetMaxClockInfo, h, 1)
        gpu.mem_clock_max_mhz = call(lib, gpu, "max_clock_mem", lib.nvmlDeviceGetMaxClockInfo, h, 2)
        # the link count and the slowdown threshold in one batched call
        fixed = self._field_batch(gpu, "identity_fields", [FI_NVLINK_LINK_COUNT, FI_TEMP_SLOWDOWN])
        slowdown = fixed.get((FI_TEMP_SLOWDOWN, 0))
        if slowdown is None:  # before Ada, or a driver without the field: the call
            slowdown = call(lib, gpu, "temp_slowdown", lib.nvmlDeviceGetTemperatureThreshold, h, 1)
        gpu.temp_slowdown_c = float(slowdown) if slowdown is not None else None
        count = fixed.get((FI_NVLINK_LINK_COUNT, 0))
        if count is not None:
            gpu.nvlink_count = int(count)
        gpu.numa_node = call(lib, gpu, "numa_node", lib.nvmlDeviceGetNumaNodeId, h)
        words = call(lib, gpu, "cpu_affinity", lib.nvmlDeviceGetCpuAffinity, h, 16)
        gpu.cpu_affinity = cpulist(list(words)) if words is not None else None
        gpu.pcie_gen_max = call(lib, gpu, "pcie_gen_max", lib.nvmlDeviceGetMaxPcieLinkGeneration, h)
        gpu.pcie_width_max = call(lib, gpu, "pcie_width_max", lib.nvmlDeviceGetMaxPcieLinkWidth, h)
        if not self._one_shot:  # GPM's rates need a second sample, a poll later
            support = call(lib, gpu, "gpm_support", lib.nvmlGpmQueryDeviceSupport, h)
            gpu.gpm_supported = bool(support is not None and support.isSupportedDevice)
        gpu.fields = self._table_fields(gpu)
        gpu.errors.clear()

    def _table_fields(self, gpu: GpuRecord) -> list[int | tuple[int, int]]:
        """The fields of the batched call, but the NVLink ones: those this driver has."""
        fields: list[int | tuple[int, int]] = [*BASE_FIELDS]
        if gpu.pcie_counter_bits is not None and not self._pcie_counters_hold(gpu):
            fields = [f for f in fields if f not in (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES)]
        if self._recovery_field is not None:
            fields.append(self._recovery_field)
        if gpu.architecture is None or gpu.architecture in BEFORE_AMPERE:
            fields += RETIRED_PAGE_FIELDS  # from Ampere on, row remapping replaces it
        return fields + [fid for fid, _reason in self._throttle_counters]

    def _pcie_counters_hold(self, gpu: GpuRecord) -> bool:
        """Whether the PCIe byte counters cannot wrap twice between two polls, even with the
        link at its top speed (counters.py takes a counter that went back for one wrap). Real
        drivers' are 32 bits: a Gen5 x16 link wraps them every 70 ms, so at any usual interval
        they say nothing and the driver's own rate is read instead."""
        bits = gpu.pcie_counter_bits or 64
        if bits >= 64:
            return True
        lane = PCIE_LANE_BYTES_PER_S.get(gpu.pcie_gen_max or 0)
        if lane is None or not gpu.pcie_width_max:
            return False
        return lane * gpu.pcie_width_max * self.interval_s < 1 << (bits - 1)

    def _pci_level(self, i: int, j: int) -> str:
        """The PCI level between GPUs `i` < `j` (nvidia-smi topo's code), asked once."""
        known = self._pci_levels.get((i, j))
        if known is not None:
            return known
        lib, a, b = self._lib, self._gpus[i], self._gpus[j]
        if a.handle is None or b.handle is None:
            return "?"  # asked again once it opens
        try:
            level = lib.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle)
        except lib.NVMLError:
            level = None
        code = TOPO_CODES.get(level, "?") if level is not None else "?"
        self._pci_levels[(i, j)] = code
        return code

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
            self._fabric_manager_running = self._fabric_manager_state(gpus)
        driver, nvml, cuda = self._versions
        self._xids.flush()
        return NvmlReading(
            at=self._clock(),
            driver_version=driver,
            nvml_version=nvml,
            cuda_driver_version=cuda,
            gpus=gpus,
            gpu_topology=self._gpu_topology,
            fabric_manager_running=self._fabric_manager_running,
            simulated=self.simulated,
        )

    def _fabric_manager_state(self, gpus: Sequence[GpuReading]) -> bool | None:
        """Whether Fabric Manager runs, where the GPUs need it: on an NVSwitch system (a GPU
        that has a fabric state); None elsewhere."""
        if not any(g.fabric_state not in (None, "not_supported") for g in gpus):
            return None
        if any(g.virtualization_mode == "passthrough" for g in gpus):
            return None  # a guest: Fabric Manager runs on the host or a service VM, unseen here
        try:
            return self._fabric_manager()
        except OSError as exc:
            # said once: an operator must not read "not known" as "not running"
            if not self._fabric_manager_unknown:
                log.warning("whether Fabric Manager runs is not known: %s", exc)
            self._fabric_manager_unknown = True
            return None

    def _read_gpu(self, gpu: GpuRecord, detail: bool, inventory: bool) -> GpuReading:
        gpu.errors.clear()
        if gpu.unopened is not None:
            return self._unopened_reading(gpu)
        if gpu.lost_since is not None and not (inventory and self._revived(gpu)):
            return self._lost_reading(gpu)
        try:
            return self._read_live(gpu, detail, inventory)
        except GpuLostError as exc:
            self._mark_lost(gpu, str(exc))
            return self._lost_reading(gpu)

    def _revived(self, gpu: GpuRecord) -> bool:
        if gpu.handle is None:
            return False
        # A reading the driver must ask the GPU for: the library answers the UUID (and the
        # name) of a lost GPU from what it read at attach.
        try:
            self._lib.nvmlDeviceGetPerformanceState(gpu.handle)
        except self._lib.NVMLError as exc:
            if getattr(exc, "value", None) not in (
                NOT_SUPPORTED,
                FUNCTION_NOT_FOUND,
                NO_PERMISSION,
            ):
                return False
        log.warning("GPU %d answers again", gpu.index)
        gpu.lost_since = None
        # a lost GPU answers again only after a reset
        self._xids.clear(_xid_key(gpu), self._clock())
        self._post(
            Event(
                self._clock(),
                self.node,
                self.kind,
                "gpu_recovered",
                Severity.INFO,
                f"{gpu_words(gpu.index, gpu.bus_id)} answers again",
                gpu.index,
                gpu.uuid,
                gpu_bus_id=known_bus_id(gpu.bus_id),
            )
        )
        return True

    def _mark_lost(self, gpu: GpuRecord, why: str) -> None:
        gpu.lost_since = self._clock()
        self._xids.mark_lost(_xid_key(gpu))
        bus = known_bus_id(gpu.bus_id)
        uuid = gpu.uuid if bus is not None else None  # not 'unknown-N': it never said either
        self._post(
            Event(
                gpu.lost_since,
                self.node,
                self.kind,
                "gpu_lost",
                Severity.CRITICAL,
                f"{gpu_words(gpu.index, bus)} is lost ({why})",
                gpu.index,
                uuid,
                79,
                bus,
            )
        )

    def _lost_reading(self, gpu: GpuRecord) -> GpuReading:
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
            xids=self._gpu_xids(gpu),
            reset_at=self._xids.reset_at(_xid_key(gpu), self._clock()),
            error="GPU is lost: it fell off the bus or needs a reset",
        )

    def _unopened_reading(self, gpu: GpuRecord) -> GpuReading:
        return GpuReading(
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.bus_id,
            state=GpuState.UNREADABLE,
            error=f"NVML counts this GPU but cannot open it: {gpu.unopened}",
        )

    def _read_live(self, gpu: GpuRecord, detail: bool, inventory: bool) -> GpuReading:
        lib, h = self._lib, gpu.handle
        if inventory:
            gpu.reprobe = gpu.unsupported | gpu.denied
            self._read_inventory(gpu)
            # every field, those once NotSupported too, and what the links need to be known,
            # in the poll's one batched call; _read_fields marks what is still NotSupported
            gpu.fields = self._table_fields(gpu)
            gpu.unsupported.difference_update(f"field {f}" for f in gpu.fields)
            values = self._read_fields(gpu, self._link_probe(gpu))
            self._read_links(gpu, values)
        else:
            values = self._read_fields(gpu)
        util = call(lib, gpu, "utilization", lib.nvmlDeviceGetUtilizationRates, h)
        mem = call(lib, gpu, "memory_v2", lib.nvmlDeviceGetMemoryInfo, h, version=lib.nvmlMemory_v2)
        if mem is None and "memory_v2" in gpu.unsupported:
            mem = call(lib, gpu, "memory", lib.nvmlDeviceGetMemoryInfo, h)
        temp = call(lib, gpu, "temperature", lib.nvmlDeviceGetTemperatureV, h, 0)
        if temp is None and "temperature" in gpu.unsupported:  # before R560: the older call
            temp = call(lib, gpu, "temperature_legacy", lib.nvmlDeviceGetTemperature, h, 0)
        if inventory:
            gpu.pcie_busy = util.gpu >= BUSY_UTIL_PCT if util is not None else None
        if detail:
            self._read_detail(gpu)
        self._update_throttle(gpu, values)

        def field(fid: int, scope: int = 0) -> Any:
            return values.get((fid, scope))

        power_mw = field(FI_POWER_INSTANT)
        if power_mw is None and FI_POWER_INSTANT not in gpu.fields:
            power_mw = call(lib, gpu, "power_usage", lib.nvmlDeviceGetPowerUsage, h)
        limit_mw = field(FI_POWER_LIMIT)
        if limit_mw is None and inventory and FI_POWER_LIMIT not in gpu.fields:
            limit_mw = call(lib, gpu, "power_limit", lib.nvmlDeviceGetEnforcedPowerLimit, h)
        if limit_mw is not None:
            gpu.power_limit_w = limit_mw / 1000.0
        recovery = field(FI_RECOVERY_ACTION) if self._recovery_field is not None else None
        links = tuple(
            NvLinkReading(
                link=link.link,
                active=link.active,
                version=link.version,
                remote_kind=link.remote_kind,
                remote_pci_bus_id=link.remote_pci_bus_id,
                tx_kib_total=field(FI_NVLINK_TX, link.link) if link.active else None,
                rx_kib_total=field(FI_NVLINK_RX, link.link) if link.active else None,
                replay_errors_total=link.errors[0] if link.active else None,
                recovery_errors_total=link.errors[1] if link.active else None,
                crc_errors_total=link.errors[2] if link.active else None,
            )
            for link in gpu.links
        )
        pending, failure = field(FI_REMAPPED_PENDING), field(FI_REMAPPED_FAILURE)
        retired_pending = field(FI_RETIRED_PENDING)
        replays = field(FI_PCIE_REPLAY)
        replays_climbed, replays_s = 0, (None if replays is None else 0.0)
        if replays is not None:
            climbed = gpu.replays.add(self._clock(), 0, (replays,))
            if climbed is not None:
                replays_climbed, replays_s = climbed[0][0], climbed[1]
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
            # NVML's v1 has no reservation (it counts it as used): unknown, not 0
            mem_reserved_bytes=int(mem.reserved) if hasattr(mem, "reserved") else None,
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
            throttle_known=gpu.throttle_mask_read or bool(gpu.throttle_ns),
            ecc=EccReading(
                volatile_corrected=field(FI_ECC_SBE_VOL),
                volatile_uncorrected=field(FI_ECC_DBE_VOL),
                aggregate_corrected=field(FI_ECC_SBE_AGG),
                aggregate_uncorrected=field(FI_ECC_DBE_AGG),
                remapped_corrected=field(FI_REMAPPED_COR),
                remapped_uncorrected=field(FI_REMAPPED_UNC),
                remap_pending=bool(pending) if pending is not None else None,
                remap_failure=bool(failure) if failure is not None else None,
                retired_sbe=field(FI_RETIRED_SBE),
                retired_dbe=field(FI_RETIRED_DBE),
                retired_pending=bool(retired_pending) if retired_pending is not None else None,
            ),
            pcie=PcieReading(
                gen_current=gpu.pcie_gen,
                gen_max=gpu.pcie_gen_max,
                width_current=gpu.pcie_width,
                width_max=gpu.pcie_width_max,
                busy=gpu.pcie_busy,
                replay_count=replays,
                replays_climbed=replays_climbed,
                replays_climbed_s=replays_s,
                tx_bytes_total=field(FI_PCIE_TX_BYTES),
                rx_bytes_total=field(FI_PCIE_RX_BYTES),
                bytes_counter_bits=gpu.pcie_counter_bits or 64,
                tx_bytes_per_s=gpu.pcie_tx_bytes_per_s,
                rx_bytes_per_s=gpu.pcie_rx_bytes_per_s,
            ),
            nvlinks=links,
            nvlink_errors=gpu.nvlink_climbed,
            slowdown_since=gpu.slowdown_since,
            numa_node=gpu.numa_node,
            cpu_affinity=gpu.cpu_affinity,
            processes=gpu.processes,
            mig_enabled=gpu.mig_enabled,
            mig_pending=gpu.mig_pending,
            mig_instances=mig_gpm.mig_readings(gpu),
            virtualization_mode=gpu.virtualization,
            fabric_state=gpu.fabric_state,
            fabric_status=gpu.fabric_status,
            recovery_action=int(recovery) if recovery is not None else None,
            xids=self._gpu_xids(gpu),
            reset_at=self._xids.reset_at(_xid_key(gpu), self._clock()),
            gpm=gpu.gpm,
            unsupported=_unsupported(gpu),
            denied=denied_readings(gpu.denied),
        )

    def _field_batch(
        self, gpu: GpuRecord, key: str, asked: Sequence[int | tuple[int, int]]
    ) -> dict[tuple[int, int], Any]:
        """Fields in one batched call, by (field, scope): those the GPU answered."""
        return self._field_values(gpu, key, asked)[0]

    def _field_values(
        self, gpu: GpuRecord, key: str, asked: Sequence[int | tuple[int, int]]
    ) -> tuple[dict[tuple[int, int], Any], list[int | tuple[int, int]]]:
        """One nvmlDeviceGetFieldValues: the values answered, and the fields NotSupported."""
        if not asked:
            return {}, []
        lib = self._lib
        result = call(lib, gpu, key, field_values, lib, gpu.handle, asked)
        if result is None:
            return {}, []
        values: dict[tuple[int, int], Any] = {}
        dropped: list[int | tuple[int, int]] = []
        # Unpacked from the array's bytes: pynvml's per-attribute wrapper costs more than
        # the trip into the driver.
        for requested, (fid, scope, kind, ret, raw) in zip(
            asked, FIELD_VALUE.iter_unpack(bytes(result)), strict=False
        ):
            if ret == OK:
                values[(fid, scope)] = VALUE_TYPES.get(kind, VALUE_TYPES[3]).unpack(raw)[0]
                if fid == FI_PCIE_TX_BYTES and gpu.pcie_counter_bits is None:
                    gpu.pcie_counter_bits = counter_bits(kind)
            elif ret == GPU_IS_LOST:
                raise GpuLostError("field values: GPU is lost")
            elif ret in UNSUPPORTED_CODES:
                dropped.append(requested)
        return values, dropped

    def _read_fields(
        self, gpu: GpuRecord, extra: Sequence[int | tuple[int, int]] = ()
    ) -> dict[tuple[int, int], Any]:
        """The batched call: every field this GPU supports (and `extra`, asked once), in one
        trip. A field of the poll's own that is NotSupported is left out from then on."""
        values, dropped = self._field_values(gpu, "field_values", [*gpu.fields, *extra])
        if (FI_PCIE_TX_BYTES, 0) in values and not self._pcie_counters_hold(gpu):
            log.info(
                "GPU %d: its PCIe byte counters are %s bits wide and wrap faster than it is "
                "polled; reading the driver's PCIe rate instead",
                gpu.index,
                gpu.pcie_counter_bits,
            )
            values.pop((FI_PCIE_TX_BYTES, 0), None)
            values.pop((FI_PCIE_RX_BYTES, 0), None)
            gpu.fields = [f for f in gpu.fields if f not in (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES)]
        own = [f for f in dropped if f in gpu.fields]
        if own:
            gpu.fields = [f for f in gpu.fields if f not in own]
            gpu.unsupported.update(f"field {f if isinstance(f, int) else f[0]}" for f in own)
        return values

    def _read_detail(self, gpu: GpuRecord) -> None:
        lib, h = self._lib, gpu.handle
        gpu.sm_clock_mhz = call(lib, gpu, "clock_sm", lib.nvmlDeviceGetClockInfo, h, 1)
        gpu.pstate = call(lib, gpu, "pstate", lib.nvmlDeviceGetPerformanceState, h)
        mask = call(lib, gpu, "clocks_event_reasons", lib.nvmlDeviceGetCurrentClocksEventReasons, h)
        gpu.throttle_mask_read = mask is not None
        gpu.throttle_mask = (
            tuple(name for bit, name in THROTTLE_BITS if mask & bit) if mask is not None else ()
        )
        procs = call(lib, gpu, "processes", running_processes, lib, h)
        if procs is not None:
            gpu.processes = tuple(_process(p) for p in procs)
        elif "processes" in gpu.denied and gpu.migs:
            self._read_mig_processes(gpu)
        mig_gpm.read_mig_memory(lib, gpu)
        if gpu.gpm_supported:
            mig_gpm.read_gpm(lib, gpu)
        # the driver's rate samples 20 ms per call (21 ms on an H200): a one-shot leaves the rate
        # out where the byte counters cannot give it, as they cannot from one sample
        if FI_PCIE_TX_BYTES not in gpu.fields and not _pcie_from_gpm(gpu) and not self._one_shot:
            self._read_pcie_throughput(gpu)

    def _read_mig_processes(self, gpu: GpuRecord) -> None:
        """Only root may list a MIG-enabled GPU's processes; each MIG device lists its own
        to anyone."""
        lib = self._lib
        found: list[ProcessReading] = []
        for mig in gpu.migs:
            key = f"mig_processes {mig.gpu_instance_id}"
            procs = call(lib, gpu, key, running_processes, lib, mig.handle)
            for p in procs or ():
                found.append(_process(p, mig.gpu_instance_id, mig.compute_instance_id))
        gpu.processes = tuple(found)

    def _read_pcie_throughput(self, gpu: GpuRecord) -> None:
        """Where the driver has no PCIe byte counters: its own rate, sampled over 20 ms."""
        lib, h = self._lib, gpu.handle
        fn = getattr(lib, "nvmlDeviceGetPcieThroughput", None)
        tx = call(lib, gpu, "pcie_throughput", fn, h, PCIE_UTIL_TX)
        rx = call(lib, gpu, "pcie_throughput", fn, h, PCIE_UTIL_RX)
        gpu.pcie_tx_bytes_per_s = tx * 1024.0 if tx is not None else None  # KB/s
        gpu.pcie_rx_bytes_per_s = rx * 1024.0 if rx is not None else None

    def _update_throttle(self, gpu: GpuRecord, values: dict[tuple[int, int], Any]) -> None:
        """Reasons that held the clocks down: the last bitmask, plus every reason whose
        time counter moved since the previous poll (so a slowdown that starts between two
        bitmask reads shows at once; one that ends shows at the next bitmask read).
        """
        moved: set[str] = set()
        for fid, reason in self._throttle_counters:
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
        first, gpu.throttle_seen = not gpu.throttle_seen, True
        if HOT_THROTTLE.isdisjoint(throttle):
            gpu.slowdown_since, gpu.slowdown_unknown = None, False
        elif gpu.slowdown_since is None and not gpu.slowdown_unknown:
            if not first:  # began between this poll and the last
                gpu.slowdown_since = self._clock()
                return
            # already held at the first poll: the driver's counters (575 and later) say how
            # long it was held (the most any slowdown counter holds); without them, since
            # when is not known
            held_ns = [
                values[(fid, 0)]
                for fid, reason in self._throttle_counters
                if reason in HOT_THROTTLE and (fid, 0) in values
            ]
            if held_ns:
                gpu.slowdown_since = self._clock() - max(held_ns) / 1e9
            else:
                gpu.slowdown_unknown = True

    def _throttle_changed(
        self, gpu: GpuRecord, before: tuple[str, ...], now: tuple[str, ...]
    ) -> None:
        """An event when the reasons that slow a GPU down start or stop (idle is not one)."""
        old, new = set(before) - BENIGN_THROTTLE, set(now) - BENIGN_THROTTLE
        if old == new:
            return
        where = gpu_words(gpu.index, gpu.bus_id)
        if new:
            words = ", ".join(THROTTLE_WORDS.get(r, r) for r in sorted(new))
            severity = Severity.WARNING if new & HOT_THROTTLE else Severity.INFO
            message = f"{where} throttled: {words}"
        else:
            severity, message = Severity.INFO, f"{where} no longer throttled"
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
                gpu_bus_id=known_bus_id(gpu.bus_id),
            )
        )

    def _read_inventory(self, gpu: GpuRecord) -> None:
        lib, h = self._lib, gpu.handle
        gpu.mem_clock_mhz = call(lib, gpu, "clock_mem", lib.nvmlDeviceGetClockInfo, h, 2)
        gpu.pcie_gen = call(lib, gpu, "pcie_gen", lib.nvmlDeviceGetCurrPcieLinkGeneration, h)
        gpu.pcie_width = call(lib, gpu, "pcie_width", lib.nvmlDeviceGetCurrPcieLinkWidth, h)
        mode = call(lib, gpu, "virtualization", lib.nvmlDeviceGetVirtualizationMode, h)
        gpu.virtualization = VIRTUALIZATION.get(mode, str(mode)) if mode is not None else None
        self._read_fabric(gpu)
        mig_gpm.read_mig(lib, gpu)

    def _read_fabric(self, gpu: GpuRecord) -> None:
        """The GPU's NVSwitch fabric: its state, and once it completed, how (its status, an
        nvmlReturn_t: not 0 where the GPU failed to join the fabric)."""
        lib = self._lib
        info_type = getattr(lib, "c_nvmlGpuFabricInfo_t", None)
        gpu.fabric_state = gpu.fabric_status = None
        if info_type is None:
            return
        info = info_type()
        fn = lib.nvmlDeviceGetGpuFabricInfo
        if call(lib, gpu, "fabric_info", fn, gpu.handle, ctypes.byref(info)) is None:
            return  # no fabric (NotSupported), or not known this round
        state = int(info.state)
        gpu.fabric_state = FABRIC_STATES.get(state, str(state))
        # the probe's result means something once the probe ended
        gpu.fabric_status = int(info.status) if state == FABRIC_COMPLETED else None

    def _link_probe(self, gpu: GpuRecord) -> list[int | tuple[int, int]]:
        """What the inventory round asks of every link in the poll's batched call: its state,
        its NVLink version, its byte counters, how many links reach an NVSwitch, and (but in
        a one-shot, which sees no counter climb) its error counters."""
        if not gpu.nvlink_count:
            return []
        asked: list[int | tuple[int, int]] = [FI_NVSWITCH_LINK_COUNT]
        errors = () if self._one_shot else NVLINK_ERROR_FIELDS
        for n in range(gpu.nvlink_count):
            asked += [(FI_NVLINK_STATE, n), (FI_NVLINK_VERSION, n)]
            asked += [(FI_NVLINK_TX, n), (FI_NVLINK_RX, n)]
            asked += [(fid, n) for fid in errors]
        return asked

    def _read_links(self, gpu: GpuRecord, values: dict[tuple[int, int], Any]) -> None:
        """Each link from the batched call's answers (a link the driver did not answer there
        is asked on its own); then the links' byte counters join the poll's fields."""
        lib, h = self._lib, gpu.handle
        known = {link.link: link for link in gpu.links}
        # Every link of a GPU speaks one NVLink generation.
        version = next((link.version for link in gpu.links if link.version is not None), None)
        links: list[LinkRecord] = []
        to_switches = values.get((FI_NVSWITCH_LINK_COUNT, 0))
        states = {
            n: bool(values[(FI_NVLINK_STATE, n)])
            for n in range(gpu.nvlink_count)
            if (FI_NVLINK_STATE, n) in values
        }
        if to_switches is not None and to_switches != sum(states.values()):
            to_switches = None  # some links reach something else: each is asked what
        for n in range(gpu.nvlink_count):
            state = states.get(n)
            if state is None:
                state = call(lib, gpu, "nvlink_state", lib.nvmlDeviceGetNvLinkState, h, n)
            if state is None:
                continue
            link = known.get(n) or LinkRecord(n, bool(state))
            link.active = bool(state)
            if link.active and link.version is None:
                if version is None:
                    raw = values.get((FI_NVLINK_VERSION, n))
                    if raw is None:
                        raw = call(lib, gpu, "nvlink_version", lib.nvmlDeviceGetNvLinkVersion, h, n)
                    version = NVLINK_GENERATIONS.get(raw) if raw is not None else None
                link.version = version
            if link.active and link.remote_kind is RemoteKind.UNKNOWN:
                if to_switches:
                    link.remote_kind = RemoteKind.NVSWITCH
                else:
                    kind = call(
                        lib,
                        gpu,
                        "nvlink_remote_type",
                        lib.nvmlDeviceGetNvLinkRemoteDeviceType,
                        h,
                        n,
                    )
                    link.remote_kind = REMOTE_KINDS.get(kind, RemoteKind.UNKNOWN)
            # The far end's bus id, once per link (the wiring does not change while the node
            # runs). A one-shot leaves it out for a link to an NVSwitch: the topology needs only
            # the kind there, and the 18 calls of a Hopper GPU would be most of what it asks.
            if (
                link.active
                and link.remote_pci_bus_id is None
                and not (self._one_shot and link.remote_kind is RemoteKind.NVSWITCH)
            ):
                pci = call(
                    lib, gpu, "nvlink_remote_pci", lib.nvmlDeviceGetNvLinkRemotePciInfo, h, n
                )
                link.remote_pci_bus_id = normal_bus_id(text(pci.busId)) if pci is not None else None
            links.append(link)
        gpu.links = links
        self._link_errors(gpu, values)
        for link in links:
            if link.active:
                gpu.fields += [(FI_NVLINK_TX, link.link), (FI_NVLINK_RX, link.link)]

    def _link_errors(self, gpu: GpuRecord, values: dict[tuple[int, int], Any]) -> None:
        """The active links' error counters, as the inventory round's batched call answered
        them (every 30 polls is often enough for a climb over ten minutes, and keeps 54
        entries per Hopper GPU out of every other poll), and how far each climbed over the
        window. A counter NotSupported on every link (Blackwell) is listed, not an error."""
        if self._one_shot:
            return
        window, now = gpu.link_errors, self._clock()
        active = [link for link in gpu.links if link.active]
        for fid in NVLINK_ERROR_FIELDS:
            if any((fid, link.link) in values for link in active):
                gpu.unsupported.discard(f"field {fid}")
            elif active:
                gpu.unsupported.add(f"field {fid}")
        climbed = []
        for link in active:
            replay = values.get((FI_NVLINK_ERROR_REPLAY, link.link))
            recovery = values.get((FI_NVLINK_ERROR_RECOVERY, link.link))
            crc = values.get((FI_NVLINK_ERROR_CRC, link.link))
            link.errors = (replay, recovery, crc)
            if replay is None and recovery is None and crc is None:
                continue
            moved = window.add(now, link.link, replay, recovery, crc)
            if moved is not None:
                climbed.append(moved)
        window.forget({link.link for link in active if link.errors != (None, None, None)})
        gpu.nvlink_climbed = tuple(climbed)

    def _topology(self) -> tuple[tuple[str, ...], ...]:
        """PCI levels from NVML, with NV# where NVLinks join two GPUs (or both reach NVSwitch):
        the level is asked only of pairs no NVLink joins (an NVSwitch node asks none)."""
        gpus = self._gpus
        rows: list[tuple[str, ...]] = []
        for i, a in enumerate(gpus):
            row: list[str] = []
            for j, b in enumerate(gpus):
                if i == j:
                    row.append("X")
                elif links := _nvlinks_between(a, b):
                    row.append(f"NV{links}")
                else:
                    row.append(self._pci_level(min(i, j), max(i, j)))
            rows.append(tuple(row))
        return tuple(rows)

    # --- events ----------------------------------------------------------------------

    def _post(self, event: Event) -> None:
        if self._emit is not None:
            self._emit(event)

    def _post_nvml_event(self, data: Any, gpus: list[GpuRecord]) -> None:
        """An event from NVML's event set (in the watcher's thread) to the hub; an XID is
        counted for its GPU too."""
        event = event_from(data, gpus, self._clock(), self.node, self.kind)
        gpu = event.gpu_bus_id or event.gpu_uuid
        if event.kind == "xid" and event.code is not None and gpu:
            self._xids.add(gpu, event.code, event.at)
        self._post(event)

    def _gpu_xids(self, gpu: GpuRecord) -> tuple[XidCount, ...]:
        return self._xids.counts(_xid_key(gpu), self._clock())


def _former_records(now: list[GpuRecord], before: list[GpuRecord]) -> dict[int, GpuRecord]:
    """For each GPU that could not name itself at this start (by NVML index), its record
    from before NVML restarted, where only one record can be it.

    NVML enumerates in the same order each time it starts, less the GPUs that left its
    driver: a run of unreadable GPUs lies where, in the order before, the GPUs between its
    readable neighbours were, and is those of them not read now. The ones lost already
    are taken first (one that was healthy may have left for vfio-pci instead).
    """
    place = {b.bus_id: k for k, b in enumerate(before) if ":" in b.bus_id}
    read = {g.bus_id for g in now if g.bus_id in place}
    found: dict[int, GpuRecord] = {}
    run: list[GpuRecord] = []
    lower = -1
    for gpu in [*now, None]:
        if gpu is not None and gpu.bus_id not in place:
            if ":" not in gpu.bus_id:
                run.append(gpu)
            continue  # one new to NVML (back from vfio-pci) tells nothing of the order before
        upper = place[gpu.bus_id] if gpu is not None else len(before)
        if run:
            gone = [b for b in before[lower + 1 : upper] if b.bus_id not in read]
            lost = [b for b in gone if b.lost_since is not None]
            pool = lost if len(lost) == len(run) else gone
            if len(pool) == len(run):
                found.update(zip((g.index for g in run), pool, strict=True))
            run = []
        if gpu is not None:
            lower = upper
    return found


def _keep_identity(gpu: GpuRecord, before: GpuRecord) -> None:
    """What an unreadable GPU cannot say about itself, as it said it before (if it could);
    lost since then, if it was lost already."""
    gpu.lost_since = before.lost_since
    if ":" not in before.bus_id:
        return
    gpu.uuid, gpu.name, gpu.bus_id = before.uuid, before.name, before.bus_id
    gpu.serial, gpu.module_id = before.serial, before.module_id
    gpu.architecture, gpu.sm_count = before.architecture, before.sm_count
    gpu.numa_node, gpu.cpu_affinity = before.numa_node, before.cpu_affinity


def _pcie_from_gpm(gpu: GpuRecord) -> bool:
    """Take the PCIe rates from GPM where it measured them: the driver's own rate call
    samples for 20 ms each time (21 ms per call on an H200, 580.159.04), so a node of 8 GPUs
    would wait a third of a second per poll for what GPM already averaged over the interval."""
    gpm = gpu.gpm
    if gpm is None or gpm.pcie_tx_bytes_per_s is None or gpm.pcie_rx_bytes_per_s is None:
        return False
    gpu.pcie_tx_bytes_per_s = gpm.pcie_tx_bytes_per_s
    gpu.pcie_rx_bytes_per_s = gpm.pcie_rx_bytes_per_s
    return True


def _file_safe(name: str) -> str:
    """A node's name as part of a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "node"


def _xid_key(gpu: GpuRecord) -> str:
    """What a GPU's XIDs are kept by: its bus id, its UUID where NVML never said the bus id."""
    return known_bus_id(gpu.bus_id) or gpu.uuid


def _nvlinks_between(a: GpuRecord, b: GpuRecord) -> int:
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


def _unsupported(gpu: GpuRecord) -> tuple[str, ...]:
    """What this GPU cannot tell, as NVML calls: not those another call or the datasheet
    answered for (a full GPU's attributes, where its model says how many SMs it has)."""
    missing = gpu.unsupported
    shown = {key for key in missing if STAND_INS.get(key, key) in missing}
    if gpu.sm_count is not None:
        shown.discard("attributes")
    return tuple(sorted(shown))


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _process(p: Any, mig_gi: int | None = None, mig_ci: int | None = None) -> ProcessReading:
    """One process NVML listed; `mig_gi`/`mig_ci` are the instance of the MIG device that
    listed it, where NVML leaves them out."""
    gi = getattr(p, "gpuInstanceId", NA_ID)
    ci = getattr(p, "computeInstanceId", NA_ID)
    used = getattr(p, "usedGpuMemory", None)
    return ProcessReading(
        pid=int(p.pid),
        # NVML's "not available" (WDDM) where the struct comes straight from the library
        used_mem_bytes=int(used) if used not in (None, NOT_AVAILABLE_U64) else None,
        gpu_instance_id=mig_gi if gi in (None, NA_ID) else int(gi),
        compute_instance_id=mig_ci if ci in (None, NA_ID) else int(ci),
    )
