"""The fleet a head console reads: its members, from the config and a file_sd file.

Each member is a node with its agent's URL and the SSH destination that actions on it
use. Targets files follow Prometheus' file service discovery format, so the list an
operator keeps for Prometheus serves the console too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpuconsole.config import ConfigError, FleetConfig
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.sources.remote import AgentClient, RemoteSource


@dataclass(frozen=True, slots=True)
class FleetMember:
    """One node of the fleet."""

    node: str
    url: str
    ssh: str | None = None


def _url(target: str) -> str:
    return target if "://" in target else f"http://{target}"


def _name_of(url: str) -> str:
    host = urlsplit(url).hostname
    if not host:
        raise ValueError(f"agent URL {url!r} has no host")
    return host


def parse_agent(entry: str) -> FleetMember:
    """'NAME=URL' or 'URL' (or host:port) to a member."""
    name, sep, url = entry.partition("=")
    if not sep:
        url = _url(entry.strip())
        return FleetMember(_name_of(url), url)
    if not name.strip() or not url.strip():
        raise ValueError(f"agent entry {entry!r}: expected NAME=URL")
    return FleetMember(name.strip(), _url(url.strip()))


def read_targets(path: Path) -> list[FleetMember]:
    """Members from a Prometheus file_sd JSON file (labels: node, ssh)."""
    try:
        groups = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"[fleet] targets_file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"[fleet] targets_file {path}: not JSON: {exc}") from None
    if not isinstance(groups, list):
        raise ConfigError(f"[fleet] targets_file {path}: expected a list of target groups")
    members = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ConfigError(f"[fleet] targets_file {path}: group {i} has no targets list")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict):
            raise ConfigError(f"[fleet] targets_file {path}: group {i} labels must be a table")
        for target in group["targets"]:
            if not isinstance(target, str):
                raise ConfigError(f"[fleet] targets_file {path}: group {i}: {target!r}")
            url = _url(target)
            node = labels.get("node") if len(group["targets"]) == 1 else None
            members.append(FleetMember(str(node or _name_of(url)), url, labels.get("ssh")))
    return members


def members(cfg: FleetConfig) -> list[FleetMember]:
    """Every member the config names, in order, without duplicates by node."""
    found: list[FleetMember] = []
    for i, entry in enumerate(cfg.agents):
        try:
            found.append(parse_agent(entry))
        except ValueError as exc:
            raise ConfigError(f"[fleet] agents[{i}]: {exc}") from None
    if cfg.targets_file:
        found.extend(read_targets(Path(cfg.targets_file).expanduser()))
    seen: set[str] = set()
    unique = []
    for member in found:
        if member.node not in seen:
            seen.add(member.node)
            unique.append(member)
    return unique


def fleet_hub(cfg: FleetConfig, settings: HubSettings | None = None) -> Hub:
    """A hub that reads every member through its agent, with one bounded client."""
    hub = Hub(settings)
    client = AgentClient(cfg.max_connections)
    for member in members(cfg):
        hub.add_source(
            RemoteSource(
                member.node,
                member.url,
                client,
                interval_s=cfg.interval_s,
                timeout_s=cfg.timeout_s,
            )
        )
    return hub
