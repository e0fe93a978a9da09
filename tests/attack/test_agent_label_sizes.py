"""An agent's strings that become labels of the head's series (a GPU's UUID and model, in
every series of that GPU): one that no NVML could have written is refused with the node's
reading, said plainly; it never multiplies into the head's /metrics or its alerts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuconsole import codec
from gpuconsole.export.agent import select
from gpuconsole.export.collector import build
from gpuconsole.readings.snapshot import FleetSnapshot
from tests.attack.test_agent_verdicts import _head_reads
from tests.export_fixtures import frozen_fleet


def _served(key: str, value: str) -> dict[str, Any]:
    body = codec.snapshot_json(select(frozen_fleet(), "dgx-004", summary=True), sparse=True)
    body = copy.deepcopy(body)
    body["nodes"][0]["nvml"]["gpus"][0][key] = value
    return body


@pytest.mark.parametrize(
    ("key", "value"),
    [("uuid", "GPU-" + "a" * 2_000_000), ("name", "\u0301" * 100_000), ("uuid", "G" * 97)],
)
async def test_a_gpu_identity_no_nvml_could_write_refuses_the_reading_not_the_head(
    key: str, value: str
) -> None:
    node, neighbour = await _head_reads(_served(key, value))
    assert node is not None and neighbour is not None
    status = node.status("remote")
    assert status is not None and not status.ok and status.error is not None
    assert f"gpus[0].{key}: expected str of length <= 96" in status.error
    assert neighbour.status("remote").ok  # type: ignore[union-attr]
    text = build(FleetSnapshot(1, 1.0, (node, neighbour))).text()
    assert len(text) < 1_000_000


async def test_a_gpu_identity_at_nvmls_length_is_taken() -> None:
    node, _ = await _head_reads(_served("name", "N" * 96))
    assert node is not None and node.status("remote").ok  # type: ignore[union-attr]
    assert node.nvml is not None and node.nvml.gpus[0].name == "N" * 96


def _with_pod(**names: str) -> dict[str, Any]:
    """dgx-004's summary with a pod holding its first GPU, named as given."""
    body = codec.snapshot_json(select(frozen_fleet(), "dgx-004", summary=True), sparse=True)
    body = copy.deepcopy(body)
    node = body["nodes"][0]
    uuid = node["nvml"]["gpus"][0]["uuid"]
    device = {
        "namespace": "ml",
        "pod": "train-0",
        "container": "main",
        "resource": "nvidia.com/gpu",
        "device_id": uuid,
        "uuid": uuid,
        **names,
    }
    tenancy = node.setdefault("tenancy", {"at": node["nvml"]["at"]})
    tenancy["pod_devices"] = [device]
    return body


@pytest.mark.parametrize(
    "names",
    [{"pod": "p" * 1_000_000}, {"namespace": "n" * 64}, {"container": "c" * 100_000}],
    ids=["pod", "namespace", "container"],
)
async def test_a_pod_name_kubernetes_would_refuse_refuses_the_reading(
    names: dict[str, str],
) -> None:
    node, neighbour = await _head_reads(_with_pod(**names))
    assert node is not None and neighbour is not None
    status = node.status("remote")
    assert status is not None and not status.ok and status.error is not None
    [key] = names
    assert f"pod_devices[0].{key}: expected str of length <=" in status.error
    text = build(FleetSnapshot(1, 1.0, (node, neighbour))).text()
    assert len(text) < 1_000_000


async def test_a_pod_named_within_kubernetes_limits_is_taken() -> None:
    node, _ = await _head_reads(_with_pod(pod="p" * 253, namespace="n" * 63))
    assert node is not None and node.status("remote").ok  # type: ignore[union-attr]
    assert node.tenancy is not None and node.tenancy.pod_devices[0].pod == "p" * 253
