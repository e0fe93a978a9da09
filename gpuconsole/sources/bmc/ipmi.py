"""IPMI over LAN (RMCP+) through pyghmi, and what its answers mean.

Two layers: an `IpmiSession` returns what pyghmi returns (sensor readings with their
health bitmask and states, power state, SEL records as dicts); `IpmiLink` turns that
into normalised sensors and SEL entries. `PyghmiSession` is the real session; the demo's
simulated BMC (gpuconsole.sim.bmc) is another `IpmiSession`, so everything above the
wire is the same code for both.

Each command stands on its own: a BMC that answers one with an error completion code
(a blade's controller that is no chassis device, a SEL it does not keep, one sensor it
cannot read) loses that part of the reading, named with the command and the code, and
keeps the rest. Only a BMC that does not answer at all loses the whole reading.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from gpuconsole.readings.base import PartStatus, Severity
from gpuconsole.readings.bmc import BmcSensor, PowerState, SelEntry, SensorHealth, Thresholds
from gpuconsole.sources.bmc.link import (
    BmcAuthError,
    BmcError,
    LinkReading,
    PowerAction,
)
from gpuconsole.sources.bmc.sensors import (
    PSU_SENSOR_TYPE,
    PSU_STATES,
    context_of,
    discrete_health,
    gpu_module_of,
    kind_of,
    unit_of,
)

log = logging.getLogger(__name__)

# pyghmi's names for the power states it can ask for
PYGHMI_POWER = {
    PowerAction.ON: "on",
    PowerAction.OFF: "off",
    PowerAction.SOFT: "softoff",
    PowerAction.RESET: "reset",
    PowerAction.CYCLE: "cycle",  # not pyghmi's: the session sends chassis control 2 itself
}
_CHASSIS_POWER_CYCLE = 0x02
# Threshold mask bits and reading offsets of Get Sensor Thresholds (IPMI 2.0, 35.9)
_THRESHOLD_FIELDS = (
    (0x01, "lower_non_critical"),
    (0x02, "lower_critical"),
    (0x04, "lower_non_recoverable"),
    (0x08, "upper_non_critical"),
    (0x10, "upper_critical"),
    (0x20, "upper_non_recoverable"),
)
_AUTH_WORDS = ("password", "unauthorized", "user name", "username", "privilege")
_SENSOR_ABSENT = 0xCB  # completion code: requested sensor not present
# SEL times below this count from the BMC's initialisation, not 1970 (IPMI 2.0 37.1,
# pre-init timestamps): its clock was never set
_SEL_TIME_SET = 0x20000000
T = TypeVar("T")


class IpmiCommandError(Exception):
    """The BMC answered a command with an error: that part of the reading is lost, not the
    session. The message names the command and the completion code where pyghmi kept it."""

    def __init__(self, command: str, text: str, code: int | None = None) -> None:
        self.command = command
        self.code = code
        answer = f"completion code 0x{code:02X} ({text})" if code else text
        super().__init__(f"{command} failed: {answer}")


@dataclass(frozen=True, slots=True)
class IpmiSensorData:
    """One sensor as pyghmi reads it, with the sensor number it does not keep."""

    sensor_id: str
    name: str
    type: str
    value: float | None
    units: str
    health: int  # pyghmi.constants.Health bitmask
    states: tuple[str, ...]
    unavailable: bool
    error: str = ""  # why the BMC gave no reading for it, when it answered with an error


class IpmiSession(Protocol):
    """The pyghmi-shaped layer under IpmiLink (blocking).

    A command the BMC answers with an error raises IpmiCommandError (that part is lost);
    anything else it raises (no answer, a broken session) costs the whole reading.
    """

    def sensor_data(self) -> Iterable[IpmiSensorData]: ...

    def thresholds(self) -> Mapping[str, Thresholds]:
        """Thresholds by sensor id, for the sensors that have them."""

    def get_power(self) -> Mapping[str, Any]: ...

    def set_power(self, powerstate: str, wait: bool = False) -> Mapping[str, Any]: ...

    def sel_signature(self) -> tuple[int, ...] | None:
        """Something that changes whenever the SEL does (None: unknown, always fetch)."""

    def get_event_log(self) -> Iterable[Mapping[str, Any]]: ...

    def sel_time(self) -> float | None:
        """The SEL's clock now (Get SEL Time), in seconds since 1970; None where it is not
        set (a time before 0x20000000 counts from the BMC's start, not 1970)."""

    def logout(self) -> None: ...


def notice_early_replies() -> None:
    """Make pyghmi take a reply that arrived before it began to wait for it (idempotent).

    pyghmi 1.6.19 sends a request, then queues a waiter for its I/O thread. A reply the
    I/O thread picked up in between sits in the session's queue until the waiter's
    deadline: the retry timer (0.5 to 1 s, growing) for a command, which is then sent
    again, and each step of a logon alike. With a BMC close by and a busy CPU that is most
    commands: a poll of the test BMC took 5 to 30 s instead of 20 ms. The wrapper returns
    at once when packets are already queued, and its caller then processes them; a reply
    landing between that check and the waiter being queued is caught by waking every
    50 ms (the callers wait again, up to their own deadlines).
    """
    from pyghmi.ipmi.private import session

    original = session._io_wait
    if getattr(original, "notices_early_replies", False):
        return

    def _io_wait(timeout: float, myaddr: Any = None, evq: Any = None) -> None:
        # An event queue is given only by _cmdwait (waiting for another thread's command
        # on the same session), which processes no packets: leave it as it is.
        if evq is None:
            if myaddr is None:  # wait_for_rsp: any session's packets
                queued = bool(session.sessionqueue)
            else:  # awaitresponse: this BMC's
                handlers = session.Session.bmc_handlers.get(myaddr) or {}
                queued = any(s.pktqueue for s in list(handlers.values()))
            if queued:
                return
            timeout = min(timeout, 0.05)
        original(timeout, myaddr, evq)

    _io_wait.notices_early_replies = True  # type: ignore[attr-defined]
    session._io_wait = _io_wait


class _SessionQueue(collections.deque[Any]):
    """pyghmi's queue of the sessions that have packets to handle, safe to share.

    pyghmi's I/O thread puts a session on it for every packet it receives, and only its
    event loop (wait_for_rsp, run while logging on) takes them off, with `while queue:
    queue.popleft()`. Held once per session, it no longer grows by one entry per reply
    while every session is logged on (a command takes its reply from the session's own
    packet queue). The I/O thread is its only writer, and appends a packet to the
    session's packet queue before the session here, so a session found already queued
    still has that packet handled. Two threads emptying it at once: the one that finds
    it empty gets a session with nothing to handle, not IndexError.
    """

    def append(self, queued: Any) -> None:
        try:
            if queued in self:
                return
        except RuntimeError:  # changed while looked through: queue it to be sure
            pass
        super().append(queued)

    def popleft(self) -> Any:
        try:
            return super().popleft()
        except IndexError:
            return _NOTHING_QUEUED


class _NothingQueued:
    def process_pktqueue(self) -> None:
        pass


_NOTHING_QUEUED = _NothingQueued()


def mend_pyghmi() -> None:
    """pyghmi's session module made safe for several BMCs on several threads (idempotent).

    pyghmi runs one event loop for every session of the process, on whichever thread
    waits, so one BMC's packets and timers are handled on another BMC's thread. Where that
    races, it is mended here: see each helper.
    """
    notice_early_replies()
    one_lock_for_session_tables()
    errors_kept_before_the_session_ends()
    queues_shared_safely()
    handlers_removed_safely()


def errors_kept_before_the_session_ends() -> None:
    """Make a session that failed to log on say why, whichever thread saw it fail.

    pyghmi's _mark_broken logs the session out (which ends its logon) before it keeps the
    error; the thread logging on, seeing the logon ended, then reads an error not yet
    kept: AttributeError 'errormsg'. Keeping it first gives that thread the BMC's reason
    (a wrong password, say). A later call with no reason does not overwrite one.
    """
    from pyghmi.ipmi.private import session

    original = session.Session._mark_broken
    if getattr(original, "keeps_errors_first", False):
        return

    def _mark_broken(self: Any, error: Any = None) -> None:
        if error is not None or getattr(self, "errormsg", None) is None:
            self.errormsg = error
        original(self, error)

    _mark_broken.keeps_errors_first = True  # type: ignore[attr-defined]
    session.Session._mark_broken = _mark_broken


def queues_shared_safely() -> None:
    """Make pyghmi's queues safe to empty from two threads at once (idempotent).

    Its queue of sessions with packets becomes a _SessionQueue; and a session's own packet
    queue, which pyghmi empties with `while queue: queue.popleft()` (IndexError on the
    thread that loses the last packet), is emptied one step per packet.
    """
    from pyghmi.ipmi.private import session

    if not isinstance(session.sessionqueue, _SessionQueue):
        queue = _SessionQueue()
        for queued in list(session.sessionqueue):
            queue.append(queued)
        session.sessionqueue = queue

    def process_pktqueue(self: Any) -> None:
        # pyghmi 1.6.19's process_pktqueue, but for the one-step pop
        while True:
            try:
                pkt = list(self.pktqueue.popleft())
            except IndexError:
                return
            pkt[0] = bytearray(pkt[0])
            if not (pkt[0][0] == 6 and pkt[0][2:4] == b"\xff\x07"):
                continue
            if pkt[1] in self.bmc_handlers:
                self._handle_ipmi_packet(pkt[0], sockaddr=pkt[1], qent=pkt)
            elif pkt[2] in self.bmc_handlers:
                self.sessionless_data(pkt[0], pkt[1])

    session.Session.process_pktqueue = process_pktqueue


class _Ports(dict[Any, Any]):
    """The sessions of one BMC address by local port: one removed twice is removed."""

    def __delitem__(self, key: Any) -> None:
        self.pop(key, None)


class _Handlers(dict[Any, Any]):
    """pyghmi's sessions by BMC address, each a _Ports: one removed twice is removed."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, _Ports(value) if type(value) is dict else value)

    def __delitem__(self, key: Any) -> None:
        self.pop(key, None)


def handlers_removed_safely() -> None:
    """Make a session's removal from pyghmi's table of sessions safe to race (idempotent).

    pyghmi 1.6.19's logout removes the session from `Session.bmc_handlers` where it is
    not yet marked broken, checking then deleting; a session that failed to log on is
    logged out by the thread that saw it fail and by the thread logging on, and the second
    to delete raised KeyError with the local port ("KeyError: 57111", once in a suite run:
    five BMCs logging on at once, three with a wrong password). Removing what is gone is
    done; every other use of the table is as it was.
    """
    from pyghmi.ipmi.private import session

    table = session.Session.bmc_handlers
    if isinstance(table, _Handlers):
        return
    safe = _Handlers()
    for address, ports in list(table.items()):
        safe[address] = ports
    session.Session.bmc_handlers = safe


def one_lock_for_session_tables() -> None:
    """Make pyghmi take one lock where it takes two in opposite orders (idempotent).

    pyghmi 1.6.19 guards its process-wide tables of sessions with two locks, and takes
    them in both orders: a command being sent holds KEEPALIVE_SESSIONS, then takes
    WAITING_SESSIONS to arm its retry timer; a session whose retry timer ran out holds
    WAITING_SESSIONS, then takes KEEPALIVE_SESSIONS to send the request again. Two BMCs
    on two threads, one sending while the other retries, then wait for each other
    forever; and since the locks are the whole process's, every BMC's next call waits
    behind them too ("no answer" from every BMC until the process ends). One reentrant
    lock for both cannot be taken in two orders.
    """
    from pyghmi.ipmi.private import session

    session.WAITING_SESSIONS = session.KEEPALIVE_SESSIONS


class PyghmiSession:
    """A real RMCP+ session through pyghmi.ipmi.command.Command."""

    def __init__(self, host: str, port: int, username: bytes, password: bytes) -> None:
        from pyghmi.ipmi import command

        mend_pyghmi()
        # bytes, not str: with str a second Command to the same BMC can hang (PEERS.md)
        self._cmd = command.Command(bmc=host, userid=username, password=password, port=port)
        ended = self._cmd.ipmi_session
        if not getattr(ended, "logged", 0):
            # The logon ended on another thread an instant before this one looked: pyghmi
            # returns the session as logged on, and its first command would fail saying
            # only "Session no longer connected". Say what the BMC did.
            from pyghmi.exceptions import IpmiException

            raise IpmiException(getattr(ended, "errormsg", None))

    @contextlib.contextmanager
    def _answered(self, what: str) -> Iterator[None]:
        """pyghmi's errors inside: one the BMC answered (its session still up) costs `what`
        only; a timeout or a broken session stays as it is and costs the whole reading."""
        from pyghmi.exceptions import IpmiException

        try:
            yield
        except IpmiException as exc:
            code = exc.ipmicode or None
            if getattr(self._cmd.ipmi_session, "broken", False) or (code or 0) > 0xFF:
                raise
            raise IpmiCommandError(what, str(exc), code) from None

    def _command(self, name: str, netfn: int, command: int, **kw: Any) -> Any:
        """A raw command's reply; IpmiCommandError when the BMC answered it with an error."""
        from pyghmi.exceptions import IpmiException

        rsp = self._cmd.raw_command(netfn=netfn, command=command, **kw)
        if "error" not in rsp:
            return rsp
        code = int(rsp.get("code") or 0)
        if 0 < code <= 0xFF:
            raise IpmiCommandError(name, str(rsp["error"]), code)
        raise IpmiException(rsp["error"], code=code)  # no answer (pyghmi's code 0xFFFF)

    def _entries(self) -> list[Any]:
        with self._answered("reading the SDR repository"):
            sdr = self._cmd.init_sdr()
        return [sdr.sensors[key] for key in sdr.get_sensor_numbers()]

    def sensor_data(self) -> Iterable[IpmiSensorData]:
        for entry in self._entries():
            number = entry.sensor_number
            command = f"Get Sensor Reading (sensor {number})"
            try:
                rsp = self._command(command, 4, 0x2D, rslun=entry.sensor_lun, data=(number,))
            except IpmiCommandError as exc:
                if exc.code == _SENSOR_ABSENT:
                    continue
                yield IpmiSensorData(
                    sensor_id=str(number),
                    name=str(entry.sensor_name),
                    type=str(entry.sensor_type),
                    value=None,
                    units=str(entry.unit_suffix or ""),
                    health=0,
                    states=(),
                    unavailable=True,
                    error=str(exc),
                )
                continue
            reading = entry.decode_sensor_reading(self._cmd, rsp["data"])
            yield IpmiSensorData(
                sensor_id=str(entry.sensor_number),
                name=reading.name,
                type=reading.type,
                value=reading.value,
                units=reading.units or "",
                health=int(reading.health or 0),
                states=tuple(reading.states or ()),
                unavailable=bool(reading.unavailable),
            )

    def thresholds(self) -> Mapping[str, Thresholds]:
        out: dict[str, Thresholds] = {}
        for entry in self._entries():
            if not getattr(entry, "has_thresholds", False):
                continue
            rsp = self._cmd.raw_command(
                netfn=4, command=0x27, rslun=entry.sensor_lun, data=(entry.sensor_number,)
            )
            if "error" in rsp or len(rsp["data"]) < 7:
                continue
            data = rsp["data"]
            values: dict[str, float] = {}
            for offset, (bit, name) in enumerate(_THRESHOLD_FIELDS, start=1):
                if data[0] & bit:
                    values[name] = round(entry.decode_value(self._cmd, data[offset]), 6)
            if values:
                out[str(entry.sensor_number)] = Thresholds(**values)
        return out

    def get_power(self) -> Mapping[str, Any]:
        # what pyghmi's get_power sends, with the completion code it drops kept
        rsp = self._command("Get Chassis Status", 0, 0x01)
        if not rsp["data"]:
            raise IpmiCommandError("Get Chassis Status", "an empty answer")
        return {"powerstate": "on" if rsp["data"][0] & 1 else "off"}

    def set_power(self, powerstate: str, wait: bool = False) -> Mapping[str, Any]:
        # pyghmi reads the power state first as well, but drops the completion code
        self.get_power()
        if powerstate == "cycle":  # pyghmi's set_power has no power cycle
            self._command("Chassis Control", 0x00, 0x02, data=[_CHASSIS_POWER_CYCLE])
            return {"pendingpowerstate": "cycle"}
        with self._answered("Chassis Control"):
            return dict(self._cmd.set_power(powerstate, wait=wait))

    def sel_signature(self) -> tuple[int, ...] | None:
        rsp = self._command("Get SEL Info", 0x0A, 0x40)
        if len(rsp["data"]) < 13:
            return None
        return tuple(rsp["data"][1:3]) + tuple(rsp["data"][5:13])

    def sel_time(self) -> float | None:
        data = self._command("Get SEL Time", 0x0A, 0x48)["data"]
        if len(data) < 4:
            raise IpmiCommandError("Get SEL Time", "a short answer")
        value = int.from_bytes(bytes(data[:4]), "little")
        return None if value < _SEL_TIME_SET else float(value)

    def get_event_log(self) -> Iterable[Mapping[str, Any]]:
        with self._answered("reading the SEL"):
            records = [dict(r) for r in self._cmd.get_event_log()]
            sdr = self._cmd.init_sdr()
        for record in records:
            # pyghmi leaves threshold events' values as raw bytes: convert with the SDR
            # (and for other events they are not readings at all)
            entry = sdr.sensors.get(record.get("component_id"))
            threshold = entry is not None and getattr(entry, "has_thresholds", False)
            for key in ("triggered_value", "threshold_value"):
                raw = record.pop(key, None)
                if isinstance(raw, int) and threshold:
                    record[key] = round(entry.decode_value(self._cmd, raw), 6)
        return records

    def logout(self) -> None:
        with contextlib.suppress(Exception):
            self._cmd.ipmi_session.logout()


class IpmiLink:
    """A BmcLink over an IpmiSession: one session, opened on first use, reopened after errors."""

    def __init__(
        self,
        label: str,
        connect: Callable[[], IpmiSession],
        *,
        thresholds_every: int = 60,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.label = label
        self._connect = connect
        self._session: IpmiSession | None = None
        self._thresholds: Mapping[str, Thresholds] = {}
        self._thresholds_every = max(1, thresholds_every)
        self._thresholds_in = 0  # reads until the thresholds are read again
        self._sel_signature: tuple[int, ...] | None = None
        self._sel: tuple[SelEntry, ...] = ()
        self._clock = clock  # this host's: what the BMC's SEL clock is measured against
        self._skew: float | None = None

    def _open(self) -> IpmiSession:
        if self._session is None:
            self._session = self._call(self._connect)
        return self._session

    def _call(self, fn: Callable[[], T]) -> T:
        """Run one pyghmi call; its errors become BmcErrors that name this BMC (but for
        an error the BMC answered, which costs only what that call reads)."""
        try:
            return fn()
        except (BmcError, IpmiCommandError):
            raise
        except Exception as exc:
            self._drop()
            text = str(exc).strip()
            if not isinstance(exc, OSError) and not type(exc).__module__.startswith("pyghmi"):
                # pyghmi failed on something in the answer (a short packet, a missing
                # field) with a Python error, not one of its own
                log.debug("%s: pyghmi failed", self.label, exc_info=True)
                detail = text or type(exc).__name__
                raise BmcError(
                    f"{self.label}: an answer the IPMI client could not read ({detail})"
                ) from None
            if any(word in text.lower() for word in _AUTH_WORDS):
                raise BmcAuthError(
                    f"{self.label}: the BMC refused the user name or password ({text})"
                ) from None
            if not text or text == "None":
                text = "no answer (BMC down or unreachable?)"
            raise BmcError(f"{self.label}: {text}") from None

    def _drop(self) -> None:
        session, self._session = self._session, None
        self._sel_signature = None
        if session is not None:
            session.logout()

    def read(self, *, sel: bool) -> LinkReading:
        session = self._open()
        parts: list[PartStatus] = []
        raw = self._part(parts, "sensors", lambda: list(session.sensor_data()), _count("sensors"))
        if raw is not None:
            if self._thresholds_in <= 0:
                found = self._part(parts, "thresholds", session.thresholds, _count("sensors"))
                if found is not None:  # else the last ones stand, and it is tried again
                    self._thresholds, self._thresholds_in = found, self._thresholds_every
            else:
                parts.append(PartStatus("thresholds", True, f"{len(self._thresholds)} sensors"))
            self._thresholds_in -= 1
            parts += [PartStatus(f"sensor {d.name}", False, d.error) for d in raw if d.error]
        sensors = tuple(self._sensor(data) for data in raw or ())
        answer = self._part(parts, "power", session.get_power, lambda a: str(a.get("powerstate")))
        if raw is None and answer is None:  # nothing read: the BMC is as good as down
            raise BmcError(f"{self.label}: " + "; ".join(p.detail for p in parts))
        power = (answer or {}).get("powerstate")
        state = PowerState(power) if power in ("on", "off") else PowerState.UNKNOWN
        skew: float | None = None
        if sel:
            read_sel = functools.partial(self._read_sel, session, sensors)
            self._part(parts, "sel", read_sel, lambda n: f"{n} records")
            skew = self._skew
        else:
            parts.append(PartStatus("sel", True, "not read", enabled=False))
        return LinkReading(state, sensors, self._sel, parts=tuple(parts), clock_skew_s=skew)

    def _part(
        self,
        parts: list[PartStatus],
        name: str,
        fn: Callable[[], T],
        detail: Callable[[T], str],
    ) -> T | None:
        """One part of a reading, its status added to `parts`; None when the BMC refused it."""
        try:
            found = self._call(fn)
        except IpmiCommandError as exc:
            parts.append(PartStatus(name, False, str(exc)))
            return None
        parts.append(PartStatus(name, True, detail(found)))
        return found

    def _read_sel(self, session: IpmiSession, sensors: tuple[BmcSensor, ...]) -> int:
        """The SEL's records, fetched again only when it changed; how many there are. The
        SEL's clock is measured against this host's each time (pyghmi corrects the records'
        times by it as it fetches them; the skew is for the operator to see)."""
        self._skew = None
        before = self._clock()
        try:
            bmc_now = session.sel_time()
        except IpmiCommandError as exc:  # the SEL may still be read: its times uncorrected
            log.debug("%s: %s", self.label, exc)
        else:
            # against the middle of the command, so its round trip does not count
            after = self._clock()
            self._skew = None if bmc_now is None else bmc_now - (before + after) / 2
        signature = session.sel_signature()
        if signature is not None and signature == self._sel_signature:
            return len(self._sel)
        records = list(session.get_event_log())
        units = {s.name: s.unit for s in sensors}
        self._sel = tuple(entry for r in records if (entry := sel_entry(r, units)) is not None)
        self._sel_signature = signature
        return len(self._sel)

    def _sensor(self, data: IpmiSensorData) -> BmcSensor:
        unit = unit_of(data.units)
        kind = kind_of(data.type, unit)
        return BmcSensor(
            name=data.name,
            sensor_id=data.sensor_id,
            kind=kind,
            type=data.type,
            value=None if data.unavailable else data.value,
            unit=unit,
            health=discrete_health(data.type, data.states, data.health),
            states=data.states,
            thresholds=self._thresholds.get(data.sensor_id),
            context=context_of(data.name, kind),
            gpu_module_id=gpu_module_of(data.name),
        )

    def set_power(self, action: PowerAction) -> str:
        session = self._open()
        try:
            answer = self._call(lambda: session.set_power(PYGHMI_POWER[action], wait=False))
        except IpmiCommandError as exc:
            raise BmcError(f"{self.label}: power {action.value} refused: {exc}") from None
        return str(answer.get("pendingpowerstate") or answer.get("powerstate") or "requested")

    def close(self) -> None:
        self._drop()


def _count(what: str) -> Callable[[Any], str]:
    return lambda found: f"{len(found)} {what}"


def sel_entry(record: Mapping[str, Any], units: Mapping[str, str]) -> SelEntry | None:
    """A pyghmi SEL record (a dict) as a SelEntry; None for a record without an id.

    `units` gives the unit of each sensor by name, for the values a threshold event carries.
    """
    record_id = record.get("record_id")
    if not isinstance(record_id, int):
        return None
    sensor = str(record.get("component") or "")
    sensor_type = str(record.get("component_type") or "")
    event = str(record.get("event") or record.get("message") or "event")
    severity = severity_of(int(record.get("severity") or 0))
    if sensor_type.lower() == PSU_SENSOR_TYPE and not record.get("deassertion"):
        # a PSU's event as its sensor's state is rated (PSU_STATES, the Power registry's
        # severities): pyghmi rates a lost input and a predicted failure critical, which
        # would judge a PSU whose cable is out one to return for service
        rated = PSU_STATES.get(event.lower())
        severity = severity if rated is None else _PSU_SEVERITY[rated]
    return SelEntry(
        record_id=record_id,
        at=_timestamp(record.get("timestamp")),
        sensor=sensor,
        sensor_type=sensor_type,
        event=event,
        severity=severity,
        deassertion=bool(record.get("deassertion")),
        reading=_float(record.get("triggered_value")),
        threshold=_float(record.get("threshold_value")),
        unit=units.get(sensor, ""),
    )


_PSU_SEVERITY = {
    SensorHealth.OK: Severity.INFO,
    SensorHealth.WARNING: Severity.WARNING,
    SensorHealth.CRITICAL: Severity.CRITICAL,
    SensorHealth.FAILED: Severity.CRITICAL,
}


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def severity_of(mask: int) -> Severity:
    if mask & 0b110:
        return Severity.CRITICAL
    if mask & 0b1:
        return Severity.WARNING
    return Severity.INFO


def _timestamp(text: Any) -> float | None:
    """pyghmi's local ISO 8601 time as Unix time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
