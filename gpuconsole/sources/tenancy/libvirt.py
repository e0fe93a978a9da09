"""KVM guests and the PCI functions they hold, from libvirt (libvirt-python, optional).

Every domain counts, running and defined: a shut-off guest with a <hostdev> still has a
claim on the GPU (managed='yes' takes it at start). libvirt is blocking: call `read` from
a worker thread. The tenant may sit in the domain's metadata, either gpuconsole's own
element or OpenStack Nova's project:

    <metadata><gc:tenant xmlns:gc="https://gpuconsole.dev/xmlns/tenancy/1">acme</gc:tenant>
"""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuconsole.readings.tenancy import Guest

__all__ = ["TENANT_XMLNS", "GuestXml", "LibvirtError", "LibvirtReader", "parse_domain_xml"]

TENANT_XMLNS = "https://gpuconsole.dev/xmlns/tenancy/1"
NOVA_XMLNS_PREFIX = "http://openstack.org/xmlns/libvirt/nova/"

# virDomainState, in the words virsh uses
STATES = {
    0: "no state",
    1: "running",
    2: "blocked",
    3: "paused",
    4: "in shutdown",
    5: "shut off",
    6: "crashed",
    7: "pmsuspended",
}


class LibvirtError(Exception):
    """libvirt cannot be read: not installed, not reachable, or it refused; says which."""


@dataclass(frozen=True, slots=True)
class GuestXml:
    """What a domain's XML says: name, UUID, PCI functions held, tenant, and problems."""

    name: str
    uuid: str | None
    bus_ids: tuple[str, ...]
    tenant: str | None
    problems: tuple[str, ...]
    vsock_cid: int | None = None
    addresses: tuple[tuple[str, str], ...] = ()  # (host bus id, guest bus id)


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def _address(source: ET.Element | None) -> str | None:
    address = source.find("address") if source is not None else None
    return _bus_id(address)


def _bus_id(address: ET.Element | None) -> str | None:
    """An <address domain= bus= slot= function=/> in sysfs form."""
    if address is None:
        return None
    domain = _int(address.get("domain", "0"))
    bus, slot, function = (_int(address.get(k)) for k in ("bus", "slot", "function"))
    if domain is None or bus is None or slot is None or function is None:
        return None
    return f"{domain:04x}:{bus:02x}:{slot:02x}.{function:x}"


def _tenant(metadata: ET.Element | None) -> str | None:
    if metadata is None:
        return None
    own = metadata.find(f"{{{TENANT_XMLNS}}}tenant")
    if own is not None and (own.text or "").strip():
        return (own.text or "").strip()
    for element in metadata.iter():
        tag = element.tag
        if tag.startswith("{" + NOVA_XMLNS_PREFIX) and tag.endswith("}project"):
            if (element.text or "").strip():
                return (element.text or "").strip()
    return None


def parse_domain_xml(text: str) -> GuestXml:
    """The PCI functions a domain XML hands to its guest (<hostdev> and hostdev NICs)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"domain XML does not parse: {exc}") from None
    name = (root.findtext("name") or "").strip() or "(unnamed)"
    uuid = (root.findtext("uuid") or "").strip() or None
    bus_ids: list[str] = []
    problems: list[str] = []
    devices = root.find("devices")
    holders = []
    if devices is not None:
        holders += [h for h in devices.findall("hostdev") if h.get("type") == "pci"]
        holders += [i for i in devices.findall("interface") if i.get("type") == "hostdev"]
    addresses: list[tuple[str, str]] = []
    for number, holder in enumerate(holders, start=1):
        bus_id = _address(holder.find("source"))
        if bus_id is None:
            problems.append(f"{holder.tag} #{number} has no PCI source address")
        elif bus_id not in bus_ids:
            bus_ids.append(bus_id)
            # the address the guest sees it at (libvirt fills it in when it defines the domain)
            guest = holder.find("address")
            at = _bus_id(guest) if guest is not None and guest.get("type") == "pci" else None
            if at is not None:
                addresses.append((bus_id, at))
    return GuestXml(
        name,
        uuid,
        tuple(bus_ids),
        _tenant(root.find("metadata")),
        tuple(problems),
        _vsock_cid(devices),
        tuple(addresses),
    )


def _vsock_cid(devices: ET.Element | None) -> int | None:
    """The guest's virtio-vsock context id; None without a vsock device or before libvirt
    assigned one (auto='yes' on a domain that has not started)."""
    cid = devices.find("vsock/cid") if devices is not None else None
    number = _int(cid.get("address")) if cid is not None else None
    # 0-2 are the hypervisor's, the local and the host's own: never a guest's
    return number if number is not None and 3 <= number < 0xFFFFFFFF else None


def _load_libvirt() -> Any:
    try:
        import libvirt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise LibvirtError(
            "libvirt-python not installed (pip install 'gpuconsole[libvirt]')"
        ) from None
    return libvirt


_quiet = threading.Lock()
_quieted = False


def _silence(libvirt: Any) -> None:
    """libvirt prints every error to stderr by default; errors here become values."""
    global _quieted
    with _quiet:
        if not _quieted:
            libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
            _quieted = True


class LibvirtReader:
    """Reads every domain's state and XML through one read-only connection, kept open."""

    def __init__(self, uri: str, *, connect: Callable[[str], Any] | None = None) -> None:
        self.uri = uri
        self._connect = connect
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is not None:
            return self._conn
        if self._connect is not None:
            self._conn = self._connect(self.uri)
            return self._conn
        libvirt = _load_libvirt()
        _silence(libvirt)
        try:
            self._conn = libvirt.openReadOnly(self.uri)
        except libvirt.libvirtError as exc:
            raise LibvirtError(f"cannot connect to {self.uri}: {_message(exc)}") from None
        return self._conn

    def read(self) -> tuple[Guest, ...]:
        """Every domain, running and defined, with the PCI functions it holds (blocking)."""
        conn = self._connection()
        try:
            domains = conn.listAllDomains(0)
        except Exception as exc:
            self.close()  # reconnect next time: libvirtd may have restarted
            raise LibvirtError(f"{self.uri}: listing domains failed: {_message(exc)}") from None
        guests = []
        for domain in domains:
            try:
                state = STATES.get(int(domain.state()[0]), "unknown")
                parsed = parse_domain_xml(domain.XMLDesc(0))
            except ValueError as exc:
                guests.append(Guest(_name(domain), "unknown", (), "libvirt", problems=(str(exc),)))
                continue
            except Exception as exc:  # the domain vanished between list and read
                if "no domain" in _message(exc).lower():
                    continue
                raise LibvirtError(f"{self.uri}: {_name(domain)}: {_message(exc)}") from None
            guests.append(
                Guest(
                    name=parsed.name,
                    state=state,
                    bus_ids=parsed.bus_ids,
                    source="libvirt",
                    uuid=parsed.uuid,
                    tenant=parsed.tenant,
                    problems=parsed.problems,
                    vsock_cid=parsed.vsock_cid,
                    addresses=parsed.addresses,
                )
            )
        return tuple(guests)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection
                pass


def _name(domain: Any) -> str:
    try:
        return str(domain.name())
    except Exception:
        return "(unknown domain)"


def _message(exc: BaseException) -> str:
    get = getattr(exc, "get_error_message", None)
    text = get() if callable(get) else None
    return str(text or exc or type(exc).__name__)


def describe(guests: tuple[Guest, ...]) -> str:
    """'5 domains, 3 holding PCI devices' for the part's status line."""
    holding = sum(1 for g in guests if g.bus_ids)
    return f"{len(guests)} domain{'' if len(guests) == 1 else 's'}, {holding} holding PCI devices"
