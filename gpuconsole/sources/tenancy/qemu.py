"""KVM guests without libvirt: QEMU processes and the vfio-pci devices on their command line.

`-device vfio-pci,host=0000:1b:00.0,...` (or the JSON form libvirt writes since 7.x,
`-device {"driver":"vfio-pci","host":"0000:1b:00.0",...}`, or `sysfsdev=/sys/...`) names
what the guest holds; `-name guest=NAME,...` names the guest. A QEMU process is a running
guest, and its start time is when the guest took the devices.
"""

from __future__ import annotations

import itertools
import json
import os

from gpuconsole.readings.base import normal_bus_id
from gpuconsole.readings.tenancy import Guest
from gpuconsole.sources.tenancy import procfs

__all__ = ["parse_qemu_command", "read_guests"]


def _is_qemu(argv: tuple[str, ...]) -> bool:
    return bool(argv) and os.path.basename(argv[0]).startswith("qemu")


def _options(text: str) -> dict[str, str]:
    """'vfio-pci,host=1b:00.0,id=x' -> {'driver': 'vfio-pci', 'host': '1b:00.0', 'id': 'x'}.

    A doubled comma is a comma inside a value (QEMU's escape, which libvirt writes for a
    domain named 'foo=1,bar=2': `-name guest=foo=1,,bar=2,debug-threads=on`).
    """
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    # an argv read from /proc holds no NUL, so it can stand for the escaped commas
    parts = [part.replace("\0", ",") for part in text.replace(",,", "\0").split(",")]
    out = {"driver": parts[0]} if parts and "=" not in parts[0] else {}
    for part in parts:
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value
    return out


def parse_qemu_command(argv: tuple[str, ...]) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(guest name, UUID, PCI functions passed through) from a QEMU argv."""
    name = uuid = None
    bus_ids: list[str] = []
    for flag, value in itertools.pairwise(argv):
        if flag == "-name":
            opts = _options(value)
            name = opts.get("guest") or opts.get("driver") or value
        elif flag == "-uuid":
            uuid = value
        elif flag == "-device":
            opts = _options(value)
            if opts.get("driver") != "vfio-pci":
                continue
            host = opts.get("host") or os.path.basename(opts.get("sysfsdev", "").rstrip("/"))
            if host:
                bus_id = normal_bus_id(host)
                if bus_id not in bus_ids:
                    bus_ids.append(bus_id)
    return name, uuid, tuple(bus_ids)


def read_guests(proc_root: str, clock: procfs.Clock | None = None) -> tuple[Guest, ...]:
    """Every QEMU process under proc_root that passes a PCI function through."""
    clock = clock or procfs.Clock(proc_root)
    guests = []
    for pid in sorted(procfs.pids(proc_root)):
        argv = procfs.command_line(proc_root, pid)
        if not _is_qemu(argv):
            continue
        name, uuid, bus_ids = parse_qemu_command(argv)
        if not bus_ids:
            continue
        started = clock.started_at(pid)
        guests.append(
            Guest(
                name=name or f"qemu pid {pid}",
                state="running",
                bus_ids=bus_ids,
                source="qemu",
                uuid=uuid,
                pid=pid,
                since=started,
                since_observed=started is None,
            )
        )
    return tuple(guests)
