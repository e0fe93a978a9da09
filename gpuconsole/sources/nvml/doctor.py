"""What the driver answers to every NVML call the source makes, beside what the source made of
it: the data behind `gpuconsole doctor`.

The real NvmlSource runs once (discovery, two full polls so GPM has an interval, close) with its
`lib` wrapped in a recorder, so "every call the source makes" stays true as the source changes.
Each call is kept with its arguments (handles named by the GPU's bus id), its return code, the
type and value of its answer and the C symbols pynvml used for it; field values are unpacked
entry by entry, since a call that succeeds can hold entries that failed.
"""

from __future__ import annotations

import asyncio
import ctypes
import enum
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuconsole.readings.base import Event, is_record, normal_bus_id, record_fields
from gpuconsole.readings.nvml import GpuReading, NvmlReading
from gpuconsole.sources.base import SourceUnavailable
from gpuconsole.sources.nvml.lib import (
    BASE_FIELDS,
    FIELD_VALUE,
    NO_PERMISSION,
    OK,
    UNSUPPORTED_CODES,
    VALUE_TYPES,
)
from gpuconsole.sources.nvml.source import NvmlSource

log = logging.getLogger(__name__)

PARAMS_FILE = Path("/proc/driver/nvidia/params")
# GPM needs two samples at least 100 ms apart ("internal sample refresh rate").
POLL_GAP_S = 0.25

# nvmlValueType_t
VALUE_TYPE_NAMES = {
    0: "DOUBLE",
    1: "UNSIGNED_INT",
    2: "UNSIGNED_LONG",
    3: "UNSIGNED_LONG_LONG",
    4: "SIGNED_LONG_LONG",
    5: "SIGNED_INT",
    6: "UNSIGNED_SHORT",
}
# Field ids the driver may or may not have, read by the doctor itself beside the source's own:
# the clock-event time counters and power-smoothing settings moved between driver branches.
PROBE_FIELDS = (74, 76, 91, 251, 252, 253, 269, 270, 271)

# What an operator loses when a call fails, in the words of the readings.
READING_OF: dict[str, str] = {
    "nvmlInit": "NVML itself",
    "nvmlSystemGetDriverVersion": "driver version",
    "nvmlSystemGetNVMLVersion": "NVML version",
    "nvmlSystemGetCudaDriverVersion": "CUDA version",
    "nvmlDeviceGetCount": "the GPUs",
    "nvmlDeviceGetMemoryInfo": "memory used/total",
    "nvmlDeviceGetComputeRunningProcesses": "processes",
    "nvmlDeviceGetGpuInstanceById": "MIG instance placement and profile",
    "nvmlGpuInstanceGetInfo": "MIG instance placement and profile",
    "nvmlDeviceGetGpuInstanceProfileInfo": "MIG profile names",
    "nvmlGpmQueryDeviceSupport": "GPM metrics",
    "nvmlGpmSampleAlloc": "GPM metrics",
    "nvmlGpmSampleGet": "GPM metrics (SM activity, tensor, DRAM bandwidth)",
    "nvmlGpmMigSampleGet": "GPM metrics of MIG instances",
    "nvmlGpmMetricsGet": "GPM metrics",
    "nvmlDeviceGetTemperatureV": "GPU temperature",
    "nvmlDeviceGetTemperature": "GPU temperature",
    "nvmlDeviceGetTemperatureThreshold": "slowdown temperature",
    "nvmlDeviceGetUtilizationRates": "utilization",
    "nvmlDeviceGetPowerUsage": "power",
    "nvmlDeviceGetEnforcedPowerLimit": "power limit",
    "nvmlDeviceGetClockInfo": "clocks",
    "nvmlDeviceGetMaxClockInfo": "maximum clocks",
    "nvmlDeviceGetPerformanceState": "P-state",
    "nvmlDeviceGetCurrentClocksEventReasons": "throttle reasons",
    "nvmlDeviceGetCurrPcieLinkGeneration": "PCIe generation",
    "nvmlDeviceGetCurrPcieLinkWidth": "PCIe width",
    "nvmlDeviceGetMaxPcieLinkGeneration": "PCIe maximum generation",
    "nvmlDeviceGetMaxPcieLinkWidth": "PCIe maximum width",
    "nvmlDeviceGetPcieThroughput": "PCIe throughput",
    "nvmlDeviceGetNvLinkState": "NVLink state",
    "nvmlDeviceGetNvLinkVersion": "NVLink version",
    "nvmlDeviceGetNvLinkRemoteDeviceType": "NVLink far end",
    "nvmlDeviceGetNvLinkRemotePciInfo": "NVLink far end",
    "nvmlDeviceGetMigMode": "MIG mode",
    "nvmlDeviceGetMaxMigDeviceCount": "MIG instances",
    "nvmlDeviceGetMigDeviceHandleByIndex": "MIG instances",
    "nvmlDeviceGetGpuInstanceId": "MIG instance ids",
    "nvmlDeviceGetComputeInstanceId": "MIG instance ids",
    "nvmlDeviceGetAttributes": "SM count",
    "nvmlDeviceGetGpuFabricInfo": "fabric state",
    "nvmlDeviceGetVirtualizationMode": "virtualization mode",
    "nvmlDeviceGetSerial": "serial",
    "nvmlDeviceGetModuleId": "module id",
    "nvmlDeviceGetArchitecture": "architecture",
    "nvmlDeviceGetNumaNodeId": "NUMA node",
    "nvmlDeviceGetCpuAffinity": "CPU affinity",
    "nvmlDeviceGetTopologyCommonAncestor": "PCI topology",
    "nvmlDeviceGetSupportedEventTypes": "XID and ECC events",
    "nvmlDeviceRegisterEvents": "XID and ECC events",
    "nvmlEventSetCreate": "XID and ECC events",
    "nvmlDeviceGetHandleByIndex": "the whole GPU",
}
FIELD_NAMES: dict[int, str] = {
    3: "ECC corrected (volatile)",
    4: "ECC uncorrected (volatile)",
    5: "ECC corrected (aggregate)",
    6: "ECC uncorrected (aggregate)",
    74: "clock-event time: power cap",
    76: "clock-event time: sync boost",
    82: "HBM temperature",
    83: "energy",
    91: "NVLink count",
    94: "PCIe replays",
    138: "NVLink TX bytes",
    139: "NVLink RX bytes",
    142: "remapped rows (corrected)",
    143: "remapped rows (uncorrected)",
    144: "row remap pending",
    145: "row remap failure",
    147: "NVLinks to an NVSwitch",
    165: "NVLink state",
    166: "NVLink version",
    186: "power (instant)",
    190: "power limit",
    194: "slowdown temperature",
    197: "PCIe TX bytes",
    198: "PCIe RX bytes",
    230: "recovery action (565+)",
    251: "clock-event time: SW thermal (575 to 580.65)",
    252: "clock-event time: HW thermal (575 to 580.65)",
    253: "clock-event time: HW power brake (575 to 580.65)",
    269: "clock-event time: SW thermal (580.82+); power smoothing preset (575 to 580.65)",
    270: "clock-event time: HW thermal (580.82+); power smoothing floor (575 to 580.65)",
    271: "clock-event time: HW power brake (580.82+); power smoothing ramp (575 to 580.65)",
}
# Answers that are how NVML says "nothing here", not a reading lost.
EXPECTED = frozenset(
    {
        ("nvmlDeviceGetMigDeviceHandleByIndex", "NOT_FOUND"),  # an empty MIG slot
        ("nvmlEventSetWait", "TIMEOUT"),  # no event in the wait
        ("nvmlDeviceGetGpuInstanceProfileInfo", "NOT_SUPPORTED"),  # a profile this GPU lacks
        ("nvmlDeviceGetGpuInstanceProfileInfo", "INVALID_ARGUMENT"),
    }
)
_GPM_CALLS = frozenset(
    {"nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet"}
)
_MAX_ITEMS = 64  # of one array or list in a value: enough for every NVML answer the source reads


class Why(enum.StrEnum):
    """Why a reading is missing."""

    PERMISSION = "permission"  # NO_PERMISSION: this user may not read it
    UNSUPPORTED = "unsupported"  # NOT_SUPPORTED or a function this driver lacks
    ERROR = "error"  # any other code


@dataclass(frozen=True, slots=True)
class FieldAnswer:
    """One entry of an nvmlDeviceGetFieldValues answer, as the driver filled it."""

    field_id: int
    scope_id: int
    code: int
    code_name: str
    value_type: int
    value_type_name: str
    value: float | int | None


@dataclass(frozen=True, slots=True)
class MetricAnswer:
    """One metric of an nvmlGpmMetricsGet answer, with its own return code."""

    metric_id: int
    code: int
    code_name: str
    value: float | None


@dataclass(slots=True)
class Answer:
    """One distinct NVML call (function, arguments, outcome), how often it was made, and the
    latest answer to it: the one the source's last reading is made of."""

    phase: str  # where it was first made: discovery, poll N, events, probe, close
    function: str
    arguments: tuple[str, ...]
    code: int | None  # None: pynvml raised something that is not an NVMLError
    code_name: str
    value_type: str
    value: Any  # plain JSON types
    symbols: tuple[str, ...] = ()  # the C entry points pynvml looked up for it
    fields: tuple[FieldAnswer, ...] = ()
    metrics: tuple[MetricAnswer, ...] = ()
    gpu: str | None = None  # bus id of the GPU (or MIG instance's parent) it asked about
    target: str | None = None  # the handle it asked about, by name ("... MIG slot 2")
    times: int = 1
    seconds: float = 0.0  # the slowest of them


@dataclass(frozen=True, slots=True)
class Hidden:
    """A reading this user does not get, and why."""

    gpu: str | None  # the GPU by bus id, or a MIG instance of it
    reading: str
    call: str  # function, or "field N"
    code_name: str
    why: Why
    explanation: str


@dataclass(frozen=True, slots=True)
class Identity:
    """Who asked, of which library."""

    uid: int
    euid: int
    user: str | None
    library: str | None  # the file actually mapped into this process
    pynvml_version: str | None
    profiling_admin_only: bool | None  # RmProfilingAdminOnly, None when unreadable
    params_note: str


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """The answers, what the source made of them, and what this user does not get."""

    identity: Identity
    driver_version: str | None
    nvml_version: str | None
    cuda_driver_version: str | None
    answers: tuple[Answer, ...]
    gpus: tuple[GpuReading, ...]
    events: tuple[Event, ...]
    hidden: tuple[Hidden, ...]
    error: str | None  # why NVML did not answer at all
    seconds: float
    calls: int  # every call made, repeats included

    @property
    def ok(self) -> bool:
        return self.error is None


# --- recording -------------------------------------------------------------------------


class _InFlight(threading.local):
    symbols: list[str] | None = None


@dataclass(slots=True)
class _Call:
    """One distinct call as recorded, its arguments kept until their names are known."""

    answer: Answer
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Recorder:
    """Keeps every call made through `RecordingLibrary`, with handles named by their GPU."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.phase = "init"
        self.calls = 0
        self.handles: list[Any] = []  # the GPUs' handles, in the order NVML gave them
        self.codes = _code_names(lib)
        self._calls: dict[tuple[Any, ...], _Call] = {}
        self._lock = threading.Lock()
        self._in_flight = _InFlight()
        self._names: dict[int, Callable[[], str]] = {}  # handle address -> its name
        self._parent: dict[int, int] = {}  # a MIG or GPU instance handle -> its GPU's
        self._bus: dict[int, str] = {}  # a GPU handle -> its bus id
        self._samples = 0
        self._instance: dict[int, Any] = {}  # a GPM sample -> the GPU instance it samples
        self._keep: list[Any] = []  # handles stay alive while their address names them
        self._waiting: dict[int, tuple[float, str, tuple[Any, ...]]] = {}  # by thread

    # calls ----------------------------------------------------------------------------

    def call(self, function: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        phase = self.phase
        if threading.current_thread().name.startswith("nvml-events"):
            phase = "events"
        outer = self._in_flight.symbols
        symbols: list[str] = []
        self._in_flight.symbols = symbols
        start = time.perf_counter()
        thread = threading.get_ident()
        self._waiting[thread] = (start, function, args)
        code: int | None = OK
        result: Any = None
        error: Exception | None = None
        try:
            result = fn(*args, **kwargs)
        except self.lib.NVMLError as exc:
            code, error = int(getattr(exc, "value", -1)), exc
        except Exception as exc:
            code, error = None, exc
        finally:
            self._in_flight.symbols = outer
            self._waiting.pop(thread, None)
        seconds = time.perf_counter() - start
        with self._lock:
            self.calls += 1
            if error is None:
                self._learn(function, args, result)
            self._add(phase, function, args, kwargs, code, result, error, tuple(symbols), seconds)
        if error is not None:
            raise error
        return result

    def note_symbol(self, name: str) -> None:
        """pynvml looked up this C entry point for the call in flight on this thread."""
        symbols = self._in_flight.symbols
        if symbols is not None and name not in symbols:
            symbols.append(name)

    def waiting(self) -> str | None:
        """The call in flight longest, with its arguments and how long it has waited."""
        now = time.perf_counter()
        calls = list(self._waiting.values())  # one copy: other threads come and go
        if not calls:
            return None
        start, function, args = min(calls, key=lambda waiting: waiting[0])
        with self._lock:
            shown = ", ".join(self._argument(a) for a in args)
        return f"{function}({shown}), waiting {now - start:.0f} s"

    def answers(self) -> tuple[Answer, ...]:
        """Every distinct call in the order first made, handles named as finally known."""
        with self._lock:
            for call in self._calls.values():
                call.answer.arguments = tuple(self._argument(a) for a in call.args) + tuple(
                    f"{k}={self._argument(v)}" for k, v in call.kwargs.items()
                )
                call.answer.gpu = self._gpu_of(call.args)
                call.answer.target = next((self._name(k) for k in _handles(call.args)), None)
            return tuple(call.answer for call in self._calls.values())

    def _add(
        self,
        phase: str,
        function: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        code: int | None,
        result: Any,
        error: Exception | None,
        symbols: tuple[str, ...],
        seconds: float,
    ) -> None:
        fields: tuple[FieldAnswer, ...] = ()
        metrics: tuple[MetricAnswer, ...] = ()
        value: Any = None
        if error is not None:
            value = str(error) if code is not None else f"{type(error).__name__}: {error}"
            value_type = type(error).__name__
        else:
            out = _out_parameter(args) if result is None else None
            answered = out if out is not None else result
            value_type = _type_name(answered)
            if function == "nvmlDeviceGetFieldValues":
                fields = self._fields(answered)
            elif function == "nvmlGpmMetricsGet":
                metrics = self._metrics(answered)
            else:
                value = self._plain(answered, 0)
        answer = Answer(
            phase=phase,
            function=function,
            arguments=(),
            code=code,
            code_name=self.codes.get(code, str(code)) if code is not None else "exception",
            value_type=value_type,
            value=value,
            symbols=symbols,
            fields=fields,
            metrics=metrics,
            seconds=seconds,
        )
        # A later poll asking the same again is a repeat: it keeps the phase of the first,
        # and its answer (the one the source's last reading is made of).
        group = phase if phase in ("probe", "events", "close") else "source"
        key = (group, function, tuple(map(self._same, args)), repr(kwargs), code)
        known = self._calls.get(key)
        if known is None:
            self._calls[key] = _Call(answer, args, kwargs)
            return
        first = known.answer
        answer.phase = first.phase
        answer.times = first.times + 1
        answer.seconds = max(first.seconds, seconds)
        answer.symbols = first.symbols + tuple(s for s in symbols if s not in first.symbols)
        known.answer = answer

    def _fields(self, result: Any) -> tuple[FieldAnswer, ...]:
        entries = []
        for fid, scope, kind, ret, raw in FIELD_VALUE.iter_unpack(bytes(result)):
            value = VALUE_TYPES.get(kind, VALUE_TYPES[3]).unpack(raw)[0] if ret == OK else None
            entries.append(
                FieldAnswer(
                    field_id=fid,
                    scope_id=scope,
                    code=ret,
                    code_name=self.codes.get(ret, str(ret)),
                    value_type=kind,
                    value_type_name=VALUE_TYPE_NAMES.get(kind, str(kind)),
                    value=value if not isinstance(value, float) or math.isfinite(value) else None,
                )
            )
        return tuple(entries)

    def _metrics(self, request: Any) -> tuple[MetricAnswer, ...]:
        count = min(int(getattr(request, "numMetrics", 0)), _MAX_ITEMS)
        out = []
        for metric in request.metrics[:count]:
            code, value = int(metric.nvmlReturn), float(metric.value)
            out.append(
                MetricAnswer(
                    metric_id=int(metric.metricId),
                    code=code,
                    code_name=self.codes.get(code, str(code)),
                    value=value if code == OK and math.isfinite(value) else None,
                )
            )
        return tuple(out)

    # names of things ------------------------------------------------------------------

    def _learn(self, function: str, args: tuple[Any, ...], result: Any) -> None:
        """Name the handles an answer hands out, and the GPU a PCI answer belongs to."""
        if function == "nvmlDeviceGetPciInfo" and args:
            gpu, bus = _key(args[0]), getattr(result, "busId", None)
            if gpu is not None and bus is not None:
                self._bus[gpu] = normal_bus_id(_text(bus))
        if function in ("nvmlGpmSampleGet", "nvmlGpmMigSampleGet") and args:
            sample = _key(args[-1])
            if sample is not None and sample not in self._parent and _key(args[0]) is not None:
                self._parent[sample] = _key(args[0])  # type: ignore[assignment]
                self._instance[sample] = args[1] if len(args) == 3 else None
        key = _key(result)
        if key is None or key in self._names:
            return
        self._keep.append(result)
        parent = _key(args[0]) if args else None
        if function.startswith("nvmlDeviceGetHandleBy"):
            index = args[0] if args else "?"
            self._names[key] = lambda: self._bus.get(key) or f"GPU handle {index}"
            self.handles.append(result)
        elif function == "nvmlDeviceGetMigDeviceHandleByIndex" and parent is not None:
            slot = args[1]
            self._parent[key] = parent
            self._names[key] = lambda: f"{self._name(parent)} MIG slot {slot}"
        elif function == "nvmlDeviceGetGpuInstanceById" and parent is not None:
            gi = args[1]
            self._parent[key] = parent
            self._names[key] = lambda: f"{self._name(parent)} GPU instance {gi}"
        elif function == "nvmlGpmSampleAlloc":
            self._samples += 1
            n = self._samples
            self._names[key] = lambda: f"GPM sample {n}{self._sample_of(key)}"
        elif function == "nvmlEventSetCreate":
            self._names[key] = lambda: "event set"
        else:
            kind = type(result).__name__
            self._names[key] = lambda: kind

    def _name(self, key: int) -> str:
        make = self._names.get(key)
        return make() if make is not None else "handle"

    def _sample_of(self, key: int) -> str:
        parent = self._parent.get(key)
        if parent is None:
            return ""
        gi = self._instance.get(key)
        return f" of {self._name(parent)}" + (f" GPU instance {gi}" if gi is not None else "")

    def _gpu_of(self, args: Sequence[Any]) -> str | None:
        """The bus id of the GPU a call asked about (a MIG instance's: its parent's)."""
        for key in _handles(args):
            while key in self._parent:
                key = self._parent[key]
            if key in self._bus:
                return self._bus[key]
        return None

    def _same(self, value: Any) -> Any:
        """What makes two arguments the same: the handles in it, else how it is shown."""
        handles = tuple(_handles([value]))
        return ("handles", handles) if handles else self._argument(value)

    def _argument(self, value: Any) -> str:
        key = _key(value)
        if key is not None:
            return self._name(key)
        if isinstance(value, bool | int | float | str):
            return repr(value)
        if isinstance(value, list | tuple):
            inner = ", ".join(self._argument(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner})"
        obj = getattr(value, "_obj", None)  # ctypes.byref(...)
        if obj is not None:
            return f"byref({type(obj).__name__})"
        inside = ", ".join(self._name(k) for k in _handles([value]))
        return f"{type(value).__name__}({inside})" if inside else type(value).__name__

    def _plain(self, value: Any, depth: int) -> Any:
        """An NVML answer as plain JSON types: structures as dicts, handles by name."""
        key = _key(value)
        if key is not None:
            return self._name(key)
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else str(value)
        if isinstance(value, bytes):
            return _text(value)
        if depth > 4:
            return type(value).__name__
        if isinstance(value, ctypes.Structure | ctypes.Union):
            return {
                name: self._plain(getattr(value, name), depth + 1)
                for name, *_rest in getattr(value, "_fields_", ())
            }
        if isinstance(value, ctypes.Array | list | tuple):
            return [self._plain(v, depth + 1) for v in list(value[:_MAX_ITEMS])]
        if isinstance(value, ctypes._SimpleCData):
            return self._plain(value.value, depth + 1)
        if hasattr(value, "__dict__"):  # pynvml's friendly objects
            return {k: self._plain(v, depth + 1) for k, v in vars(value).items()}
        return type(value).__name__


class RecordingLibrary:
    """`lib` as the source sees it, with every nvml* function call recorded."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def __getattr__(self, name: str) -> Any:
        if name == "_nvmlGetFunctionPointer":
            # the source's one-call process list goes to a C entry point straight: without
            # it the source takes pynvml's wrapper, a call recorded by its name like the rest
            raise AttributeError(name)
        value = getattr(self._recorder.lib, name)
        if name.startswith("nvml") and callable(value) and not isinstance(value, type):
            recorder = self._recorder

            def recorded(*args: Any, **kwargs: Any) -> Any:
                return recorder.call(name, value, *args, **kwargs)

            return recorded
        return value


class _SymbolTrace:
    """While open, pynvml's function-pointer lookups are noted on the call in flight, so
    each answer says which C entry points of the library it came from."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self._original: Any = None

    def __enter__(self) -> _SymbolTrace:
        lib = self._recorder.lib
        original = getattr(lib, "_nvmlGetFunctionPointer", None)
        if original is None:  # not pynvml: nothing to trace
            return self
        self._original = original
        recorder = self._recorder

        def traced(name: str) -> Any:
            try:
                pointer = original(name)
            except lib.NVMLError:
                recorder.note_symbol(f"{name} (missing)")
                raise
            recorder.note_symbol(name)
            return pointer

        lib._nvmlGetFunctionPointer = traced
        return self

    def __exit__(self, *exc: object) -> None:
        if self._original is not None:
            self._recorder.lib._nvmlGetFunctionPointer = self._original


# --- the run ---------------------------------------------------------------------------


class Diagnosis:
    """The NVML source run once through a recorder: discovery, `polls` full polls (the last
    of them what the source made of it), the doctor's own field probe, then close."""

    def __init__(self, lib: Any, node: str = "doctor", polls: int = 2) -> None:
        self.recorder = Recorder(lib)
        self._lib = lib
        self._polls = max(1, polls)
        self._started = time.perf_counter()
        self._events: list[Event] = []
        self._readings: list[NvmlReading] = []
        self._source = NvmlSource(
            node,
            lib=RecordingLibrary(self.recorder),
            detail_every=1,
            inventory_every=1,
            events=True,
        )

    def run(self) -> DoctorReport:
        """Blocking; a driver that hangs holds it (see `stuck` and `report`)."""
        self._started = time.perf_counter()
        error: str | None = None
        with _SymbolTrace(self.recorder):
            try:
                asyncio.run(self._run())
            except SourceUnavailable as exc:
                error = str(exc)
            except Exception as exc:
                # What the doctor is for: a source that stops on an answer it did not
                # expect is reported with the answers that led there.
                log.debug("the NVML source stopped", exc_info=True)
                error = f"the NVML source stopped: {type(exc).__name__}: {exc}"
        return self.report(error)

    async def _run(self) -> None:
        recorder, source = self.recorder, self._source
        try:
            recorder.phase = "discovery"
            await source.start(self._events.append)
            for n in range(1, self._polls + 1):
                if n > 1:
                    await asyncio.sleep(POLL_GAP_S)
                recorder.phase = f"poll {n}"
                self._readings.append(await source.poll())
            recorder.phase = "probe"
            await asyncio.to_thread(_probe_fields, recorder)
        finally:
            recorder.phase = "close"
            await source.close()

    def stuck(self) -> str | None:
        """The call that has waited longest for the driver, if one is waiting."""
        return self.recorder.waiting()

    def report(self, error: str | None) -> DoctorReport:
        """What is known so far (all of it once `run` has returned)."""
        last = self._readings[-1] if self._readings else None
        answers = self.recorder.answers()
        identity = identify(self._lib)
        return DoctorReport(
            identity=identity,
            driver_version=last.driver_version if last else None,
            nvml_version=last.nvml_version if last else None,
            cuda_driver_version=last.cuda_driver_version if last else None,
            answers=answers,
            gpus=last.gpus if last else (),
            events=tuple(self._events),
            hidden=tuple(hidden_readings(answers, identity)),
            error=error,
            seconds=time.perf_counter() - self._started,
            calls=self.recorder.calls,
        )


def _probe_fields(recorder: Recorder) -> None:
    """Every field id the source asks for and those that moved between drivers, as the
    driver answers each entry (the source keeps only the values it understood)."""
    lib = RecordingLibrary(recorder)
    ids = sorted({*BASE_FIELDS, *PROBE_FIELDS})
    for handle in recorder.handles:
        try:
            lib.nvmlDeviceGetFieldValues(handle, ids)
        except recorder.lib.NVMLError:
            continue  # recorded with its code


def hidden_readings(answers: Sequence[Answer], who: Identity) -> Iterator[Hidden]:
    """Each reading a call (or field entry) did not deliver, once per GPU, and why."""
    seen: set[tuple[str | None, str]] = set()
    for answer in answers:
        if answer.phase == "probe":
            continue  # the doctor's own question, not a reading the source lost
        if answer.code not in (None, OK) and (answer.function, answer.code_name) not in EXPECTED:
            what = answer.function
            reading = READING_OF.get(what, what.removeprefix("nvmlDevice").removeprefix("nvml"))
            if (answer.target, what) not in seen:
                seen.add((answer.target, what))
                yield _hidden(answer.target, reading, what, answer.code, answer.code_name, who)
        for entry in answer.fields:
            if entry.code == OK:
                continue
            what = f"field {entry.field_id}" + (
                f" scope {entry.scope_id}" if entry.scope_id else ""
            )
            if (answer.target, what) in seen:
                continue
            seen.add((answer.target, what))
            reading = FIELD_NAMES.get(entry.field_id, what)
            yield _hidden(answer.target, reading, what, entry.code, entry.code_name, who)
        for metric in answer.metrics:
            what = f"GPM metric {metric.metric_id}"
            if metric.code == OK or (answer.target, what) in seen:
                continue
            seen.add((answer.target, what))
            yield _hidden(answer.target, what, what, metric.code, metric.code_name, who)


def _hidden(
    gpu: str | None, reading: str, call: str, code: int | None, code_name: str, who: Identity
) -> Hidden:
    if code == NO_PERMISSION:
        if call in _GPM_CALLS and who.profiling_admin_only:
            text = "GPM profiling is admin-only on this node (RmProfilingAdminOnly=1): needs root"
        else:
            text = f"needs root: NVML refuses it to uid {who.uid}"
        return Hidden(gpu, reading, call, code_name, Why.PERMISSION, text)
    if code in UNSUPPORTED_CODES:
        text = (
            "this driver lacks the function"
            if code_name.endswith("FUNCTION_NOT_FOUND")
            else "not supported by this GPU or driver"
        )
        return Hidden(gpu, reading, call, code_name, Why.UNSUPPORTED, text)
    return Hidden(gpu, reading, call, code_name, Why.ERROR, f"the driver answered {code_name}")


# --- who and what ----------------------------------------------------------------------


def identify(lib: Any) -> Identity:
    """The user, the library file in use, pynvml's version and the profiling switch."""
    admin_only, note = profiling_admin_only()
    return Identity(
        uid=os.getuid(),
        euid=os.geteuid(),
        user=_user_name(os.geteuid()),
        library=_mapped_library(),
        pynvml_version=_pynvml_version(lib),
        profiling_admin_only=admin_only,
        params_note=note,
    )


def profiling_admin_only(path: Path = PARAMS_FILE) -> tuple[bool | None, str]:
    """RmProfilingAdminOnly from the driver's parameters, and where that came from."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "RmProfilingAdminOnly":
            value = value.strip()
            if value.isdigit():
                return value != "0", f"{path}: RmProfilingAdminOnly: {value}"
    return None, f"{path}: no RmProfilingAdminOnly line"


def _mapped_library() -> str | None:
    """The libnvidia-ml file this process has mapped (which one the loader found)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if "libnvidia-ml" in Path(path).name:
                    return path
    except OSError:
        pass
    return None


def _pynvml_version(lib: Any) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("nvidia-ml-py", "pynvml"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    found = getattr(lib, "__version__", None)
    return str(found) if found is not None else None


def _user_name(uid: int) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


# --- small helpers ---------------------------------------------------------------------


def _code_names(lib: Any) -> dict[int, str]:
    names = {OK: "SUCCESS"}
    for name in dir(lib):
        if name.startswith("NVML_ERROR_"):
            value = getattr(lib, name)
            if isinstance(value, int):
                names.setdefault(value, name.removeprefix("NVML_ERROR_"))
    return names


def _key(value: Any) -> int | None:
    """The address a ctypes handle points at (what names a GPU, MIG instance or sample)."""
    if not isinstance(value, ctypes._Pointer):
        return None
    try:
        return ctypes.cast(value, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _handles(args: Sequence[Any]) -> Iterator[int]:
    """The handles among `args`, and those a structure argument holds (GPM's samples)."""
    for arg in args:
        key = _key(arg)
        if key is not None:
            yield key
        elif isinstance(arg, ctypes.Structure):
            for name, *_rest in getattr(arg, "_fields_", ()):
                inner = _key(getattr(arg, name, None))
                if inner is not None:
                    yield inner


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _out_parameter(args: Sequence[Any]) -> Any:
    """The structure a call filled through ctypes.byref, where it returned nothing itself."""
    for arg in args:
        obj = getattr(arg, "_obj", None)
        if isinstance(obj, ctypes.Structure):
            return obj
    return None


def _type_name(value: Any) -> str:
    if isinstance(value, list | tuple):
        inner = type(value[0]).__name__ if value else ""
        return f"list[{inner}]" if inner else "list"
    if isinstance(value, ctypes.Array):
        return f"{getattr(value, '_type_', object).__name__}[{len(value)}]"
    return type(value).__name__


def as_plain(value: Any) -> Any:
    """A report (or any part of it) as plain JSON types; NaN and infinities as text."""
    if is_record(value):
        return {f.name: as_plain(getattr(value, f.name)) for f in record_fields(type(value))}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): as_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
