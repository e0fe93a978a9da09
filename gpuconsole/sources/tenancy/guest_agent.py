"""The guest channel: what a tenant's `gpuconsole agent --guest` tells the host of the GPUs
its KVM guest holds through vfio-pci, which the host's NVML cannot see.

Both ends are here, so they cannot drift apart. The host connects over virtio-vsock (the
guest's context id from its libvirt domain; no guest network needed) and writes one request
line; the guest answers with one line of JSON and closes:

    host:  GET gpuconsole/1\\n
    guest: {"protocol": 1, "at": 1733300000.0, "driver_version": "580.82.07",
            "shared": ["util", "memory", ...], "gpus": [<GpuReading as the agent codec writes it>]}\\n

The guest decides what the host may see (`share`): what it leaves out stays unknown on the
host. The host trusts a guest for readings only: an answer larger than MAX_ANSWER, one that
does not decode, one with more GPUs than the domain gives the guest, or a GPU at an address
the domain does not give it is refused whole, with a message, and that guest's GPUs go stale
alone. Each GPU is named on the host by the host's bus id, found through the domain's
<hostdev> (host address <-> guest address), never by anything the guest says of itself.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec

from gpuconsole.codec import DecodeError, decode, encode
from gpuconsole.config import DEFAULTS
from gpuconsole.readings.base import normal_bus_id, safe_strings, safe_text
from gpuconsole.readings.nvml import EccReading, GpuReading, NvmlReading, PcieReading
from gpuconsole.readings.tenancy import Guest

__all__ = [
    "DEFAULT_SHARE",
    "GUEST_PORT",
    "MAX_ANSWER",
    "REQUEST",
    "SHAREABLE",
    "GuestConnect",
    "GuestRefused",
    "ask_guest",
    "guest_answer",
    "read_answer",
    "vsock_connect",
]

PROTOCOL = 1
REQUEST = b"GET gpuconsole/1\n"
GUEST_PORT = 9511  # the vsock port a guest agent listens on by default
# Eight GPUs with every reading, MIG instances and processes come to some 60 KiB.
MAX_ANSWER = 1 << 20
# Distinct XID codes one GPU may report within the window: a real GPU raises a handful. Each
# is a finding and an exported series of its own; a guest's thousands would flood both.
MAX_XID_CODES = 64

# What a guest may share, and the reading fields each word stands for. A GPU's identity
# (UUID, model, where the guest sees it, its state) always goes: without it nothing maps.
SHAREABLE: dict[str, tuple[str, ...]] = {
    "util": ("util_gpu_pct", "util_mem_pct", "gpm"),
    "memory": ("mem_total_bytes", "mem_used_bytes", "mem_reserved_bytes"),
    "temperature": ("temp_gpu_c", "temp_hbm_c", "temp_slowdown_c"),
    "power": ("power_w", "power_limit_w", "energy_mj_total"),
    "clocks": (
        "sm_clock_mhz",
        "mem_clock_mhz",
        "sm_clock_max_mhz",
        "mem_clock_max_mhz",
        "pstate",
        "throttle_reasons",
    ),
    "ecc": ("ecc",),
    "xids": ("xids", "recovery_action"),
    "pcie": ("pcie",),
    "nvlink": ("nvlinks", "fabric_state", "fabric_status"),
    "mig": ("mig_enabled", "mig_pending", "mig_instances"),
    "processes": ("processes",),
}
# A guest's processes are the tenant's business: shared only when the tenant says so.
DEFAULT_SHARE = frozenset(DEFAULTS.guest.share)
_BLANK = {
    "throttle_reasons": (),
    "ecc": EccReading(),
    "pcie": PcieReading(),
    "nvlinks": (),
    "xids": (),
    "mig_instances": (),
    "processes": (),
}


class GuestRefused(Exception):
    """A guest's answer the host does not take, and why."""


GuestConnect = Callable[[Guest], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


# --- the guest's end ---------------------------------------------------------------------


def _shared_only(gpu: GpuReading, share: frozenset[str]) -> GpuReading:
    hidden: dict[str, Any] = {
        name: _BLANK.get(name)
        for word, names in SHAREABLE.items()
        if word not in share
        for name in names
    }
    return msgspec.structs.replace(gpu, **hidden) if hidden else gpu


def guest_answer(reading: NvmlReading, share: Iterable[str] = DEFAULT_SHARE) -> bytes:
    """The line a guest agent answers with: its NVML reading, cut to what it shares."""
    chosen = frozenset(share) & frozenset(SHAREABLE)
    body = {
        "protocol": PROTOCOL,
        "at": reading.at,
        "driver_version": reading.driver_version,
        "shared": sorted(chosen),
        "gpus": [encode(_shared_only(g, chosen), sparse=True) for g in reading.gpus],
    }
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


# --- the host's end ----------------------------------------------------------------------


def read_answer(data: bytes, guest: Guest) -> tuple[GpuReading, ...]:
    """The GPUs of a guest's answer, each named by the host's bus id; raises GuestRefused."""
    if len(data) > MAX_ANSWER:
        raise GuestRefused(f"answered more than {MAX_ANSWER >> 10} KiB")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        raise GuestRefused("answered something that is not JSON") from None
    if not isinstance(body, dict) or body.get("protocol") != PROTOCOL:
        seen = body.get("protocol") if isinstance(body, dict) else None
        raise GuestRefused(f"speaks protocol {safe_text(str(seen))[:20]!r}, not {PROTOCOL}")
    items = body.get("gpus")
    if not isinstance(items, list):
        raise GuestRefused("answered no GPU list")
    host_of = {g: h for h, g in guest.addresses}
    if len(items) > len(host_of):
        raise GuestRefused(
            f"reports {len(items)} GPUs; its domain gives it {len(host_of)} PCI devices"
        )
    out: list[GpuReading] = []
    for k, item in enumerate(items):
        try:
            gpu = decode(GpuReading, item, f"$.gpus[{k}]")
        except DecodeError as exc:
            raise GuestRefused(f"answered a GPU that does not decode: {exc}") from None
        at = normal_bus_id(gpu.pci_bus_id)
        host = host_of.get(at)
        if host is None:
            raise GuestRefused(
                f"reports a GPU at {safe_text(at)[:32]}, which its domain does not give it"
            )
        if any(normal_bus_id(o.pci_bus_id) == host for o in out):
            raise GuestRefused(f"reports the GPU at {at} twice")
        if len(gpu.xids) > MAX_XID_CODES:
            raise GuestRefused(
                f"reports {len(gpu.xids)} XID codes for the GPU at {at} (at most {MAX_XID_CODES})"
            )
        out.append(safe_strings(msgspec.structs.replace(gpu, pci_bus_id=host)))
    return tuple(out)


async def vsock_connect(
    guest: Guest, port: int = GUEST_PORT
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream to the guest agent at the guest's vsock context id."""
    family = getattr(socket, "AF_VSOCK", None)
    if family is None:
        raise OSError("this Python has no AF_VSOCK")
    if guest.vsock_cid is None:
        raise OSError("its domain has no vsock device")
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (guest.vsock_cid, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock, limit=MAX_ANSWER + 1)


async def ask_guest(
    guest: Guest, connect: GuestConnect, timeout_s: float
) -> tuple[GpuReading, ...]:
    """Ask one guest's agent; raises GuestRefused (with the reason) for any failure."""

    async def exchange() -> bytes:
        reader, writer = await connect(guest)
        try:
            writer.write(REQUEST)
            await writer.drain()
            data = b""
            while len(data) <= MAX_ANSWER:  # one answer, to its end: the guest closes after it
                chunk = await reader.read(65536)
                if not chunk:
                    break
                data += chunk
            return data
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    try:
        data = await asyncio.wait_for(exchange(), timeout_s)
    except TimeoutError:
        raise GuestRefused(f"did not answer in {timeout_s:g} s") from None
    except OSError as exc:
        raise GuestRefused(f"cannot be reached: {exc.strerror or exc}") from None
    if not data:
        raise GuestRefused("closed without an answer")
    return read_answer(data, guest)
