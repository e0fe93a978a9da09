"""Snapshots to versioned JSON and back: what `snapshot --json` prints and agents serve.

Every string decoded passes `safe_text`: an agent's or a capture's text reaches no terminal
with a control character in it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orjson

from gpuconsole.history import HistoryView
from gpuconsole.readings.base import (
    SCHEMA_VERSION,
    Event,
    Key,
    normal_bus_id,
    nvml_bus_id,
    safe_text,
)
from gpuconsole.readings.nvml import GpuReading, NvLinkReading
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot

_SKIP = {"history"}  # history stays in the process that recorded it
_KEYED = {"rates", "deltas"}  # NodeSnapshot mappings keyed by counter path
# NVML's bus ids: sysfs's form in a reading, NVML's in the JSON (as `snapshot --json` and
# agents have always written them); either form reads back as sysfs's. An event's GPU is
# written as its reading's is, so the two join in the JSON as well.
_BUS_IDS: dict[type, tuple[str, ...]] = {
    GpuReading: ("pci_bus_id",),
    NvLinkReading: ("remote_pci_bus_id",),
    Event: ("gpu_bus_id",),
}


def encode(value: Any, *, sparse: bool = False) -> Any:
    """Readings to plain JSON types; enums as their values, rate keys joined with '/'.

    Sparse leaves out each field that holds its default: the decoder puts it back.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for name, default in _encoded_fields(type(value)):
            item = getattr(value, name)
            if sparse and default is not _MISSING and _is_default(item, default):
                continue
            if name in _KEYED:
                out[name] = {"/".join(k): v for k, v in item.items()}
            else:
                out[name] = encode(item, sparse=sparse)
        for name in _BUS_IDS.get(type(value), ()):
            if out.get(name) is not None:
                out[name] = nvml_bus_id(out[name])
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [encode(v, sparse=sparse) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v, sparse=sparse) for k, v in value.items()}
    return value


_MISSING: Any = object()
_FLOAT_MAX = sys.float_info.max  # a larger int does not fit a float: OverflowError
_ENCODED: dict[type, tuple[tuple[str, Any], ...]] = {}


def _encoded_fields(kind: type) -> tuple[tuple[str, Any], ...]:
    """Each field a dataclass is encoded with, and its default (_MISSING where none)."""
    found = _ENCODED.get(kind)
    if found is None:
        found = _ENCODED[kind] = tuple(
            (
                f.name,
                f.default
                if f.default is not dataclasses.MISSING
                else f.default_factory()
                if f.default_factory is not dataclasses.MISSING
                else _MISSING,
            )
            for f in dataclasses.fields(kind)
            if f.name not in _SKIP
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


class _Misfit(Exception):
    """Raised inside the decoders; each level it passes adds its step to the path, so the
    path is only spelled out for the value that does not fit."""

    def __init__(self, reason: str, step: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.steps = [step] if step else []  # innermost first

    def at(self, where: str) -> DecodeError:
        return DecodeError(f"{where}{''.join(reversed(self.steps))}: {self.reason}")


Decoder = Callable[[Any], Any]
_T = TypeVar("_T")
_DECODERS: dict[Any, Decoder] = {}


def _decoder(kind: Any) -> Decoder:
    """A decoding function for a type, built once per type and cached."""
    found = _DECODERS.get(kind)
    if found is None:
        found = _DECODERS[kind] = _build(kind)
    return found


def _build(kind: Any) -> Decoder:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        optional = len(args) < len(typing.get_args(kind))
        choices = [_decoder(a) for a in args]

        def union(data: Any) -> Any:
            if data is None and optional:
                return None
            for choice in choices:
                try:
                    return choice(data)
                except _Misfit:
                    continue
            raise _Misfit(f"{data!r} matches none of {kind}")

        return union
    if origin in (dict, Mapping):
        key_type, value_type = typing.get_args(kind)
        keys, values = _decoder(key_type), _decoder(value_type)

        def mapping(data: Any) -> Any:
            if not isinstance(data, dict):
                raise _Misfit("expected an object")
            out = {}
            for k, v in data.items():
                try:
                    out[keys(k)] = values(v)
                except _Misfit as wrong:
                    wrong.steps.append(f".{safe_text(k)}")
                    raise
            return out

        return mapping
    if origin is tuple:
        parts = typing.get_args(kind)
        if len(parts) == 2 and parts[1] is Ellipsis:
            return _sequence(_decoder(parts[0]), parts[0])
        items = [_decoder(a) for a in parts]

        def fixed(data: Any) -> Any:
            if not isinstance(data, list) or len(data) != len(items):
                raise _Misfit(f"expected a list of {len(items)}")
            out = []
            for i, (f, v) in enumerate(zip(items, data, strict=True)):
                try:
                    out.append(f(v))
                except _Misfit as wrong:
                    wrong.steps.append(f"[{i}]")
                    raise
            return tuple(out)

        return fixed
    if dataclasses.is_dataclass(kind):
        return _dataclass_decoder(kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _enum_decoder(kind)
    if kind is float:

        def number(data: Any) -> Any:
            if type(data) is float:
                return data
            if type(data) is int and -_FLOAT_MAX <= data <= _FLOAT_MAX:
                return float(data)
            raise _Misfit("expected a float")

        return number
    if kind is str:

        def text(data: Any) -> Any:
            if type(data) is str:
                return data if data.isprintable() else safe_text(data)
            raise _Misfit("expected str")

        return text
    if kind in (int, bool):

        def scalar(data: Any) -> Any:
            if type(data) is kind:
                return data
            raise _Misfit(f"expected {kind.__name__}")

        return scalar
    if kind is Any:
        return lambda data: data
    raise TypeError(f"cannot decode {kind}")


def _sequence(item: Decoder, kind: Any) -> Decoder:
    # A scalar item needs only its type checked (a string, that it is printable): the list
    # is returned as json built it.
    plain = kind if kind in (int, str, bool) else None

    def sequence(data: Any) -> Any:
        if type(data) is not list:
            raise _Misfit("expected a list")
        if plain is str:
            if all(type(v) is str and v.isprintable() for v in data):
                return tuple(data)
        elif plain is not None and all(type(v) is plain for v in data):
            return tuple(data)
        for i, v in enumerate(data):
            try:
                item(v)
            except _Misfit as wrong:
                wrong.steps.append(f"[{i}]")
                raise
        return tuple([item(v) for v in data])

    def checked(data: Any) -> Any:
        if type(data) is not list:
            raise _Misfit("expected a list")
        try:
            return tuple([item(v) for v in data])
        except _Misfit:
            pass
        for i, v in enumerate(data):  # again, to say which item does not fit
            try:
                item(v)
            except _Misfit as wrong:
                wrong.steps.append(f"[{i}]")
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    return sequence if plain is not None else checked


def _enum_decoder(kind: Any) -> Decoder:
    members = {m.value: m for m in kind}
    # Look up by value only where every value is a string: a bool never passes for an int.
    by_text = all(type(v) is str for v in members)

    def enumeration(data: Any) -> Any:
        if by_text and type(data) is str:
            found = members.get(data)
            if found is not None:
                return found
        try:
            return kind(data)
        except ValueError:
            raise _Misfit(f"{data!r} is not a {kind.__name__}") from None

    return enumeration


# How a field of each of these types is checked inline, in the generated decoder.
_INLINE = {
    int: "type(v) is not int",
    str: "type(v) is not str",
    bool: "type(v) is not bool",
}


def _field_lines(name: str, kind: Any, ns: dict[str, Any]) -> list[str]:
    """Lines that turn `v`, the JSON value of field `name`, into its decoded value."""
    step = repr("." + name)
    optional = False
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(kind)):
            kind, optional = args[0], True
    guard = "v is not None and " if optional else ""
    if kind in _INLINE:
        reason = repr(f"expected {kind.__name__}")
        lines = [f"if {guard}{_INLINE[kind]}:", f"    raise _Misfit({reason}, {step})"]
        if kind is str:  # made safe to show, as every string decoded
            lines += [f"if {guard}not v.isprintable():", "    v = _safe_text(v)"]
        return lines
    if kind is float:
        return [
            f"if {guard}type(v) is not float:",
            "    if type(v) is int and -_FLOAT_MAX <= v <= _FLOAT_MAX:",
            "        v = float(v)",
            "    else:",
            f"        raise _Misfit('expected a float', {step})",
        ]
    if kind is Any:
        return []
    ns[f"_d_{name}"] = _KEYED_DECODERS[name] if name in _KEYED else _decoder(kind)
    lines = ["try:", f"    v = _d_{name}(v)", "except _Misfit as wrong:"]
    lines += [f"    wrong.steps.append({step})", "    raise"]
    if optional:
        lines = ["if v is not None:"] + ["    " + line for line in lines]
    return lines


def _slot_setters(kind: Any) -> dict[str, Any] | None:
    """Each field's slot, to fill an instance made without __init__; None where the class
    needs its __init__ (no slots, a __post_init__, a field without a default it skips)."""
    if "__slots__" not in kind.__dict__ or hasattr(kind, "__post_init__"):
        return None
    setters = {}
    for f in dataclasses.fields(kind):
        slot = kind.__dict__.get(f.name)
        if not isinstance(slot, types.MemberDescriptorType):
            return None
        unset = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if unset and (f.name in _SKIP or not f.init):
            return None
        setters[f.name] = slot.__set__
    return setters


def _dataclass_decoder(kind: Any) -> Decoder:
    """A decoder written for this dataclass: one function that checks each field inline.

    A frozen dataclass's __init__ sets each field through object.__setattr__; where the
    class has slots the decoder fills them directly (three times as fast), as __init__
    would have, since nothing but the fields' values is left to check.
    """
    hints = typing.get_type_hints(kind, localns={"HistoryView": HistoryView})
    ns: dict[str, Any] = {
        "_Misfit": _Misfit,
        "_MISSING": _MISSING,
        "_FLOAT_MAX": _FLOAT_MAX,
        "_safe_text": safe_text,
        "_made": kind,
        "_new": object.__new__,
    }
    setters = _slot_setters(kind)
    body = [
        "def decode(data):",
        "    if type(data) is not dict:",
        "        raise _Misfit('expected an object')",
        "    get = data.get",
    ]
    if setters is not None:
        body.append("    o = _new(_made)")
    args: list[str] = []
    for f in dataclasses.fields(kind):
        if f.default is not dataclasses.MISSING:
            ns[f"_default_{f.name}"] = f.default
            missing = [f"v = _default_{f.name}"]
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_factory_{f.name}"] = f.default_factory
            missing = [f"v = _factory_{f.name}()"]
        else:
            missing = [f"raise _Misfit('missing {f.name}')"]
        if setters is not None:
            ns[f"_set_{f.name}"] = setters[f.name]
        if f.name in _SKIP or not f.init:
            if setters is not None:  # left to its default, as __init__ would
                body += ["    " + line for line in missing]
                body.append(f"    _set_{f.name}(o, v)")
            continue
        lines = _field_lines(f.name, hints[f.name], ns)
        if f.name in _BUS_IDS.get(kind, ()):
            ns["_normal_bus_id"] = normal_bus_id
            lines += ["if v is not None:", "    v = _normal_bus_id(v)"]
        body.append(f"    v = get({f.name!r}, _MISSING)")
        body += ["    if v is _MISSING:"] + ["        " + line for line in missing]
        if lines:
            body += ["    else:"] + ["        " + line for line in lines]
        if setters is not None:
            body.append(f"    _set_{f.name}(o, v)")
        else:
            body.append(f"    f_{f.name} = v")
            args.append(f"{f.name}=f_{f.name}" if f.kw_only else f"f_{f.name}")
    body.append("    return o" if setters is not None else f"    return _made({', '.join(args)})")
    exec("\n".join(body), ns)  # its source is made of field names, never of input
    decode: Decoder = ns["decode"]
    return decode


def _rates(data: Any) -> dict[Key, float]:
    if not isinstance(data, dict):
        raise _Misfit("expected an object")
    try:  # v * 1.0, not float(v), which also reads "nan" and "inf" from a string
        return {_key(k): v * 1.0 for k, v in data.items()}
    except (TypeError, OverflowError):
        raise _Misfit("rates must be numbers") from None


def _deltas(data: Any) -> dict[Key, int]:
    if not isinstance(data, dict) or not all(type(v) is int for v in data.values()):
        raise _Misfit("deltas must be an object of integers")
    return {_key(k): v for k, v in data.items()}


def _key(joined: str) -> Key:
    """A counter path from its JSON key, "gpu/GPU-1234/energy_mj"."""
    return tuple((joined if joined.isprintable() else safe_text(joined)).split("/"))


_KEYED_DECODERS: dict[str, Decoder] = {"rates": _rates, "deltas": _deltas}


def decode(kind: type[_T], data: Any, where: str = "$") -> _T:
    """One `kind` (a snapshot's dataclass) from its JSON form; DecodeError says where not."""
    try:
        result = _decoder(kind)(data)
    except _Misfit as wrong:
        raise wrong.at(where) from None
    assert isinstance(result, kind)
    return result


def decode_node(data: Any, where: str = "$") -> NodeSnapshot:
    """One NodeSnapshot from its JSON form (as in a fleet snapshot's "nodes")."""
    return decode(NodeSnapshot, data, where)


def parse_json(text: str | bytes) -> Any:
    """JSON text (or its UTF-8 bytes) to plain values; DecodeError also for what no
    snapshot holds: a number out of float's range, NaN, Infinity, or nesting too deep."""
    # orjson refuses each of those itself, and reads an agent's summary three times as fast
    # as json (0.05 ms, not 0.16): a head reads a thousand a second.
    try:
        return orjson.loads(text)
    except ValueError as exc:  # orjson.JSONDecodeError, for invalid UTF-8 too
        raise DecodeError(f"not JSON: {exc}") from None


def loads(text: str | bytes) -> FleetSnapshot:
    """A FleetSnapshot from `dumps` output; DecodeError says where it does not fit."""
    data = parse_json(text)
    if not isinstance(data, dict):
        raise DecodeError("expected a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DecodeError(f"schema_version {version!r} is not {SCHEMA_VERSION}")
    try:
        result = _decoder(FleetSnapshot)(data)
    except _Misfit as wrong:
        raise wrong.at("$") from None
    assert isinstance(result, FleetSnapshot)
    return result


__all__ = [
    "DecodeError",
    "decode",
    "decode_node",
    "dumps",
    "encode",
    "loads",
    "parse_json",
    "snapshot_json",
]
