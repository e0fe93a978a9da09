"""Fuzzing what BMCs send: Redfish JSON documents, IPMI SEL records as pyghmi
hands them over, and the SEL cursor file. No crash: a reading, or a BmcError that names
the BMC; and whatever is read can still be written as the JSON snapshot.

Redfish documents are the repo's own mockup (the tree sushy-static serves in the BMC
tests), changed one place at a time and served by a stand-in for pyghmi's client that
answers 404 for a URL it does not hold, as a BMC would.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st

from gpuconsole import codec
from gpuconsole.readings.base import PartStatus, Severity
from gpuconsole.readings.bmc import BmcReading, SelEntry
from gpuconsole.sources.bmc import BmcSource
from gpuconsole.sources.bmc.ipmi import sel_entry
from gpuconsole.sources.bmc.link import BmcError
from gpuconsole.sources.bmc.redfish import RedfishHttpError, RedfishLink
from gpuconsole.sources.bmc.sel import SelCursor
from gpuconsole.sources.bmc.sensors import gpu_module_of
from tests.fuzz_fixtures import FINITE, Json, change_one_place, fuzz_settings, json_trees, scalars

FUZZ = fuzz_settings(150, HealthCheck.function_scoped_fixture)
MOCKUPS = Path(__file__).parent / "data" / "bmc" / "redfish"


@functools.cache
def mockup(name: str) -> dict[str, Json]:
    """Every resource of a mockup tree by URL, as sushy-static serves it."""
    root = MOCKUPS / name
    docs: dict[str, Json] = {}
    for file in root.rglob("index.json"):
        rel = file.parent.relative_to(root).as_posix()
        docs["/redfish/v1" + ("" if rel == "." else "/" + rel)] = json.loads(file.read_text())
    return docs


class MockupClient:
    """pyghmi's Redfish client, reduced to what RedfishLink asks: GET and POST by URL."""

    def __init__(self, docs: Mapping[str, Json]) -> None:
        self.docs = docs

    def get(self, url: str) -> Json:
        found = self.docs.get(url.rstrip("/"))
        if found is None:
            raise RedfishHttpError(url, 404)
        return found  # any kind, as pyghmi decodes it: a string body is a string

    def post(self, url: str, body: Mapping[str, Any]) -> None:
        if url.rstrip("/") not in self.docs:
            raise RedfishHttpError(url, 404, "POST")

    def logout(self) -> None:
        return None


def read(docs: Mapping[str, Json]) -> BmcReading | None:
    """One poll of a BMC serving `docs`: its reading, or None after a BmcError."""
    source = BmcSource("dgx-017", RedfishLink("redfish://bmc:443", lambda: MockupClient(docs)))
    try:
        reading = source.collect()
    except BmcError as exc:
        assert str(exc).startswith("redfish://bmc:443: "), exc
        return None
    json.dumps(codec.encode(reading), allow_nan=False)  # it fits the JSON snapshot
    return reading


def test_the_mockups_read_whole() -> None:
    for name in ("modern", "legacy"):
        reading = read(mockup(name))
        assert reading is not None and reading.sensors and reading.power_w is not None


# --- changing one place of one document --------------------------------------------------

ASCII = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)
TREES = json_trees(scalars(ASCII), ASCII)


def same_kind(value: Json) -> st.SearchStrategy[Json]:
    """Another value of the same JSON kind: what a BMC with odd but well-typed data sends."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers()
    if isinstance(value, float):
        return FINITE
    if isinstance(value, str):
        return ASCII
    if isinstance(value, list):  # fewer items, or some twice
        return st.lists(st.sampled_from(value), max_size=4) if value else st.just([])
    if isinstance(value, dict):
        return st.just({})
    return st.none()


@st.composite
def mutated(draw: st.DrawFn, values: str) -> dict[str, Json]:
    """A mockup with one value somewhere replaced (`values` "same": by one of its kind;
    "any": by any JSON), or one key removed."""
    docs = copy.deepcopy(mockup(draw(st.sampled_from(["modern", "legacy"]))))
    url = draw(st.sampled_from(sorted(docs)))
    new = same_kind if values == "same" else lambda _: TREES
    change_one_place(draw, docs, url, stop_one_in=4, new=new)
    return docs


@FUZZ
@given(mutated("same"))
def test_redfish_documents_with_odd_values_of_the_right_kind_read_or_say_why(
    docs: dict[str, Json],
) -> None:
    read(docs)


@FUZZ
@given(mutated("any"))
@example({**mockup("modern"), "/redfish/v1/Chassis/DGX/Sensors/CPU1_Temp": {"Status": "OK"}})
def test_redfish_documents_with_values_of_any_kind_read_or_say_why(
    docs: dict[str, Json],
) -> None:
    read(docs)


def test_a_redfish_reading_too_large_for_a_float_leaves_the_snapshot_writable() -> None:
    docs = copy.deepcopy(mockup("modern"))
    url = next(u for u in sorted(docs) if "/Sensors/" in u and "Reading" in docs[u])
    docs[url] = {**docs[url], **json.loads('{"Reading": 1e400}')}
    read(docs)


@pytest.mark.parametrize("ident", ["²", "7" * 5000], ids=["unicode-digit", "5000-digits"])
def test_a_redfish_log_entry_with_an_odd_numeric_id_is_skipped(ident: str) -> None:
    docs = copy.deepcopy(mockup("modern"))
    url = next(u for u in sorted(docs) if u.endswith("/Entries"))
    docs[url]["Members"] = [*docs[url]["Members"], {"Id": ident, "Message": "odd"}]
    assert read(docs) is not None


def test_a_body_that_is_not_an_object_costs_that_sensor_and_names_its_url() -> None:
    docs = {**mockup("modern"), "/redfish/v1/Chassis/DGX/Sensors/P12V": ["P12V", 12.1]}
    reading = read(docs)
    assert reading is not None and reading.unread == (
        PartStatus("Chassis/DGX/Sensors", False, "P12V: the body is an array, not an object"),
    )
    assert reading.sensor("P12V") is None and reading.power_w == 6120.0


def test_a_resource_answering_500_costs_that_part_alone() -> None:
    class Failing(MockupClient):
        def get(self, url: str) -> Json:
            if url.endswith("/Chassis/DGX/PowerSubsystem"):
                raise RedfishHttpError(url, 500)
            return super().get(url)

    docs = mockup("modern")
    link = RedfishLink("redfish://bmc:443", lambda: Failing(docs))
    reading = BmcSource("dgx-017", link).collect()
    assert reading.unread == (PartStatus("Chassis/DGX/PowerSubsystem", False, "HTTP 500"),)
    assert reading.psus_present == 6  # counted from the PSU power Sensors: no units listed
    assert (reading.power_w, reading.inlet_c, reading.fans_present) == (6120.0, 25.5, 12)


# --- HGX module numbers in sensor and chassis names ----------------------------------------


@pytest.mark.parametrize(
    ("names", "module"),
    [
        (("HGX_GPU_SXM_5_TEMP_0",), 5),
        (("hgx gpu sxm 12",), 12),
        (("HGX_GPU_SXM_" + "7" * 5000,), None),  # int() refuses more than 4300 digits
        (("HGX_GPU_SXM_" + "7" * 5000, "HGX_GPU_SXM_3 TEMP 0"), 3),  # the next name
        (("HGX_GPU_SXM_\u0663_TEMP_0",), None),  # an Arabic-Indic 3: not ASCII
        (("HGX_GPU_SXM_12345",), None),
        (("Inlet Temp",), None),
    ],
)
def test_the_hgx_module_is_a_short_ascii_number(names: tuple[str, ...], module: int | None) -> None:
    assert gpu_module_of(*names) == module


@FUZZ
@given(st.text(max_size=30).map(lambda t: "HGX_GPU_SXM_" + t) | st.text(max_size=30))
@example("HGX_GPU_SXM_" + "9" * 5000)
def test_any_name_has_a_small_module_number_or_none(name: str) -> None:
    module = gpu_module_of(name)
    assert module is None or 0 <= module < 10_000


def test_a_sensor_named_with_thousands_of_digits_takes_its_chassis_module() -> None:
    docs = copy.deepcopy(mockup("modern"))
    url = "/redfish/v1/Chassis/HGX_GPU_SXM_1/Sensors/HGX_GPU_SXM_1_TEMP_0"
    long_name = "HGX_GPU_SXM_" + "7" * 5000
    docs[url] = {**docs[url], "Id": long_name, "Name": long_name}
    reading = read(docs)
    assert reading is not None
    sensor = reading.sensor(long_name)
    assert sensor is not None and sensor.value == 41.0 and sensor.gpu_module_id == 1


# --- SEL records as pyghmi returns them --------------------------------------------------

TIMESTAMPS = st.none() | ASCII | st.datetimes().map(lambda d: d.isoformat())
SEL_RECORDS = st.fixed_dictionaries(
    {},
    optional={
        "record_id": st.none() | st.integers() | ASCII,
        "timestamp": TIMESTAMPS,
        "severity": st.none() | st.integers(0, 2**31),
        "component": st.none() | st.text(max_size=20),
        "component_type": st.none() | st.text(max_size=20),
        "event": st.none() | st.text(max_size=40),
        "message": st.none() | st.text(max_size=40),
        "deassertion": st.booleans(),
        "triggered_value": st.none() | st.integers() | FINITE | st.binary(max_size=2),
        "threshold_value": st.none() | st.integers() | FINITE | st.binary(max_size=2),
    },
)


@FUZZ
@given(SEL_RECORDS, st.dictionaries(st.text(max_size=10), ASCII, max_size=3))
def test_sel_records_become_entries_or_are_skipped(
    record: dict[str, Any], units: dict[str, str]
) -> None:
    entry = sel_entry(record, units)
    assert entry is None or isinstance(entry.record_id, int)
    if entry is not None:
        json.dumps(codec.encode(entry), allow_nan=False)


def entry(record_id: int) -> SelEntry:
    return SelEntry(record_id, None, "", "", "e", Severity.INFO)


@FUZZ
@given(st.lists(st.lists(st.integers(0, 2**16), max_size=8), min_size=1, max_size=6))
def test_the_sel_cursor_takes_any_ids_and_remembers_where_it_stood(
    tmp_path_factory: pytest.TempPathFactory, logs: list[list[int]]
) -> None:
    path = tmp_path_factory.mktemp("sel") / "cursor.json"
    cursor = SelCursor(path)
    for ids in logs:
        fresh = cursor.new_entries([entry(i) for i in ids])
        assert [e.record_id for e in fresh] == sorted(e.record_id for e in fresh)
        assert {e.record_id for e in fresh} <= set(ids)
        reopened = SelCursor(path)
        reopened.load()
        assert reopened.last_record_id == cursor.last_record_id  # it survives a restart


@FUZZ
@given(st.binary(max_size=200) | TREES.map(lambda t: json.dumps(t).encode()))
def test_an_unreadable_sel_cursor_file_starts_over(
    tmp_path_factory: pytest.TempPathFactory, content: bytes
) -> None:
    path = tmp_path_factory.mktemp("sel") / "cursor.json"
    path.write_bytes(content)
    cursor = SelCursor(path)
    cursor.load()
    assert cursor.last_record_id is None or isinstance(cursor.last_record_id, int)


def test_a_deeply_nested_sel_cursor_file_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "cursor.json"
    path.write_bytes(b"[" * 100_000)
    cursor = SelCursor(path)
    cursor.load()
    assert cursor.last_record_id is None
