"""The JSON snapshot: versioned, and it reads back to the same readings."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

import msgspec
import pytest

from gpuconsole import codec
from gpuconsole.readings.base import NO_DEFAULT, SCHEMA_VERSION, Key, Severity, record_fields
from gpuconsole.readings.nvml import GpuReading, NvLinkReading, NvmlReading, RemoteKind
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sim.cluster import demo_hub

FIXED = 1_796_000_000.0


async def test_a_demo_snapshot_round_trips_through_json() -> None:
    hub = demo_hub(clock=lambda: FIXED, start=FIXED - 120, events=False)
    snapshot = await hub.poll_once()
    text = codec.dumps(snapshot)
    data = json.loads(text)
    assert data["schema_version"] == SCHEMA_VERSION and data["simulated"] is True
    back = codec.loads(text)
    assert back.nodes[1].nvml == snapshot.nodes[1].nvml
    assert [n.node for n in back.nodes] == [n.node for n in snapshot.nodes]
    assert back.nodes[3].nvml is not None
    mig_gpu = back.nodes[3].nvml.gpus[6]  # NVML's 6: GPU 2 is passed through to a guest
    assert mig_gpu.mig_instances
    assert mig_gpu.mig_instances == snapshot.nodes[3].nvml.gpus[6].mig_instances  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"schema_version": 99}', "schema_version 99"),
        ('{"schema_version": 1, "seq": "x", "at": 1, "nodes": []}', r"\$.seq: expected int"),
    ],
)
def test_a_bad_document_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(codec.DecodeError, match=message):
        codec.loads(text)


async def test_a_sparse_snapshot_leaves_out_defaults_and_reads_back_the_same() -> None:
    hub = demo_hub(clock=lambda: FIXED, start=FIXED - 120, events=False)
    snapshot = await hub.poll_once()
    full, sparse = codec.dumps(snapshot), codec.dumps(snapshot, sparse=True)
    assert len(sparse) < len(full)
    assert '"lost_since": null' in full and '"lost_since": null' not in sparse
    assert codec.loads(sparse) == codec.loads(full)


def test_a_wrong_field_deep_in_a_node_is_named_by_its_path() -> None:
    doc = {"node": "n1", "nvml": {"at": 1, "driver_version": None, "nvml_version": None}}
    doc["nvml"]["cuda_driver_version"] = None  # type: ignore[index]
    doc["nvml"]["gpus"] = [{"index": 0, "uuid": "u", "name": "g", "pci_bus_id": "b"}] * 2  # type: ignore[index]
    doc["nvml"]["gpus"] = [
        doc["nvml"]["gpus"][0],
        {**doc["nvml"]["gpus"][0], "ecc": {"remap_pending": 1}},
    ]  # type: ignore[index]
    with pytest.raises(
        codec.DecodeError,
        match=r"^\$\.nvml\.gpus\[1\]\.ecc\.remap_pending: expected bool \| null, got int$",
    ):
        codec.decode_node(doc)


def test_bus_ids_are_written_as_nvml_writes_them_and_read_back_in_sysfs_form() -> None:
    link = NvLinkReading(0, True, remote_kind=RemoteKind.NVSWITCH, remote_pci_bus_id="0000:c7:00.0")
    gpu = GpuReading(0, "GPU-a", "NVIDIA H100 80GB HBM3", "0000:1b:00.0", nvlinks=(link,))
    node = NodeSnapshot("n1", nvml=NvmlReading(FIXED, None, None, None, (gpu,)))
    doc = codec.snapshot_json(FleetSnapshot(1, FIXED, (node,)), sparse=True)
    sent = doc["nodes"][0]["nvml"]["gpus"][0]
    assert sent["pci_bus_id"] == "00000000:1B:00.0"  # as `snapshot --json` always wrote it
    assert sent["nvlinks"][0]["remote_pci_bus_id"] == "00000000:C7:00.0"
    assert codec.decode_node(doc["nodes"][0]) == node
    sent["pci_bus_id"] = "0000:1B:00.0"  # any form a capture or an agent may hold
    assert codec.decode_node(doc["nodes"][0]) == node


async def test_every_string_of_a_body_reads_back_safe_and_the_rest_as_it_was() -> None:
    """A body whose strings need cleaning (an escape, a C1 control, a bidi override) reads
    as the same body would with each string made safe, as a capture and as a head reads it."""
    from gpuconsole.export.agent import snapshot_body
    from gpuconsole.readings.base import safe_text
    from gpuconsole.sources.agents import AgentClient, AgentSource

    hub = demo_hub(clock=lambda: FIXED, start=FIXED - 120, events=False)
    snapshot = await hub.poll_once()
    data = json.loads(snapshot_body(snapshot, "dgx-002", summary=True))
    profile, name = "dgx\x1b]52;c;x\x07\u00e9\u202e", "H100\x9b2J"
    data["nodes"][0]["profile"] = profile
    data["nodes"][0]["nvml"]["gpus"][0]["name"] = name
    data["nodes"][0]["rates"] = {"gpu/GPU-\x1b[2J/energy_mj": 1.5}
    poisoned = json.dumps(data).encode()
    data["nodes"][0]["profile"] = safe_text(profile)
    data["nodes"][0]["nvml"]["gpus"][0]["name"] = safe_text(name)
    data["nodes"][0]["rates"] = {"gpu/GPU-\\x1b[2J/energy_mj": 1.5}
    expected = codec.loads(json.dumps(data).encode()).nodes[0]
    assert expected.profile == "dgx\\x1b]52;c;x\\x07\u00e9\\u202e"
    assert codec.loads(poisoned).nodes[0] == expected
    source = AgentSource("dgx-002", "http://127.0.0.1:9", AgentClient())
    assert source.parse(poisoned).node == expected
    assert expected.rate("gpu", "GPU-\\x1b[2J", "energy_mj") == 1.5


class Judged(msgspec.Struct, frozen=True):
    severity: Severity
    gpu: GpuReading | None = None
    notes: tuple[str, ...] = ()


class Report(msgspec.Struct, frozen=True):
    judged: tuple[Judged, ...]
    moved: Mapping[Key, int] = msgspec.field(default_factory=dict)


def test_a_reading_type_the_codec_has_not_seen_decodes_by_its_types_alone() -> None:
    """The decoder is built from the readings' types: a new reading (an enum, a nested
    reading, a tuple, a mapping keyed by counter path) needs no edit here, and keeps every
    rule: strings made safe, NVML bus ids in sysfs form, a path for what does not fit."""
    body = json.dumps(
        {
            "judged": [
                {
                    "severity": "warning",
                    "gpu": {
                        "index": 0,
                        "uuid": "GPU-a",
                        "name": "H\x1b[2J",
                        "pci_bus_id": "00000000:1B:00.0",
                    },
                    "notes": ["ok", "\u202e"],
                }
            ],
            "moved": {"fabric/mlx5_0/1/symbol_error": 3},
        }
    ).encode()
    report = codec.read(Report, codec.safe_body(body))
    judged = report.judged[0]
    assert judged.severity is Severity.WARNING and judged.notes == ("ok", "\\u202e")
    assert judged.gpu is not None and judged.gpu.name == "H\\x1b[2J"
    assert judged.gpu.pci_bus_id == "0000:1b:00.0"
    assert report.moved == {("fabric", "mlx5_0", "1", "symbol_error"): 3}
    with pytest.raises(
        codec.DecodeError, match=r"^\$\.judged\[0\]\.severity: invalid enum value 'bad'$"
    ):
        codec.read(Report, b'{"judged": [{"severity": "bad"}]}')


@dataclasses.dataclass(frozen=True)
class _Noted:
    judged: tuple[Judged, ...]
    moved: Mapping[Key, int] = dataclasses.field(default_factory=dict)
    note: str = "none"


def test_a_records_fields_read_alike_from_a_struct_and_from_a_dataclass() -> None:
    """One place reads fields: a reading's Struct and any other record's dataclass give the
    same names, defaults and factories, so encoding (sparse too) treats them alike."""
    struct = [(f.name, f.default, f.factory) for f in record_fields(Report)]
    plain = [(f.name, f.default, f.factory) for f in record_fields(_Noted)]
    assert struct == [("judged", NO_DEFAULT, None), ("moved", NO_DEFAULT, dict)]
    assert plain == [*struct, ("note", "none", None)]
    judged = (Judged(Severity.INFO, notes=("a",)),)
    assert codec.encode(Report(judged), sparse=True) == {
        "judged": [{"severity": "info", "notes": ["a"]}]
    }
    assert codec.encode(_Noted(judged, note="x"), sparse=True) == {
        "judged": [{"severity": "info", "notes": ["a"]}],
        "note": "x",
    }
    assert codec.read(Report, b'{"judged": []}').moved == {}
