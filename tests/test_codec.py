"""The JSON snapshot: versioned, and it reads back to the same readings."""

from __future__ import annotations

import json

import pytest

from gpuconsole import codec
from gpuconsole.model import SCHEMA_VERSION
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
