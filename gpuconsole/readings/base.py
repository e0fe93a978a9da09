"""The basic types every reading shares: keys, counters, events, source status, and the one
form of a PCI bus id."""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import msgspec

SCHEMA_VERSION = 1

# A counter or series is named by a path, e.g. ("gpu", "GPU-1234", "energy_mj").
Key = tuple[str, ...]


class Severity(enum.StrEnum):
    """How much an event or a state should worry an operator."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Health(enum.StrEnum):
    """Health at a glance for a node, a GPU or a source."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    STALE = "stale"
    UNKNOWN = "unknown"


class CounterSample(NamedTuple):
    """One raw, monotonically increasing counter as read, with its width in bits.

    `history` asks the hub to keep the derived rate in a sparkline ring as well; `delta`
    asks it to keep how far the counter moved over the interval (error counters).
    """

    key: Key
    value: int
    bits: int = 64
    history: bool = False
    delta: bool = False


# What the hub takes: CounterSample's five fields in a plain tuple (a CounterSample is one).
# A DGX's NVLinks alone are 288 counters a poll, and building a plain tuple costs a fifth
# of building a NamedTuple, so the NVML reading yields these.
RawCounter = tuple[Key, int, int, bool, bool]


class Event(msgspec.Struct, frozen=True):
    """Something that happened: an XID, a source going stale, an action.

    A GPU's event names it by bus id (sysfs form): NVML's index is only the label the GPU
    had then, and another GPU may have it once NVML numbers them again. An event about
    several GPUs at once (a plan that resets an NVLink set in one command) names each in
    `gpu_bus_ids` and `gpu_uuids`, in the same order ("" for a UUID not known), and none in
    the fields for one GPU."""

    at: float
    node: str
    source: str
    kind: str
    severity: Severity
    message: str
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    code: int | None = None
    gpu_bus_id: str | None = None  # sysfs form; None for no GPU, or an agent that said none
    gpu_bus_ids: tuple[str, ...] = ()  # an event about several GPUs: each, sysfs form
    gpu_uuids: tuple[str, ...] = ()  # and their UUIDs, in that order


class SourceStatus(msgspec.Struct, frozen=True):
    """Whether a source's latest reading is fresh, and if not since when and why."""

    node: str
    source: str
    ok: bool
    last_ok_at: float | None = None
    stale_since: float | None = None
    error: str | None = None
    polls: int = 0
    failures: int = 0
    last_poll_s: float | None = None

    @property
    def stale(self) -> bool:
        return not self.ok


class PartStatus(msgspec.Struct, frozen=True):
    """One part of a source (tenancy's libvirt or kubelet, a BMC's Redfish resource) and
    how it went: a source whose parts fail apart keeps what the others read.

    `enabled` is False when the part was left out on purpose (the config turned it off, or
    a newer resource covers it); `detail` says what was found ("3 domains") or, when `ok`
    is False, why nothing was ("kubelet socket ... not found", "HTTP 404").
    """

    part: str
    ok: bool
    detail: str = ""
    enabled: bool = True


# Every reading names a PCI function as sysfs does, '0000:18:00.0' (lower case): the NVML
# source converts NVML's '00000000:18:00.0' where it reads it, so consumers compare plainly.
# Cached: the codec and the exporter convert the same few dozen ids of a node every poll.
@functools.lru_cache(maxsize=4096)
def normal_bus_id(bus_id: str) -> str:
    """'00000000:18:00.0' (NVML) or '0000:18:00.0' (sysfs) as sysfs writes it, lower case;
    what is not a bus id ('unknown') stripped and lower case."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3 and _is_hex(parts[0]):
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:
        return f"0000:{parts[0]}:{parts[1]}"
    return text


def known_bus_id(bus_id: str) -> str | None:
    """The bus id; None for what stands in for one NVML could not read ('unknown')."""
    return bus_id if ":" in bus_id else None


@functools.lru_cache(maxsize=4096)
def nvml_bus_id(bus_id: str) -> str:
    """A bus id as NVML and dcgm-exporter write it, '00000000:18:00.0', for the outputs that
    have always shown that form; what is not a bus id ('unknown') as it is."""
    parts = bus_id.split(":")
    if len(parts) != 3 or not _is_hex(parts[0]):
        return bus_id
    return f"{int(parts[0], 16):08X}:{parts[1]}:{parts[2]}".upper()


def _is_hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdefABCDEF" for c in text)


# What a terminal would act on rather than show: C0 controls (ESC starts every escape
# sequence), DEL, C1 controls (0x9b alone is a CSI), the bidi controls that reorder what is
# shown around them, and lone surrogates, which no UTF-8 output can encode.
# Compiled when first needed: most processes never meet such text, and each start pays.
_UNSAFE = r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"


def _shown(match: re.Match[str]) -> str:
    return repr(match.group())[1:-1]  # ESC as the four characters \x1b


def safe_text(text: str) -> str:
    r"""Text from outside (a driver, a BMC, an agent, sysfs, a kubelet, a file) made safe to
    show on a terminal: each control character written out as Python writes it (\x1b, \n,
    \u202e), so that nothing acts on the terminal and the operator sees something odd was
    there. A second pass changes nothing."""
    if text.isprintable():  # each character above is unprintable: most text stops here
        return text
    return re.sub(_UNSAFE, _shown, text)


_T = TypeVar("_T")
_R = TypeVar("_R")


class Field(NamedTuple):
    """One field of a record class (a reading's msgspec Struct, or a dataclass)."""

    name: str
    default: Any  # NO_DEFAULT where it has none, or where `factory` makes it
    factory: Callable[[], Any] | None = None

    def initial(self) -> Any:
        """The value the field takes where none is given; NO_DEFAULT where it must be."""
        return self.factory() if self.factory is not None else self.default


NO_DEFAULT: Any = msgspec.NODEFAULT


class _Probe(msgspec.Struct):
    made: list[int] = msgspec.field(default_factory=list)


# How a Struct class holds a default_factory among its defaults.
_FACTORY = type(_Probe.__struct_defaults__[0])


def is_record(value: object) -> bool:
    """Whether `value` is a record (a reading, or a dataclass) rather than a plain value."""
    if isinstance(value, msgspec.Struct):
        return True
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def is_record_class(kind: object) -> bool:
    """Whether `kind` is a record class (a reading's Struct, or a dataclass)."""
    return isinstance(kind, type) and (
        issubclass(kind, msgspec.Struct) or dataclasses.is_dataclass(kind)
    )


_RECORD_FIELDS: dict[type, tuple[Field, ...]] = {}


def record_fields(kind: type) -> tuple[Field, ...]:
    """Each field a record class is built with, in order, with its default: the one place
    that reads a record's fields (readings are msgspec Structs; other records dataclasses)."""
    found = _RECORD_FIELDS.get(kind)
    if found is None:
        found = _RECORD_FIELDS[kind] = _record_fields(kind)
    return found


def _record_fields(kind: type) -> tuple[Field, ...]:
    if issubclass(kind, msgspec.Struct):
        # Not msgspec.structs.fields: it resolves every annotation, and a reading may name
        # a type only imported for type checking (NodeSnapshot.history).
        names: tuple[str, ...] = kind.__struct_fields__
        defaults: tuple[Any, ...] = kind.__struct_defaults__  # the last fields'
        given = (NO_DEFAULT,) * (len(names) - len(defaults)) + defaults
        return tuple(
            Field(name, NO_DEFAULT, default.factory)
            if type(default) is _FACTORY
            else Field(name, default)
            for name, default in zip(names, given, strict=True)
        )
    return tuple(
        Field(
            f.name,
            NO_DEFAULT if f.default is dataclasses.MISSING else f.default,
            None if f.default_factory is dataclasses.MISSING else f.default_factory,
        )
        for f in dataclasses.fields(kind)  # type: ignore[arg-type]
        if f.init
    )


def _replace(record: _R, /, **changes: Any) -> _R:
    """A copy of a record with `changes`: for code that holds either kind of record."""
    if isinstance(record, msgspec.Struct):
        return msgspec.structs.replace(record, **changes)
    return dataclasses.replace(record, **changes)  # type: ignore[type-var]


# Types that hold no text (enums join when first met); each record class's field names.
_LEAVES: set[type] = {int, float, bool, type(None)}
_FIELDS: dict[type, tuple[str, ...]] = {}


def safe_strings(value: _T) -> _T:
    """A reading (a Struct and everything in it) with `safe_text` applied to each of its
    strings; the same objects where nothing needed it."""
    kind = type(value)
    if kind is str:
        return safe_text(value)  # type: ignore[arg-type, return-value]
    if kind in _LEAVES:
        return value
    if kind is tuple:
        return _safe_items(value)  # type: ignore[arg-type, return-value]
    if isinstance(value, Mapping):
        pairs = [(safe_strings(k), safe_strings(v)) for k, v in value.items()]
        if all(k is a and v is b for (k, v), (a, b) in zip(pairs, value.items(), strict=True)):
            return value
        return dict(pairs)  # type: ignore[return-value]
    names = _FIELDS.get(kind)
    if names is None:
        if not is_record(value):
            if issubclass(kind, enum.Enum):
                _LEAVES.add(kind)  # its values are the program's own
            return value
        names = _FIELDS[kind] = tuple(f.name for f in record_fields(kind))
    changed: dict[str, Any] = {}
    for name in names:
        item = getattr(value, name)
        if type(item) in _LEAVES or (type(item) is str and item.isprintable()):
            continue  # the most of a reading, checked without a call
        cleaned = safe_strings(item)
        if cleaned is not item:
            changed[name] = cleaned
    return _replace(value, **changed) if changed else value


def _safe_items(items: tuple[Any, ...]) -> tuple[Any, ...]:
    new: list[Any] | None = None
    for i, item in enumerate(items):
        if type(item) in _LEAVES or (type(item) is str and item.isprintable()):
            continue
        cleaned = safe_strings(item)
        if cleaned is not item:
            if new is None:
                new = list(items)
            new[i] = cleaned
    return items if new is None else tuple(new)
