"""The fleet overview read from Prometheus with PromQL, for fleets past what one head polls.

Prometheus scrapes every agent; a round of instant queries asks it for the series the
agents export (dcgm-exporter's DCGM_*, gpuconsole_*, ipmi_*, node_infiniband_*) for the
whole fleet at once, and every node's source builds its overview from that one round: the
first round every series, later ones what moves and a part of the rest in turn (see
PrometheusReader). Each node stays its own source for the hub, so an agent Prometheus
cannot scrape goes stale alone. Drilling into a node (`detail`) reads that node's agent
directly, for everything.

A node's series are found by the scrape target (`instance`, host:port of its agent, as
Prometheus names file_sd and static targets) and, within it, by the node name the agent
exports (`node`; `Hostname` on DCGM series; `exported_node` when a target label `node`
displaced it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import re
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlencode

import aiohttp
import msgspec

from gpuconsole.export import names
from gpuconsole.facts.inventory import gpu_and_bus
from gpuconsole.facts.summaries import BUSY_PCT
from gpuconsole.facts.verdict import actions_verdict
from gpuconsole.facts.xids import describe_xid
from gpuconsole.readings.agents import AgentReading
from gpuconsole.readings.base import (
    Event,
    Severity,
    SourceStatus,
    known_bus_id,
    normal_bus_id,
    safe_text,
)
from gpuconsole.readings.bmc import BmcReading, PowerState
from gpuconsole.readings.fabric import (
    FabricDevice,
    FabricPort,
    FabricReading,
    NetdevStats,
    PortRole,
)
from gpuconsole.readings.nvml import (
    EccReading,
    GpmMetrics,
    GpuReading,
    GpuState,
    MigInstance,
    NvmlReading,
    PcieReading,
)
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.verdict import Action, CarriedVerdict
from gpuconsole.sources.agents import AgentClient, AgentSource
from gpuconsole.sources.base import EmitEvent
from gpuconsole.sources.nvml.lib import THROTTLE_BITS

MIB = 1024 * 1024
BYTES_PER_S_PER_GBPS = 125_000_000  # how the exporter writes a port's rate (procfs does so)
# A thousand nodes' overview is a few MB of JSON; this only stops a runaway answer.
MAX_ANSWER_BYTES = 256 * 1024 * 1024

# Per GPU: the figures the fleet view, GPU health and the wallboard read.
_GPU = (
    names.DCGM_GPU_UTIL,
    names.DCGM_MEM_COPY_UTIL,
    names.DCGM_FB_USED,
    names.DCGM_FB_FREE,
    names.DCGM_FB_RESERVED,
    names.DCGM_GPU_TEMP,
    names.DCGM_MEMORY_TEMP,
    names.DCGM_POWER_USAGE,
    names.DCGM_POWER_LIMIT,
    names.DCGM_SM_CLOCK,
    names.DCGM_MEM_CLOCK,
    names.DCGM_PSTATE,
    names.DCGM_THROTTLE,
    names.DCGM_PCIE_GEN,
    names.DCGM_PCIE_WIDTH,
    names.DCGM_PCIE_REPLAY,
    names.DCGM_XID,
    names.DCGM_ECC_SBE_VOL,
    names.DCGM_ECC_DBE_VOL,
    names.DCGM_ECC_SBE_AGG,
    names.DCGM_ECC_DBE_AGG,
    names.DCGM_REMAP_COR,
    names.DCGM_REMAP_UNC,
    names.DCGM_REMAP_FAILURE,
    names.DCGM_REMAP_PENDING,
    names.DCGM_RETIRED_SBE,
    names.DCGM_RETIRED_DBE,
    names.DCGM_RETIRED_PENDING,
    names.PROF_SM_ACTIVE,
    names.GPU_LOST,
    names.GPU_PCIE_MAX_GEN,
    names.GPU_PCIE_MAX_WIDTH,
)
_SOURCE = (names.SOURCE_UP, names.SOURCE_LAST_OK, names.SOURCE_STALE, names.SOURCE_POLL)
_NODE = (
    names.NODE_GPUS_FLAGGED,
    names.NODE_SIMULATED,
    names.BMC_POWER,
    names.BMC_INLET,
    names.BMC_EXHAUST,
    names.BMC_FANS,
    names.BMC_FANS_FAILED,
    names.BMC_PSUS,
    names.BMC_PSUS_FAILED,
    names.BMC_PSUS_NO_INPUT,
    names.IPMI_CHASSIS_POWER,
    names.FABRIC_PEERMEM,
    names.FABRIC_MANAGER,
    names.NODE_VERDICT,
)
_PORT = (names.IB_STATE, names.IB_PHYSICAL_STATE, names.IB_RATE, names.FABRIC_PORT_EXPECTED_RATE)
_NETDEV = (names.FABRIC_NETDEV_UP, names.FABRIC_NETDEV_CARRIER)
_INFO = (names.GPU_INFO, names.MIG_INFO, names.FABRIC_PORT_INFO, names.BMC_INFO)
UP = "up"
# What every round asks of each GPU: what the fleet view draws and sorts by. Memory's share
# is used over the GPU's total, which does not move: free is read with the parts, and the
# total (used + free + reserved) kept from the round that read it beside used.
_EVERY_ROUND = (
    names.DCGM_GPU_UTIL,
    names.DCGM_FB_USED,
    names.DCGM_GPU_TEMP,
    names.DCGM_POWER_USAGE,
)
_FREE = names.DCGM_FB_FREE[0]
_TOTAL = "total MiB"  # kept in a GPU's values beside its series, under no metric's name
_DRAWN = tuple(spec[0] for spec in _EVERY_ROUND)
_DRAWN_SET = frozenset(_DRAWN)
_ASKED_APART = _DRAWN_SET | {names.NODE_GPUS_FLAGGED[0]}  # asked by the round as it goes
# Each GPU's health flags, asked where raised (above 0) of the nodes whose count of GPUs
# so flagged (the agent's per-node series) is above 0, or that lack it (an older agent):
# a few nodes of a fleet, not all. The rest have none raised.
_FLAGGED = names.NODE_GPUS_FLAGGED[0]
_RAISED = (
    names.GPU_LOST,
    names.DCGM_XID,
    names.DCGM_ECC_DBE_VOL,
    names.DCGM_REMAP_FAILURE,
    names.DCGM_REMAP_PENDING,
    # GPUs before Ampere only (none on a newer fleet)
    names.DCGM_RETIRED_SBE,
    names.DCGM_RETIRED_DBE,
    names.DCGM_RETIRED_PENDING,
)
# The clock throttle reasons: the count takes only clocks held down by heat or power, while
# the mask holds reasons a busy or idle GPU has (power cap, idle): read in a part like the
# clocks, and of those nodes each round beside their flags, and of the nodes flagged the
# round before (the mask of a slowdown that ended).
_THROTTLE = names.DCGM_THROTTLE[0]
_FLAG_NAMES = tuple(spec[0] for spec in _RAISED)
# The verdict each agent judged (the action's rank; its label aggregated away): the node's
# asked of every node each round where not fit (above 0), and whole in the parts, which
# tells a node that is fit from one whose agent does not export it (an older one: judged
# here, from its series); each GPU's, by bus id, asked where not fit of the nodes not fit.
_NODE_VERDICT = names.NODE_VERDICT[0]
_GPU_VERDICT = names.GPU_VERDICT[0]
_ACTIONS = tuple(Action)  # by rank
# and how bad each of those GPUs is (their health series: 2 critical, 1 warning), which
# its action alone does not say (a remap pending calls for a reset, as a warning)
_SEVERITY = "verdict severity"  # kept in a GPU's values, under no metric's name
_SEVERITIES: dict[int | None, Severity] = {1: Severity.WARNING, 2: Severity.CRITICAL}
PARTS = 10  # the rest, one part a round in turn: every series fresh within this many rounds
# The series a typical node holds of one metric of each kind (8 GPUs, 8 fabric ports, 4
# sources), which is what a query's cost grows with, Prometheus' and the head's: the parts
# are made about as heavy as each other from them. The info series count about three
# per-GPU metrics: their labels are many and long.
_WEIGHT = {"gpu": 8, "verdict": 8, "port": 8, "netdev": 8, "source": 4, "node": 1, "info": 26}
NEW_PER_ROUND = 200  # targets new to the rounds read whole in one round, at most
# While viewers say which rows they see, the GPU gauges of the rest are asked this often
# (every node's, so that rows out of view still sort by them).
OUT_OF_VIEW_S = 30.0
WHOLE_AT_ONCE = 4  # the first round's queries asked side by side

_KIND: dict[str, str] = {
    UP: "up",
    **{spec[0]: "gpu" for spec in _GPU},
    **{spec[0]: "source" for spec in _SOURCE},
    **{spec[0]: "node" for spec in _NODE},
    **{spec[0]: "port" for spec in _PORT},
    **{spec[0]: "netdev" for spec in _NETDEV},
    _GPU_VERDICT: "verdict",
    _SEVERITY: "gpu",
}
_SERIES = tuple(m for m in _KIND if m != _SEVERITY)  # the metrics among them
# Labels that place a value; every other label (pods, UUIDs, models) is aggregated away,
# which keeps the answer about a sixth of the raw series' size.
_PLACE = ("__name__", "instance", "Hostname", "node", "exported_node", "gpu", "source")
_PLACE_PORT = ("device", "port", "netdev")

# sysfs words for the state numbers node_exporter exports
_IB_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_IB_PHYS = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "PhyTest",
}
_SLICES = re.compile(r"^(\d+)g\.")


def _selector(extra: str) -> str:
    return f", {extra.strip()}" if extra.strip() else ""


def _values_query(metrics: Collection[str], extra: str, raised: bool = False) -> str:
    by = ", ".join((*_PLACE, *_PLACE_PORT))
    # MIG instances' DCGM series carry GPU_I_ID; the GPU's own do not
    selected = f'{{__name__=~"{"|".join(metrics)}", GPU_I_ID=""{_selector(extra)}}}'
    return f"max by ({by}) ({selected}{' > 0' if raised else ''})"


def _metric_query(metric: str, extra: str, raised: bool = False) -> str:
    """One metric's values, without its name on every sample (a third of a GPU gauge's
    answer): Prometheus evaluates these side by side, and the head parses less."""
    by = ", ".join(label for label in (*_PLACE, *_PLACE_PORT) if label != "__name__")
    return f'max by ({by}) ({metric}{{GPU_I_ID=""{_selector(extra)}}}{" > 0" if raised else ""})'


def _info_query(extra: str) -> str:
    info = "|".join(spec[0] for spec in _INFO)
    return f'{{__name__=~"{info}"{_selector(extra)}}}'


def drawn_gauges() -> tuple[str, ...]:
    """The GPU gauges every round asks for: what the fleet view draws."""
    return _DRAWN


def overview_queries(selector: str = "") -> tuple[str, str]:
    """The two instant queries of a whole round: every placed value, and the info series."""
    return _values_query(_SERIES, selector), _info_query(selector)


@dataclass(frozen=True)
class Ask:
    """One instant query of a round and what its answer replaces: the metrics it covers
    (absent from the answer: gone), or the info series."""

    query: str
    metrics: frozenset[str] = frozenset()
    raised: frozenset[str] = frozenset()  # of `metrics`, those sent only above 0
    info: bool = False
    named: str = ""  # the one metric asked, whose samples then come without its name
    within: frozenset[str] | None = None  # the targets asked about (instances); None: all


def _metric_ask(
    metric: str, extra: str, raised: bool = False, within: frozenset[str] | None = None
) -> Ask:
    asked = frozenset({metric})
    selector = extra if within is None else _instances(sorted(within), extra)
    query = _metric_query(metric, selector, raised)
    return Ask(query, asked, raised=asked if raised else frozenset(), named=metric, within=within)


def drawn_asks(selector: str = "", within: frozenset[str] | None = None) -> tuple[Ask, ...]:
    """The GPU gauges the fleet view draws, of the targets at `within` (None: of all)."""
    return tuple(_metric_ask(m, selector, within=within) for m in _DRAWN)


@dataclass(frozen=True)
class RoundPlan:
    """What the rounds ask: `every` each round, one of `parts` in turn, and at first
    `whole` (every series: the flags' too, raised or not)."""

    every: tuple[Ask, ...]
    parts: tuple[tuple[Ask, ...], ...]
    whole: tuple[Ask, ...]


def flag_asks(
    selector: str = "", within: frozenset[str] | None = None, before: frozenset[str] = frozenset()
) -> tuple[Ask, ...]:
    """Each GPU health flag where raised, of the targets at `within` (None: of all), whose
    answer speaks for every target (the others have none raised); and the throttle mask
    where raised, of those and the targets at `before`, whose answer speaks for them alone."""
    if within is None:
        return tuple(_metric_ask(m, selector, raised=True) for m in (*_FLAG_NAMES, _THROTTLE))
    asks = []
    if within:
        selected = _instances(sorted(within), selector)
        for metric in _FLAG_NAMES:
            asked = frozenset({metric})
            query = _metric_query(metric, selected, raised=True)
            asks.append(Ask(query, asked, raised=asked, named=metric))
    if within | before:
        asks.append(_metric_ask(_THROTTLE, selector, raised=True, within=within | before))
    return tuple(asks)


def verdict_ask(selector: str = "") -> Ask:
    """Each node's verdict where not fit: of every node, each round."""
    return _metric_ask(_NODE_VERDICT, selector, raised=True)


_GPU_VERDICTS = (_GPU_VERDICT, _SEVERITY)


def gpu_verdict_asks(
    selector: str = "", within: frozenset[str] | None = None, *, every: bool = True
) -> tuple[Ask, ...]:
    """Each GPU's verdict where not fit, and its health where a warning or critical, of the
    targets at `within` (None: of all): with `every`, of all those whose node is not fit,
    whose answers then speak for every target (a node takes its GPUs' worst: the GPUs of a
    node that is fit are); else of some of them, whose answers speak for them alone."""
    selected = _selector(selector if within is None else _instances(sorted(within), selector))
    verdict, health = frozenset({_GPU_VERDICT}), frozenset({_SEVERITY})
    by = ", ".join(label for label in (*_PLACE, *_PLACE_PORT) if label != "__name__")
    of = f'GPU_I_ID=""{selected}'
    # each selection cut to the GPUs in that state before they are joined
    critical = f'({names.GPU_HEALTH[0]}{{state="critical", {of}}} == 1)'
    warning = f'({names.GPU_HEALTH[0]}{{state="warning", {of}}} == 1)'
    only = None if every else within
    return (
        Ask(_metric_query(_GPU_VERDICT, selected.lstrip(", "), raised=True), verdict,
            raised=verdict, named=_GPU_VERDICT, within=only),
        Ask(f"max by ({by}) (2 * {critical} or {warning})", health, raised=health,
            named=_SEVERITY, within=only),
    )  # fmt: skip


def round_plan(selector: str = "") -> RoundPlan:
    """What every round asks (up, the GPU gauges the fleet view draws, each node's count of
    flagged GPUs; then each flagged node's flags where raised: `flag_asks`), the parts of the
    rest, one of which each round adds in turn, and the parts of a whole round."""
    # each metric its own query, side by side (one joined with `or` would drop the flags
    # of a GPU whose gauges it holds: set operators match series on labels without names)
    every = tuple(_metric_ask(m, selector) for m in (UP, *_DRAWN, _FLAGGED))
    asked = {m for ask in every for m in ask.metrics} | {*_FLAG_NAMES, *_GPU_VERDICTS}
    rest = [(m, _WEIGHT[_KIND[m]]) for m in _KIND if m not in asked]
    parts = _balanced([*rest, ("", _WEIGHT["info"])], PARTS)
    plan_parts = tuple(
        tuple(
            Ask(_info_query(selector), info=True) if not m else _metric_ask(m, selector) for m in p
        )
        for p in parts
    )
    # free beside used, so that the first total is taken from one moment
    whole = (
        *every[:2],
        _metric_ask(_FREE, selector),
        *every[2:],
        *(_metric_ask(m, selector) for m in _FLAG_NAMES),  # raised or not
        *gpu_verdict_asks(selector),
        *(ask for part in plan_parts for ask in part if ask.named != _FREE),
    )
    return RoundPlan(every, plan_parts, whole)


_TEMP = names.DCGM_GPU_TEMP[0]
_POWER = names.DCGM_POWER_USAGE[0]
_UTIL = names.DCGM_GPU_UTIL[0]


FIGURES = ("hottest", "power", "watts", "busy")


def figure_queries(top: int, selector: str = "") -> dict[str, str]:
    """The fleet-wide figures a wallboard shows, aggregated by Prometheus, by FIGURES: the
    `top` hottest GPUs and those drawing the most power, the GPUs' total power and how many
    are busy. Far cheaper than every GPU's gauges, for Prometheus (no 80,000 samples to
    write) and for the head (a few to read), though each still has Prometheus find every
    GPU's series: a viewer asks for those it shows now."""
    by = ", ".join(label for label in _PLACE if label != "__name__")

    def placed(metric: str) -> str:
        return f'max by ({by}) ({metric}{{GPU_I_ID=""{_selector(selector)}}})'

    return {
        "hottest": f"topk({top}, {placed(_TEMP)})",
        "power": f"topk({top}, {placed(_POWER)})",
        "watts": f"sum({placed(_POWER)})",
        "busy": f"count({placed(_UTIL)} >= {BUSY_PCT})",
    }


@dataclass(frozen=True)
class FleetFigures:
    """The whole fleet's figures from one round's aggregations: the hottest GPUs and those
    drawing the most power (each its node, GPU index and value, highest first), the GPUs'
    total power, how many are busy (`BUSY_PCT` or more); None: not asked this round."""

    at: float
    hottest: tuple[tuple[str, int, float], ...] | None = None
    power: tuple[tuple[str, int, float], ...] | None = None
    watts: float | None = None
    busy: int | None = None

    @staticmethod
    def merged(figures: Collection[FleetFigures], top: int) -> FleetFigures | None:
        """Several Prometheus servers' figures as one fleet's (None: none yet)."""
        if not figures:
            return None
        if len(figures) == 1:
            return next(iter(figures))

        def listed(
            each: list[tuple[tuple[str, int, float], ...] | None],
        ) -> tuple[tuple[str, int, float], ...] | None:
            if any(one is None for one in each):
                return None
            return tuple(sorted((g for one in each for g in one or ()), key=lambda g: -g[2]))[:top]

        watts = [f.watts for f in figures]
        busy = [f.busy for f in figures]
        return FleetFigures(
            at=min(f.at for f in figures),
            hottest=listed([f.hottest for f in figures]),
            power=listed([f.power for f in figures]),
            watts=None if None in watts else sum(w or 0.0 for w in watts),
            busy=None if None in busy else sum(b or 0 for b in busy),
        )


def _balanced(weighed: list[tuple[str, int]], count: int) -> list[list[str]]:
    """`weighed` (each a name and its weight) in `count` parts about as heavy as each
    other: the heaviest first, each to the lightest part so far."""
    parts: list[list[str]] = [[] for _ in range(count)]
    load = [0] * count
    for name, weight in sorted(weighed, key=lambda item: -item[1]):
        lightest = load.index(min(load))
        parts[lightest].append(name)
        load[lightest] += weight
    return [p for p in parts if p]


@dataclass
class NodeSeries:
    """One agent node's series in a round, by where they belong."""

    gpus: dict[int, dict[str, float]] = field(default_factory=dict)
    gpu_info: dict[int, Mapping[str, str]] = field(default_factory=dict)
    migs: dict[int, list[Mapping[str, str]]] = field(default_factory=dict)
    sources: dict[str, dict[str, float]] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    bmc: str | None = None
    ports: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    port_info: dict[tuple[str, int], Mapping[str, str]] = field(default_factory=dict)
    netdevs: dict[tuple[str, int], tuple[str, dict[str, float]]] = field(default_factory=dict)
    verdicts: dict[str, dict[str, float]] = field(default_factory=dict)  # by GPU bus id
    # what changed since a build: `version` counts changes to anything but the GPU gauges
    # every round asks (the fleet view's figures), `drawn` changes to those
    version: int = 0
    drawn: int = 0


@dataclass(frozen=True)
class Overview:
    """One round's answer: every target's `up` and every agent node's series."""

    at: float
    up: Mapping[str, float]  # by instance
    nodes: Mapping[str, Mapping[str, NodeSeries]]  # instance -> exported node name -> series

    def pick(self, instance: str, node: str) -> tuple[str, NodeSeries]:
        """The agent node read at `instance` for fleet member `node`; its exported name too."""
        up = self.up.get(instance)
        if up is None:
            raise ConnectionError(f"Prometheus does not scrape {instance} (no up series)")
        if up < 1:
            raise ConnectionError(f"Prometheus cannot scrape the agent at {instance} (up 0)")
        served = self.nodes.get(instance) or {}
        if node in served:
            return node, served[node]
        if len(served) == 1:
            return next(iter(served.items()))
        if not served:
            raise ValueError(f"Prometheus has no gpuconsole series from {instance}")
        raise ValueError(f"{instance} exports nodes {', '.join(sorted(served))}, not {node}")


def _value(sample: Any) -> float:
    return float(sample["value"][1])  # "NaN", "+Inf" included


def _int(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else round(value)


def _gauge(values: Mapping[str, float], spec: tuple[str, str]) -> float | None:
    value = values.get(spec[0])
    return None if value is None or math.isnan(value) else value


def _flag(values: Mapping[str, float], spec: tuple[str, str]) -> bool | None:
    value = _gauge(values, spec)
    return None if value is None else value >= 1


_INDEXES = {str(i): i for i in range(256)}


def _index(label: Any) -> int | None:
    """A GPU's NVML index or a port's number from its label; None for any other value: a
    GPU the host reads from its guest is labelled by its bus id, and is left, as is one
    agent's odd label, to the drill-down rather than failing every node's round."""
    if type(label) is str:
        index = _INDEXES.get(label)
        if index is not None:
            return index
        if label.isascii() and label.isdigit() and len(label) < 6:
            return int(label)
    return None


def _safe_labels(labels: Mapping[str, Any]) -> Mapping[str, Any]:
    """A series' labels with `safe_text` applied to each value."""
    if all(type(v) is not str or v.isprintable() for v in labels.values()):
        return labels
    return {k: safe_text(v) if type(v) is str else v for k, v in labels.items()}


def _holding(found: NodeSeries, kinds: Collection[str | None]) -> list[dict[str, float]]:
    """A node's dicts of values of the metrics of `kinds`."""
    held: list[dict[str, float]] = []
    if "gpu" in kinds:
        held += found.gpus.values()
    if "source" in kinds:
        held += found.sources.values()
    if "node" in kinds:
        held.append(found.values)
    if "port" in kinds:
        held += found.ports.values()
    if "netdev" in kinds:
        held += (stats for _, stats in found.netdevs.values())
    if "verdict" in kinds:
        held += found.verdicts.values()
    return held


_Slot = tuple[NodeSeries, dict[str, float]]  # a series' node and the dict its value is in
_NONE: frozenset[int] = frozenset()


class FleetSeries:
    """Every node's series as the rounds left them: each answer replaces the metrics it
    was asked for (those it no longer holds are gone) or the info series."""

    def __init__(self) -> None:
        self.at = time.time()
        self.up: dict[str, float] = {}
        self.nodes: dict[str, dict[str, NodeSeries]] = {}
        self.read_whole: set[str] = set()  # targets whose every series was asked for
        # per metric: the values held, and those held above 0 (none left out of an answer
        # that placed as many: nothing to sweep)
        self._held: dict[str, int] = {}
        self._nonzero: dict[str, int] = {}

    def _series_of(self, labels: Mapping[str, str]) -> NodeSeries | None:
        name = labels.get("exported_node") or labels.get("Hostname") or labels.get("node")
        instance = labels.get("instance")
        if not name or instance is None:
            return None
        served = self.nodes.get(instance)
        if served is None:
            served = self.nodes[instance] = {}
        found = served.get(name)
        if found is None:
            found = served[name] = NodeSeries()
        return found

    def _sweep(
        self,
        metrics: frozenset[str],
        raised: frozenset[str],
        placed: Mapping[str, set[int]],
        within: frozenset[str] | None = None,
    ) -> None:
        """Of `metrics`, drop those the answer did not hold (`placed`: each value's dict
        and metric); of those `raised`, a series held is 0 unless the answer says it is
        raised (one never exported stays unknown). An answer about the targets at `within`
        says nothing of the others: theirs stay, and so do their counts."""
        kinds = {_KIND.get(m) for m in metrics}
        counts, nonzero = self._held, self._nonzero  # counted again
        if within is None:
            for metric in metrics:
                counts[metric] = nonzero[metric] = 0
            swept: Iterable[dict[str, NodeSeries]] = self.nodes.values()
        else:
            swept = [self.nodes[i] for i in within if i in self.nodes]
            for served in swept:  # counted again, as far as within
                for found in served.values():
                    for values in _holding(found, kinds):
                        for metric in metrics.intersection(values):
                            counts[metric] = counts.get(metric, 0) - 1
                            if values[metric] != 0.0:
                                nonzero[metric] = nonzero.get(metric, 0) - 1
        for served in swept:
            for found in served.values():
                for values in _holding(found, kinds):
                    for metric in metrics.intersection(values) if len(metrics) > 1 else metrics:
                        value = values.get(metric)
                        if value is None:
                            continue
                        if id(values) not in placed.get(metric, _NONE):
                            if metric in raised:
                                if value == 0.0:
                                    continue
                                values[metric] = value = 0.0
                            else:
                                del values[metric]
                            if metric in _DRAWN_SET:
                                found.drawn += 1
                            elif metric != _FREE:
                                found.version += 1
                            if value is None or metric not in values:
                                continue
                        counts[metric] = counts.get(metric, 0) + 1
                        if value != 0.0:
                            nonzero[metric] = nonzero.get(metric, 0) + 1

    def take_values(
        self,
        values: list[Any],
        metrics: frozenset[str] | None = None,
        raised: frozenset[str] = frozenset(),
        named: str = "",
        within: frozenset[str] | None = None,
    ) -> None:
        """An answer covering `metrics` (None: every placed value) of the targets at
        `within` (None: of all), of which `raised` are sent only above 0, its samples
        without their name where it asked for `named` alone; ValueError when it does not
        fit."""
        try:
            if values:  # when Prometheus evaluated the query
                self.at = float(values[0]["value"][0])
            if metrics is None or UP in metrics:
                self.up = {}
            if metrics is None:
                self.nodes, self._held, self._nonzero = {}, {}, {}
            placed: dict[str, set[int]] = {}
            self._place(values, named, placed)
            # a metric asked alone, placed in as many values as hold it: none to sweep
            holding = (self._nonzero if raised else self._held).get(named, -1)
            alone = len(placed.get(named, _NONE))
            if metrics is not None and not (named and within is None and alone == holding):
                self._sweep(metrics, raised, placed, within)
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(f"Prometheus sent a vector that does not fit: {exc!r}") from None
        if metrics is None:
            self.read_whole = {i for i, up in self.up.items() if up >= 1}
            self.settle_totals()

    def settle_totals(self, instances: Collection[str] | None = None) -> None:
        """Each GPU's total memory from its used, free and reserved as held now: after a
        round that read free beside used (of the targets at `instances`, when given)."""
        used_name = names.DCGM_FB_USED[0]
        for instance in self.nodes if instances is None else instances:
            for found in self.nodes.get(instance, {}).values():
                for values in found.gpus.values():
                    used, free = values.get(used_name), values.get(_FREE)
                    total = None
                    if used is not None and free is not None:
                        total = used + free + (_gauge(values, names.DCGM_FB_RESERVED) or 0.0)
                    if total is None or math.isnan(total):
                        if values.pop(_TOTAL, None) is not None:
                            found.drawn += 1
                    elif values.get(_TOTAL) != total:
                        values[_TOTAL] = total
                        found.drawn += 1

    def _slot(self, kind: str, labels: Mapping[str, Any]) -> _Slot | None:
        """The node and the dict of values a series of `kind` with `labels` lands in."""
        found = self._series_of(labels)
        if found is None:
            return None
        held: dict[str, float] | None = None
        if kind == "gpu":
            if (index := _index(labels.get("gpu"))) is not None:
                held = found.gpus.get(index)
                if held is None:
                    held = found.gpus[index] = {}
        elif kind == "source" and "source" in labels:
            held = found.sources.setdefault(safe_text(labels["source"]), {})
        elif kind == "node":
            held = found.values
        elif kind == "verdict" and type(bus := labels.get("gpu")) is str and ":" in bus:
            held = found.verdicts.setdefault(normal_bus_id(safe_text(bus)), {})
        elif kind in ("port", "netdev") and "device" in labels:
            if (port := _index(labels.get("port"))) is None:
                return None
            place = (safe_text(labels["device"]), port)
            if kind == "port":
                held = found.ports.setdefault(place, {})
            else:
                netdev = safe_text(labels.get("netdev", ""))
                ifname, held = found.netdevs.get(place, (netdev, {}))
                found.netdevs[place] = (ifname, held)
        return None if held is None else (found, held)

    def _place(self, values: list[Any], named: str, placed: dict[str, set[int]]) -> None:
        up = self.up
        for sample in values:
            labels = sample["metric"]
            metric = named or labels.get("__name__", "")
            kind = _KIND.get(metric)
            if kind is None:
                continue
            if kind == "up":
                up[labels.get("instance", "")] = _value(sample)
                continue
            slot = self._slot(kind, labels)
            if slot is None:
                continue
            found, held = slot
            value = _value(sample)
            ids = placed.get(metric)
            if ids is None:
                ids = placed[metric] = set()
            ids.add(id(held))
            old = held.get(metric)
            if old != value:  # NaN too: it is never equal to itself
                held[metric] = value
                if metric in _DRAWN_SET:
                    found.drawn += 1
                elif metric != _FREE:  # only through the total it makes (settle_totals)
                    found.version += 1
                if old is None:
                    self._held[metric] = self._held.get(metric, 0) + 1
                if (old is not None and old != 0.0) != (value != 0.0):
                    step = 1 if value != 0.0 else -1
                    self._nonzero[metric] = self._nonzero.get(metric, 0) + step

    def take_info(self, info: list[Any], instances: Collection[str] | None = None) -> None:
        """The info series (GPUs, MIG instances, ports, the BMC), replacing the last (of
        the targets at `instances`, when given)."""
        try:
            before = []
            for instance in self.nodes if instances is None else instances:
                for held in self.nodes.get(instance, {}).values():
                    before.append((held, held.gpu_info, held.migs, held.port_info, held.bmc))
                    held.gpu_info, held.migs, held.port_info = {}, {}, {}
                    held.bmc = None
            for sample in info:
                labels = _safe_labels(sample["metric"])  # these name GPUs, MIGs, ports, the BMC
                metric = labels.get("__name__", "")
                found = self._series_of(sample["metric"])  # as the values found it
                if found is None:
                    continue
                index = _index(labels.get("gpu"))
                if metric == names.GPU_INFO[0] and index is not None:
                    found.gpu_info[index] = labels
                elif metric == names.MIG_INFO[0] and index is not None:
                    found.migs.setdefault(index, []).append(labels)
                elif metric == names.FABRIC_PORT_INFO[0]:
                    if (port := _index(labels.get("port"))) is not None:
                        found.port_info[(labels["device"], port)] = labels
                elif metric == names.BMC_INFO[0]:
                    found.bmc = labels.get("bmc", "")
            for held, gpu_info, migs, port_info, bmc in before:
                if (held.gpu_info, held.migs, held.port_info, held.bmc) != (
                    gpu_info,
                    migs,
                    port_info,
                    bmc,
                ):
                    held.version += 1
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(f"Prometheus sent a vector that does not fit: {exc!r}") from None

    def take_whole(self, values: list[Any], info: list[Any], instances: Collection[str]) -> None:
        """Every series of the targets at `instances`, in place of what was held of them."""
        for instance in instances:
            self.nodes.pop(instance, None)
        try:
            self._place([s for s in values if s["metric"].get("__name__") != UP], "", {})
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(f"Prometheus sent a vector that does not fit: {exc!r}") from None
        self.take_info(info, instances)
        self.settle_totals(instances)
        self.read_whole.update(instances)

    def flagged(self) -> frozenset[str]:
        """Targets Prometheus scrapes with a node that has a GPU flagged, or that does not
        say (an agent older than the count, or its series gone): theirs are the GPU health
        flags a round asks."""
        found = set()
        for instance, up in self.up.items():
            if up < 1:
                continue
            for held in self.nodes.get(instance, {}).values():
                count = held.values.get(_FLAGGED)
                if count is None or not count <= 0:  # NaN: it does not say either
                    found.add(instance)
                    break
        return frozenset(found)

    def unfit(self) -> dict[str, tuple[float | None, ...]]:
        """Targets Prometheus scrapes with a node whose agent judged it not fit, whose GPU
        verdicts a round asks, each with what a round compares with the last: its nodes'
        verdicts and counts of flagged GPUs."""
        found = {}
        for instance, up in self.up.items():
            if up < 1:
                continue
            served = self.nodes.get(instance)
            if not served:
                continue
            marks: list[float | None] = []
            unfit = False
            for held in served.values():
                rank = held.values.get(_NODE_VERDICT)
                unfit = unfit or (rank is not None and rank > 0)
                marks += (rank, held.values.get(_FLAGGED))
            if unfit:
                found[instance] = tuple(marks)
        return found

    def unheld(self) -> list[str]:
        """Targets Prometheus scrapes that no whole read has covered yet (new to the rounds)."""
        return [i for i, up in self.up.items() if up >= 1 and i not in self.read_whole]

    def overview(self) -> Overview:
        return Overview(self.at, self.up, self.nodes)


def parse_overview(values: list[Any], info: list[Any]) -> Overview:
    """An Overview from a whole round's two vectors; ValueError on a malformed answer."""
    series = FleetSeries()
    series.take_values(values)
    series.take_info(info)
    return series.overview()


def _mig(labels: Mapping[str, str]) -> MigInstance:
    profile = labels.get("profile", "")
    slices = _SLICES.match(profile)
    return MigInstance(
        gpu_instance_id=int(labels["gpu_instance"]),
        compute_instance_id=None,
        uuid=labels.get("mig_uuid", ""),
        profile_name=profile,
        slice_count=int(slices.group(1)) if slices else 0,
        sm_count=int(labels.get("sm_count") or 0),
    )


def _drawn(v: Mapping[str, float]) -> dict[str, Any]:
    """A GPU reading's fields from the gauges every round asks."""
    used, total = _gauge(v, names.DCGM_FB_USED), v.get(_TOTAL)
    return {
        "util_gpu_pct": _gauge(v, names.DCGM_GPU_UTIL),
        "mem_total_bytes": None if total is None else round(total * MIB),
        "mem_used_bytes": None if used is None else round(used * MIB),
        "temp_gpu_c": _gauge(v, names.DCGM_GPU_TEMP),
        "power_w": _gauge(v, names.DCGM_POWER_USAGE),
    }


def _steady(
    index: int, info: Mapping[str, str], v: Mapping[str, float], migs: list[MigInstance]
) -> dict[str, Any]:
    """A GPU reading's other fields: its info, health flags and the series read in parts."""
    reserved = _gauge(v, names.DCGM_FB_RESERVED)
    mask = _int(_gauge(v, names.DCGM_THROTTLE))
    sm_active = _gauge(v, names.PROF_SM_ACTIVE)
    lost = bool(_flag(v, names.GPU_LOST))
    return dict(
        index=index,
        uuid=info.get("uuid", ""),
        name=info.get("model", ""),
        pci_bus_id=normal_bus_id(info.get("pci_bus_id", "")),
        state=GpuState.LOST if lost else GpuState.OK,
        serial=info.get("serial") or None,
        module_id=_int(float(info["module_id"])) if info.get("module_id") else None,
        architecture=info.get("architecture") or None,
        util_mem_pct=_gauge(v, names.DCGM_MEM_COPY_UTIL),
        mem_reserved_bytes=None if reserved is None else round(reserved * MIB),
        temp_hbm_c=_gauge(v, names.DCGM_MEMORY_TEMP),
        power_limit_w=_gauge(v, names.DCGM_POWER_LIMIT),
        sm_clock_mhz=_int(_gauge(v, names.DCGM_SM_CLOCK)),
        mem_clock_mhz=_int(_gauge(v, names.DCGM_MEM_CLOCK)),
        pstate=_int(_gauge(v, names.DCGM_PSTATE)),
        throttle_reasons=tuple(name for bit, name in THROTTLE_BITS if mask and mask & bit),
        ecc=EccReading(
            volatile_corrected=_int(_gauge(v, names.DCGM_ECC_SBE_VOL)),
            volatile_uncorrected=_int(_gauge(v, names.DCGM_ECC_DBE_VOL)),
            aggregate_corrected=_int(_gauge(v, names.DCGM_ECC_SBE_AGG)),
            aggregate_uncorrected=_int(_gauge(v, names.DCGM_ECC_DBE_AGG)),
            remapped_corrected=_int(_gauge(v, names.DCGM_REMAP_COR)),
            remapped_uncorrected=_int(_gauge(v, names.DCGM_REMAP_UNC)),
            remap_pending=_flag(v, names.DCGM_REMAP_PENDING),
            remap_failure=_flag(v, names.DCGM_REMAP_FAILURE),
            retired_sbe=_int(_gauge(v, names.DCGM_RETIRED_SBE)),
            retired_dbe=_int(_gauge(v, names.DCGM_RETIRED_DBE)),
            retired_pending=_flag(v, names.DCGM_RETIRED_PENDING),
        ),
        pcie=PcieReading(
            gen_current=_int(_gauge(v, names.DCGM_PCIE_GEN)),
            gen_max=_int(_gauge(v, names.GPU_PCIE_MAX_GEN)),
            width_current=_int(_gauge(v, names.DCGM_PCIE_WIDTH)),
            width_max=_int(_gauge(v, names.GPU_PCIE_MAX_WIDTH)),
            replay_count=_int(_gauge(v, names.DCGM_PCIE_REPLAY)),
        ),
        numa_node=_int(float(info["numa_node"])) if info.get("numa_node") else None,
        mig_enabled=True if migs else None,
        mig_instances=tuple(migs),
        gpm=None if sm_active is None else GpmMetrics(sm_util_pct=sm_active * 100.0),
    )


def _statuses(node: str, found: NodeSeries, at: float) -> tuple[SourceStatus, ...]:
    out = []
    for source, v in sorted(found.sources.items()):
        ok = bool(_flag(v, names.SOURCE_UP))
        stale_s = _gauge(v, names.SOURCE_STALE) or 0.0
        out.append(
            SourceStatus(
                node=node,
                source=source,
                ok=ok,
                last_ok_at=_gauge(v, names.SOURCE_LAST_OK),
                stale_since=None if ok else at - stale_s,
                # the reason stays with the agent; drilling in shows it
                error=None if ok else f"stale for {stale_s:.0f} s (as Prometheus has it)",
                polls=1,
                last_poll_s=_gauge(v, names.SOURCE_POLL),
            )
        )
    return tuple(out)


def _bmc(found: NodeSeries, at: float, simulated: bool) -> BmcReading | None:
    v = found.values
    if found.bmc is None:
        return None  # no BMC configured for that node
    power = _gauge(v, names.IPMI_CHASSIS_POWER)
    state = PowerState.UNKNOWN if power is None else PowerState.ON if power >= 1 else PowerState.OFF
    return BmcReading(
        at=at,
        bmc=found.bmc,
        power_state=state,
        power_w=_gauge(v, names.BMC_POWER),
        inlet_c=_gauge(v, names.BMC_INLET),
        exhaust_c=_gauge(v, names.BMC_EXHAUST),
        fans_present=_int(_gauge(v, names.BMC_FANS)) or 0,
        fans_failed=_int(_gauge(v, names.BMC_FANS_FAILED)) or 0,
        psus_present=_int(_gauge(v, names.BMC_PSUS)) or 0,
        psus_failed=_int(_gauge(v, names.BMC_PSUS_FAILED)) or 0,
        psus_no_input=_int(_gauge(v, names.BMC_PSUS_NO_INPUT)) or 0,
        simulated=simulated,
    )


def _port(place: tuple[str, int], info: Mapping[str, str], found: NodeSeries) -> FabricPort:
    v = found.ports.get(place, {})
    state_id, phys_id = _int(_gauge(v, names.IB_STATE)), _int(_gauge(v, names.IB_PHYSICAL_STATE))
    rate = _gauge(v, names.IB_RATE)
    expected = _gauge(v, names.FABRIC_PORT_EXPECTED_RATE)
    stats = None
    if place in found.netdevs:
        ifname, nv = found.netdevs[place]
        up = "UP" if _flag(nv, names.FABRIC_NETDEV_UP) else "DOWN"
        stats = NetdevStats(ifname, up, _flag(nv, names.FABRIC_NETDEV_CARRIER))
    try:
        role = PortRole(info.get("role", ""))
    except ValueError:
        role = PortRole.COMPUTE
    gbps = None if rate is None else rate / BYTES_PER_S_PER_GBPS
    return FabricPort(
        device=place[0],
        port=place[1],
        # node_exporter's series vanish while the agent cannot read sysfs: unknown, then
        state=_IB_STATES.get(state_id, "UNKNOWN") if state_id is not None else "UNKNOWN",
        state_id=state_id,
        phys_state=_IB_PHYS.get(phys_id, "Unknown") if phys_id is not None else "Unknown",
        phys_state_id=phys_id,
        link_layer=info.get("link_layer", ""),
        role=role,
        role_from=info.get("role_from", ""),
        rate_gbps=gbps,
        rate_text="" if gbps is None else f"{gbps:g} Gb/sec",
        expected_rate_gbps=None if expected is None else expected / BYTES_PER_S_PER_GBPS,
        netdev=info.get("netdev") or None,
        netdev_stats=stats,
    )


def _fabric(found: NodeSeries, at: float, simulated: bool) -> FabricReading | None:
    if not found.port_info:
        return None
    devices: dict[str, list[FabricPort]] = {}
    first: dict[str, Mapping[str, str]] = {}
    for place, info in sorted(found.port_info.items()):
        devices.setdefault(place[0], []).append(_port(place, info, found))
        first.setdefault(place[0], info)
    return FabricReading(
        at=at,
        devices=tuple(
            FabricDevice(
                name,
                pci_bus_id=first[name].get("pci_bus_id") or None,
                numa_node=_int(float(first[name]["numa_node"]))
                if first[name].get("numa_node")
                else None,
                ports=tuple(ports),
            )
            for name, ports in devices.items()
        ),
        peermem_loaded=_flag(found.values, names.FABRIC_PEERMEM),
        simulated=simulated,
    )


class NodeBuilder:
    """One node's overview from its series, built again only as far as they changed: the
    GPU gauges alone (the fleet view's figures, which move every round) redraw its GPUs
    from what the rest of their series made last time."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._found: NodeSeries | None = None
        self._version = -1
        self._drawn = -1
        self._built: NodeSnapshot | None = None
        self._steady: dict[int, dict[str, Any]] = {}
        self._carried: tuple[object, CarriedVerdict] | None = None  # by what made it

    def build(self, found: NodeSeries, at: float) -> NodeSnapshot:
        built = self._built
        if built is None or found is not self._found or found.version != self._version:
            built = self._whole(found, at)
        elif found.drawn != self._drawn:
            built = self._redrawn(built, found, at)
        self._found, self._version, self._drawn, self._built = (
            found,
            found.version,
            found.drawn,
            built,
        )
        return built

    def _gpus(self, found: NodeSeries) -> tuple[GpuReading, ...]:
        steady, gpus = self._steady, found.gpus
        return tuple(
            GpuReading(**fields, **_drawn(gpus.get(index, {})))
            for index, fields in sorted(steady.items())
        )

    def _redrawn(self, built: NodeSnapshot, found: NodeSeries, at: float) -> NodeSnapshot:
        if built.nvml is None:
            return built  # gauges of GPUs the node has no info of: not drawn
        gpus = self._gpus(found)
        nvml = msgspec.structs.replace(built.nvml, at=at, gpus=gpus)
        return msgspec.structs.replace(built, nvml=nvml)

    def _whole(self, found: NodeSeries, at: float) -> NodeSnapshot:
        simulated = bool(_flag(found.values, names.NODE_SIMULATED))
        migs = {g: [_mig(labels) for labels in found.migs.get(g, [])] for g in found.gpu_info}
        self._steady = {
            index: _steady(index, info, found.gpus.get(index, {}), migs[index])
            for index, info in found.gpu_info.items()
        }
        gpus = self._gpus(found)
        xids = {
            g.uuid: code
            for g in gpus
            if (code := _int(_gauge(found.gpus.get(g.index, {}), names.DCGM_XID)))
        }
        nvml = None
        if gpus or "nvml" in found.sources:
            fm = _flag(found.values, names.FABRIC_MANAGER)
            nvml = NvmlReading(
                at, None, None, None, gpus, fabric_manager_running=fm, simulated=simulated
            )
        node = NodeSnapshot(
            node=self.node,
            simulated=simulated,
            nvml=nvml,
            bmc=_bmc(found, at, simulated),
            fabric=_fabric(found, at, simulated),
            statuses=_statuses(self.node, found, at),
            last_xid=xids,
        )
        verdict = self._verdict(found, node)
        return node if verdict is None else msgspec.structs.replace(node, verdict=verdict)

    def _verdict(self, found: NodeSeries, node: NodeSnapshot) -> CarriedVerdict | None:
        """The verdict its agent judged, as Prometheus has it (the same object while it is
        the same); None where its agent exports none (an older one): judged here."""
        rank = _int(_gauge(found.values, names.NODE_VERDICT))
        if rank is None or not 0 <= rank < len(_ACTIONS):
            self._carried = None
            return None
        gpus: dict[str, Action] = {}
        if rank:
            for bus, values in found.verdicts.items():
                judged = _int(_gauge(values, names.GPU_VERDICT))
                if judged is not None and 0 < judged < len(_ACTIONS):
                    gpus[bus] = _ACTIONS[judged]
        severities: dict[str, Severity] = {}
        named: list[tuple[str, int]] = []
        for gpu in node.gpus:
            if gpu.pci_bus_id in gpus:
                named.append((gpu.pci_bus_id, gpu.index))
                severity = _SEVERITIES.get(_int(found.gpus.get(gpu.index, {}).get(_SEVERITY)))
                if severity is not None:
                    severities[gpu.pci_bus_id] = severity
        key = (rank, sorted(gpus.items()), named, sorted(severities.items()))
        if self._carried is None or self._carried[0] != key:
            verdict = actions_verdict(node, _ACTIONS[rank], gpus, severities)
            self._carried = (key, verdict)
        return self._carried[1]


def build_node(node: str, found: NodeSeries, at: float) -> NodeSnapshot:
    """The overview of one node from its series: what the fleet view reads of it."""
    return NodeBuilder(node).build(found, at)


class PrometheusReader:
    """One Prometheus server read for the whole fleet: one round per interval, shared by
    every node's source (the first to ask starts it, the rest wait for it).

    The first round asks for every series, a part at a time. Later rounds ask each time for
    what moves and what a fleet view draws (up, each GPU's gauges, each node's count of
    flagged GPUs and its agent's verdict where not fit, then the health flags that are
    raised of the nodes that count is above 0 for or that lack it, and the GPU verdicts of
    the nodes not fit whose verdict or count moved) and for one part of the rest, the parts in turn: a round then
    carries under a quarter of the series a whole one does, and every series is fresh
    within ten rounds.

    A round asks the GPU gauges of the nodes viewers see (`view`: the rows on their
    screens, the nodes they opened) only, and every node's once each `out_of_view_s`; up,
    the counts of flagged GPUs, their flags and the parts stay the whole fleet's, so a row
    out of view still has its health, its GPUs and figures to sort by. With no viewer (a
    head that only exports or alerts) no node is seen: each node's health every round, its
    GPU gauges every `out_of_view_s`. Figures of the whole fleet a viewer shows (a
    wallboard's hottest GPUs, total power) Prometheus aggregates each round while one
    wants them (`want_figures`).
    """

    def __init__(
        self,
        url: str,
        client: AgentClient,
        *,
        selector: str = "",
        interval_s: float = 1.0,
        timeout_s: float = 3.0,
        monotonic: Callable[[], float] = time.monotonic,
        evaluate_at: Callable[[], float] | None = None,
        out_of_view_s: float = OUT_OF_VIEW_S,
    ) -> None:
        """`evaluate_at`: the time each query asks about (a replay's, a benchmark's);
        None: Prometheus' now."""
        self.url = url.rstrip("/")
        self.evaluate_at = evaluate_at
        self.selector = selector
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.queries = overview_queries(selector)
        plan = round_plan(selector)
        self.every, self.parts, self.whole = plan.every, plan.parts, plan.whole
        self._flagged: frozenset[str] = frozenset()  # the targets the last round asked flags of
        # the last round's marks of each target not fit (FleetSeries.unfit), and the rounds
        # in turn, the first of PARTS asking every such target's GPU verdicts
        self._marks: dict[str, tuple[float | None, ...]] = {}
        self._verdict_turn = -1
        self._series: FleetSeries | None = None  # none until a whole round landed
        self._turn = 0
        self._rested = False  # whether the last round asked no part
        self.rounds = 0  # rounds that landed
        self._client = client
        self._monotonic = monotonic
        self._round: asyncio.Future[Overview] | None = None
        self._began = -math.inf
        self.out_of_view_s = out_of_view_s
        self._seen: dict[tuple[str, str], bool] = {}  # (instance, node) -> a viewer sees it
        self._unseen = 0  # of those, how many no viewer sees
        self._all_drawn_at = -math.inf  # when a round last asked every node's gauges
        self.said = False  # whether a node's source told the event log how it reads
        # viewer -> how many top GPUs it lists, and the figures it shows now
        self._figures_for: dict[int, tuple[int, frozenset[str]]] = {}
        self.figures: FleetFigures | None = None  # the last round's, while a viewer wants them
        self.figures_error: str | None = None  # why the last round has none

    def refresh_words(self) -> str:
        """How often the overview reads what, for the event log."""
        return (
            f"Prometheus overview: every {self.interval_s:g} s each node's health and the "
            f"GPUs of the rows viewers show and the nodes they open; every node's GPUs "
            f"every {self.out_of_view_s:g} s"
        )

    def want_figures(
        self, viewer: object, top: int | None, kinds: Collection[str] = FIGURES
    ) -> None:
        """Which of the whole fleet's figures (FIGURES) `viewer` shows now, of how many GPUs
        its lists hold (`top`; None: it shows none): each round Prometheus aggregates those
        any viewer shows."""
        if top is None or not kinds:
            self._figures_for.pop(id(viewer), None)
        else:
            self._figures_for[id(viewer)] = (top, frozenset(kinds))
        if not self._figures_for:
            self.figures = None

    async def _fleet_figures(self, at: float) -> None:
        top = max((t for t, _ in self._figures_for.values()), default=0)
        kinds = frozenset().union(*(k for _, k in self._figures_for.values()))
        if not top:
            return
        asked = {k: q for k, q in figure_queries(top, self.selector).items() if k in kinds}
        try:
            answered = await asyncio.gather(*(self.query(q) for q in asked.values()))
        except (OSError, ValueError, TimeoutError, aiohttp.ClientError) as error:
            # the figures only: the round's health and gauges stand; the viewer falls back
            # to what the head holds, and says so
            self.figures = None
            self.figures_error = safe_text(str(error))[:200]
            return
        self.figures_error = None
        answers = dict(zip(asked, answered, strict=True))
        members: dict[str, list[str]] = {}
        for instance, node in self._seen:
            members.setdefault(instance, []).append(node)

        def listed(answer: list[Any]) -> tuple[tuple[str, int, float], ...]:
            out = []
            for sample in answer:
                labels = sample.get("metric", {})
                index = _index(labels.get("gpu"))
                name = labels.get("exported_node") or labels.get("Hostname") or labels.get("node")
                served = members.get(labels.get("instance", ""), [])
                node = name if name in served else served[0] if len(served) == 1 else name
                value = _value(sample)
                if index is None or not node or not math.isfinite(value):
                    continue
                out.append((safe_text(str(node)), index, value))
            return tuple(sorted(out, key=lambda g: -g[2]))

        def one(answer: list[Any]) -> float:
            return _value(answer[0]) if answer else 0.0

        if self._figures_for:  # no viewer left while the round was out
            self.figures = FleetFigures(
                at=at,
                hottest=listed(answers["hottest"]) if "hottest" in answers else None,
                power=listed(answers["power"]) if "power" in answers else None,
                watts=one(answers["watts"]) if "watts" in answers else None,
                busy=round(one(answers["busy"])) if "busy" in answers else None,
            )

    def view(self, instance: str, node: str, seen: bool) -> None:
        """Whether a viewer sees the node `node` read at `instance` (in view, opened)."""
        before = self._seen.get((instance, node))
        self._seen[(instance, node)] = seen
        self._unseen += (not seen) - (before is False)

    def seen(self, instance: str, node: str) -> bool:
        return self._seen.get((instance, node), True)

    def _drawn_asks(self) -> tuple[tuple[Ask, ...], frozenset[str] | None, bool]:
        """This round's asks of the GPU gauges, the targets they cover (None: all), and
        whether this is the pass over every node that rows out of view wait for."""
        now = self._monotonic()
        if not self._unseen:
            self._all_drawn_at = now
            return drawn_asks(self.selector), None, False
        if now - self._all_drawn_at >= self.out_of_view_s:
            self._all_drawn_at = now
            return drawn_asks(self.selector), None, True
        shown = frozenset(i for (i, _), seen in self._seen.items() if seen)
        if 2 * len(shown) > len({i for i, _ in self._seen}):
            return drawn_asks(self.selector), None, False  # most of the fleet: cheaper unmatched
        return (drawn_asks(self.selector, shown) if shown else ()), shown, False

    async def overview(self) -> Overview:
        """The latest round, or a new one when the latest is half an interval old."""
        now = self._monotonic()
        if self._round is None or (self._round.done() and now - self._began >= self.interval_s / 2):
            self._began = now
            self._round = asyncio.ensure_future(self._read())
            self._round.add_done_callback(_retrieve)
        # a node's poll that times out must not cancel the round the others wait for
        return await asyncio.shield(self._round)

    async def query(self, promql: str) -> list[Any]:
        """An instant query's vector; errors name Prometheus and what it said."""
        asked = {"query": promql}
        if self.evaluate_at is not None:
            asked["time"] = repr(self.evaluate_at())
        url = f"{self.url}/api/v1/query?{urlencode(asked)}"
        data = await self._client.get_json(
            url, self.timeout_s * 0.9, peer="Prometheus", limit=MAX_ANSWER_BYTES
        )
        if not isinstance(data, dict) or data.get("status") != "success":
            error = data.get("error") if isinstance(data, dict) else None
            raise ValueError(f"Prometheus refused the query: {error or data!r}"[:300])
        result = data.get("data", {})
        if result.get("resultType") != "vector" or not isinstance(result.get("result"), list):
            raise ValueError("Prometheus answered with something other than a vector")
        vector: list[Any] = result["result"]
        return vector

    async def _take(self, series: FleetSeries, asks: Collection[Ask]) -> None:
        """Ask side by side (Prometheus evaluates each on a core of its own) and take each
        answer as it lands, while the others are still being evaluated."""

        async def one(ask: Ask) -> None:
            answer = await self.query(ask.query)
            with _collector_paused():
                if ask.info:
                    series.take_info(answer)
                else:
                    series.take_values(answer, ask.metrics, ask.raised, ask.named, ask.within)

        await asyncio.gather(*(one(ask) for ask in asks))

    async def _health(self, series: FleetSeries) -> None:
        """Each node's count of flagged GPUs and its verdict where not fit, then the flags
        of the nodes that count is above 0 for (or that lack it), where raised, and the GPU
        verdicts of the nodes not fit, where not fit: none of the others' is."""
        counts = [a for a in self.every if a.named == _FLAGGED]
        await self._take(series, [*counts, verdict_ask(self.selector)])
        flagged, marks = series.flagged(), series.unfit()
        scraped = sum(1 for up in series.up.values() if up >= 1)
        if 2 * len(flagged) > scraped:
            asks = flag_asks(self.selector)  # most of the fleet: cheaper unmatched
        else:
            asks = flag_asks(self.selector, flagged, self._flagged)
        self._flagged = flagged
        # the GPU verdicts of the nodes not fit whose verdict or count of flagged GPUs moved
        # since the last round, and of them all every PARTS rounds: a fleet of many such
        # nodes is asked little more than the flags of the nodes in trouble
        unfit = frozenset(marks)
        self._verdict_turn = (self._verdict_turn + 1) % PARTS
        every = self._verdict_turn == 0
        moved = unfit if every else frozenset(i for i in unfit if self._marks.get(i) != marks[i])
        self._marks = marks
        if 2 * len(moved) > scraped:
            asks = (*asks, *gpu_verdict_asks(self.selector))
        elif moved:
            asks = (*asks, *gpu_verdict_asks(self.selector, moved, every=moved == unfit))
        elif not unfit:  # none not fit: no GPU is either
            for metric in _GPU_VERDICTS:
                one = frozenset({metric})
                series.take_values([], one, one, metric)
        await self._take(series, asks)
        asked = {a.named for a in asks}
        for metric in _FLAG_NAMES:
            if metric not in asked:  # none flagged: what was raised is no longer
                one = frozenset({metric})
                series.take_values([], one, one, metric)

    async def _read(self) -> Overview:
        series = self._series
        if series is None:
            # every series once, a few queries at a time: all at once for a large fleet
            # would outlast any timeout (and hold every answer in memory at once)
            series = FleetSeries()
            for at in range(0, len(self.whole), WHOLE_AT_ONCE):
                await self._take(series, self.whole[at : at + WHOLE_AT_ONCE])
            series.settle_totals()
            series.read_whole = {i for i, up in series.up.items() if up >= 1}
            self._series = series
            self._all_drawn_at = self._monotonic()
            await self._fleet_figures(time.time())
            self.rounds += 1
            return series.overview()
        drawn, within, out_of_view = self._drawn_asks()
        part: tuple[Ask, ...] = ()
        # that pass is as heavy as a part: the next round asks it (never two rounds on end)
        self._rested = out_of_view and not self._rested
        if not self._rested:
            part = self.parts[self._turn % len(self.parts)]
            self._turn += 1
        every = (*(a for a in self.every if a.named not in _ASKED_APART), *drawn)
        await asyncio.gather(
            self._take(series, (*every, *part)),
            self._health(series),
            self._fleet_figures(time.time()),
        )
        if any(ask.named == _FREE for ask in part):
            # the total of those whose used was read this round, beside free
            series.settle_totals(within)
        # targets Prometheus began to scrape since: every series of theirs, by instance
        new = series.unheld()[:NEW_PER_ROUND]
        if new:
            values, info = await asyncio.gather(
                *(self.query(q) for q in overview_queries(_instances(new, self.selector)))
            )
            series.take_whole(values, info, new)
        self.rounds += 1
        return series.overview()


def _instances(instances: Collection[str], selector: str) -> str:
    """A selector for the targets at `instances` (within `selector`)."""
    alternatives = "|".join(re.escape(i) for i in instances)
    quoted = alternatives.replace("\\", "\\\\").replace('"', '\\"')
    return f'instance=~"{quoted}"' + (f", {selector.strip()}" if selector.strip() else "")


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic collector held off while an answer is taken (nothing else runs then): a
    large fleet's answer is hundreds of thousands of short-lived, acyclic objects, each
    thousand of which would have the collector walk the young objects, and now and then
    the whole heap (every node's series), again."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _retrieve(future: asyncio.Future[Overview]) -> None:
    if not future.cancelled():
        future.exception()


class PromQLSource:
    """One node's overview, read from Prometheus; its agent when the console drills in."""

    kind: ClassVar[str] = "remote"

    def __init__(
        self,
        node: str,
        instance: str,
        reader: PrometheusReader,
        agent: AgentSource,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.instance = instance
        self.interval_s = reader.interval_s
        self.timeout_s = reader.timeout_s
        self.agent = agent
        self.reader = reader
        self._clock = clock
        self._emit: EmitEvent | None = None
        self._xids: dict[str, int] | None = None
        self._builder = NodeBuilder(node)
        self._reading: AgentReading | None = None  # the last built from the overview
        reader.view(instance, node, False)  # until a viewer says it sees the node

    @property
    def detail(self) -> bool:
        return self.agent.detail

    @detail.setter
    def detail(self, value: bool) -> None:
        self.agent.detail = value

    @property
    def in_view(self) -> bool:
        """Whether a viewer sees this node: its GPU gauges are then asked every round."""
        return self.reader.seen(self.instance, self.node)

    @in_view.setter
    def in_view(self, value: bool) -> None:
        self.reader.view(self.instance, self.node, value)

    async def start(self, emit: EmitEvent) -> None:
        self._emit = emit
        if not self.reader.said:  # once for the fleet, as a demo says its refresh
            self.reader.said = True
            words = self.reader.refresh_words()
            emit(Event(self._clock(), self.node, "remote", "refresh", Severity.INFO, words))
        await self.agent.start(emit)

    async def close(self) -> None:
        await self.agent.close()

    async def poll(self) -> AgentReading:
        if self.detail:
            return await self.agent.poll()
        overview = await self.reader.overview()
        _name, found = overview.pick(self.instance, self.node)
        node = self._builder.build(found, overview.at)
        if self._reading is not None and self._reading.node is node:
            return self._reading  # nothing of it changed: the hub then records no point
        self._post_xids(node)
        self._reading = AgentReading(self._clock(), self.reader.url, node, summary=True)
        return self._reading

    def _post_xids(self, node: NodeSnapshot) -> None:
        """An XID that changed since the last round becomes an event, as the agent's would."""
        seen, self._xids = self._xids, dict(node.last_xid)
        if seen is None or self._emit is None:
            return
        for gpu in node.gpus:
            code = node.last_xid.get(gpu.uuid)
            if code is None or seen.get(gpu.uuid) == code:
                continue
            severity, words = describe_xid(code)
            self._emit(
                Event(
                    at=node.nvml.at if node.nvml is not None else self._clock(),
                    node=self.node,
                    source="nvml",
                    kind="xid",
                    severity=severity,
                    message=f"XID {code} on {gpu_and_bus(gpu.index, gpu.pci_bus_id)}: {words}",
                    gpu_index=gpu.index,
                    gpu_uuid=gpu.uuid or None,
                    code=code,
                    gpu_bus_id=known_bus_id(gpu.pci_bus_id),
                )
            )
