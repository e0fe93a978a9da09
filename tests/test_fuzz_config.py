"""Fuzzing the config file: any text is a Config or a ConfigError, an error names
the key and its line, and a Config that loads keeps every number within its limits.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpuconsole.config import BmcConfig, Config, ConfigError, parse, table_keys
from tests.fuzz_fixtures import FINITE, fuzz_settings, json_trees

FUZZ = fuzz_settings(200)

SECTIONS: dict[str, type] = {
    name: key.kind
    for name, key in table_keys(Config).items()
    if name not in ("bmc", "alert", "path")  # arrays of tables
}
KEYS: dict[str, list[str]] = {t: list(table_keys(c)) for t, c in SECTIONS.items()}
BMC_KEYS = list(table_keys(BmcConfig))


def toml(value: Any) -> str:
    """A value as TOML: strings as basic strings, floats with their special names."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):  # JSON's escapes are TOML's, but for DEL
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml(k)} = {toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


SCALARS = st.booleans() | st.integers(-(2**63), 2**63 - 1) | FINITE | st.text(max_size=16)
VALUES = json_trees(SCALARS, st.text(max_size=6), max_leaves=6)  # TOML has no null


@st.composite
def documents(
    draw: st.DrawFn, values: st.SearchStrategy[Any] = VALUES
) -> tuple[str, list[tuple[str, str, int]]]:
    """A config file of known tables and (mostly) known keys with values of any type; and
    where each key was set: (table, key, line)."""
    lines: list[str] = []
    where: list[tuple[str, str, int]] = []
    for table in draw(st.lists(st.sampled_from(sorted(SECTIONS)), unique=True, max_size=4)):
        lines.append(f"[{table}]")
        names = st.sampled_from(KEYS[table]) | st.from_regex(r"\A[a-z_]{1,12}\Z")
        for key in draw(st.lists(names, unique=True, max_size=4)):
            lines.append(f"{key} = {toml(draw(values))}")
            where.append((table, key, len(lines)))
    if draw(st.booleans()):
        lines.append("[[bmc]]")
        for key in draw(st.lists(st.sampled_from(BMC_KEYS), unique=True, max_size=4)):
            lines.append(f"{key} = {toml(draw(values))}")
    return "\n".join(lines) + "\n", where


def within_limits(cfg: Config) -> None:
    """Every number of a loaded Config respects the minimum and maximum its key declares."""
    sections = [getattr(cfg, t) for t in SECTIONS] + list(cfg.bmc)
    for section in sections:
        for spec in table_keys(type(section)).values():
            value = getattr(section, spec.name)
            low, high = spec.metadata.get("minimum"), spec.metadata.get("maximum")
            if low is not None:
                assert value >= low, (type(section).__name__, spec.name, value)
            if high is not None:
                assert value <= high, (type(section).__name__, spec.name, value)


@FUZZ
@given(st.text(max_size=300))
@example("[nvml\ninterval_s = 1")
@example('[[bmc]]\nhost = "a"\n[[bmc]]\nhost = "b"\n')
@example("nvml = 3\n")
@example("[hub]\n[hub]\n")
def test_any_text_is_a_config_or_a_config_error(text: str) -> None:
    try:
        cfg = parse(text)
    except ConfigError as exc:
        assert str(exc).startswith("config"), exc
        return
    within_limits(cfg)


@FUZZ
@given(documents())
def test_a_bad_value_is_named_by_key_and_line(doc: tuple[str, list[tuple[str, str, int]]]) -> None:
    text, where = doc
    try:
        cfg = parse(text)
    except ConfigError as exc:
        message = str(exc)
        named = re.match(r"^config(?::(\d+))?: \[\[?(\w+)\]?\](?: #\d+)?(?: (\w+))?", message)
        assert named, message
        line, table, key = named.groups()
        if key is not None and table != "bmc":
            assert (table, key, int(line)) in where, (message, where)
        return
    within_limits(cfg)


@pytest.mark.parametrize(
    "text",
    ["[nvml]\ninterval_s = nan\n", "[hub]\nmax_backoff_s = nan\n", "[ssh]\nrefresh_s = nan\n"],
)
def test_nan_is_not_a_number_within_limits(text: str) -> None:
    with pytest.raises(ConfigError, match="must be"):
        within_limits(parse(text))


@FUZZ
@given(documents(SCALARS | st.floats()))
def test_special_floats_never_crash_the_loader(doc: tuple[str, list[tuple[str, str, int]]]) -> None:
    try:
        parse(doc[0])
    except ConfigError:
        pass
