"""An in-process stand-in for the `pynvml` module, backed by a SimNode.

It answers the same function names with the same shapes (ctypes structures where the NVML
source reads them as such) and raises pynvml's own NVMLError subclasses, so the NVML
source runs unchanged. Calls are counted like the fake C library counts them.

Like a real host's driver, it does not see a GPU bound to vfio-pci for a guest: the count
is smaller and NVML's indices run over the GPUs it sees, in enumeration order.

It plays one driver branch (gpuconsole.sim.drivers; by default the one the node profile names)
as the fake C library does: nvmlDeviceGetTemperatureV only from 560, the PCIe byte counters
only from 560 and 32 bits wide, the clock-event time counters at that branch's field ids, the
GPU recovery action (field 230) from 565: none, or what `recovery_actions` says for a GPU; the
NVLink error counters (161-163, per link; not on Blackwell) and, before Ampere, the retired
pages (29-31), as the nvlinkerr and retired scenarios move them. It
has no power-smoothing fields and no idle PCIe link training: the fake library has both.

Built with ``privileged=False`` it answers as the driver answers an unprivileged user:
NO_PERMISSION for a MIG-enabled GPU's memory and processes, for nvmlDeviceGetGpuInstanceById
and for GPM.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import pynvml

from gpuconsole.hardware import TOPO_LEVEL
from gpuconsole.sim.drivers import DriverProfile, driver_profile
from gpuconsole.sim.fakenvml import NVLINK_VERSION_ENUM
from gpuconsole.sim.node import SimMigSlice, SimNode, xid_of

F = TypeVar("F", bound=Callable[..., Any])

IDENTITY_CALLS = frozenset(
    {
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetHandleByIndex",
    }
)


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class SimDevice:
    """A GPU handle: `index` is the GPU's place in the profile (what the physics and the
    topology use), `nvml_index` the index NVML gives it on this host."""

    def __init__(self, index: int, nvml_index: int | None = None) -> None:
        self.index = index
        self.nvml_index = index if nvml_index is None else nvml_index


class SimMigDevice:
    """A MIG device handle."""

    def __init__(self, parent: SimDevice, mig: SimMigSlice) -> None:
        self.parent = parent
        self.mig = mig


class _Sample:
    def __init__(self) -> None:
        self.buffer = ctypes.create_string_buffer(16)
        self.pointer = ctypes.cast(self.buffer, pynvml.c_nvmlGpmSample_t)
        self.taken: tuple[float, float, SimDevice, int | None] | None = None


def _counted(fn: F) -> F:
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: SimNvml, *args: Any, **kwargs: Any) -> Any:
        self.calls[name] += 1
        if not self._initialized and name not in ("nvmlInit", "nvmlInitWithFlags"):
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if args and isinstance(args[0], SimDevice | SimMigDevice):
            device = args[0].parent if isinstance(args[0], SimMigDevice) else args[0]
            self.device_calls[device.index] += 1
            if self.node.lost(device.index):
                raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
            if name not in IDENTITY_CALLS and self.node.active("notsupported", device.index):
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class SimNvml:
    """A pynvml-shaped view of one SimNode."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION

    def __init__(
        self, node: SimNode, driver: DriverProfile | str | None = None, *, privileged: bool = True
    ) -> None:
        self.node = node
        self.privileged = privileged
        plays = (
            driver
            if isinstance(driver, DriverProfile)
            else driver_profile(driver or node.profile.driver_version)
        )
        if plays is None:
            raise ValueError(f"no driver profile plays {driver or node.profile.driver_version!r}")
        self.driver = plays
        self.calls: Counter[str] = Counter()
        self.device_calls: Counter[int] = Counter()  # calls per GPU index
        self._initialized = False
        self._devices: list[SimDevice] = []
        self._by_gpu: dict[int, SimDevice] = {}
        self._enumerate()
        self._samples: dict[int, _Sample] = {}
        self._delivered: set[tuple[str, int]] = set()
        # nvmlDeviceGpuRecoveryAction_t the driver advises, by GPU index (0, none, elsewhere)
        self.recovery_actions: dict[int, int] = {}
        # (nvmlGpuFabricState_t, status) of a GPU's fabric probe (completed, success elsewhere)
        self.fabric_probes: dict[int, tuple[int, int]] = {}

    def _enumerate(self) -> None:
        """Number the GPUs the host's driver holds, as NVML does when it starts."""
        node = self.node
        visible = [g.index for g in node.profile.gpus if node.visible(g.index)]
        self._devices = [SimDevice(i, n) for n, i in enumerate(visible)]
        self._by_gpu = {d.index: d for d in self._devices}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            # pynvml resolves symbols lazily and raises FunctionNotFound for absent ones.
            def missing(*_args: Any, **_kwargs: Any) -> Any:
                self.calls[name] += 1
                raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

            return missing
        raise AttributeError(name)

    # --- system ----------------------------------------------------------------------

    @_counted
    def nvmlInit(self) -> None:
        self._enumerate()  # a GPU rebound since the last init (a demo assign) is seen now
        self._initialized = True

    @_counted
    def nvmlShutdown(self) -> None:
        self._initialized = False

    @_counted
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver.version

    @_counted
    def nvmlSystemGetNVMLVersion(self) -> str:
        return f"{self.driver.cuda_driver_version // 1000}.{self.driver.version}"

    @_counted
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.driver.cuda_driver_version

    @_counted
    def nvmlDeviceGetCount(self) -> int:
        return len(self._devices)

    @_counted
    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimDevice:
        if not 0 <= index < len(self._devices):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._devices[index]

    @_counted
    def nvmlDeviceGetIndex(self, h: SimDevice) -> int:
        return h.nvml_index

    # --- identity --------------------------------------------------------------------

    def _slot(self, h: SimDevice) -> Any:
        return self.node.profile.gpus[h.index]

    @_counted
    def nvmlDeviceGetName(self, h: SimDevice | SimMigDevice) -> str:
        if isinstance(h, SimMigDevice):
            return f"{self.node.model.name} MIG {h.mig.profile.name}"
        return self.node.model.name

    @_counted
    def nvmlDeviceGetUUID(self, h: SimDevice | SimMigDevice) -> str:
        if isinstance(h, SimMigDevice):
            return h.mig.uuid
        return self.node.uuids[h.index]

    @_counted
    def nvmlDeviceGetSerial(self, h: SimDevice) -> str:
        return self.node.serials[h.index]

    @_counted
    def nvmlDeviceGetPciInfo(self, h: SimDevice) -> Any:
        slot = self._slot(h)
        return SimpleNamespace(
            busId=slot.bus_id,
            pciDeviceId=self.node.model.pci_device_id,
            domain=0,
            bus=int(slot.bus_id.split(":")[1], 16),
            device=0,
        )

    @_counted
    def nvmlDeviceGetModuleId(self, h: SimDevice) -> int:
        return int(self._slot(h).module_id)

    @_counted
    def nvmlDeviceGetArchitecture(self, h: SimDevice) -> int:
        return self.node.model.arch_code

    @_counted
    def nvmlDeviceGetAttributes(self, h: SimDevice | SimMigDevice) -> Any:
        if not isinstance(h, SimMigDevice):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # MIG device handles only
        p = h.mig.profile
        return SimpleNamespace(
            multiprocessorCount=p.sm_count,
            gpuInstanceSliceCount=p.slices,
            computeInstanceSliceCount=p.slices,
            memorySizeMB=p.mem_bytes // 2**20,
        )

    @_counted
    def nvmlDeviceGetMaxClockInfo(self, h: SimDevice, clock: int) -> int:
        m = self.node.model
        return m.sm_clock_max_mhz if clock in (0, 1) else m.mem_clock_mhz

    @_counted
    def nvmlDeviceGetTemperatureThreshold(self, h: SimDevice, threshold: int) -> int:
        m = self.node.model
        return m.temp_slowdown_c if threshold == 1 else m.temp_shutdown_c

    @_counted
    def nvmlDeviceGetNumaNodeId(self, h: SimDevice) -> int:
        return int(self._slot(h).numa_node)

    @_counted
    def nvmlDeviceGetCpuAffinity(self, h: SimDevice, words: int) -> list[int]:
        mask = [0] * words
        for part in self._slot(h).cpu_affinity.split(","):
            lo, _, hi = part.partition("-")
            for cpu in range(int(lo), int(hi or lo) + 1):
                if cpu // 64 < words:
                    mask[cpu // 64] |= 1 << (cpu % 64)
        return mask

    @_counted
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: SimDevice) -> int:
        return self.node.model.pcie_gen_max

    @_counted
    def nvmlDeviceGetMaxPcieLinkWidth(self, h: SimDevice) -> int:
        return self.node.model.pcie_width_max

    @_counted
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: SimDevice) -> int:
        return self.node.model.pcie_gen_max

    @_counted
    def nvmlDeviceGetCurrPcieLinkWidth(self, h: SimDevice) -> int:
        return self.node.model.pcie_width_max

    @_counted
    def nvmlDeviceGetTopologyCommonAncestor(self, a: SimDevice, b: SimDevice) -> int:
        p = self.node.profile
        return TOPO_LEVEL[p.pci_level(p.gpus[a.index].pci_path, p.gpus[b.index].pci_path)]

    @_counted
    def nvmlDeviceGetVirtualizationMode(self, h: SimDevice) -> int:
        return 0

    @_counted
    def nvmlDeviceGetGpuFabricInfo(self, h: SimDevice, ref: Any) -> int:
        if not self.node.profile.nvswitches:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = getattr(ref, "_obj", ref)
        info.state, info.status = self.fabric_probes.get(h.index, (3, 0))  # completed, success
        return 0

    @_counted
    def nvmlDeviceGetEnforcedPowerLimit(self, h: SimDevice) -> int:
        return self.node.model.tdp_w * 1000

    # --- dynamic ---------------------------------------------------------------------

    @_counted
    def nvmlDeviceGetUtilizationRates(self, h: SimDevice) -> Any:
        if self.node.migs.get(h.index):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # not supported in MIG mode
        g = self.node.gpu(h.index)
        return SimpleNamespace(gpu=int(g.util_pct), memory=int(g.mem_util_pct))

    def _deny_mig_parent(self, h: SimDevice | SimMigDevice) -> None:
        """Only root reads a MIG-enabled GPU's own memory and processes (its MIG devices
        answer anyone)."""
        if not self.privileged and isinstance(h, SimDevice) and self.node.migs.get(h.index):
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)

    def _deny_profiling(self) -> None:
        if not self.privileged:  # RmProfilingAdminOnly=1, the driver's default
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)

    @_counted
    def nvmlDeviceGetMemoryInfo(self, h: SimDevice | SimMigDevice, version: int = 0) -> Any:
        self._deny_mig_parent(h)
        if isinstance(h, SimMigDevice):
            total = h.mig.profile.mem_bytes
            used = sum(
                b
                for _pid, b, gi in self.node.processes(h.parent.index)
                if gi == h.mig.gpu_instance_id
            )
            return SimpleNamespace(total=total, used=used, free=total - used, reserved=0)
        total = self.node.model.mem_bytes
        used = self.node.gpu(h.index).mem_used_bytes
        reserved = 512 * 2**20
        return SimpleNamespace(
            total=total, used=used, free=total - used - reserved, reserved=reserved
        )

    @_counted
    def nvmlDeviceGetTemperatureV(self, h: SimDevice, sensor: int) -> int:
        if not self.driver.temperature_v:  # pynvml finds no such symbol before R560
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return int(self.node.gpu(h.index).temp_c)

    @_counted
    def nvmlDeviceGetTemperature(self, h: SimDevice, sensor: int) -> int:
        return int(self.node.gpu(h.index).temp_c)

    @_counted
    def nvmlDeviceGetPowerUsage(self, h: SimDevice) -> int:
        return int(self.node.gpu(h.index).power_w * 1000)

    @_counted
    def nvmlDeviceGetClockInfo(self, h: SimDevice, clock: int) -> int:
        if clock == 2:
            return self.node.model.mem_clock_mhz
        return self.node.gpu(h.index).sm_clock_mhz

    @_counted
    def nvmlDeviceGetPerformanceState(self, h: SimDevice) -> int:
        return self.node.gpu(h.index).pstate

    @_counted
    def nvmlDeviceGetCurrentClocksEventReasons(self, h: SimDevice) -> int:
        return self.node.gpu(h.index).throttle_mask

    @_counted
    def nvmlDeviceGetComputeRunningProcesses(self, h: SimDevice | SimMigDevice) -> list[Any]:
        self._deny_mig_parent(h)
        na = 0xFFFFFFFF
        device = h.parent if isinstance(h, SimMigDevice) else h
        return [
            SimpleNamespace(
                pid=pid,
                usedGpuMemory=used,
                gpuInstanceId=na if gi is None else gi,
                computeInstanceId=na if gi is None else 0,
            )
            for pid, used, gi in self.node.processes(device.index)
            # a MIG device lists only its own instance's processes
            if not isinstance(h, SimMigDevice) or gi == h.mig.gpu_instance_id
        ]

    @_counted
    def nvmlDeviceGetPcieThroughput(self, h: SimDevice, counter: int) -> int:
        """KB/s: over the last second here, where the driver samples 20 ms."""
        if counter not in (0, 1):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self.node.pcie_rates(h.index)[counter] / 1024)

    @_counted
    def nvmlDeviceGetFieldValues(self, h: SimDevice, fields: list[Any]) -> Any:
        node, i, driver = self.node, h.index, self.driver
        g = node.gpu(i)
        sbe_v, dbe_v, sbe_a, dbe_a = node.ecc(i)
        remapped_cor, remapped_unc, pending = node.remapped_rows(i)
        tx, rx = node.pcie_bytes(i)
        thermal_ns = int(node.thermal_slowdown_s(i) * 1e9)
        scalar: dict[int, tuple[int, int]] = {
            82: (1, int(g.temp_hbm_c)),
            83: (3, g.energy_mj),
            186: (1, int(g.power_w * 1000)),
            185: (1, int(g.power_w * 1000)),
            3: (3, sbe_v),
            4: (3, dbe_v),
            5: (3, sbe_a),
            6: (3, dbe_a),
            142: (3, remapped_cor),  # 64 bits, as a real 580 driver answers
            143: (3, remapped_unc),
            144: (3, int(pending)),
            145: (3, 0),
            94: (1, 0),
            91: (1, node.model.nvlink_count),
            74: (3, 0),  # power cap, sync boost and power brake: never in the simulator
            76: (3, 0),
            190: (1, node.model.tdp_w * 1000),
            194: (1, int(node.model.temp_slowdown_c)),
        }
        if driver.recovery_action:
            scalar[230] = (1, self.recovery_actions.get(i, 0))
        arch = node.model.arch_code
        if arch < 7:  # page retirement: before Ampere (row remapping from then on)
            sbe, dbe, retired_pending = node.retired_pages(i)
            scalar.update({29: (3, sbe), 30: (3, dbe), 31: (3, int(retired_pending))})
        links = node.model.nvlink_count if arch < 10 else 0  # no DL error fields on Blackwell
        if driver.pcie_byte_counters:
            scalar.update({197: (1, tx % 2**32), 198: (1, rx % 2**32)})
        if driver.throttle_counters_at:
            sw_thermal = driver.throttle_counters_at
            scalar.update({sw_thermal: (3, thermal_ns), sw_thermal + 1: (3, thermal_ns)})
            scalar[sw_thermal + 2] = (3, 0)
        values = (pynvml.c_nvmlFieldValue_t * len(fields))()
        for k, requested in enumerate(fields):
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            entry = values[k]
            entry.fieldId, entry.scopeId = fid, scope
            entry.timestamp = int(node.clock() * 1e6)
            value: int
            if fid in (138, 139) and scope < node.model.nvlink_count:
                kind, value = 3, node.nvlink_kib(i, scope, rx=fid == 139)
            elif fid == 166 and scope < node.model.nvlink_count:  # scoped by link
                kind, value = 1, NVLINK_VERSION_ENUM[node.model.nvlink_gen]
            elif fid in (161, 162, 163) and scope < links:  # replay, recovery, CRC
                replay, recovery, crc = node.nvlink_errors(i, scope)
                kind, value = 3, (replay, recovery, crc)[fid - 161]
            elif fid in scalar:
                kind, value = scalar[fid]
            else:
                entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                entry.valueType = 1  # as a real driver leaves an unanswered entry
                continue
            entry.valueType = kind
            entry.nvmlReturn = 0
            if kind == 3:
                entry.value.ullVal = int(value)
            else:
                entry.value.uiVal = int(value)
        return values

    # --- NVLink ----------------------------------------------------------------------

    def _link_remote(self, index: int, link: int) -> str | None:
        """The bus id at the far end of a link: its NVSwitch, or the GPU it joins."""
        profile = self.node.profile
        n = 0
        for switch in profile.nvswitches:
            n += switch.links_per_gpu[index]
            if link < n:
                return switch.bus_id
        peers = profile.link_peers(index)
        return profile.gpus[peers[link]].bus_id if link < len(peers) else None

    @_counted
    def nvmlDeviceGetNvLinkState(self, h: SimDevice, link: int) -> int:
        if link >= self.node.model.nvlink_count:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if self._link_remote(h.index, link) is not None else 0

    @_counted
    def nvmlDeviceGetNvLinkVersion(self, h: SimDevice, link: int) -> int:
        return NVLINK_VERSION_ENUM[self.node.model.nvlink_gen]  # nvmlNvlinkVersion_t

    @_counted
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: SimDevice, link: int) -> int:
        return 2 if self.node.profile.nvswitches else 0  # NVSwitch, or a GPU

    @_counted
    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: SimDevice, link: int) -> Any:
        remote = self._link_remote(h.index, link)
        if remote is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(busId=remote)

    # --- MIG -------------------------------------------------------------------------

    @_counted
    def nvmlDeviceGetMigMode(self, h: SimDevice) -> list[int]:
        if not self.node.model.mig_profiles:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        on = 1 if self.node.migs.get(h.index) else 0
        return [on, on]

    @_counted
    def nvmlDeviceGetMaxMigDeviceCount(self, h: SimDevice) -> int:
        return 7

    @_counted
    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: SimDevice, slot: int) -> SimMigDevice:
        slices = self.node.migs.get(h.index, ())
        if slot >= len(slices):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return SimMigDevice(h, slices[slot])

    @_counted
    def nvmlDeviceGetGpuInstanceId(self, h: SimMigDevice) -> int:
        return h.mig.gpu_instance_id

    @_counted
    def nvmlDeviceGetComputeInstanceId(self, h: SimMigDevice) -> int:
        return h.mig.compute_instance_id

    @_counted
    def nvmlDeviceGetGpuInstanceById(self, h: SimDevice, gi: int) -> Any:
        if not self.privileged:  # "requires privileged user"
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        for mig in self.node.migs.get(h.index, ()):
            if mig.gpu_instance_id == gi:
                return mig
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    @_counted
    def nvmlGpuInstanceGetInfo(self, mig: SimMigSlice) -> Any:
        return SimpleNamespace(
            id=mig.gpu_instance_id,
            profileId=mig.profile.profile_id,
            placement=SimpleNamespace(start=mig.placement_start, size=mig.profile.slices),
        )

    @_counted
    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: SimDevice, index: int) -> Any:
        if not self.node.migs.get(h.index):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for p in self.node.model.mig_profiles:
            if p.index == index:
                return SimpleNamespace(
                    id=p.profile_id,
                    sliceCount=p.slices,
                    multiprocessorCount=p.sm_count,
                    memorySizeMB=p.mem_bytes // 2**20,
                    instanceCount=p.max_instances,
                    name=f"MIG {p.name}",
                )
        raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    # --- GPM -------------------------------------------------------------------------

    @_counted
    def nvmlGpmQueryDeviceSupport(self, h: SimDevice) -> Any:
        return SimpleNamespace(isSupportedDevice=int(self.node.model.gpm))

    @_counted
    def nvmlGpmSampleAlloc(self) -> Any:
        sample = _Sample()
        address = ctypes.cast(sample.pointer, ctypes.c_void_p).value or 0
        self._samples[address] = sample
        return sample.pointer

    @_counted
    def nvmlGpmSampleFree(self, pointer: Any) -> None:
        self._samples.pop(ctypes.cast(pointer, ctypes.c_void_p).value or 0, None)

    def _sample(self, pointer: Any) -> _Sample:
        sample = self._samples.get(ctypes.cast(pointer, ctypes.c_void_p).value or 0)
        if sample is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return sample

    @_counted
    def nvmlGpmSampleGet(self, h: SimDevice, pointer: Any) -> Any:
        if not self.node.model.gpm:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._deny_profiling()
        t = self.node.elapsed()
        self._sample(pointer).taken = (t, self.node.gpu(h.index).activity_s, h, None)
        return pointer

    @_counted
    def nvmlGpmMigSampleGet(self, h: SimDevice, gi: int, pointer: Any) -> Any:
        if not self.node.model.gpm:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._deny_profiling()
        t = self.node.elapsed()
        self._sample(pointer).taken = (t, self.node.gpu(h.index).activity_s, h, gi)
        return pointer

    @_counted
    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        first, second = self._sample(request.sample1).taken, self._sample(request.sample2).taken
        if first is None or second is None or second[0] <= first[0]:
            for k in range(request.numMetrics):
                request.metrics[k].nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            return request
        busy = max(0.0, min(1.0, (second[1] - first[1]) / (second[0] - first[0])))
        gi = second[3]
        if gi is not None:  # one MIG instance: its share of the GPU's work, none when free
            running = {g for _pid, _used, g in self.node.processes(second[2].index)}
            busy = min(1.0, busy * (1.1 if gi % 2 else 0.6)) if gi in running else 0.0
        m = self.node.model
        pcie = {5: 64e9, 4: 32e9}.get(m.pcie_gen_max, 16e9) * 0.12 / 2**20
        nvlink = m.nvlink_gbytes_per_s * 1e9 / 2 * 0.35 / 2**20
        values = {
            1: 100 * busy,
            2: 100 * busy * 0.97,
            3: 100 * busy * 0.42,
            5: 100 * busy * 0.61,
            6: 0.0,
            7: 100 * busy * 0.55,
            8: 0.0,
            9: 0.0,
            10: 100 * busy * 0.48,
            11: 100 * busy * 0.02,
            12: 100 * busy * 0.18,
            13: 100 * busy * 0.09,
            20: busy * pcie * 0.4,
            21: busy * pcie,
            60: busy * nvlink * 0.93,  # received: a little less than sent
            61: busy * nvlink,
        }
        for k in range(request.numMetrics):
            metric = request.metrics[k]
            if metric.metricId in values:
                metric.value = values[metric.metricId]
                metric.nvmlReturn = 0
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    # --- events ----------------------------------------------------------------------

    @_counted
    def nvmlEventSetCreate(self) -> Any:
        return SimpleNamespace(devices=[])

    @_counted
    def nvmlDeviceGetSupportedEventTypes(self, h: SimDevice) -> int:
        return 0x1 | 0x2 | 0x4 | 0x8

    @_counted
    def nvmlDeviceRegisterEvents(self, h: SimDevice, mask: int, event_set: Any) -> None:
        event_set.devices.append(h)

    def _due_event(self, event_set: Any) -> Any:
        for s in self.node.scenarios:
            # as the fake library does: an xid scenario is its XID, an ECC one a corrected error
            xid = xid_of(s.kind)
            kind, data = (0x8, xid) if xid is not None else (0x1, 0) if s.kind == "ecc" else (0, 0)
            if not kind or (s.kind, s.gpu) in self._delivered:
                continue
            if self.node.active(s.kind, s.gpu) is None:
                continue
            self._delivered.add((s.kind, s.gpu))
            device = self._by_gpu.get(s.gpu)  # None: a guest's GPU, the host hears nothing
            if device is None or device not in event_set.devices:
                continue
            return SimpleNamespace(
                device=device,
                eventType=kind,
                eventData=data,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
        return None

    @_counted
    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            event = self._due_event(event_set)
            if event is not None:
                return event
            left = deadline - time.monotonic()
            if left <= 0:
                raise _error(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(left, 0.25))

    @_counted
    def nvmlEventSetFree(self, event_set: Any) -> None:
        event_set.devices.clear()
