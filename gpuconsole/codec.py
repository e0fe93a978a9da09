"""Snapshots to versioned JSON and back: what `snapshot --json` prints and agents serve."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from gpuconsole.history import HistoryView
from gpuconsole.model import SCHEMA_VERSION, FleetSnapshot, Key, NodeSnapshot

_SKIP = {"history"}  # history stays in the process that recorded it
_KEYED = {"rates", "deltas"}  # NodeSnapshot mappings keyed by counter path


def encode(value: Any) -> Any:
    """Readings to plain JSON types; enums as their values, rate keys joined with '/'."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if f.name in _SKIP:
                continue
            item = getattr(value, f.name)
            if f.name in _KEYED:
                out[f.name] = {"/".join(k): v for k, v in item.items()}
            else:
                out[f.name] = encode(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    return value


def snapshot_json(snapshot: FleetSnapshot) -> dict[str, Any]:
    """The JSON document for a fleet snapshot, with its schema version."""
    body = encode(snapshot)
    return {"schema_version": SCHEMA_VERSION, "simulated": snapshot.simulated, **body}


def dumps(snapshot: FleetSnapshot, *, indent: int | None = None) -> str:
    return json.dumps(snapshot_json(snapshot), indent=indent, allow_nan=False)


class DecodeError(ValueError):
    """A JSON snapshot that does not match the schema, with the path that is wrong."""


Decoder = Callable[[Any, str], Any]
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

        def union(data: Any, where: str) -> Any:
            if data is None and optional:
                return None
            for choice in choices:
                try:
                    return choice(data, where)
                except DecodeError:
                    continue
            raise DecodeError(f"{where}: {data!r} matches none of {kind}")

        return union
    if origin in (dict, Mapping):
        key_type, value_type = typing.get_args(kind)
        keys, values = _decoder(key_type), _decoder(value_type)

        def mapping(data: Any, where: str) -> Any:
            if not isinstance(data, dict):
                raise DecodeError(f"{where}: expected an object")
            return {keys(k, where): values(v, f"{where}.{k}") for k, v in data.items()}

        return mapping
    if origin is tuple:
        parts = typing.get_args(kind)
        if len(parts) == 2 and parts[1] is Ellipsis:
            item = _decoder(parts[0])

            def sequence(data: Any, where: str) -> Any:
                if not isinstance(data, list):
                    raise DecodeError(f"{where}: expected a list")
                return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(data))

            return sequence
        items = [_decoder(a) for a in parts]

        def fixed(data: Any, where: str) -> Any:
            if not isinstance(data, list) or len(data) != len(items):
                raise DecodeError(f"{where}: expected a list of {len(items)}")
            return tuple(
                f(v, f"{where}[{i}]") for i, (f, v) in enumerate(zip(items, data, strict=True))
            )

        return fixed
    if dataclasses.is_dataclass(kind):
        return _dataclass_decoder(kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):

        def enumeration(data: Any, where: str) -> Any:
            try:
                return kind(data)
            except ValueError:
                raise DecodeError(f"{where}: {data!r} is not a {kind.__name__}") from None

        return enumeration
    if kind is float:

        def number(data: Any, where: str) -> Any:
            if isinstance(data, int | float) and not isinstance(data, bool):
                return float(data)
            raise DecodeError(f"{where}: expected a number")

        return number
    if kind in (int, str, bool):

        def scalar(data: Any, where: str) -> Any:
            if type(data) is kind:
                return data
            raise DecodeError(f"{where}: expected {kind.__name__}")

        return scalar
    if kind is Any:
        return lambda data, where: data
    raise TypeError(f"cannot decode {kind}")


def _dataclass_decoder(kind: Any) -> Decoder:
    hints = typing.get_type_hints(kind, localns={"HistoryView": HistoryView})
    fields = [
        (f.name, _KEYED_DECODERS[f.name] if f.name in _KEYED else _decoder(hints[f.name]))
        for f in dataclasses.fields(kind)
        if f.name not in _SKIP
    ]

    def decode(data: Any, where: str) -> Any:
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected an object")
        values = {name: f(data[name], where + "." + name) for name, f in fields if name in data}
        try:
            return kind(**values)
        except TypeError as exc:
            raise DecodeError(f"{where}: {exc}") from None

    return decode


def _rates(data: Any, where: str) -> dict[Key, float]:
    if not isinstance(data, dict):
        raise DecodeError(f"{where}: expected an object")
    try:
        return {tuple(k.split("/")): float(v) for k, v in data.items()}
    except (TypeError, ValueError):
        raise DecodeError(f"{where}: rates must be numbers") from None


def _deltas(data: Any, where: str) -> dict[Key, int]:
    if not isinstance(data, dict) or not all(type(v) is int for v in data.values()):
        raise DecodeError(f"{where}: deltas must be an object of integers")
    return {tuple(k.split("/")): v for k, v in data.items()}


_KEYED_DECODERS: dict[str, Decoder] = {"rates": _rates, "deltas": _deltas}


def decode_node(data: Any, where: str = "$") -> NodeSnapshot:
    """One NodeSnapshot from its JSON form (as in a fleet snapshot's "nodes")."""
    result = _decoder(NodeSnapshot)(data, where)
    assert isinstance(result, NodeSnapshot)
    return result


def loads(text: str | bytes) -> FleetSnapshot:
    """A FleetSnapshot from `dumps` output; DecodeError says where it does not fit."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DecodeError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DecodeError("expected a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DecodeError(f"schema_version {version!r} is not {SCHEMA_VERSION}")
    result = _decoder(FleetSnapshot)(data, "$")
    assert isinstance(result, FleetSnapshot)
    return result


__all__ = ["DecodeError", "decode_node", "dumps", "encode", "loads", "snapshot_json"]
