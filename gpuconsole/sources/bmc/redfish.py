"""Redfish through pyghmi's client: both the older Thermal/Power resources and the newer
Sensors, EnvironmentMetrics, PowerSubsystem and ThermalSubsystem ones.

pyghmi opens the session (X-Auth-Token where the service offers one) and speaks HTTPS
only; the resources are walked here, because pyghmi's own sensor list drops health,
thresholds and the HGX chassis. Resource URLs are discovered once and re-read every
poll; `RedfishClient` is the layer a test or another client can stand in for.

BMCs send odd documents, so parsing is tolerant one field or array item at a time: a
value of another JSON kind than the schema's is unknown (a Status, a unit, a place) or
skipped (an array item, a link). Only a document that is unusable as a whole (a body
that is not an object, a collection whose Members is not an array) fails the read,
with a BmcError naming its URL.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import math
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuconsole.readings.base import Severity
from gpuconsole.readings.bmc import BmcSensor, PowerState, SelEntry, SensorHealth, Thresholds
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

    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"GET {url}: HTTP {status}")
        self.status = status


class RedfishClient(Protocol):
    """The layer under RedfishLink (blocking)."""

    def get(self, url: str) -> Any:
        """The decoded JSON body: an object, or whatever else the BMC sent."""
        ...

    def get_power(self) -> Mapping[str, Any]: ...

    def set_power(self, powerstate: str, wait: bool = False) -> Mapping[str, Any]: ...

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
            super().__init__(*args, **kwargs)

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
    """A session through pyghmi.redfish.command.Command; `timeout_s` bounds each request."""

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
        body, status = self._cmd.wc.grab_json_response_with_status(url)
        if not 200 <= status < 300:
            raise RedfishHttpError(url, status)
        return body  # any JSON kind: RedfishLink names a body that is not an object

    def get_power(self) -> Mapping[str, Any]:
        return dict(self._cmd.get_power())

    def set_power(self, powerstate: str, wait: bool = False) -> Mapping[str, Any]:
        return dict(self._cmd.set_power(powerstate, wait=wait))

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


@dataclass
class _Chassis:
    id: str
    module_id: int | None
    sensors: list[str] = field(default_factory=list)
    thermal: str | None = None
    power: str | None = None
    environment: str | None = None
    psus: list[str] = field(default_factory=list)
    fans: list[str] = field(default_factory=list)


@dataclass
class _Inventory:
    chassis: list[_Chassis]
    logs: list[str]


class RedfishLink:
    """A BmcLink over a RedfishClient."""

    def __init__(
        self,
        label: str,
        connect: Callable[[], RedfishClient],
        *,
        inventory_every: int = 60,
        timeout_s: float | None = None,
    ) -> None:
        self.label = label
        self._connect = connect
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
        return BmcError(f"{self.label}: {text}")

    def _drop(self) -> None:
        client, self._client = self._client, None
        self._inventory = None
        if client is not None:
            client.logout()

    def _get(self, url: str) -> Json:
        client = self._open()
        doc = self._call(lambda: client.get(url))
        if not isinstance(doc, Mapping):
            raise BmcError(f"{self.label}: GET {url}: the body is {_kind(doc)}, not an object")
        return doc

    def _collection(self, url: str) -> list[Json]:
        """The objects among a collection's Members (other items skipped)."""
        members = self._get(url).get("Members")
        if members is None:
            return []
        if not isinstance(members, list):
            raise BmcError(f"{self.label}: GET {url}: Members is {_kind(members)}, not an array")
        return [m for m in members if isinstance(m, Mapping)]

    # --- discovery -----------------------------------------------------------------

    def _discover(self) -> _Inventory:
        root = self._get("/redfish/v1/")
        chassis: list[_Chassis] = []
        for member in self._members(_ref(root, "Chassis")):
            doc = self._get(member)
            cid = str(doc.get("Id") or member.rstrip("/").rsplit("/", 1)[-1])
            item = _Chassis(cid, gpu_module_of(cid, str(doc.get("Name") or "")))
            sensors = _ref(doc, "Sensors")
            if sensors:
                item.sensors = self._members(sensors)
            else:
                item.thermal = _ref(doc, "Thermal")
                item.power = _ref(doc, "Power")
            item.environment = _ref(doc, "EnvironmentMetrics")
            power_subsystem = _ref(doc, "PowerSubsystem")
            if power_subsystem:
                item.psus = self._members(_ref(self._get(power_subsystem), "PowerSupplies"))
            thermal_subsystem = _ref(doc, "ThermalSubsystem")
            if thermal_subsystem:
                item.fans = self._members(_ref(self._get(thermal_subsystem), "Fans"))
            chassis.append(item)
        logs: list[str] = []
        for system in self._members(_ref(root, "Systems")):
            for service in self._members(_ref(self._get(system), "LogServices")):
                entries = _ref(self._get(service), "Entries")
                if entries:
                    logs.append(entries)
        return _Inventory(chassis, logs)

    def _members(self, url: str | None) -> list[str]:
        """The member URLs of a collection; a member without a usable link is skipped."""
        if not url:
            return []
        return [ref for m in self._collection(url) if (ref := _odata_id(m))]

    # --- reading -------------------------------------------------------------------

    def read(self, *, sel: bool) -> LinkReading:
        if self._inventory is None or self._reads % self._inventory_every == 0:
            self._inventory = self._discover()
        self._reads += 1
        inventory = self._inventory
        sensors: list[BmcSensor] = []
        extra: list[BmcSensor] = []
        psus: list[UnitStatus] = []
        fans: list[UnitStatus] = []
        for chassis in inventory.chassis:
            for url in chassis.sensors:
                sensors.append(_generic_sensor(self._get(url), chassis.module_id))
            if chassis.thermal:
                sensors.extend(_thermal_sensors(self._get(chassis.thermal), chassis))
            if chassis.power:
                found, units = _power_sensors(self._get(chassis.power), chassis)
                sensors.extend(found)
                psus.extend(units)
            if chassis.environment:
                extra.extend(_environment_sensors(self._get(chassis.environment), chassis))
            psus.extend(_unit(self._get(url)) for url in chassis.psus)
            fans.extend(_unit(self._get(url)) for url in chassis.fans)
        client = self._open()
        power = str(self._call(client.get_power).get("powerstate", "")).lower()
        state = PowerState(power) if power in ("on", "off") else PowerState.UNKNOWN
        entries: list[SelEntry] = []
        if sel:
            for url in inventory.logs:
                for member in self._collection(url):
                    entry = _log_entry(member)
                    if entry is not None:
                        entries.append(entry)
        return LinkReading(
            state,
            tuple(sensors + extra),
            tuple(sorted(entries, key=lambda e: e.record_id)),
            tuple(psus),
            tuple(fans),
        )

    def set_power(self, action: PowerAction) -> str:
        client = self._open()
        answer = self._call(lambda: client.set_power(PYGHMI_POWER[action], wait=False))
        return str(answer.get("pendingpowerstate") or answer.get("powerstate") or "requested")

    def close(self) -> None:
        self._drop()


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
    sensor_id: str,
    type_name: str,
    value: Any,
    unit: str,
    chassis_module: int | None,
    thresholds: Thresholds | None,
) -> BmcSensor:
    name = str(doc.get("Name") or sensor_id)
    kind = kind_of(type_name, unit)
    return BmcSensor(
        name=name,
        sensor_id=sensor_id,
        kind=kind,
        type=type_name,
        value=_number(value),
        unit=unit,
        health=_health(doc),
        states=_states(doc),
        thresholds=thresholds,
        context=context_of(name, kind, _text(doc.get("PhysicalContext"))),
        gpu_module_id=gpu_module_of(sensor_id, name) or chassis_module,
    )


def _generic_sensor(doc: Json, chassis_module: int | None) -> BmcSensor:
    """A Sensor resource (DMTF 2020.4 and later)."""
    thresholds = doc.get("Thresholds")
    return _sensor(
        doc,
        sensor_id=str(doc.get("Id") or doc.get("Name") or "?"),
        type_name=str(doc.get("ReadingType") or "Unknown"),
        value=doc.get("Reading"),
        unit=unit_of(_text(doc.get("ReadingUnits"))),
        chassis_module=chassis_module,
        thresholds=_thresholds(thresholds, _THRESHOLDS)
        if isinstance(thresholds, Mapping)
        else None,
    )


def _thermal_sensors(doc: Json, chassis: _Chassis) -> list[BmcSensor]:
    """The deprecated Thermal resource: Temperatures and Fans."""
    out: list[BmcSensor] = []
    for temp in _objects(doc, "Temperatures"):
        out.append(
            _sensor(
                temp,
                sensor_id=f"{chassis.id}/Temperatures/{temp.get('MemberId', len(out))}",
                type_name="Temperature",
                value=temp.get("ReadingCelsius"),
                unit="C",
                chassis_module=chassis.module_id,
                thresholds=_thresholds(temp, _LEGACY_THRESHOLDS),
            )
        )
    for index, fan in enumerate(_objects(doc, "Fans")):
        out.append(
            _sensor(
                fan,
                sensor_id=f"{chassis.id}/Fans/{fan.get('MemberId', index)}",
                type_name="Fan",
                value=fan.get("Reading"),
                unit=unit_of(_text(fan.get("ReadingUnits") or "RPM")),  # the default
                chassis_module=chassis.module_id,
                thresholds=_thresholds(fan, _LEGACY_THRESHOLDS),
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
            sensor_id=f"{chassis.id}/PowerControl/{control.get('MemberId', index)}",
            type_name="Power",
            value=control.get("PowerConsumedWatts"),
            unit="W",
            chassis_module=chassis.module_id,
            thresholds=None,
        )
        out.append(_with_context(sensor, "total"))
    for index, psu in enumerate(_objects(doc, "PowerSupplies")):
        watts = psu.get("PowerOutputWatts", psu.get("LastPowerOutputWatts"))
        sensor = _sensor(
            psu,
            sensor_id=f"{chassis.id}/PowerSupplies/{psu.get('MemberId', index)}",
            type_name="Power Supply",
            value=watts,
            unit="W",
            chassis_module=chassis.module_id,
            thresholds=None,
        )
        out.append(_with_context(sensor, "psu"))
        units.append(_unit(psu))
    for index, volt in enumerate(_objects(doc, "Voltages")):
        out.append(
            _sensor(
                volt,
                sensor_id=f"{chassis.id}/Voltages/{volt.get('MemberId', index)}",
                type_name="Voltage",
                value=volt.get("ReadingVolts"),
                unit="V",
                chassis_module=chassis.module_id,
                thresholds=_thresholds(volt, _LEGACY_THRESHOLDS),
            )
        )
    return out, units


def _environment_sensors(doc: Json, chassis: _Chassis) -> list[BmcSensor]:
    """EnvironmentMetrics: chassis power and temperature, used where no sensor says more."""
    out: list[BmcSensor] = []
    for key, name, type_name, unit, context in (
        ("PowerWatts", "Chassis Power", "Power", "W", "total"),
        ("TemperatureCelsius", "Chassis Temperature", "Temperature", "C", "intake"),
    ):
        value = doc.get(key)
        if isinstance(value, Mapping) and _number(value.get("Reading")) is not None:
            sensor = _sensor(
                {"Name": f"{chassis.id} {name}"},
                sensor_id=f"{chassis.id}/EnvironmentMetrics/{key}",
                type_name=type_name,
                value=value.get("Reading"),
                unit=unit,
                chassis_module=chassis.module_id,
                thresholds=None,
            )
            out.append(_with_context(sensor, context))
    return out


def _with_context(sensor: BmcSensor, context: str) -> BmcSensor:
    from dataclasses import replace

    return replace(sensor, context=context)


def _unit(doc: Json) -> UnitStatus:
    """A PSU or fan's presence and failure from its Status."""
    status = _status(doc)
    present = status.get("State") not in ("Absent",)
    failed = status.get("Health") == "Critical" or status.get("State") == "UnavailableOffline"
    return UnitStatus(str(doc.get("Name") or doc.get("Id") or "?"), present, failed)


def _log_entry(doc: Json) -> SelEntry | None:
    """A LogEntry as a SelEntry; entries without a numeric Id cannot be ordered: skipped."""
    ident = str(doc.get("Id") or "")
    # isdigit() alone takes '²' and other Unicode digits, which int() refuses
    if not (ident.isascii() and ident.isdigit() and len(ident) <= _MAX_ID_DIGITS):
        return None
    created = doc.get("Created") or doc.get("EventTimestamp")
    at: float | None = None
    if isinstance(created, str):
        try:
            at = dt.datetime.fromisoformat(created).timestamp()
        except ValueError:
            at = None
    return SelEntry(
        record_id=int(ident),
        at=at,
        sensor=str(doc.get("SensorName") or ""),
        sensor_type=str(doc.get("SensorType") or ""),
        event=str(doc.get("Message") or doc.get("MessageId") or "event"),
        severity=_SEVERITY.get(str(doc.get("Severity") or "OK"), Severity.WARNING),
    )
