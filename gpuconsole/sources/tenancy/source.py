"""TenancySource: what this node's PCI bus, libvirt, QEMU, kubelet and /proc say about owners.

Each part runs on its own and reports its own status inside the reading, so a missing
kubelet socket or an absent libvirt-python leaves the rest intact; only a node with nothing
to own (no PCI bus, or no NVIDIA GPU and no guest, pod or GPU process) makes the whole
source unavailable. sysfs, /proc and libvirt are read in worker threads, the kubelet over
grpc.aio on the hub's loop. Tenants are mapped here, from the config's rules, so every
consumer (and every remote reader of the JSON) sees the same.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Hashable
from typing import Any, ClassVar

import msgspec

from gpuconsole.config import DEFAULTS
from gpuconsole.readings.base import Event, Severity, normal_bus_id, safe_strings
from gpuconsole.readings.tenancy import (
    Guest,
    GuestGpu,
    HostProcess,
    PartStatus,
    PciGpu,
    PodDevice,
    TenancyReading,
)
from gpuconsole.sources.base import EmitEvent, SourceUnavailable
from gpuconsole.sources.tenancy import pci_binding, qemu
from gpuconsole.sources.tenancy.cgroups import ProcessScanner
from gpuconsole.sources.tenancy.guest_agent import (
    GuestConnect,
    GuestRefused,
    ask_guest,
    vsock_connect,
)
from gpuconsole.sources.tenancy.kubelet import (
    KubeletError,
    KubeletReader,
    unknown_ids,
)
from gpuconsole.sources.tenancy.libvirt import LibvirtError, LibvirtReader, describe
from gpuconsole.sources.tenancy.sharing import (
    MAX_CHECKPOINT_BYTES,
    CheckpointError,
    checkpoint_pods,
)
from gpuconsole.sources.tenancy.tenants import TenantRules

__all__ = ["TenancySource"]

# Every reading reports these parts, in this order.
PARTS = ("pci", "libvirt", "qemu", "kubelet", "processes")


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


class TenancySource:
    """Reads who holds each GPU of one node, from below NVML."""

    kind: ClassVar[str] = "tenancy"

    def __init__(
        self,
        node: str,
        *,
        sysfs_root: str = DEFAULTS.host.sysfs_root,
        proc_root: str = DEFAULTS.host.proc_root,
        libvirt_uri: str = DEFAULTS.tenancy.libvirt_uri,
        kubelet_socket: str = DEFAULTS.tenancy.kubelet_socket,
        kubelet_checkpoint: str = DEFAULTS.tenancy.kubelet_checkpoint,
        processes: bool = DEFAULTS.tenancy.processes,
        qemu_scan: bool = True,
        rules: TenantRules | None = None,
        interval_s: float = DEFAULTS.tenancy.interval_s,
        timeout_s: float = DEFAULTS.tenancy.timeout_s,
        passwd_file: str = "/etc/passwd",
        libvirt_connect: Callable[[str], Any] | None = None,
        kubelet_stub: Any = None,
        guest_agents: bool = DEFAULTS.tenancy.guest_agents,
        guest_port: int = DEFAULTS.tenancy.guest_port,
        guest_connect: GuestConnect | None = None,
        simulated: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.rules = rules or TenantRules()
        self.simulated = simulated
        self._clock = clock
        self._qemu_scan = qemu_scan
        self._libvirt = LibvirtReader(libvirt_uri, connect=libvirt_connect) if libvirt_uri else None
        self._kubelet = (
            KubeletReader(kubelet_socket, timeout_s=max(0.5, timeout_s / 2), stub=kubelet_stub)
            if kubelet_socket or kubelet_stub is not None
            else None
        )
        self._checkpoint = kubelet_checkpoint if self._kubelet is not None else ""
        # guest agents: asked over vsock unless a test or the simulator hands another way
        self._guest_connect: GuestConnect | None = (
            guest_connect
            if guest_connect is not None
            else (lambda g: vsock_connect(g, guest_port))
            if guest_agents
            else None
        )
        self._guest_gpus: dict[str, GuestGpu] = {}  # by host bus id: kept while a guest is mute
        self._scanner = ProcessScanner(proc_root, passwd_file) if processes else None
        self._emit: EmitEvent | None = None
        self._first_seen: dict[Hashable, float] = {}
        self._last_claims: dict[str, str] | None = None

    async def start(self, emit: EmitEvent) -> None:
        self._emit = emit

    async def close(self) -> None:
        if self._libvirt is not None:
            await asyncio.to_thread(self._libvirt.close)
        if self._kubelet is not None:
            await self._kubelet.close()

    async def poll(self) -> TenancyReading:
        host = asyncio.to_thread(self._read_host)
        guests = asyncio.to_thread(self._read_libvirt)
        pods = self._read_kubelet()
        (
            (gpus, qemu_guests, processes, host_parts),
            (lv_guests, lv_part),
            (
                devices,
                allocatable,
                kube_part,
            ),
        ) = await asyncio.gather(host, guests, pods)
        if not (gpus or qemu_guests or processes or lv_guests or devices):
            # Nothing to own and nobody holding anything: say so rather than look healthy.
            why = "; ".join(p.detail for p in (*host_parts, lv_part, kube_part) if not p.ok)
            root = os.path.join(self.sysfs_root, "bus", "pci", "devices")
            raise SourceUnavailable(f"no NVIDIA GPUs under {root}" + (f" ({why})" if why else ""))
        now = self._clock()
        seen: set[Hashable] = set()
        gpus = tuple(self._bound_since(g, now, seen) for g in gpus)
        all_guests = self._merge_guests(lv_guests, qemu_guests, now, seen)
        devices = tuple(self._pod_since(d, now, seen) for d in devices)
        guest_gpus, guest_part = await self._ask_guests(all_guests)
        self._first_seen = {k: v for k, v in self._first_seen.items() if k in seen}
        # names from sysfs, /proc, libvirt and the kubelet, safe to show before events quote them
        reading = safe_strings(
            TenancyReading(
                at=now,
                simulated=self.simulated,
                gpus=gpus,
                guests=all_guests,
                pod_devices=devices,
                allocatable=allocatable,
                processes=tuple(self._process_tenant(p) for p in processes),
                parts=(host_parts[0], lv_part, host_parts[1], kube_part, host_parts[2])
                + ((guest_part,) if guest_part is not None else ()),
                guest_gpus=guest_gpus,
            )
        )
        self._note_changes(reading)
        return reading

    # --- the parts ---------------------------------------------------------------------

    def _read_host(
        self,
    ) -> tuple[
        tuple[PciGpu, ...],
        tuple[Guest, ...],
        tuple[HostProcess, ...],
        tuple[PartStatus, PartStatus, PartStatus],
    ]:
        """sysfs and /proc, in one worker thread: PCI GPUs, QEMU guests, GPU processes."""
        devices = os.path.join(self.sysfs_root, "bus", "pci", "devices")
        if not os.path.isdir(devices):
            raise SourceUnavailable(f"no PCI bus under {devices}")
        gpus = pci_binding.read_gpus(self.sysfs_root, self.proc_root)
        vfio = sum(1 for g in gpus if g.driver == "vfio-pci")
        pci = PartStatus(
            "pci",
            True,
            f"{_plural(len(gpus), 'GPU')} in sysfs, {vfio} bound to vfio-pci"
            if gpus
            else f"no NVIDIA GPUs under {devices}",
        )
        proc_ok = os.path.isdir(self.proc_root)
        qemu_guests: tuple[Guest, ...] = ()
        if not self._qemu_scan:
            qemu_part = PartStatus("qemu", True, "off", enabled=False)
        elif not proc_ok:
            qemu_part = PartStatus("qemu", False, f"{self.proc_root} not readable")
        else:
            qemu_guests = qemu.read_guests(self.proc_root)
            qemu_part = PartStatus(
                "qemu", True, f"{_plural(len(qemu_guests), 'QEMU process')} passing GPUs through"
            )
        processes: tuple[HostProcess, ...] = ()
        if self._scanner is None:
            proc_part = PartStatus("processes", True, "off", enabled=False)
        elif not proc_ok:
            proc_part = PartStatus("processes", False, f"{self.proc_root} not readable")
        else:
            processes = self._scanner.scan()
            proc_part = PartStatus(
                "processes", True, f"{_plural(len(processes), 'process')} holding NVIDIA devices"
            )
        return gpus, qemu_guests, processes, (pci, qemu_part, proc_part)

    def _read_libvirt(self) -> tuple[tuple[Guest, ...], PartStatus]:
        if self._libvirt is None:
            return (), PartStatus("libvirt", True, "off", enabled=False)
        try:
            guests = self._libvirt.read()
        except LibvirtError as exc:
            return (), PartStatus("libvirt", False, str(exc))
        return guests, PartStatus("libvirt", True, f"{self._libvirt.uri}: {describe(guests)}")

    async def _read_kubelet(
        self,
    ) -> tuple[tuple[PodDevice, ...], tuple[str, ...], PartStatus]:
        if self._kubelet is None:
            return (), (), PartStatus("kubelet", True, "off", enabled=False)
        try:
            devices, allocatable = await self._kubelet.read()
        except KubeletError as exc:
            return (), (), PartStatus("kubelet", False, str(exc))
        pods = {(d.namespace, d.pod) for d in devices}
        detail = f"{_plural(len(devices), 'GPU device')} allocated to {_plural(len(pods), 'pod')}"
        if self._checkpoint and devices:
            devices, note = await asyncio.to_thread(self._pod_uids, devices)
            if note:
                detail += f"; {note}"
        if allocatable is None:
            detail += "; GetAllocatableResources not offered"
        bad = unknown_ids(devices)
        if bad:
            detail += f"; device IDs not understood: {', '.join(sorted(set(bad))[:3])}"
        return devices, allocatable or (), PartStatus("kubelet", True, detail)

    def _pod_uids(self, devices: tuple[PodDevice, ...]) -> tuple[tuple[PodDevice, ...], str]:
        """The devices with their pods' UIDs from the kubelet's device checkpoint, and what
        to say when it cannot be read (processes of pods sharing a GPU then stay by UID)."""
        path = self._checkpoint
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_CHECKPOINT_BYTES + 1)
            uids = checkpoint_pods(data)
        except FileNotFoundError:
            return devices, ""  # no device plugin on this node (DRA only, or none yet)
        except PermissionError:
            return devices, f"device checkpoint {path}: not permitted (root reads it)"
        except (OSError, CheckpointError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return devices, f"device checkpoint {path}: {why}"
        return tuple(
            msgspec.structs.replace(d, pod_uid=uid)
            if (uid := uids.get((d.resource, d.device_id))) is not None
            else d
            for d in devices
        ), ""

    async def _ask_guests(
        self, guests: tuple[Guest, ...]
    ) -> tuple[tuple[GuestGpu, ...], PartStatus | None]:
        """What each running guest's agent reads of its passthrough GPUs; a guest that does
        not answer keeps its last readings, marked with why, and costs no other guest."""
        connect = self._guest_connect
        asked = [g for g in guests if g.active and g.vsock_cid is not None and g.addresses]
        if connect is None or not asked:
            self._guest_gpus = {}
            return (), None
        timeout = min(2.0, self.timeout_s / 4)
        answers = await asyncio.gather(
            *(ask_guest(g, connect, timeout) for g in asked), return_exceptions=True
        )
        now = self._clock()
        kept: dict[str, GuestGpu] = {}
        failed = []
        for guest, answer in zip(asked, answers, strict=True):
            if isinstance(answer, BaseException):
                why = str(answer) if isinstance(answer, GuestRefused) else repr(answer)
                failed.append(f"{guest.name} {why}")
                for host, at in guest.addresses:
                    old = self._guest_gpus.get(host)
                    kept[host] = GuestGpu(
                        host,
                        guest.name,
                        at,
                        old.reading if old is not None and old.guest == guest.name else None,
                        old.seen_at if old is not None and old.guest == guest.name else None,
                        why,
                        guest.tenant,
                    )
                continue
            guest_at = {h: g for h, g in guest.addresses}
            for gpu in answer:
                host = normal_bus_id(gpu.pci_bus_id)
                kept[host] = GuestGpu(
                    host, guest.name, guest_at[host], gpu, now, None, guest.tenant
                )
        self._guest_gpus = kept
        answered = len(asked) - len(failed)
        detail = f"{answered} of {_plural(len(asked), 'guest agent')} answered"
        if failed:
            detail += "; " + "; ".join(failed[:3])
        return tuple(kept[b] for b in sorted(kept)), PartStatus("guests", not failed, detail)

    # --- tenants and since -------------------------------------------------------------

    def _seen(self, key: Hashable, now: float, seen: set[Hashable]) -> float:
        seen.add(key)
        return self._first_seen.setdefault(key, now)

    def _bound_since(self, gpu: PciGpu, now: float, seen: set[Hashable]) -> PciGpu:
        since = self._seen(("driver", gpu.bus_id, gpu.driver), now, seen)
        return msgspec.structs.replace(gpu, bound_since=since)

    def _merge_guests(
        self,
        libvirt_guests: tuple[Guest, ...],
        qemu_guests: tuple[Guest, ...],
        now: float,
        seen: set[Hashable],
    ) -> tuple[Guest, ...]:
        """libvirt's guests, with the start time of their QEMU process where one runs; QEMU
        processes libvirt does not know stay as guests of their own."""
        by_name = {g.name: g for g in qemu_guests}
        out = []
        for guest in libvirt_guests:
            process = by_name.pop(guest.name, None) if guest.active else None
            if process is not None and process.since is not None:
                guest = msgspec.structs.replace(
                    guest, pid=process.pid, since=process.since, since_observed=False
                )
            else:
                since = self._seen(("guest", guest.name, guest.state), now, seen)
                guest = msgspec.structs.replace(guest, since=since, since_observed=True)
            out.append(guest)
        for guest in by_name.values():
            if guest.since is None:
                since = self._seen(("guest", guest.name, guest.state), now, seen)
                guest = msgspec.structs.replace(guest, since=since)
            out.append(guest)
        return tuple(
            msgspec.structs.replace(g, tenant=self.rules.guest(g.name, g.tenant)) for g in out
        )

    def _pod_since(self, device: PodDevice, now: float, seen: set[Hashable]) -> PodDevice:
        claim = device.dra.claim if device.dra is not None else ""
        key = ("pod", device.namespace, device.pod, device.container, device.device_id, claim)
        return msgspec.structs.replace(
            device,
            since=self._seen(key, now, seen),
            tenant=self.rules.namespace(device.namespace),
        )

    def _process_tenant(self, process: HostProcess) -> HostProcess:
        tenant = self.rules.process(process.user, process.slurm_account)
        return msgspec.structs.replace(process, tenant=tenant) if tenant else process

    # --- events ------------------------------------------------------------------------

    def _note_changes(self, reading: TenancyReading) -> None:
        """Post an event when a guest or pod takes or releases a device, or a driver changes."""
        claims: dict[str, str] = {}
        for gpu in reading.gpus:
            claims[f"driver {gpu.bus_id}"] = gpu.driver or "no driver"
        for guest in reading.guests:
            if guest.active:
                for bus_id in guest.bus_ids:
                    claims[f"guest {guest.name} {bus_id}"] = f"vm {guest.name}"
        for d in reading.pod_devices:
            claims[f"pod {d.namespace}/{d.pod} {d.device_id}"] = f"pod {d.namespace}/{d.pod}"
        last, self._last_claims = self._last_claims, claims
        if last is None or self._emit is None:
            return
        for key in sorted(claims.keys() | last.keys()):
            before, after = last.get(key), claims.get(key)
            if before == after:
                continue
            what, _, rest = key.partition(" ")
            device = rest.rsplit(" ", 1)[-1]
            if what == "driver":
                message = f"{device}: driver {before or 'none'} -> {after}"
            elif after is not None:
                message = f"{device}: now held by {after}"
            else:
                message = f"{device}: released by {before}"
            bus = device if what != "pod" else None  # a pod's is the device plugin's ID
            self._emit(
                Event(
                    reading.at,
                    self.node,
                    self.kind,
                    "ownership",
                    Severity.INFO,
                    message,
                    gpu_bus_id=bus,
                )
            )
