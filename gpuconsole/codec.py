"""Snapshots to versioned JSON and back: what `snapshot --json` prints and agents serve.

Decoding is msgspec's typed decoding, straight into the readings. Every string decoded
passes `safe_text`: an agent's or a capture's text reaches no terminal with a control
character in it. NVML's bus ids read back in sysfs's form, counter paths as keys, and a
body that does not fit is a DecodeError that names the path that is wrong.
"""

from __future__ import annotations

import enum
import functools
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import msgspec

from gpuconsole.history import HistoryView
from gpuconsole.readings.base import (
    NO_DEFAULT,
    SCHEMA_VERSION,
    Event,
    Field,
    Key,
    is_record,
    is_record_class,
    normal_bus_id,
    nvml_bus_id,
    record_fields,
    safe_text,
)
from gpuconsole.readings.nvml import GpuReading, NvLinkReading
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot

# history stays in the process that recorded it, the journal on its node (the node's
# verdict carries what it says), what a hub rebuilt with the hub
_SKIP = {"history", "actions", "rebuilt"}
_KEYED = {"rates", "deltas"}  # NodeSnapshot mappings keyed by counter path
# NVML's bus ids: sysfs's form in a reading, NVML's in the JSON (as `snapshot --json` and
# agents have always written them); either form reads back as sysfs's. An event's GPU is
# written as its reading's is, so the two join in the JSON as well.
_BUS_IDS: dict[type, tuple[str, ...]] = {
    GpuReading: ("pci_bus_id",),
    NvLinkReading: ("remote_pci_bus_id",),
    Event: ("gpu_bus_id", "gpu_bus_ids"),
}


def encode(value: Any, *, sparse: bool = False) -> Any:
    """Readings to plain JSON types; enums as their values, rate keys joined with '/'.

    Sparse leaves out each field that holds its default: the decoder puts it back.
    """
    if type(value) in _SCALARS:  # most of a reading
        return value
    if is_record(value):
        out: dict[str, Any] = {}
        for name, default in _encoded_fields(type(value)):
            item = getattr(value, name)
            if sparse and default is not _MISSING and _is_default(item, default):
                continue
            if type(item) in _SCALARS:
                out[name] = item
            elif name in _KEYED:
                out[name] = {"/".join(k): v for k, v in item.items()}
            else:
                out[name] = encode(item, sparse=sparse)
        for name in _BUS_IDS.get(type(value), ()):
            bus_id = out.get(name)
            if isinstance(bus_id, list):  # an event about several GPUs
                out[name] = [nvml_bus_id(b) for b in bus_id]
            elif bus_id is not None:
                out[name] = nvml_bus_id(bus_id)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [encode(v, sparse=sparse) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v, sparse=sparse) for k, v in value.items()}
    return value


_MISSING: Any = NO_DEFAULT
_SCALARS = frozenset((str, int, float, bool, type(None)))
_T = TypeVar("_T")
_ENCODED: dict[type, tuple[tuple[str, Any], ...]] = {}


def _encoded_fields(kind: type) -> tuple[tuple[str, Any], ...]:
    """Each field a reading is encoded with, and its default (_MISSING where none)."""
    found = _ENCODED.get(kind)
    if found is None:
        found = _ENCODED[kind] = tuple(
            (f.name, f.initial()) for f in record_fields(kind) if f.name not in _SKIP
        )
    return found


def _is_default(item: Any, default: Any) -> bool:
    # By type as well as value: 0 is not False, 1 is not 1.0 where a decoder checks types.
    if item is default:
        return True
    if isinstance(default, Mapping):
        return isinstance(item, Mapping) and not item and not default
    return type(item) is type(default) and bool(item == default)


def snapshot_json(snapshot: FleetSnapshot, *, sparse: bool = False) -> dict[str, Any]:
    """The JSON document for a fleet snapshot, with its schema version."""
    body = encode(snapshot, sparse=sparse)
    return {"schema_version": SCHEMA_VERSION, "simulated": snapshot.simulated, **body}


def dumps(snapshot: FleetSnapshot, *, indent: int | None = None, sparse: bool = False) -> str:
    """The snapshot as JSON text; sparse (what agents serve for the fleet view) leaves out
    fields at their defaults."""
    return json.dumps(snapshot_json(snapshot, sparse=sparse), indent=indent, allow_nan=False)


class DecodeError(ValueError):
    """A JSON snapshot that does not match the schema, with the path that is wrong."""


# --- decoding ----------------------------------------------------------------------------
#
# msgspec reads the JSON straight into the readings' Structs and checks every type on
# the way. Around it, driven by the same types: a wire type per reading that holds what
# the JSON holds otherwise (a mapping keyed by counter path; no history), converted to the
# reading after; NVML's bus ids put in sysfs's form; and strings made safe to show.

Convert = Callable[[Any], Any]
Fix = Callable[[Any], None]
_NONE = type(None)


class _Wire(NamedTuple):
    kind: Any  # the type msgspec decodes
    convert: Convert | None  # from what msgspec decoded to the reading; None: it is one


_WIRES: dict[Any, _Wire] = {}


def _wire(kind: Any) -> _Wire:
    found = _WIRES.get(kind)
    if found is None:
        found = _WIRES[kind] = _build_wire(kind)
    return found


def _build_wire(kind: Any) -> _Wire:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(kind)
        wires = [_wire(a) for a in args]
        if all(w.convert is None for w in wires):
            return _Wire(kind, None)
        inner = [w for a, w in zip(args, wires, strict=True) if a is not _NONE]
        if len(inner) != 1:
            raise TypeError(f"cannot decode {kind}: a union of types read otherwise")
        present = inner[0].convert
        assert present is not None

        def optional(value: Any) -> Any:
            return None if value is None else present(value)

        return _Wire(inner[0].kind | None, optional)
    if origin in (dict, Mapping):
        key, value = typing.get_args(kind)
        item = _wire(value)
        step = item.convert
        if key == Key:  # a counter path, joined with '/' in the JSON

            def keyed(data: Any) -> Any:
                if not data:  # the default, or none sent
                    return data
                if len(_KEYS) > _MOST_KEYS:
                    _KEYS.clear()
                known = _KEYS.get
                if step is None:
                    return {known(k) or _key(k): v for k, v in data.items()}
                return {known(k) or _key(k): step(v) for k, v in data.items()}

            return _Wire(dict.__class_getitem__((str, item.kind)), keyed)
        if step is None:
            return _Wire(kind, None)
        return _Wire(
            dict.__class_getitem__((key, item.kind)),
            lambda data: {k: step(v) for k, v in data.items()},
        )
    if origin is tuple:
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            item = _wire(args[0])
            if item.convert is None:
                return _Wire(kind, None)
            convert = item.convert
            return _Wire(
                tuple.__class_getitem__((item.kind, ...)),
                lambda data: tuple([convert(v) for v in data]),
            )
        if any(_wire(a).convert is not None for a in args):
            raise TypeError(f"cannot decode {kind}: a fixed tuple of types read otherwise")
        return _Wire(kind, None)
    if is_record_class(kind):
        return _wire_record(kind)
    return _Wire(kind, None)


def _fields(kind: Any) -> list[tuple[Field, Any]]:
    """Each field the JSON carries, with its type."""
    hints = typing.get_type_hints(kind, localns={"HistoryView": HistoryView})
    return [(f, hints[f.name]) for f in record_fields(kind) if f.name not in _SKIP]


def _default(f: Field) -> Any:
    """A field's default as a msgspec Struct field takes it; _MISSING: none."""
    if f.factory is not None:
        return msgspec.field(default_factory=f.factory)
    return f.default


def _mirror(name: str, fields: list[tuple[str, Any, Any]]) -> Any:
    """A msgspec Struct with `fields` (name, the type msgspec decodes, default or
    _MISSING) for msgspec to decode into."""
    spec = [(n, wire) if default is _MISSING else (n, wire, default) for n, wire, default in fields]
    return msgspec.defstruct(name, spec, kw_only=True)


def _wire_record(kind: Any) -> _Wire:
    fields = _fields(kind)
    wires = [(f, _wire(hint)) for f, hint in fields]
    skipped = len(fields) < len(record_fields(kind))
    if not skipped and all(w.convert is None for _, w in wires):
        return _Wire(kind, None)  # msgspec makes the reading itself
    mirror = _mirror(f"Wire{kind.__name__}", [(f.name, w.kind, _default(f)) for f, w in wires])
    steps = [(f.name, w.convert) for f, w in wires]

    def convert(data: Any) -> Any:
        return kind(
            **{
                name: getattr(data, name) if step is None else step(getattr(data, name))
                for name, step in steps
            }
        )

    return _Wire(mirror, convert)


# Counter paths as keys, each made once: a head reads the same few hundred a second from
# every agent. Bounded: an agent that sends new ones every time only empties it.
_KEYS: dict[str, Key] = {}
_MOST_KEYS = 200_000


def _key(joined: str) -> Key:
    """A counter path from its JSON key, "gpu/GPU-1234/energy_mj"."""
    key = _KEYS[joined] = tuple(sys.intern(part) for part in joined.split("/"))
    return key


_FIXES: dict[Any, Fix | None] = {}
_sysfs_bus_id = functools.lru_cache(maxsize=16384)(normal_bus_id)


def _fix(kind: Any) -> Fix | None:
    """What puts each NVML bus id in a freshly decoded `kind` in sysfs's form, in place;
    None where `kind` holds none."""
    if kind not in _FIXES:
        _FIXES[kind] = None  # a type that holds itself is walked once
        _FIXES[kind] = _build_fix(kind)
    return _FIXES[kind]


def _build_fix(kind: Any) -> Fix | None:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        found = [(a, _fix(a)) for a in typing.get_args(kind) if a is not _NONE]
        fixes = [(a, f) for a, f in found if f is not None]
        if not fixes:
            return None
        if len(found) == 1:
            only = fixes[0][1]
            return lambda v: None if v is None else only(v)

        def either(value: Any) -> None:
            for each, fix in fixes:
                if isinstance(value, typing.get_origin(each) or each):
                    fix(value)
                    return

        return either
    if origin in (tuple, dict, Mapping):
        args = typing.get_args(kind)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            positions = [(i, f) for i, a in enumerate(args) if (f := _fix(a)) is not None]
            if not positions:
                return None

            def fixed(value: Any) -> None:
                for i, fix in positions:
                    fix(value[i])

            return fixed
        item = _fix(args[-1] if origin is not tuple else args[0])
        if item is None:
            return None
        if origin is tuple:

            def items(value: Any) -> None:
                for v in value:
                    item(v)

            return items

        def values(value: Any) -> None:
            for v in value.values():
                item(v)

        return values
    if not is_record_class(kind):
        return None
    bus_ids = _BUS_IDS.get(typing.cast(type, kind), ())
    inner = [(f.name, fix) for f, hint in _fields(kind) if (fix := _fix(hint)) is not None]
    if not bus_ids and not inner:
        return None
    setters = {name: _setter(kind, name) for name in bus_ids}

    def walk(value: Any) -> None:
        for name, put in setters.items():
            bus_id = getattr(value, name)
            if isinstance(bus_id, tuple):  # an event about several GPUs
                put(value, tuple([_sysfs_bus_id(b) for b in bus_id]))
            elif bus_id is not None:
                put(value, _sysfs_bus_id(bus_id))
        for name, fix in inner:
            part = getattr(value, name)
            if part:  # not None, nor empty (a summary's GPUs have no NVLinks)
                fix(part)

    return walk


def _setter(kind: Any, name: str) -> Callable[[Any, Any], None]:
    # frozen: the decoder's own new object, changed before anyone sees it
    slot = kind.__dict__.get(name)
    if isinstance(slot, types.MemberDescriptorType):
        return slot.__set__
    return lambda obj, value: object.__setattr__(obj, name, value)


def _finish(kind: Any, decoded: Any) -> Any:
    """What msgspec decoded as `kind`'s wire type, as the reading."""
    convert = _wire(kind).convert
    value = decoded if convert is None else convert(decoded)
    fix = _fix(kind)
    if fix is not None and value is not None:
        fix(value)
    return value


# --- strings -----------------------------------------------------------------------------

# In a body of printable ASCII whose escapes are only \" \\ and \/ (whitespace between
# values aside: msgspec refuses a raw control character in a string), every string is
# printable as it stands; any other body may hold one that is not.
_ESCAPE = re.compile(rb'\\[^"\\/]')


def _plain(body: bytes) -> bool:
    return (
        body.isascii()
        and b"\x7f" not in body
        and (b"\\" not in body or _ESCAPE.search(body) is None)
    )


def _clean(value: Any) -> Any:
    kind = type(value)
    if kind is str:
        return value if value.isprintable() else safe_text(value)
    if kind is list:
        return [_clean(v) for v in value]
    if kind is dict:
        return {_clean(k): _clean(v) for k, v in value.items()}
    return value


_PLAIN = msgspec.json.Decoder()


def safe_body(body: bytes | str) -> bytes:
    """A JSON body whose every string is safe to show: the body itself where it can hold no
    other, else the same document with each string made safe; DecodeError where it is
    not JSON a snapshot could be (a number out of float's range, NaN, nesting too deep)."""
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    if _plain(body):
        return body
    return msgspec.json.encode(_clean(_json(body, _PLAIN)))


def _json(body: bytes, decoder: msgspec.json.Decoder[Any]) -> Any:
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise refused(exc) from None


def parse_json(text: str | bytes) -> Any:
    """JSON text (or its UTF-8 bytes) to plain values, as they are (a caller that shows a
    string makes it safe); DecodeError also for what no snapshot holds: a number out of
    float's range, NaN, Infinity, or nesting too deep."""
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    return _json(text, _PLAIN)


# --- reading -----------------------------------------------------------------------------

_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    found = _DECODERS.get(kind)
    if found is None:
        found = _DECODERS[kind] = msgspec.json.Decoder(_wire(kind).kind)
    return found


def refused(exc: Exception, where: str = "$") -> DecodeError:
    """Why msgspec refused a body, as a DecodeError: "not JSON: why" for what is not JSON
    (or no snapshot holds: a number out of float's range, nesting too deep), else the path
    and what is wrong there, msgspec's "Expected `int`, got `str` - at `$.gpus[0].index`"
    as "WHERE.gpus[0].index: expected int, got str"."""
    if isinstance(exc, RecursionError):
        return DecodeError("not JSON: nested too deep")
    if not isinstance(exc, msgspec.ValidationError) or str(exc).startswith("Number out of"):
        return DecodeError(safe_text(f"not JSON: {exc}"))
    reason, at, path = str(exc).rpartition(" - at `")
    if not at:
        reason, path = str(exc), "$`"
    reason = reason.replace("`", "")
    reason = reason[:1].lower() + reason[1:]
    return DecodeError(safe_text(f"{where}{path[1:-1]}: {reason}"))


def read(kind: type[_T], body: bytes, where: str = "$") -> _T:
    """One `kind` (a snapshot's reading class) from JSON whose strings are safe to show
    (`safe_body`'s); DecodeError says where it does not fit."""
    value: _T = _read(_reader(kind), body, where)
    return value


# What reads one type: its decoder, what makes the reading of what it decoded, and what
# puts its bus ids in sysfs's form. Held by type, and by (class, field) for a field's type:
# hashing a union such as `BmcReading | None` costs more than the lookups it saves.
_Reader = tuple[msgspec.json.Decoder[Any], Convert | None, Fix | None]
_READERS: dict[Any, _Reader] = {}
_FIELD_READERS: dict[tuple[Any, str], _Reader] = {}


def _reader(kind: Any) -> _Reader:
    found = _READERS.get(kind)
    if found is None:
        found = _READERS[kind] = (_decoder(kind), _wire(kind).convert, _fix(kind))
    return found


def _read(reader: _Reader, body: bytes, where: str) -> Any:
    decoder, convert, fix = reader
    try:
        value = decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise refused(exc, where) from None
    if convert is not None:
        value = convert(value)
    if fix is not None and value is not None:
        fix(value)
    return value


def decode(kind: type[_T], data: Any, where: str = "$") -> _T:
    """One `kind` (a snapshot's reading class) from its JSON form as plain values (a parsed
    document's part); DecodeError says where it does not fit."""
    try:
        decoded = msgspec.convert(_clean(data), _wire(kind).kind)
    except (msgspec.ValidationError, RecursionError) as exc:
        raise refused(exc, where) from None
    value: _T = _finish(kind, decoded)
    return value


def decode_node(data: Any, where: str = "$") -> NodeSnapshot:
    """One NodeSnapshot from its JSON form (as in a fleet snapshot's "nodes")."""
    return decode(NodeSnapshot, data, where)


class _Version(msgspec.Struct, frozen=True):
    schema_version: Any = None


_VERSION = msgspec.json.Decoder(_Version)


def loads(text: str | bytes) -> FleetSnapshot:
    """A FleetSnapshot from `dumps` output; DecodeError says where it does not fit."""
    body = safe_body(text)
    try:
        version = _VERSION.decode(body).schema_version
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Number out of"):
            raise refused(exc) from None
        raise DecodeError("expected a JSON object") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise refused(exc) from None
    if version != SCHEMA_VERSION:
        raise DecodeError(f"schema_version {safe_text(repr(version))} is not {SCHEMA_VERSION}")
    return read(FleetSnapshot, body)


class Partial(msgspec.Struct, frozen=True):
    """A reading's fields as read from JSON, but those left as raw JSON: for a reader
    that reuses what came exactly as before (a head: an agent's steady parts)."""

    fields: dict[str, Any]  # each field the JSON carries but the raw ones, as the reading's
    raw: dict[str, bytes]  # each raw field the JSON holds (not null), as JSON
    extra: dict[str, Any]  # each extra field asked for, as plain values


_Step = tuple[str, Convert | None, Fix | None]
_PARTIALS: dict[tuple[Any, tuple[str, ...], tuple[str, ...]], tuple[Any, list[_Step]]] = {}
_PARTIAL_DECODERS: dict[tuple[Any, tuple[str, ...], tuple[str, ...]], Any] = {}
_RAW_ABSENT = msgspec.Raw(b"null")


def partial_type(kind: Any, *, raw: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> Any:
    """The type `read_partial` decodes `kind` into, for a reader that decodes a document
    holding one in a single pass: `finish_partial` then makes the Partial of what msgspec
    decoded into it."""
    return _partial(kind, raw, extra)[0]


def _partial(kind: Any, raw: tuple[str, ...], extra: tuple[str, ...]) -> tuple[Any, list[_Step]]:
    key = (kind, raw, extra)
    found = _PARTIALS.get(key)
    if found is None:
        fields = _fields(kind)
        spec = [
            (f.name, msgspec.Raw, _RAW_ABSENT)
            if f.name in raw
            else (f.name, _wire(hint).kind, _default(f))
            for f, hint in fields
        ]
        mirror = _mirror(f"Partial{kind.__name__}", spec + [(n, Any, None) for n in extra])
        steps = [
            (f.name, _wire(hint).convert, _fix(hint)) for f, hint in fields if f.name not in raw
        ]
        found = _PARTIALS[key] = (mirror, steps)
    return found


def finish_partial(
    kind: Any, decoded: Any, *, raw: tuple[str, ...] = (), extra: tuple[str, ...] = ()
) -> Partial:
    """The Partial of what msgspec decoded into `partial_type(kind, raw=raw, extra=extra)`."""
    steps = _partial(kind, raw, extra)[1]
    values: dict[str, Any] = {}
    for name, convert, fix in steps:
        value = getattr(decoded, name)
        if convert is not None:
            value = convert(value)
        if fix is not None and value is not None:
            fix(value)
        values[name] = value
    held = {}
    for name in raw:
        part = getattr(decoded, name)
        if part is not _RAW_ABSENT and bytes(part) != b"null":
            held[name] = bytes(part)  # not the Raw: it holds the whole body
    return Partial(values, held, {name: getattr(decoded, name) for name in extra})


def read_partial(
    kind: Any,
    body: bytes,
    where: str = "$",
    *,
    raw: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> Partial:
    """`kind`'s fields from JSON whose strings are safe to show (`safe_body`'s), but those
    named in `raw`, kept as their JSON for `read_field`; with the `extra` fields the JSON
    may carry beside them, as plain values. DecodeError says where it does not fit."""
    key = (kind, raw, extra)
    decoder = _PARTIAL_DECODERS.get(key)
    if decoder is None:
        decoder = _PARTIAL_DECODERS[key] = msgspec.json.Decoder(_partial(kind, raw, extra)[0])
    try:
        decoded = decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise refused(exc, where) from None
    return finish_partial(kind, decoded, raw=raw, extra=extra)


def read_field(kind: Any, name: str, body: bytes, where: str = "$") -> Any:
    """Field `name` of `kind` from its JSON (a `Partial`'s raw field)."""
    reader = _FIELD_READERS.get((kind, name))
    if reader is None:
        reader = _FIELD_READERS[(kind, name)] = _reader(_field_types(kind)[name])
    return _read(reader, body, f"{where}.{name}")


@functools.cache
def _field_types(kind: Any) -> dict[str, Any]:
    return {f.name: hint for f, hint in _fields(kind)}


__all__ = [
    "DecodeError",
    "Partial",
    "decode",
    "decode_node",
    "dumps",
    "encode",
    "finish_partial",
    "loads",
    "parse_json",
    "partial_type",
    "read",
    "read_field",
    "read_partial",
    "refused",
    "safe_body",
    "snapshot_json",
]
