"""Redfish through pyghmi's client: both the older Thermal/Power resources and the newer
Sensors, EnvironmentMetrics, PowerSubsystem and ThermalSubsystem ones; where a Chassis
links both, the newer (the older are deprecated since DMTF 2020.4, and their values differ).

pyghmi opens the session (X-Auth-Token where the service offers one) and speaks HTTPS
only; the resources are walked here, because pyghmi's own sensor list drops health,
thresholds and the HGX chassis. Resource URLs are discovered once and re-read every
poll; `RedfishClient` is the layer a test or another client can stand in for. Power is
read and set on one ComputerSystem: the config's `system`, else the only one (or the
only one that is not a DPU); chassis sensors are read whatever the number of systems.

BMCs send odd documents, so parsing is tolerant one field or array item at a time: a
value of another JSON kind than the schema's is unknown (a Status, a unit, a place) or
skipped (an array item, a link). A resource that fails as a whole (an HTTP error, a body
that is not an object, a collection whose Members is not an array) costs its own part,
said in the reading's `parts`; only the service root and the Chassis collection, or a
session that goes, fail the read, with a BmcError naming the URL.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import http.client
import logging
import math
import re
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import msgspec

from gpuconsole.readings.base import PartStatus, Severity, safe_text
from gpuconsole.readings.bmc import (
    BmcSensor,
    PowerState,
    SelEntry,
    SensorHealth,
    SensorKind,
    Thresholds,
)
from gpuconsole.sources.bmc.ipmi import PYGHMI_POWER
from gpuconsole.sources.bmc.link import BmcAuthError, BmcError, LinkReading, PowerAction
from gpuconsole.sources.bmc.sensors import (
    UnitStatus,
    context_of,
    gpu_module_of,
    kind_of,
    unit_of,
)

log = logging.getLogger(__name__)

Json = Mapping[str, Any]
VerifyCallback = Callable[[bytes], bool]

_HEALTH = {
    "OK": SensorHealth.OK,
    "Warning": SensorHealth.WARNING,
    "Critical": SensorHealth.CRITICAL,
}
_SEVERITY = {"OK": Severity.INFO, "Warning": Severity.WARNING, "Critical": Severity.CRITICAL}
_MAX_ID_DIGITS = 20  # a u64 in decimal; longer Ids are not record numbers
_LEGACY_THRESHOLDS = (
    ("LowerThresholdFatal", "lower_non_recoverable"),
    ("LowerThresholdCritical", "lower_critical"),
    ("LowerThresholdNonCritical", "lower_non_critical"),
    ("UpperThresholdNonCritical", "upper_non_critical"),
    ("UpperThresholdCritical", "upper_critical"),
    ("UpperThresholdFatal", "upper_non_recoverable"),
)
_THRESHOLDS = (
    ("LowerFatal", "lower_non_recoverable"),
    ("LowerCritical", "lower_critical"),
    ("LowerCaution", "lower_non_critical"),
    ("UpperCaution", "upper_non_critical"),
    ("UpperCritical", "upper_critical"),
    ("UpperFatal", "upper_non_recoverable"),
)


class RedfishHttpError(Exception):
    """A Redfish request answered with a status outside 2xx."""

    def __init__(self, url: str, status: int, method: str = "GET") -> None:
        super().__init__(f"{method} {url}: HTTP {status}")
        self.status = status


class RedfishRequestError(Exception):
    """A Redfish GET that failed on its own, the session unharmed: a 2xx body that is not
    JSON, or a URL the BMC linked that no request can carry (control characters)."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(f"GET {url}: {problem}")
        self.problem = problem


class RedfishResourceError(BmcError):
    """One resource that could not be read: an HTTP error status, or a body that is no
    usable document. The session stands; what the resource holds is not read this poll."""

    def __init__(self, label: str, url: str, problem: str) -> None:
        super().__init__(safe_text(f"{label}: GET {url}: {problem}"))  # a URL the BMC gave
        self.url = url
        self.problem = problem


class RedfishClient(Protocol):
    """The layer under RedfishLink (blocking): a logged-on session."""

    def get(self, url: str) -> Any:
        """The decoded JSON body: an object, or whatever else the BMC sent."""
        ...

    def post(self, url: str, body: Mapping[str, Any]) -> None:
        """POST a JSON body (an action); raises RedfishHttpError outside 2xx."""
        ...

    def logout(self) -> None: ...


@functools.cache
def _tls_context(verify_by_callback: bool) -> ssl.SSLContext:
    """One TLS context per process: pyghmi builds one for every request, loading the
    system's CA store each time (40 ms of CPU; a poll makes dozens of requests)."""
    if not verify_by_callback:
        return ssl.create_default_context()  # the system's CAs, and the host name checked
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the verify callback checks the certificate
    return context


@functools.cache
def _timed_command() -> type[Any]:
    """pyghmi's Redfish Command with our timeout on every connection, logon included.

    Its constructor opens the HTTPS connection with a 60 s timeout and logs on at once
    (GET /redfish/v1/, POST a session, read the system), before a caller could change
    it. `wc` is made a property here, so the connection the constructor assigns is
    swapped at once for one with our timeout; each request runs on a copy of it.
    """
    from pyghmi import exceptions
    from pyghmi.redfish import command
    from pyghmi.util import webclient

    class Connection(webclient.SecureHTTPConnection):  # type: ignore[misc]
        """pyghmi's connection (cookies, headers, the verify callback), with a shared
        TLS context; `dupe` keeps the class, so every request's copy has it too."""

        def dupe(self, timeout: float | None = None) -> Connection:
            timeout = self.mytimeout if timeout is None else timeout
            return Connection(self.thehost, self.theport, clone=self, timeout=timeout)

        def connect(self) -> None:
            family, _, _, _, address = socket.getaddrinfo(self.host, self.port)[0]
            plain = socket.socket(family)
            plain.settimeout(self.mytimeout)
            with contextlib.suppress(OSError):  # as pyghmi: BMCs that mishandle big MTUs
                plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1456)
            with contextlib.ExitStack() as on_error:
                on_error.callback(plain.close)
                plain.connect(address)
                if not self._certverify:
                    tls = _tls_context(False).wrap_socket(plain, server_hostname=self.thehost)
                else:
                    tls = _tls_context(True).wrap_socket(plain)
                    on_error.callback(tls.close)
                    der = tls.getpeercert(binary_form=True)
                    if not self._certverify(der):
                        raise exceptions.UnrecognizedCertificate("Unknown certificate", der)
                on_error.pop_all()
            self.sock = tls

    class TimedCommand(command.Command):  # type: ignore[misc]
        def __init__(self, *args: Any, timeout_s: float, **kwargs: Any) -> None:
            self._timeout_s = timeout_s
            try:
                super().__init__(*args, **kwargs)
            except exceptions.PyghmiException as exc:
                # A Manager of several ComputerSystems (blades, a host and its DPU) and no
                # system given: pyghmi refuses once logged on. The link chooses the system
                # itself, and reads chassis sensors whatever the number of systems.
                if "sysurl" not in str(exc):
                    raise

        @property
        def wc(self) -> Any:
            return self._wc

        @wc.setter
        def wc(self, given: Any) -> None:
            if not isinstance(given, Connection):
                given = Connection(
                    given.thehost,
                    given.theport,
                    verifycallback=given._certverify,
                    timeout=self._timeout_s,
                )
            self._wc = given

    return TimedCommand


class PyghmiRedfish:
    """A session through pyghmi.redfish.command.Command (its logon, X-Auth-Token, TLS and
    certificate check); `timeout_s` bounds each request. Which ComputerSystem power acts
    on is RedfishLink's choice, not pyghmi's."""

    def __init__(
        self,
        host: str,
        port: int,
        username: bytes,
        password: bytes,
        verify: VerifyCallback | None,
        timeout_s: float,
    ) -> None:
        self._cmd = _timed_command()(
            host, username, password, verify, port=port, timeout_s=timeout_s
        )

    def get(self, url: str) -> Any:
        try:
            body, status = self._cmd.wc.grab_json_response_with_status(url)
        except http.client.InvalidURL:
            raise RedfishRequestError(url, "not a URL a request can carry") from None
        except ValueError:  # a 2xx body that json.loads refused (pyghmi decodes it)
            raise RedfishRequestError(url, "the body is not JSON") from None
        if not 200 <= status < 300:
            raise RedfishHttpError(url, status)
        return body  # any JSON kind: RedfishLink names a body that is not an object

    def post(self, url: str, body: Mapping[str, Any]) -> None:
        _answer, status = self._cmd.wc.grab_json_response_with_status(url, dict(body))
        if not 200 <= status < 300:
            raise RedfishHttpError(url, status, "POST")

    def logout(self) -> None:
        self._cmd = None


def verify_callback(verify: bool, ca_file: str, host: str) -> VerifyCallback | None:
    """How to check the BMC's certificate.

    Off: accept any. A CA file: the certificate must be one in the file (a pinned
    self-signed one) or be issued by one in it, valid now and name `host`. Neither:
    None, and pyghmi checks against the system's trust store.
    """
    if not verify:
        return lambda _cert: True
    if not ca_file:
        return None
    from cryptography import x509

    pem = Path(ca_file).read_bytes()
    anchors = x509.load_pem_x509_certificates(pem)
    pinned = {c.public_bytes(_der()) for c in anchors}

    def check(der: bytes) -> bool:
        if der in pinned:
            return True
        cert = x509.load_der_x509_certificate(der)
        now = dt.datetime.now(dt.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            return False
        if not _names_host(cert, host):
            return False
        for anchor in anchors:
            try:
                cert.verify_directly_issued_by(anchor)
            except Exception:
                continue
            return True
        return False

    return check


def _der() -> Any:
    from cryptography.hazmat.primitives.serialization import Encoding

    return Encoding.DER


def _names_host(cert: Any, host: str) -> bool:
    import ipaddress

    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return any(_dns_match(host, name) for name in san.get_values_for_type(x509.DNSName))
    return address in san.get_values_for_type(x509.IPAddress)


def _dns_match(host: str, name: str) -> bool:
    host, name = host.lower().rstrip("."), name.lower().rstrip(".")
    if name.startswith("*."):
        head, _, rest = host.partition(".")
        return bool(head) and rest == name[2:]
    return host == name


# Where a Chassis links both, the newer resources are read and the deprecated ones (DMTF
# 2020.4) are not: they hold the same readings under other ids, often stale.
_DEPRECATED = {"Thermal": "ThermalSubsystem", "Power": "PowerSubsystem"}
_LINKS = ("Sensors", "ThermalSubsystem", "PowerSubsystem", "EnvironmentMetrics", *_DEPRECATED)
# Redfish's ComputerSystem.Reset types; the answer says what pyghmi's set_power would have.
_RESET_TYPE = {
    PowerAction.ON: "On",
    PowerAction.OFF: "ForceOff",
    PowerAction.SOFT: "GracefulShutdown",
    PowerAction.RESET: "ForceRestart",
    PowerAction.CYCLE: "PowerCycle",
}


@dataclass
class _Chassis:
    """A Chassis, the resources it links and the members of their collections."""

    id: str
    module_id: int | None
    links: dict[str, str]  # "Sensors", "Thermal", ... -> URL, for those it links
    sensors: list[str] = field(default_factory=list)
    fans: list[str] = field(default_factory=list)
    psus: list[str] = field(default_factory=list)
    unlisted: set[str] = field(default_factory=set)  # links whose collection did not read
    psus_needed: int | None = None  # its PowerSubsystem's PowerSupplyRedundancy says

    def reads(self, name: str) -> str | None:
        """The URL of a linked resource this poll reads (None: not linked, or its
        collection failed, or superseded by a newer one)."""
        if name in self.unlisted or (name in _DEPRECATED and "Sensors" in self.links):
            return None
        return self.links.get(name)


@dataclass
class _Log:
    """A LogService: its Entries collection, and where its clock is read (its own
    DateTime, else that of the Manager that manages its system; "" where neither has one)."""

    entries: str
    clock: str


@dataclass
class _System:
    url: str
    type: str  # SystemType: Physical, DPU, ...
    reset: str  # the ComputerSystem.Reset action's target
    logs: list[_Log]


@dataclass
class _Inventory:
    chassis: list[_Chassis]
    systems: list[_System]
    power: _System | None  # the system whose power is read and set
    power_problem: str  # why none, where `power` is None
    parts: list[PartStatus]  # what discovery could not read, and what it left out
    complete: bool  # every resource answered: nothing to look for again before its time


class RedfishLink:
    """A BmcLink over a RedfishClient. `system` is the ComputerSystem URL the config chose
    for power, where the BMC manages several."""

    def __init__(
        self,
        label: str,
        connect: Callable[[], RedfishClient],
        *,
        system: str = "",
        inventory_every: int = 60,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.label = label
        self._clock = clock  # this host's: what the BMC's is measured against
        self._connect = connect
        self._system = system
        self._timeout_s = timeout_s  # the client's per-request timeout, for messages
        self._client: RedfishClient | None = None
        self._inventory: _Inventory | None = None
        self._inventory_every = max(1, inventory_every)
        self._reads = 0

    # --- session -------------------------------------------------------------------

    def _open(self) -> RedfishClient:
        if self._client is None:
            self._client = self._call(self._connect)
        return self._client

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except BmcError:
            raise
        except (RedfishHttpError, RedfishRequestError) as exc:
            if getattr(exc, "status", None) in (401, 403):
                self._drop()
                raise self._error(exc) from None
            raise BmcError(safe_text(f"{self.label}: {exc}")) from None  # the session stands
        except Exception as exc:
            self._drop()
            raise self._error(exc) from None

    def _error(self, exc: Exception) -> BmcError:
        """What went wrong, in words an operator can act on, naming this BMC."""
        status = getattr(exc, "status", None)
        text = str(exc).strip() or type(exc).__name__
        if status in (401, 403) or "access denied" in text.lower():
            return BmcAuthError(f"{self.label}: the BMC refused the user name or password")
        if isinstance(exc, TimeoutError):  # connect, TLS handshake or a reply too slow
            within = f" within {self._timeout_s:g} s" if self._timeout_s else ""
            return BmcError(f"{self.label}: no answer{within}")
        if isinstance(exc, ConnectionRefusedError):
            return BmcError(f"{self.label}: connection refused (BMC down or not serving HTTPS?)")
        if "certificate" in text.lower():
            return BmcError(f"{self.label}: TLS certificate not trusted ({text})")
        if isinstance(exc, OSError) and exc.strerror:
            text = exc.strerror  # "No route to host", without "[Errno 113]"
        return BmcError(f"{self.label}: {safe_text(text)}")  # it may quote what the BMC sent

    def _drop(self) -> None:
        client, self._client = self._client, None
        self._inventory = None
        if client is not None:
            client.logout()

    def _get(self, url: str) -> Json:
        """A resource as an object; RedfishResourceError where this one resource failed
        (the session and every other resource stand), BmcError where the BMC did."""
        client = self._open()
        try:
            doc = client.get(url)
        except RedfishHttpError as exc:
            if exc.status in (401, 403):
                self._drop()
                raise self._error(exc) from None
            raise RedfishResourceError(self.label, url, f"HTTP {exc.status}") from None
        except RedfishRequestError as exc:
            raise RedfishResourceError(self.label, url, exc.problem) from None
        except BmcError:
            raise
        except Exception as exc:
            self._drop()
            raise self._error(exc) from None
        if not isinstance(doc, Mapping):
            raise RedfishResourceError(self.label, url, f"the body is {_kind(doc)}, not an object")
        return doc

    def _collection(self, url: str) -> list[Json]:
        """The objects among a collection's Members (other items skipped)."""
        members = self._get(url).get("Members")
        if members is None:
            return []
        if not isinstance(members, list):
            raise RedfishResourceError(
                self.label, url, f"Members is {_kind(members)}, not an array"
            )
        return [m for m in members if isinstance(m, Mapping)]

    def _members(self, url: str | None) -> list[str]:
        """The member URLs of a collection; a member without a usable link is skipped."""
        if not url:
            return []
        return [ref for m in self._collection(url) if (ref := _odata_id(m))]

    # --- discovery -----------------------------------------------------------------

    def _discover(self) -> _Inventory:
        """The Chassis and their resources, and the ComputerSystems. Only the service
        root and the Chassis collection must answer; any other resource that fails is
        one part not read, said in `parts`."""
        root = self._get("/redfish/v1/")
        parts: list[PartStatus] = []
        chassis: list[_Chassis] = []
        # The Chassis collection should list every Chassis; one that a listed Chassis
        # Contains (a card in a server) is read too where the collection leaves it out.
        queue = self._members(_ref(root, "Chassis"))
        seen = {_path(url) for url in queue}
        while queue:
            member = queue.pop(0)
            try:
                item, contained = self._discover_chassis(member, parts)
            except RedfishResourceError as exc:
                parts.append(_failed(exc.url, exc))
                continue
            chassis.append(item)
            for url in contained:
                if _path(url) not in seen:
                    seen.add(_path(url))
                    queue.append(url)
        systems: list[_System] = []
        listing = _ref(root, "Systems")
        try:
            members = self._members(listing)
        except RedfishResourceError as exc:
            parts.append(_failed(exc.url, exc))
            power, problem = None, f"{_part(exc.url)}: {exc.problem}"
        else:
            for member in members:
                try:
                    systems.append(self._discover_system(member, parts))
                except RedfishResourceError as exc:
                    parts.append(_failed(exc.url, exc))
            power, problem = self._choose(members, systems)
        complete = all(p.ok for p in parts)
        for item in chassis:
            for name, newer in _DEPRECATED.items():
                link = item.links.get(name)
                if link and "Sensors" in item.links:
                    read = " and ".join(n for n in ("Sensors", newer) if n in item.links)
                    detail = f"deprecated: {read} read instead"
                    parts.append(PartStatus(_part(link), True, detail, enabled=False))
        return _Inventory(chassis, systems, power, problem, parts, complete)

    def _discover_chassis(self, url: str, parts: list[PartStatus]) -> tuple[_Chassis, list[str]]:
        """A Chassis, and the Chassis it Contains."""
        doc = self._get(url)
        cid = str(doc.get("Id") or url.rstrip("/").rsplit("/", 1)[-1])
        links = {name: ref for name in _LINKS if (ref := _ref(doc, name))}
        item = _Chassis(cid, gpu_module_of(cid, str(doc.get("Name") or "")), links)
        for name, member_of, into in (
            ("Sensors", None, item.sensors),
            ("ThermalSubsystem", "Fans", item.fans),
            ("PowerSubsystem", "PowerSupplies", item.psus),
        ):
            link = links.get(name)
            if not link:
                continue
            try:
                resource = self._get(link) if member_of else {}
                listing = _ref(resource, member_of) if member_of else link
                if name == "PowerSubsystem":
                    item.psus_needed = _psus_needed(resource, "PowerSupplyRedundancy")
                into.extend(self._members(listing))
            except RedfishResourceError as exc:
                item.unlisted.add(name)
                parts.append(_failed(link, exc))
        links_of = doc.get("Links")
        contains = _objects(links_of, "Contains") if isinstance(links_of, Mapping) else []
        return item, [ref for link in contains if (ref := _odata_id(link))]

    def _discover_system(self, url: str, parts: list[PartStatus]) -> _System:
        doc = self._get(url)
        actions = doc.get("Actions")
        reset = actions.get("#ComputerSystem.Reset") if isinstance(actions, Mapping) else None
        target = _text(reset.get("target")) if isinstance(reset, Mapping) else None
        logs: list[_Log] = []
        services = _ref(doc, "LogServices")
        if services:
            manager = self._manager_clock(doc, parts)
            try:
                for service in self._members(services):
                    log_doc = self._get(service)
                    entries = _ref(log_doc, "Entries")
                    if entries:
                        clock = service if _text(log_doc.get("DateTime")) else manager
                        logs.append(_Log(entries, clock))
            except RedfishResourceError as exc:
                parts.append(_failed(services, exc))
        return _System(
            url,
            str(doc.get("SystemType") or ""),
            target or f"{url.rstrip('/')}/Actions/ComputerSystem.Reset",
            logs,
        )

    def _manager_clock(self, system: Json, parts: list[PartStatus]) -> str:
        """The Manager of a system (its first ManagedBy) where it has a DateTime: the BMC's
        clock, for a LogService that does not give its own; "" where none does."""
        links = system.get("Links")
        managers = _objects(links, "ManagedBy") if isinstance(links, Mapping) else []
        url = next((ref for m in managers if (ref := _odata_id(m))), None)
        if url is None:
            return ""
        try:
            return url if _text(self._get(url).get("DateTime")) else ""
        except RedfishResourceError as exc:
            parts.append(_failed(url, exc))
            return ""

    def _bmc_clock(self, url: str) -> _Clock:
        """The BMC's clock as `url` (a LogService or Manager) gives it: how far it is ahead
        of this host's, in seconds (negative: behind; None where it gives no time), taken
        against the middle of the request, so the time the request took does not count
        (DateTime has whole seconds); and its DateTimeLocalOffset."""
        before = self._clock()
        doc = self._get(url)
        after = self._clock()
        zone = _zone(doc.get("DateTimeLocalOffset"))
        said = _instant(doc.get("DateTime"), _Clock(None, zone))
        return _Clock(None if said is None else said - (before + after) / 2, zone)

    def _choose(self, listed: list[str], systems: list[_System]) -> tuple[_System | None, str]:
        """The system power is read and set on: the configured one; else the only one, or
        the only one that is not a DPU (a SmartNIC's own system beside its host's)."""
        names = ", ".join(listed) or "none"
        if self._system:
            wanted = _path(self._system)
            for system in systems:
                if _path(system.url) == wanted:
                    return system, ""
            if wanted in map(_path, listed):
                return None, f"system {self._system} could not be read"
            return None, f"system {self._system} is not on this BMC; it has {names}"
        hosts = [s for s in systems if s.type != "DPU"] if len(systems) > 1 else systems
        if len(hosts) == 1 and len(systems) == len(listed):
            return hosts[0], ""
        if not listed:
            return None, "the BMC lists no ComputerSystem"
        if len(listed) == 1:
            return None, f"system {listed[0]} could not be read"
        return None, (
            f'{len(listed)} systems, none chosen: set system = "<one of them>" in this '
            f"[[bmc]] entry: {names}"
        )

    # --- reading -------------------------------------------------------------------

    def read(self, *, sel: bool) -> LinkReading:
        inventory = self._inventory
        if inventory is None or not inventory.complete or self._reads % self._inventory_every == 0:
            inventory = self._inventory = self._discover()
        self._reads += 1
        parts = list(inventory.parts)
        sensors: list[BmcSensor] = []
        extra: list[BmcSensor] = []
        psus: list[UnitStatus] = []
        fans: list[UnitStatus] = []
        needed: list[int] = []
        for chassis in inventory.chassis:
            found = self._read_chassis(chassis, parts)
            sensors.extend(found.sensors)
            extra.extend(found.extra)
            psus.extend(found.psus)
            fans.extend(found.fans)
            if (need := chassis.psus_needed or found.psus_needed) is not None:
                needed.append(need)
        state, power_part = self._power_state(inventory)
        parts.append(power_part)
        entries: list[SelEntry] = []
        skew: float | None = None
        if sel:
            clocks: dict[str, _Clock] = {}  # by URL: one GET each per poll
            for system in inventory.systems:
                for log_service in system.logs:
                    url = log_service.clock
                    try:
                        if url and url not in clocks:
                            clocks[url] = self._bmc_clock(url)
                        members = self._collection(log_service.entries)
                    except RedfishResourceError as exc:
                        parts.append(_failed(exc.url, exc))
                        continue
                    clock = clocks.get(url, _NO_CLOCK)
                    if skew is None:
                        skew = clock.skew_s
                    entries.extend(e for m in members if (e := _log_entry(m, clock)) is not None)
        return LinkReading(
            state,
            tuple(sensors + extra),
            tuple(sorted(entries, key=lambda e: e.record_id)),
            tuple(psus),
            tuple(fans),
            tuple(parts),
            skew,
            sum(needed) if needed else None,
        )

    def _read_chassis(self, chassis: _Chassis, parts: list[PartStatus]) -> _ChassisReading:
        """One Chassis's resources, each read or failed on its own."""
        out = _ChassisReading()
        docs: list[tuple[str, Json]] = []
        known = {_path(url) for url in chassis.sensors}  # the Sensors a DataSourceUri names
        fan_sources: set[str] = set()
        url = chassis.reads("Sensors")
        if url:
            failed: list[RedfishResourceError] = []
            for member in chassis.sensors:
                try:
                    docs.append((member, self._get(member)))
                except RedfishResourceError as exc:
                    failed.append(exc)
            parts.append(_outcome(url, failed, _many(len(docs), "sensor")))
        url = chassis.reads("ThermalSubsystem")
        if url:
            failed = []
            for member in chassis.fans:
                try:
                    doc = self._get(member)
                except RedfishResourceError as exc:
                    failed.append(exc)
                    continue
                out.fans.append(_unit(doc))
                excerpt = doc.get("SpeedPercent")
                if isinstance(excerpt, Mapping):
                    source = _path(_text(excerpt.get("DataSourceUri")) or "")
                    if source in known:
                        fan_sources.add(source)  # the Sensor holds the reading: a fan
                    else:
                        out.sensors.append(_fan_excerpt(doc, excerpt, chassis))
            parts.append(_outcome(url, failed, _many(len(chassis.fans) - len(failed), "fan")))
        url = chassis.reads("PowerSubsystem")
        if url:
            failed = []
            for member in chassis.psus:
                try:
                    out.psus.append(_unit(self._get(member)))
                except RedfishResourceError as exc:
                    failed.append(exc)
            parts.append(
                _outcome(url, failed, _many(len(out.psus), "power supply", "power supplies"))
            )
        for name in _DEPRECATED:
            url = chassis.reads(name)
            if not url:
                continue
            try:
                doc = self._get(url)
            except RedfishResourceError as exc:
                parts.append(_failed(url, exc))
                continue
            if name == "Thermal":
                # fans from ThermalSubsystem where there is one: the same fans, counted once
                found = _thermal_sensors(doc, chassis, fans="ThermalSubsystem" not in chassis.links)
                detail = _many(len(found), "sensor")
            else:
                found, units = _power_sensors(doc, chassis)
                if "PowerSubsystem" not in chassis.links:
                    out.psus.extend(units)
                    out.psus_needed = _psus_needed(doc, "Redundancy")
                detail = (
                    f"{_many(len(found), 'sensor')}, "
                    f"{_many(len(units), 'power supply', 'power supplies')}"
                )
            out.sensors.extend(found)
            parts.append(PartStatus(_part(url), True, detail))
        url = chassis.reads("EnvironmentMetrics")
        if url:
            try:
                doc = self._get(url)
            except RedfishResourceError as exc:
                parts.append(_failed(url, exc))
            else:
                fan_sources |= _fan_speed_sources(doc) & known
                found = _environment_sensors(doc, chassis, known)
                out.extra.extend(found)
                parts.append(
                    PartStatus(
                        _part(url),
                        True,
                        _many(len(found), "reading of its own", "readings of its own"),
                    )
                )
        generic = [_generic_sensor(doc, u, chassis, _path(u) in fan_sources) for u, doc in docs]
        out.sensors[:0] = generic
        return out

    def _power_state(self, inventory: _Inventory) -> tuple[PowerState, PartStatus]:
        system = inventory.power
        if system is None:
            return PowerState.UNKNOWN, PartStatus("power", False, inventory.power_problem)
        try:
            doc = self._get(system.url)
        except RedfishResourceError as exc:
            return PowerState.UNKNOWN, PartStatus(
                "power", False, f"{_part(exc.url)}: {exc.problem}"
            )
        raw = _text(doc.get("PowerState"))
        state = {"on": PowerState.ON, "off": PowerState.OFF}.get((raw or "").lower())
        said = raw if state is None else state.value
        detail = f"{_part(system.url)}: {said or 'no PowerState'}"
        return state or PowerState.UNKNOWN, PartStatus("power", True, detail)

    def set_power(self, action: PowerAction) -> str:
        inventory = self._inventory
        if inventory is None or inventory.power is None:
            inventory = self._inventory = self._discover()
        system = inventory.power
        if system is None:
            problem = safe_text(inventory.power_problem)  # it names the BMC's systems
            raise BmcError(f"{self.label}: power {action.value} not sent: {problem}")
        if action in (PowerAction.ON, PowerAction.OFF):  # already so: nothing to send
            now = str(self._get(system.url).get("PowerState") or "").lower()
            if now == action.value:
                return now
        client = self._open()
        self._call(lambda: client.post(system.reset, {"ResetType": _RESET_TYPE[action]}))
        return PYGHMI_POWER[action]

    def close(self) -> None:
        self._drop()


@dataclass
class _ChassisReading:
    sensors: list[BmcSensor] = field(default_factory=list)
    extra: list[BmcSensor] = field(default_factory=list)  # read where no Sensor says it
    psus: list[UnitStatus] = field(default_factory=list)
    fans: list[UnitStatus] = field(default_factory=list)
    psus_needed: int | None = None


# The most PSUs a redundancy group may say it needs: a bigger figure is no chassis's
_MAX_NEEDED = 64


def _psus_needed(doc: Json, key: str) -> int | None:
    """How many PSUs a chassis needs to run, by its redundancy groups (`key`: a
    PowerSubsystem's PowerSupplyRedundancy, MinNeededInGroup each; the older Power
    resource's Redundancy, MinNumNeeded each), added up; None where none says it."""
    said = [
        value
        for group in _objects(doc, key)
        if (value := group.get("MinNeededInGroup", group.get("MinNumNeeded"))) is not None
        and type(value) is int
        and 0 < value <= _MAX_NEEDED
    ]
    return sum(said) if said else None


def _path(url: str) -> str:
    """A URL as the path it names: DataSourceUri and @odata.id may differ in a host part
    or a trailing slash."""
    return urlsplit(url).path.rstrip("/")


def _part(url: str) -> str:
    """A resource as a part is named: its path under the service root."""
    path = _path(url)
    return path.removeprefix("/redfish/v1/") if path != "/redfish/v1" else "service root"


def _many(n: int, one: str, more: str = "") -> str:
    return f"{n} {one if n == 1 else more or one + 's'}"


def _failed(part_url: str, exc: RedfishResourceError) -> PartStatus:
    return _outcome(part_url, [exc], "")


def _outcome(part_url: str, failed: list[RedfishResourceError], detail: str) -> PartStatus:
    """A part read whole (with `detail`), or failed: its first failure, and how many more."""
    if not failed:
        return PartStatus(_part(part_url), True, detail)
    first = failed[0]
    inner = _path(first.url).removeprefix(_path(part_url)).lstrip("/")
    text = f"{inner}: {first.problem}" if inner else first.problem
    if len(failed) > 1:
        text += f" (and {len(failed) - 1} more)"
    return PartStatus(_part(part_url), False, text)


# --- resource parsing (pure) -----------------------------------------------------------


def _kind(value: Any) -> str:
    """A JSON value's kind in words, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _text(value: Any) -> str | None:
    """A string field, or None for a value of another kind."""
    return value if isinstance(value, str) else None


def _odata_id(link: Json) -> str | None:
    ref = link.get("@odata.id")
    return ref if isinstance(ref, str) and ref else None


def _ref(doc: Json, key: str) -> str | None:
    """The URL a link field points to; None when absent or not a link."""
    value = doc.get(key)
    return _odata_id(value) if isinstance(value, Mapping) else None


def _objects(doc: Json, key: str) -> list[Json]:
    """The objects of an array field; a field of another kind has none, other items skipped."""
    value = doc.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


# A Status of another kind than an object: its health is unknown, shown as unrecognised.
_ODD_STATUS: Json = {"Health": "unreadable Status"}


def _status(doc: Json) -> Json:
    status = doc.get("Status")
    if status is None:
        return {}
    return status if isinstance(status, Mapping) else _ODD_STATUS


def _health(doc: Json) -> SensorHealth:
    health = _status(doc).get("Health")
    return _HEALTH.get(str(health or "OK"), SensorHealth.WARNING)


def _states(doc: Json) -> tuple[str, ...]:
    health = _status(doc).get("Health")
    return (str(health),) if health and health != "OK" else ()


def _number(value: Any) -> float | None:
    """A reading; anything but a finite number (1e400 reads as inf) is no reading."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond a float
        return None
    return number if math.isfinite(number) else None


def _thresholds(doc: Json, names: tuple[tuple[str, str], ...]) -> Thresholds | None:
    values: dict[str, float] = {}
    for key, name in names:
        raw = doc.get(key)
        if isinstance(raw, Mapping):
            raw = raw.get("Reading")
        number = _number(raw)
        if number is not None:
            values[name] = number
    return Thresholds(**values) if values else None


def _sensor(
    doc: Json,
    *,
    chassis: _Chassis,
    local_id: str,
    type_name: str,
    value: Any,
    unit: str,
    thresholds: Thresholds | None,
    kind: SensorKind | None = None,
) -> BmcSensor:
    """A sensor of `chassis`; its id is the Chassis Id and `local_id`, unique within it."""
    name = str(doc.get("Name") or local_id)
    kind = kind or kind_of(type_name, unit)
    return BmcSensor(
        name=name,
        sensor_id=f"{chassis.id}/{local_id}",
        kind=kind,
        type=type_name,
        value=_number(value),
        unit=unit,
        health=_health(doc),
        states=_states(doc),
        thresholds=thresholds,
        context=context_of(name, kind, _text(doc.get("PhysicalContext"))),
        gpu_module_id=gpu_module_of(local_id, name) or chassis.module_id,
    )


# The unit each ReadingType is read in (DMTF Sensor schema): a sensor with no reading and
# no ReadingUnits (a pulled PSU's) keeps its unit, so its series keeps its name.
_READING_TYPE_UNITS = {
    "Temperature": "Cel",
    "Humidity": "%",
    "Power": "W",
    "EnergykWh": "kW.h",
    "EnergyJoules": "J",
    "EnergyWh": "W.h",
    "ChargeAh": "A.h",
    "Voltage": "V",
    "Current": "A",
    "Frequency": "Hz",
    "Pressure": "Pa",
    "PressurekPa": "kPa",
    "PressurePa": "Pa",
    "LiquidLevel": "cm",
    "Rotational": "RPM",
    "AirFlow": "ft3/min",
    "AirFlowCMM": "m3/min",
    "LiquidFlow": "L/s",
    "LiquidFlowLPM": "L/min",
    "Barometric": "mm[Hg]",
    "Altitude": "m",
    "Percent": "%",
    "AbsoluteHumidity": "g/m3",
    "Heat": "kW",
}


def _generic_sensor(doc: Json, url: str, chassis: _Chassis, fan: bool) -> BmcSensor:
    """A Sensor resource (DMTF 2020.4 and later); `fan` where a Fan or the chassis's
    EnvironmentMetrics names it as a fan's speed (in percent, it says so nowhere else)."""
    reading_type = _text(doc.get("ReadingType"))
    unit = unit_of(_text(doc.get("ReadingUnits")) or _READING_TYPE_UNITS.get(reading_type or ""))
    fan = fan or (unit == "%" and _text(doc.get("PhysicalContext")) == "Fan")
    thresholds = doc.get("Thresholds")
    return _sensor(
        doc,
        chassis=chassis,
        local_id=_text(doc.get("Id")) or url.rstrip("/").rsplit("/", 1)[-1],
        type_name=reading_type or "Unknown",
        value=doc.get("Reading"),
        unit=unit,
        thresholds=_thresholds(thresholds, _THRESHOLDS)
        if isinstance(thresholds, Mapping)
        else None,
        kind=SensorKind.FAN if fan else None,
    )


def _fan_excerpt(doc: Json, excerpt: Json, chassis: _Chassis) -> BmcSensor:
    """A Fan's SpeedPercent where no Sensor read holds it: the fan's own reading."""
    percent = _number(excerpt.get("Reading"))
    rpm = _number(excerpt.get("SpeedRPM"))
    value, unit = (rpm, "RPM") if percent is None and rpm is not None else (percent, "%")
    return _sensor(
        doc,
        chassis=chassis,
        local_id=f"Fans/{_text(doc.get('Id')) or doc.get('Name') or '?'}",
        type_name="Fan",
        value=value,
        unit=unit,
        thresholds=None,
        kind=SensorKind.FAN,
    )


def _fan_speed_sources(doc: Json) -> set[str]:
    """The Sensors EnvironmentMetrics names as fan speeds."""
    found = set()
    for item in _objects(doc, "FanSpeedsPercent"):
        source = _text(item.get("DataSourceUri"))
        if source:
            found.add(_path(source))
    return found


def _thermal_sensors(doc: Json, chassis: _Chassis, *, fans: bool = True) -> list[BmcSensor]:
    """The deprecated Thermal resource: Temperatures, and Fans where `fans`."""
    out: list[BmcSensor] = []
    for index, temp in enumerate(_objects(doc, "Temperatures")):
        out.append(
            _sensor(
                temp,
                chassis=chassis,
                local_id=f"Temperatures/{temp.get('MemberId', index)}",
                type_name="Temperature",
                value=temp.get("ReadingCelsius"),
                unit="C",
                thresholds=_thresholds(temp, _LEGACY_THRESHOLDS),
            )
        )
    for index, fan in enumerate(_objects(doc, "Fans") if fans else ()):
        out.append(
            _sensor(
                fan,
                chassis=chassis,
                local_id=f"Fans/{fan.get('MemberId', index)}",
                type_name="Fan",
                value=fan.get("Reading"),
                unit=unit_of(_text(fan.get("ReadingUnits") or "RPM")),  # the default
                thresholds=_thresholds(fan, _LEGACY_THRESHOLDS),
                kind=SensorKind.FAN,
            )
        )
    return out


def _power_sensors(doc: Json, chassis: _Chassis) -> tuple[list[BmcSensor], list[UnitStatus]]:
    """The deprecated Power resource: PowerControl, PowerSupplies and Voltages."""
    out: list[BmcSensor] = []
    units: list[UnitStatus] = []
    for index, control in enumerate(_objects(doc, "PowerControl")):
        sensor = _sensor(
            control,
            chassis=chassis,
            local_id=f"PowerControl/{control.get('MemberId', index)}",
            type_name="Power",
            value=control.get("PowerConsumedWatts"),
            unit="W",
            thresholds=None,
        )
        out.append(_with_context(sensor, "total"))
    for index, psu in enumerate(_objects(doc, "PowerSupplies")):
        watts = psu.get("PowerOutputWatts", psu.get("LastPowerOutputWatts"))
        sensor = _sensor(
            psu,
            chassis=chassis,
            local_id=f"PowerSupplies/{psu.get('MemberId', index)}",
            type_name="Power Supply",
            value=watts,
            unit="W",
            thresholds=None,
        )
        out.append(_with_context(sensor, "psu"))
        units.append(_unit(psu))
    for index, volt in enumerate(_objects(doc, "Voltages")):
        out.append(
            _sensor(
                volt,
                chassis=chassis,
                local_id=f"Voltages/{volt.get('MemberId', index)}",
                type_name="Voltage",
                value=volt.get("ReadingVolts"),
                unit="V",
                thresholds=_thresholds(volt, _LEGACY_THRESHOLDS),
            )
        )
    return out, units


def _environment_sensors(doc: Json, chassis: _Chassis, known: set[str]) -> list[BmcSensor]:
    """EnvironmentMetrics' chassis power and temperature, where no Sensor read holds them.

    Each is an excerpt: its DataSourceUri names the Sensor it copies (rackmount1's
    TemperatureCelsius is a CPU's), so a value whose Sensor is read is not a second sensor
    (summing power would count it twice). The temperature is the chassis's, not the air
    at its intake."""
    out: list[BmcSensor] = []
    for key, name, type_name, unit, context in (
        ("PowerWatts", "Chassis Power", "Power", "W", "total"),
        ("TemperatureCelsius", "Chassis Temperature", "Temperature", "C", "chassis"),
    ):
        value = doc.get(key)
        if not isinstance(value, Mapping) or _number(value.get("Reading")) is None:
            continue
        if _path(_text(value.get("DataSourceUri")) or "") in known:
            continue
        sensor = _sensor(
            {"Name": f"{chassis.id} {name}"},
            chassis=chassis,
            local_id=f"EnvironmentMetrics/{key}",
            type_name=type_name,
            value=value.get("Reading"),
            unit=unit,
            thresholds=None,
        )
        out.append(_with_context(sensor, context))
    return out


def _with_context(sensor: BmcSensor, context: str) -> BmcSensor:
    return msgspec.structs.replace(sensor, context=context)


# A PowerSupply's LineInputStatus when its input is lost or out of range: it delivers no
# power, whatever its Health says, and is not failed for it (the Power registry rates
# LossOfInputPower a Warning: check the power source and cable), as IPMI's "Power input
# lost" and "out of range" (sensor type 08h, offsets 03h-05h)
_NO_INPUT = ("LossOfInput", "OutOfRange")


def _unit(doc: Json) -> UnitStatus:
    """A PSU or fan's presence and failure from its Status (and a PSU's LineInputStatus:
    one without input is failed only where a condition of its says PowerSupplyFailed)."""
    status = _status(doc)
    present = status.get("State") not in ("Absent",)
    no_input = doc.get("LineInputStatus") in _NO_INPUT
    failed = _condition(status, "PowerSupplyFailed") or (
        not no_input
        and (status.get("Health") == "Critical" or status.get("State") == "UnavailableOffline")
    )
    warning = not failed and not no_input and status.get("Health") not in (None, "OK")
    return UnitStatus(
        str(doc.get("Name") or doc.get("Id") or "?"),
        present,
        failed,
        warning,
        _why(status),
        no_input and not failed,
    )


def _condition(status: Json, message: str) -> bool:
    """Whether a Status's Conditions hold one with registry message `message` (its
    MessageId "Power.1.0.PowerSupplyFailed" names it last)."""
    conditions = status.get("Conditions")
    return isinstance(conditions, list) and any(
        isinstance(c, Mapping)
        and isinstance(c.get("MessageId"), str)
        and c["MessageId"].rpartition(".")[2] == message
        for c in conditions
    )


def _why(status: Json) -> str:
    """What a Status's Conditions say first (Redfish 2023.1 and on): "Power supply 'PSU 1'
    has a predicted failure condition."; "" where it has none."""
    conditions = status.get("Conditions")
    if isinstance(conditions, list):
        for condition in conditions:
            if isinstance(condition, Mapping):
                message = _text(condition.get("Message"))
                if message:
                    return message[:200]
    return ""


@dataclass(frozen=True, slots=True)
class _Clock:
    """A BMC's clock: how far it is ahead of this host's (None: not known), and the UTC
    offset it keeps local time in (DateTimeLocalOffset; None: not given)."""

    skew_s: float | None
    zone: dt.tzinfo | None


_NO_CLOCK = _Clock(None, None)
_OFFSET = re.compile(r"([+-])([01][0-9]|2[0-3]):([0-5][0-9])", re.ASCII)


def _zone(value: Any) -> dt.tzinfo | None:
    """A DateTimeLocalOffset ("+06:00", "-05:00", "Z") as a time zone; None for another."""
    if value == "Z":
        return dt.UTC
    match = _OFFSET.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    sign = -1 if match.group(1) == "-" else 1
    minutes = int(match.group(2)) * 60 + int(match.group(3))
    return dt.timezone(dt.timedelta(minutes=sign * minutes))


def _instant(value: Any, clock: _Clock) -> float | None:
    """A Redfish date-time stamped by the BMC's `clock`, as Unix time on this host's clock
    (less the clock's skew). A time without its UTC offset (the schema wants one) is in
    the BMC's local time (its DateTimeLocalOffset), else UTC; anything that is no
    date-time is no time."""
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=clock.zone or dt.UTC)
    try:
        at = when.timestamp()
    except (OverflowError, OSError, ValueError):  # year 1 at a negative offset, say
        return None
    return at if clock.skew_s is None else at - clock.skew_s


def _log_entry(doc: Json, clock: _Clock = _NO_CLOCK) -> SelEntry | None:
    """A LogEntry as a SelEntry, its time on this host's clock: corrected by the skew of
    the BMC's (as pyghmi corrects IPMI SEL times by Get SEL Time). Entries without a
    numeric Id cannot be ordered: skipped."""
    ident = str(doc.get("Id") or "")
    # isdigit() alone takes '²' and other Unicode digits, which int() refuses
    if not (ident.isascii() and ident.isdigit() and len(ident) <= _MAX_ID_DIGITS):
        return None
    return SelEntry(
        record_id=int(ident),
        at=_instant(doc.get("Created") or doc.get("EventTimestamp"), clock),
        sensor=str(doc.get("SensorName") or ""),
        sensor_type=str(doc.get("SensorType") or ""),
        event=str(doc.get("Message") or doc.get("MessageId") or "event"),
        severity=_SEVERITY.get(str(doc.get("Severity") or "OK"), Severity.WARNING),
    )
