"""The agents a head reads, as members of its fleet: `NAME=URL` entries and Prometheus
file_sd target files.

Each member is a node with its agent's URL and the SSH destination that actions on it use.
Targets files follow Prometheus' file service discovery format, so the list an operator
keeps for Prometheus serves the console too.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from gpuconsole.config import ConfigError, http_url_problem


@dataclass(frozen=True, slots=True)
class FleetMember:
    """One node of the fleet."""

    node: str
    url: str
    ssh: str | None = None
    # the operator named it; otherwise `node` stands in (its host) until its agent names it
    named: bool = dataclasses.field(default=True, compare=False)

    @property
    def address(self) -> str:
        """host:port of its agent, as Prometheus names the target (`instance`)."""
        return _address_of(self.url)


class Found(msgspec.Struct, frozen=True):
    """A member as an entry or a targets file gives it, before names are made distinct."""

    member: FleetMember
    named: bool  # the operator named it; otherwise the name is the agent's host


def _url(target: str) -> str:
    return target if "://" in target else f"http://{target}"


def _host_of(url: str) -> str:
    """The host of an agent URL; ValueError when the URL is not one a client can use."""
    problem = http_url_problem(url)
    if problem is not None:
        raise ValueError(f"agent URL {url!r}: {problem}")
    host = urlsplit(url).hostname
    assert host is not None
    return host


def _address_of(url: str) -> str:
    """host:port of an agent URL: what Prometheus names the target (its `instance`)."""
    parts = urlsplit(url)
    host = _host_of(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_agent(entry: str) -> FleetMember:
    """'NAME=URL' or 'URL' (or host:port) to a member."""
    name, sep, url = entry.partition("=")
    if not sep:
        url = _url(entry.strip())
        return FleetMember(_host_of(url), url, named=False)
    if not name.strip() or not url.strip():
        raise ValueError(f"agent entry {entry!r}: expected NAME=URL")
    url = _url(url.strip())
    _host_of(url)
    return FleetMember(name.strip(), url)


def read_targets(path: Path) -> list[Found]:
    """The members of a Prometheus file_sd JSON file (labels: node, ssh), in its order."""
    try:
        groups = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"[fleet] targets_file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"[fleet] targets_file {path}: not JSON: {exc}") from None
    if not isinstance(groups, list):
        raise ConfigError(f"[fleet] targets_file {path}: expected a list of target groups")
    found = []
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
            # a group's node label names its one target; several targets share a group's
            # labels, so a name would be wrong for all but one of them
            node = labels.get("node") if len(group["targets"]) == 1 else None
            try:
                member = FleetMember(
                    str(node or _host_of(url)), url, labels.get("ssh"), named=bool(node)
                )
            except ValueError as exc:
                raise ConfigError(f"[fleet] targets_file {path}: group {i}: {exc}") from None
            found.append(Found(member, bool(node)))
    return found


def distinct(found: list[Found]) -> list[FleetMember]:
    """Unnamed agents that share a host (one port per agent) are named host:port; then
    the first member of each name and of each URL wins."""
    hosts = Counter(_host_of(f.member.url) for f in found if not f.named)
    unique: list[FleetMember] = []
    names: set[str] = set()
    urls: set[str] = set()
    for f in found:
        member = f.member
        if not f.named and hosts[_host_of(member.url)] > 1:
            member = dataclasses.replace(member, node=_address_of(member.url))
        url = member.url.rstrip("/")
        if member.node in names or url in urls:
            continue
        names.add(member.node)
        urls.add(url)
        unique.append(member)
    return unique
