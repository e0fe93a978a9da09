"""NVML's event set: XIDs and ECC errors, waited for in a thread of their own, as hub events."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from gpuconsole.facts.xids import describe_xid
from gpuconsole.readings.base import Event, Severity, known_bus_id
from gpuconsole.sources.nvml.lib import TIMEOUT
from gpuconsole.sources.nvml.state import GpuRecord

log = logging.getLogger(__name__)

# How long one event wait blocks: also how long close() may wait for the watcher, which
# a one-shot `gpuconsole snapshot` pays in full.
EVENT_WAIT_MS = 100
EVENT_XID = 0x8
EVENT_SBE = 0x1
EVENT_DBE = 0x2


def watch_events(
    lib: Any,
    gpus: Sequence[GpuRecord],
    stop: threading.Event,
    post: Callable[[Any, list[GpuRecord]], None],
) -> None:
    """Register every GPU that has XID or ECC events and wait on the set until `stop`;
    each event's data goes to `post` with the GPUs it may come from."""
    try:
        event_set = lib.nvmlEventSetCreate()
    except lib.NVMLError as exc:
        log.info("NVML events unavailable: %s", exc)
        return
    try:
        registered = []
        for gpu in gpus:
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
        while not stop.is_set():
            try:
                data = lib.nvmlEventSetWait(event_set, EVENT_WAIT_MS)
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) != TIMEOUT:
                    log.debug("event wait: %s", exc)
                    stop.wait(1.0)
                continue
            post(data, registered)
    finally:
        try:
            lib.nvmlEventSetFree(event_set)
        except Exception as exc:
            log.debug("event set free: %s", exc)


def event_from(data: Any, gpus: list[GpuRecord], at: float, node: str, source: str) -> Event:
    """The hub event for one nvmlEventData_t: an XID with its meaning, or an ECC error."""
    gpu = _match_handle(data.device, gpus)
    index = gpu.index if gpu is not None else None
    uuid = gpu.uuid if gpu is not None else None
    bus = known_bus_id(gpu.bus_id) if gpu is not None else None
    where = gpu_words(index, bus)
    if data.eventType & EVENT_XID:
        xid = int(data.eventData)
        severity, meaning = describe_xid(xid)
        message, code = f"XID {xid} on {where}: {meaning}", xid
        return Event(at, node, source, "xid", severity, message, index, uuid, code, bus)
    if data.eventType & EVENT_DBE:
        severity, message = Severity.CRITICAL, f"double-bit ECC error on {where}"
    else:
        severity, message = Severity.INFO, f"single-bit ECC error on {where}"
    return Event(at, node, source, "ecc", severity, message, index, uuid, gpu_bus_id=bus)


def gpu_words(index: int | None, bus_id: str | None) -> str:
    """How an event names a GPU (facts.inventory.gpu_and_bus), imported once an event is
    told: a one-shot reading that tells none never loads the ownership facts beneath it."""
    from gpuconsole.facts.inventory import gpu_and_bus

    return gpu_and_bus(index, bus_id)


def _address(handle: Any) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _match_handle(handle: Any, gpus: list[GpuRecord]) -> GpuRecord | None:
    """The GPU an event names: by handle, or by the address a ctypes handle points at."""
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
