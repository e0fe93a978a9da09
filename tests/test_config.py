"""The config file: defaults for everything, and errors that name the key and line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuconsole import config
from gpuconsole.config import Config, ConfigError


def test_an_empty_file_is_all_defaults() -> None:
    assert config.parse("") == Config()


def test_the_example_is_complete_and_parses_back_to_the_defaults() -> None:
    text = config.example()
    for section in ("[host]", "[hub]", "[nvml]", "[demo]", "[ui]"):
        assert section in text
    assert "interval_s = 1.0" in text
    assert config.parse(text) == Config()


def test_values_are_read_with_their_types() -> None:
    cfg = config.parse("[nvml]\ninterval_s = 2\nevents = false\n[host]\nname = 'dgx-017'\n")
    assert cfg.nvml.interval_s == 2.0 and cfg.nvml.events is False
    assert cfg.host.node_name == "dgx-017"


def test_a_wrong_type_names_the_key_and_its_line(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[host]\nname = 'x'\n\n[nvml]\nenabled = true\ninterval_s = 'fast'\n")
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert f"{path}:6: [nvml] interval_s must be a number, got 'fast'" in str(err.value)


def test_an_unknown_key_is_named_with_a_suggestion() -> None:
    with pytest.raises(
        ConfigError, match=r":2: \[nvml\] intervl_s: unknown key \(did you mean 'interval_s'\?\)"
    ):
        config.parse("[nvml]\nintervl_s = 1\n")


def test_an_unknown_table_is_named() -> None:
    with pytest.raises(ConfigError, match=r":1: \[nvm\]: unknown table \(did you mean 'nvml'\?\)"):
        config.parse("[nvm]\ninterval_s = 1\n")


def test_a_value_out_of_range_says_the_limit() -> None:
    with pytest.raises(ConfigError, match=r"\[nvml\] interval_s must be at least 0.05"):
        config.parse("[nvml]\ninterval_s = 0\n")


def test_broken_toml_says_where() -> None:
    with pytest.raises(ConfigError, match=r"not valid TOML: .*line 2"):
        config.parse("[nvml]\ninterval_s = = 1\n")


def test_an_explicit_file_must_exist_but_the_default_may_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        config.load(tmp_path / "missing.toml")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config.load() == Config()


def test_a_default_is_read_from_the_defaults_never_from_a_table_class() -> None:
    """A table is a Struct: `NvmlConfig.interval_s` is the field's slot, not 1.0, and a
    signature defaulting to it would hand a descriptor to the code that polls."""
    kinds = [key.kind for key in config.table_keys(Config).values()]
    tables = {kind.__name__ for kind in kinds if isinstance(kind, type)}
    tables |= {"BmcConfig", "AlertRuleConfig"}
    assert "NvmlConfig" in tables
    read = re.compile(rf"\b({'|'.join(sorted(tables))})\.([a-z_]+)\b")
    root = Path(config.__file__).parent.parent
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for folder in ("gpuconsole", "benchmarks")
        for path in sorted((root / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if read.search(line)
    ]
    assert found == []
    assert config.DEFAULTS.nvml.interval_s == 1.0
