"""Snapshots to versioned JSON and back: what `snapshot --json` prints and agents serve."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from gpuconsole.history import HistoryView
from gpuconsole.model import SCHEMA_VERSION, FleetSnapshot, NodeSnapshot

_SKIP = {"history"}  # history stays in the process that recorded it


def encode(value: Any) -> Any:
    """Readings to plain JSON types; enums as their values, rate keys joined with '/'."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if f.name in _SKIP:
                continue
            item = getattr(value, f.name)
            if f.name == "rates":
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


def _decode(kind: Any, data: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(kind)
        if data is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _decode(arg, data, where)
            except DecodeError:
                continue
        raise DecodeError(f"{where}: {data!r} matches none of {kind}")
    if origin in (dict, Mapping):
        key_type, value_type = typing.get_args(kind)
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected an object")
        return {
            _decode(key_type, k, where): _decode(value_type, v, f"{where}.{k}")
            for k, v in data.items()
        }
    if origin is tuple:
        args = typing.get_args(kind)
        if not isinstance(data, list):
            raise DecodeError(f"{where}: expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        return tuple(
            _decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=False))
        )
    if dataclasses.is_dataclass(kind):
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected an object")
        hints = typing.get_type_hints(kind, localns={"HistoryView": HistoryView})
        values = {}
        for f in dataclasses.fields(kind):
            if f.name in data and f.name not in _SKIP:
                if f.name == "rates":
                    values[f.name] = {
                        tuple(k.split("/")): float(v) for k, v in data[f.name].items()
                    }
                else:
                    values[f.name] = _decode(hints[f.name], data[f.name], f"{where}.{f.name}")
        try:
            return kind(**values)  # type: ignore[operator]
        except TypeError as exc:
            raise DecodeError(f"{where}: {exc}") from None
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(data)
        except ValueError:
            raise DecodeError(f"{where}: {data!r} is not a {kind.__name__}") from None
    if kind is float:
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
        raise DecodeError(f"{where}: expected a number")
    if kind in (int, str, bool):
        if isinstance(data, kind) and not (kind is int and isinstance(data, bool)):
            return data
        raise DecodeError(f"{where}: expected {kind.__name__}")
    if kind is Any:
        return data
    raise DecodeError(f"{where}: cannot decode {kind}")


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
    result = _decode(FleetSnapshot, data, "$")
    assert isinstance(result, FleetSnapshot)
    return result


__all__ = ["DecodeError", "NodeSnapshot", "dumps", "encode", "loads", "snapshot_json"]
