"""Fuzzing the agent's JSON as a head console reads it: `codec.loads` and the
remote source's `parse` of the summary. No crash: a snapshot that writes itself out
again, or the project's error (DecodeError for loads, ValueError for parse) saying where.

Documents are real ones (a simulated fleet's snapshot, full and summarized as an agent
serves them), changed in one place; and plain bytes.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from gpuconsole import codec
from gpuconsole.codec import DecodeError
from gpuconsole.export.agent import select
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sim.cluster import demo_hub
from gpuconsole.sources.agents import AgentClient, AgentSource
from tests.fuzz_fixtures import TREES, Json, change_one_place, fuzz_settings

FUZZ = fuzz_settings(200)


@functools.cache
def documents() -> tuple[str, str]:
    """A simulated node as JSON (every source's reading): the full view and the summary."""
    hub = demo_hub(1, events=False, clock=lambda: 1_796_000_000.0, start=1_795_999_000.0)
    snapshot = asyncio.run(hub.poll_once(2))
    return codec.dumps(snapshot), codec.dumps(select(snapshot, "dgx-001", summary=True))


def test_the_documents_round_trip() -> None:
    for text in documents():
        again = codec.dumps(codec.loads(text))
        assert codec.dumps(codec.loads(again)) == again


@st.composite
def mutated(draw: st.DrawFn) -> Json:
    """One of the documents, with one value replaced by any JSON or one key removed."""
    wrapper: dict[str, Json] = {"": json.loads(draw(st.sampled_from(documents())))}
    change_one_place(draw, wrapper, "", stop_one_in=5, new=lambda _: TREES)
    return wrapper[""]


def loads_or_says_where(raw: str | bytes) -> FleetSnapshot | None:
    try:
        snapshot = codec.loads(raw)
    except DecodeError as exc:
        assert str(exc), "a DecodeError that says nothing"
        return None
    text = codec.dumps(snapshot)  # what was read can be served on
    assert codec.dumps(codec.loads(text)) == text
    return snapshot


@FUZZ
@given(st.binary(max_size=300))
@example(b"")
@example(b"\xff\xfe")
@example(b'{"schema_version": 1}')
def test_any_bytes_load_or_raise_a_decode_error(raw: bytes) -> None:
    loads_or_says_where(raw)


@FUZZ
@given(mutated())
def test_a_changed_snapshot_loads_or_says_where_it_does_not_fit(doc: Json) -> None:
    loads_or_says_where(json.dumps(doc))


@FUZZ
@given(mutated())
def test_the_remote_source_parses_a_changed_summary_or_says_what_is_wrong(doc: Json) -> None:
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    assume(not (isinstance(nodes, list) and len(nodes) == 1 and not isinstance(nodes[0], dict)))
    source = AgentSource("dgx-001", "http://127.0.0.1:9", AgentClient())
    try:
        reading = source.parse(json.dumps(doc).encode())
    except ValueError as exc:
        assert str(exc).startswith("agent"), exc
        return
    assert isinstance(reading.node.node, str)
    json.dumps(codec.encode(reading.node), allow_nan=False)


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a":' * 100_000])
def test_deeply_nested_json_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        codec.loads(raw)


@pytest.mark.parametrize("where", ["events", "node", "second node"])
def test_deep_nesting_anywhere_in_an_agents_body_is_said_not_to_fit(where: str) -> None:
    doc = json.loads(documents()[1])
    deep = "[" * 100_000 + "]" * 100_000
    if where == "events":
        doc["events"] = "@@"
    elif where == "node":
        doc["nodes"][0]["profile"] = "@@"
    else:
        doc["nodes"].append({"node": "@@"})
    body = json.dumps(doc).replace('"@@"', deep).encode()
    source = AgentSource("dgx-001", "http://127.0.0.1:9", AgentClient())
    with pytest.raises(ValueError, match=r"^agent sent"):
        source.parse(body)


@pytest.mark.parametrize("number", ["1e400", "Infinity", "NaN"])
def test_a_non_finite_number_from_an_agent_is_refused(number: str) -> None:
    doc = json.loads(documents()[0])
    doc["nodes"][0]["bmc"]["power_w"] = "@@"
    text = json.dumps(doc).replace('"@@"', number)
    with pytest.raises(DecodeError):
        codec.loads(text)


@pytest.mark.parametrize("node", [None, "dgx-001", 7])
def test_a_lone_node_that_is_not_an_object_is_said_not_to_fit(node: Json) -> None:
    doc = json.loads(documents()[1])
    doc["nodes"] = [node]
    source = AgentSource("dgx-001", "http://127.0.0.1:9", AgentClient())
    with pytest.raises(ValueError, match="agent sent"):
        source.parse(json.dumps(doc).encode())


def test_a_document_without_nodes_is_a_reading_of_nothing() -> None:
    doc = copy.deepcopy(json.loads(documents()[0]))
    doc["nodes"] = []
    assert codec.loads(json.dumps(doc)).nodes == ()
