"""The guests layer through libvirt: a domain's <hostdev>s defined, hotplugged or restarted.

The persistent definition is always updated (defineXML). A running guest gets its device
hotplugged where the hypervisor supports it (attachDeviceFlags, live); where it does not
(libvirt's test driver, or a hypervisor that refuses) the guest is shut down and started
again so that the new definition takes effect. A guest losing a device must be shut off
already: the plan's preconditions say so. libvirt is blocking: every call runs in a thread.
"""

from __future__ import annotations

import asyncio
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.plan import Step, StepKind
from gpuconsole.sources.tenancy.libvirt import parse_domain_xml

__all__ = ["LibvirtDriver", "hostdev_xml"]

XML_INACTIVE = 2  # VIR_DOMAIN_XML_INACTIVE
AFFECT_LIVE = 1  # VIR_DOMAIN_AFFECT_LIVE
SHUT_OFF = 5  # VIR_DOMAIN_SHUTOFF


def hostdev_xml(bdf: str) -> str:
    """The <hostdev> that hands one PCI function to a guest (managed: libvirt binds vfio)."""
    domain, bus, rest = bdf.split(":")
    slot, function = rest.split(".")
    return (
        "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
        f"<address domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' function='0x{function}'/>"
        "</source></hostdev>"
    )


def _with_hostdevs(xml: str, add: tuple[str, ...], remove: tuple[str, ...]) -> str:
    root = ET.fromstring(xml)
    devices = root.find("devices")
    if devices is None:
        devices = ET.SubElement(root, "devices")
    for hostdev in list(devices.findall("hostdev")):
        held = parse_domain_xml(
            f"<domain><devices>{ET.tostring(hostdev, 'unicode')}</devices></domain>"
        )
        if set(held.bus_ids) & set(remove):
            devices.remove(hostdev)
    have = set(parse_domain_xml(ET.tostring(root, "unicode")).bus_ids)
    for bdf in add:
        if bdf not in have:
            devices.append(ET.fromstring(hostdev_xml(bdf)))
    return ET.tostring(root, "unicode")


def _silence() -> None:
    """libvirt prints every error to stderr; here errors become StepFailed."""
    try:
        import libvirt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


class LibvirtDriver:
    """Updates guests' definitions through one read-write libvirt connection."""

    def __init__(
        self,
        uri: str = "qemu:///system",
        *,
        connect: Callable[[str], Any] | None = None,
        shutdown_timeout_s: float = 120.0,
    ) -> None:
        self.uri = uri
        self._connect = connect
        self._conn: Any = None
        self.shutdown_timeout_s = shutdown_timeout_s

    def _connection(self) -> Any:
        if self._conn is None:
            _silence()
            if self._connect is not None:
                self._conn = self._connect(self.uri)
            else:
                try:
                    import libvirt  # type: ignore[import-not-found,unused-ignore]
                except ImportError:
                    raise StepFailed(
                        "libvirt-python not installed (pip install 'gpuconsole[libvirt]')"
                    ) from None
                try:
                    self._conn = libvirt.open(self.uri)
                except libvirt.libvirtError as exc:
                    raise StepFailed(f"cannot open {self.uri}: {exc}") from None
        return self._conn

    def _domain(self, name: str | None) -> Any:
        try:
            return self._connection().lookupByName(name)
        except StepFailed:
            raise
        except Exception as exc:
            raise StepFailed(f"no guest {name!r} at {self.uri}: {exc}") from None

    async def run(self, step: Step) -> str:
        return await asyncio.to_thread(self._run, step)

    async def undo(self, step: Step) -> str:
        return await asyncio.to_thread(self._undo, step)

    def _run(self, step: Step) -> str:
        if step.kind is StepKind.ATTACH:
            return self._change(step.guest, add=step.functions, remove=())
        if step.kind is StepKind.DETACH:
            return self._change(step.guest, add=(), remove=step.functions)
        raise StepFailed(f"the libvirt driver does not do {step.kind.value}")

    def _undo(self, step: Step) -> str:
        if step.kind is StepKind.ATTACH:
            return self._change(step.guest, add=(), remove=step.functions)
        if step.kind is StepKind.DETACH:
            return self._change(step.guest, add=step.functions, remove=())
        return "nothing to undo"

    def _change(self, guest: str | None, add: tuple[str, ...], remove: tuple[str, ...]) -> str:
        domain = self._domain(guest)
        running = int(domain.state()[0]) != SHUT_OFF
        if remove and running:
            raise StepFailed(
                f"guest {guest} is running: shut it down (virsh shutdown {guest}) "
                "before its GPU leaves"
            )
        before = domain.XMLDesc(XML_INACTIVE)
        after = _with_hostdevs(before, add, remove)
        words = []
        if parse_domain_xml(after).bus_ids != parse_domain_xml(before).bus_ids:
            self._connection().defineXML(after)
            words.append(f"defined {guest} with {len(parse_domain_xml(after).bus_ids)} hostdev(s)")
        else:
            words.append(f"{guest}'s definition already as planned")
        if running and add:
            live = set(parse_domain_xml(domain.XMLDesc(0)).bus_ids)
            missing = [b for b in add if b not in live]
            if missing:
                words.append(self._hotplug_or_restart(guest, missing))
        return "; ".join(words)

    def _hotplug_or_restart(self, guest: str | None, functions: list[str]) -> str:
        domain = self._domain(guest)
        try:
            for bdf in functions:
                domain.attachDeviceFlags(hostdev_xml(bdf), AFFECT_LIVE)
            return "hotplugged " + ", ".join(functions)
        except Exception as exc:
            why = str(exc).split(":")[0]
        domain.shutdown()
        deadline = time.monotonic() + self.shutdown_timeout_s
        while int(domain.state()[0]) != SHUT_OFF and time.monotonic() < deadline:
            time.sleep(0.2)
        forced = int(domain.state()[0]) != SHUT_OFF
        if forced:
            domain.destroy()
        domain = self._domain(guest)
        domain.create()
        return f"restarted {guest}{' (forced off)' if forced else ''}: no hotplug ({why})"
