"""An agent's summary decoded by msgspec, typed, straight into the readings: the decoder the
head would use were msgspec's the codec, held here to measure it against gpuconsole.codec's
and to check that the two read every body alike.

It keeps what gpuconsole.codec guarantees: every string made safe to show (checked on the
bytes: a body of printable ASCII with no escape holds no other string), NVML's bus ids read
back in sysfs's form, counter paths split into keys.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import msgspec

from gpuconsole.history import HistoryView
from gpuconsole.readings.base import normal_bus_id, safe_text
from gpuconsole.readings.snapshot import NodeSnapshot

# NodeSnapshot's mappings as the JSON holds them; counter paths are split after decoding
_WIRE_TYPES = {"rates": dict[str, float], "deltas": dict[str, int], "last_xid": dict[str, int]}


def _wire_node() -> type:
    hints = typing.get_type_hints(NodeSnapshot, localns={"HistoryView": HistoryView})
    fields: list[Any] = []
    for f in dataclasses.fields(NodeSnapshot):
        if f.name == "history":
            continue
        kind = _WIRE_TYPES.get(f.name, hints[f.name])
        if f.name in _WIRE_TYPES:
            fields.append((f.name, kind, dataclasses.field(default_factory=dict)))
        elif f.default is not dataclasses.MISSING:
            fields.append((f.name, kind, dataclasses.field(default=f.default)))
        else:
            fields.append((f.name, kind))
    return dataclasses.make_dataclass("WireNode", fields, slots=True)


_WireNode = _wire_node()


@dataclasses.dataclass(slots=True)
class _WireDocument:
    schema_version: int
    nodes: list[_WireNode]  # type: ignore[valid-type]


_DECODER = msgspec.json.Decoder(_WireDocument)
_PLAIN = msgspec.json.Decoder()


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return value if value.isprintable() else safe_text(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    return value


def decode_nodes(body: bytes) -> list[NodeSnapshot]:
    """Every node of an agent's document, as gpuconsole.codec would read it."""
    if body.isascii() and b"\\" not in body and b"\x7f" not in body:
        document = _DECODER.decode(body)
    else:  # some string may need cleaning: each one is, before the types are checked
        document = msgspec.convert(_clean(_PLAIN.decode(body)), _WireDocument)
    return [_node(wire) for wire in document.nodes]


def _gpu(gpu: Any) -> Any:
    """A GPU reading with its bus ids (its own, its NVLinks' far ends) in sysfs's form."""
    return dataclasses.replace(
        gpu,
        pci_bus_id=normal_bus_id(gpu.pci_bus_id),
        nvlinks=tuple(
            link
            if link.remote_pci_bus_id is None
            else dataclasses.replace(link, remote_pci_bus_id=normal_bus_id(link.remote_pci_bus_id))
            for link in gpu.nvlinks
        ),
    )


def _node(wire: Any) -> NodeSnapshot:
    nvml = wire.nvml
    if nvml is not None:
        nvml = dataclasses.replace(nvml, gpus=tuple(_gpu(gpu) for gpu in nvml.gpus))
    tenancy = wire.tenancy
    if tenancy is not None and tenancy.guest_gpus:  # what guests' agents read of their GPUs
        guests = tuple(
            dataclasses.replace(g, reading=_gpu(g.reading)) if g.reading is not None else g
            for g in tenancy.guest_gpus
        )
        tenancy = dataclasses.replace(tenancy, guest_gpus=guests)
    fields = {f.name: getattr(wire, f.name) for f in dataclasses.fields(wire)}
    fields["nvml"] = nvml
    fields["tenancy"] = tenancy
    fields["rates"] = {tuple(k.split("/")): v for k, v in wire.rates.items()}
    fields["deltas"] = {tuple(k.split("/")): v for k, v in wire.deltas.items()}
    return NodeSnapshot(**fields)
