"""The fleet a head console reads: its members, from the config and a file_sd file.

Each member is a node with its agent's URL and the SSH destination that actions on it
use. Targets files follow Prometheus' file service discovery format, so the list an
operator keeps for Prometheus serves the console too; with a Prometheus server the
overview of every member is read from it, and only the node the console drills into is
read from its agent.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpuconsole.config import ConfigError, FleetConfig
from gpuconsole.hub import Hub, HubSettings


@dataclass(frozen=True, slots=True)
class FleetMember:
    """One node of the fleet."""

    node: str
    url: str
    ssh: str | None = None

    @property
    def address(self) -> str:
        """host:port of its agent, as Prometheus names the target (`instance`)."""
        return _address_of(self.url)


def _url(target: str) -> str:
    return target if "://" in target else f"http://{target}"


def _host_of(url: str) -> str:
    host = urlsplit(url).hostname
    if not host:
        raise ValueError(f"agent URL {url!r} has no host")
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
        return FleetMember(_host_of(url), url)
    if not name.strip() or not url.strip():
        raise ValueError(f"agent entry {entry!r}: expected NAME=URL")
    return FleetMember(name.strip(), _url(url.strip()))


@dataclass(frozen=True, slots=True)
class _Found:
    member: FleetMember
    named: bool  # the operator named it; otherwise the name is the agent's host


def _targets(path: Path) -> list[_Found]:
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
                member = FleetMember(str(node or _host_of(url)), url, labels.get("ssh"))
            except ValueError as exc:
                raise ConfigError(f"[fleet] targets_file {path}: group {i}: {exc}") from None
            found.append(_Found(member, bool(node)))
    return found


def _distinct(found: list[_Found]) -> list[FleetMember]:
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


def read_targets(path: Path) -> list[FleetMember]:
    """Members from a Prometheus file_sd JSON file (labels: node, ssh)."""
    return _distinct(_targets(path))


def members(cfg: FleetConfig) -> list[FleetMember]:
    """Every member the config names, in order: one per node name and one per agent URL."""
    found: list[_Found] = []
    for i, entry in enumerate(cfg.agents):
        try:
            found.append(_Found(parse_agent(entry), "=" in entry))
        except ValueError as exc:
            raise ConfigError(f"[fleet] agents[{i}]: {exc}") from None
    if cfg.targets_file:
        found.extend(_targets(Path(cfg.targets_file).expanduser()))
    return _distinct(found)


# Objects allocated, less those freed, before CPython's collector looks for cycles.
YOUNG_OBJECTS = 50_000


def quiet_collector() -> None:
    """Let the cycle collector run only when objects pile up, not as readings are replaced.

    A head keeps every node's latest reading: with a thousand nodes, some 300,000 objects
    whose million references a full collection walks (0.2 to 0.4 s each). Readings hold
    no cycles and refcounting frees each one the moment its successor lands, yet every 700
    new objects start a collection (the default), and a thousand readings a second add up
    to a full one about once a second: 40% of the head's CPU in bench_fleet. Raised, the
    count of objects allocated less those freed stays below it while nodes are replaced.
    """
    young, middle, old = gc.get_threshold()
    if young < YOUNG_OBJECTS:
        gc.set_threshold(YOUNG_OBJECTS, middle, old)


def fleet_hub(cfg: FleetConfig, settings: HubSettings | None = None) -> Hub:
    """A hub that reads every member through its agent, with one bounded client; with
    [fleet] prometheus, the overview from Prometheus and only the drill-down from agents."""
    # Here, not at the top: the HTTP client (aiohttp) costs a one-shot command a third of
    # its CPU, and a node with no [fleet] never needs it.
    from gpuconsole.sources.agents import AgentClient, RemoteSource
    from gpuconsole.sources.promql import PrometheusReader, PromQLSource

    quiet_collector()
    hub = Hub(settings)
    client = AgentClient(cfg.max_connections)
    reader = None
    if cfg.prometheus:
        reader = PrometheusReader(
            cfg.prometheus,
            client,
            selector=cfg.prometheus_selector,
            interval_s=cfg.interval_s,
            timeout_s=cfg.timeout_s,
        )
    for member in members(cfg):
        agent = RemoteSource(
            member.node, member.url, client, interval_s=cfg.interval_s, timeout_s=cfg.timeout_s
        )
        if reader is None:
            hub.add_source(agent)
        else:
            hub.add_source(PromQLSource(member.node, member.address, reader, agent))
    return hub


# hub -> viewer -> the node that viewer drilled into (consoles sharing one hub: ssh sessions)
_FOCUSED: weakref.WeakKeyDictionary[Hub, dict[int, str]] = weakref.WeakKeyDictionary()


def focus(hub: Hub, node: str | None, viewer: object = None) -> None:
    """Read every detail of `node` from its agent (`viewer`, a console, drilled into it),
    and only the overview of the nodes no viewer is in; None: `viewer` left its node.

    Several consoles on one hub (the ssh server's sessions) each hold their own node.
    """
    held = _FOCUSED.setdefault(hub, {})
    if "gpuconsole.sources.agents" not in sys.modules:
        return  # no agent is read in this process (a node's own console): nothing to do
    from gpuconsole.sources.agents import RemoteSource
    from gpuconsole.sources.promql import PromQLSource

    if node is None:
        held.pop(id(viewer), None)
    else:
        held[id(viewer)] = node
    wanted = set(held.values())
    for source in hub.sources:
        if isinstance(source, RemoteSource | PromQLSource):
            source.detail = source.node in wanted
