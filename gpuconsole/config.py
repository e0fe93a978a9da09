"""One TOML file describes a node (or, later, a fleet). Every key has a default.

A bad file gets an error that names the key and its line: `ConfigError`.
`example()` renders a complete, commented file from the same definitions, so the
example can never fall behind the loader.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from gpuconsole import paths


def _doc(text: str, **limits: float) -> dict[str, Any]:
    return {"doc": text, **limits}


@dataclass(frozen=True)
class HostConfig:
    """[host]: this machine."""

    name: str = field(default="", metadata=_doc("Node name shown everywhere; empty: the hostname"))
    sysfs_root: str = field(
        default="/sys", metadata=_doc("Root of sysfs, shared by every source that reads it")
    )
    proc_root: str = field(default="/proc", metadata=_doc("Root of procfs"))

    @property
    def node_name(self) -> str:
        return self.name or socket.gethostname()


@dataclass(frozen=True)
class HubConfig:
    """[hub]: the data loop."""

    history_points: int = field(
        default=300, metadata=_doc("Points kept per sparkline series", minimum=2, maximum=100_000)
    )
    event_log_size: int = field(
        default=2000, metadata=_doc("Events kept in memory", minimum=10, maximum=1_000_000)
    )
    max_backoff_s: float = field(
        default=60.0, metadata=_doc("Longest wait between retries of a failing source", minimum=1)
    )


@dataclass(frozen=True)
class NvmlConfig:
    """[nvml]: the GPUs, through NVML."""

    enabled: bool = field(default=True, metadata=_doc("Read GPUs through NVML"))
    interval_s: float = field(
        default=1.0, metadata=_doc("Seconds between polls", minimum=0.05, maximum=3600)
    )
    timeout_s: float = field(
        default=5.0, metadata=_doc("A poll taking longer marks the source stale", minimum=0.1)
    )
    detail_every: int = field(
        default=2,
        metadata=_doc("Clocks, throttle, processes and GPM every N polls", minimum=1, maximum=3600),
    )
    inventory_every: int = field(
        default=30,
        metadata=_doc("PCIe, NVLink, MIG layout and fabric state every N polls", minimum=1),
    )
    events: bool = field(default=True, metadata=_doc("Watch XID and ECC events in a thread"))
    library: str = field(
        default="",
        metadata=_doc("Path of libnvidia-ml.so.1 to load; empty: the system's"),
    )


@dataclass(frozen=True)
class DemoConfig:
    """[demo]: the simulated cluster."""

    nodes: int = field(
        default=0, metadata=_doc("Simulated nodes; 0: the 7-node demo cluster", minimum=0)
    )
    seed: int = field(default=0, metadata=_doc("Same seed, same cluster"))


@dataclass(frozen=True)
class UiConfig:
    """[ui]: the console."""

    theme: str = field(
        default="gpuconsole-dark",
        metadata=_doc("Theme name: a shipped one or a file in the user themes folder"),
    )


@dataclass(frozen=True)
class AgentConfig:
    """[agent]: the headless exporter (`gpuconsole agent`)."""

    listen: str = field(default="127.0.0.1:9400", metadata=_doc("HOST:PORT to serve /metrics on"))
    tls_cert: str = field(default="", metadata=_doc("PEM certificate file; empty: plain HTTP"))
    tls_key: str = field(default="", metadata=_doc("PEM key file for tls_cert"))
    basic_auth_user: str = field(default="", metadata=_doc("Require HTTP basic auth as this user"))
    basic_auth_password_file: str = field(
        default="", metadata=_doc("File holding the basic-auth password (mode 0600)")
    )


@dataclass(frozen=True)
class Config:
    """The whole file."""

    host: HostConfig = field(default_factory=HostConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    nvml: NvmlConfig = field(default_factory=NvmlConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    ui: UiConfig = field(default_factory=UiConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    path: Path | None = field(default=None, compare=False)


class ConfigError(Exception):
    """A config file that cannot be used, with the key and line that are wrong."""


_SECTIONS = [f.name for f in dataclasses.fields(Config) if f.name != "path"]


def _line_of(text: str, table: str, key: str | None) -> int | None:
    """The line where [table] key is set (or where [table] starts)."""
    current = ""
    header = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]\s*(#.*)?$")
    assign = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")
    for number, line in enumerate(text.splitlines(), start=1):
        m = header.match(line)
        if m:
            current = m.group(1)
            if key is None and current == table:
                return number
            continue
        if key is not None and current == table:
            a = assign.match(line)
            if a and a.group(1) == key:
                return number
    return None


def _where(path: Path | None, text: str, table: str, key: str | None) -> str:
    line = _line_of(text, table, key)
    name = f"[{table}] {key}" if key else f"[{table}]"
    place = str(path) if path else "config"
    return f"{place}:{line}: {name}" if line else f"{place}: {name}"


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _convert(value: Any, kind: Any) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise TypeError("must be true or false")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError("must be a whole number")
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise TypeError("must be a number")
    if kind is str:
        if isinstance(value, str):
            return value
        raise TypeError("must be a string")
    raise TypeError(f"unsupported type {kind}")


def _section(cls: type, data: Any, path: Path | None, text: str, table: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{_where(path, text, table, None)} must be a table")
    hints = get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, raw in data.items():
        spec = known.get(key)
        if spec is None:
            raise ConfigError(
                f"{_where(path, text, table, key)}: unknown key{_suggest(key, list(known))}"
            )
        try:
            value = _convert(raw, hints[key])
        except TypeError as exc:
            raise ConfigError(f"{_where(path, text, table, key)} {exc}, got {raw!r}") from None
        low, high = spec.metadata.get("minimum"), spec.metadata.get("maximum")
        if low is not None and value < low:
            raise ConfigError(f"{_where(path, text, table, key)} must be at least {low:g}")
        if high is not None and value > high:
            raise ConfigError(f"{_where(path, text, table, key)} must be at most {high:g}")
        values[key] = value
    return cls(**values)


def parse(text: str, path: Path | None = None) -> Config:
    """A Config from TOML text; ConfigError names what is wrong and where."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path or 'config'}: not valid TOML: {exc}") from None
    sections: dict[str, Any] = {}
    hints = get_type_hints(Config)
    for table, body in data.items():
        if table not in _SECTIONS:
            raise ConfigError(
                f"{_where(path, text, table, None)}: unknown table{_suggest(table, _SECTIONS)}"
            )
        sections[table] = _section(hints[table], body, path, text, table)
    return Config(**sections, path=path)


def load(path: Path | None = None) -> Config:
    """Read the config: an explicit path must exist; the XDG default may be absent."""
    explicit = path is not None
    target = path if path is not None else paths.default_config_file()
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{target}: no such config file") from None
        return Config()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{target}: cannot read: {exc}") from None
    return parse(text, target)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def example() -> str:
    """A complete config file with every key at its default, each explained."""
    lines = [
        "# gpuconsole configuration. Every key is optional; shown here at its default.",
        f"# Default location: {paths.default_config_file()}",
        "",
    ]
    defaults = Config()
    for table in _SECTIONS:
        section = getattr(defaults, table)
        lines.append(f"# {type(section).__doc__}")
        lines.append(f"[{table}]")
        for spec in dataclasses.fields(section):
            doc = spec.metadata.get("doc", "")
            lines.append(f"# {doc}")
            lines.append(f"{spec.name} = {_toml_value(getattr(section, spec.name))}")
        lines.append("")
    return "\n".join(lines)
