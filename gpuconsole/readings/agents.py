"""A node read through its agent: the agent's own NodeSnapshot, as it sent it."""

from __future__ import annotations

import hashlib
import itertools
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from gpuconsole.readings.base import CounterSample, Key
from gpuconsole.readings.bmc import BmcReading, SensorHealth
from gpuconsole.readings.fabric import (
    CONGESTION_RULES,
    ERROR_RULES,
    FabricPort,
    FabricReading,
    NetdevStats,
)
from gpuconsole.readings.nvml import GpmMetrics, GpuReading
from gpuconsole.readings.snapshot import NodeSnapshot

# The NodeSnapshot fields a remote node supplies in place of local sources.
REMOTE_PARTS = ("nvml", "bmc", "fabric", "tenancy")

# Parts of a node whose sources poll less often than a head reads: a head says which of
# them it holds (`?have=bmc:VERSION,...`) and its agent leaves those out while current,
# saying when each was read last (`kept_at`).
STEADY_PARTS = ("bmc", "fabric", "tenancy")
_VERSION_CHARS = 40


# Salted per process: an agent that restarts has every part sent whole once.
_VERSION_SALT = secrets.token_bytes(8)
_ENCODER = msgspec.msgpack.Encoder()
# (node, part, summary) -> (its latest reading, that reading's version): a part stands
# for seconds, rendered for every head that reads it. Only the latest reading of each is
# held, which the node's snapshot holds anyway.
_PART_VERSIONS: dict[tuple[str, str, bool], tuple[object, str]] = {}
_MOST_PART_VERSIONS = 3 * 2 * 4096  # parts, views, nodes


def part_version(reading: BmcReading | FabricReading | object) -> str:
    """A part's version: a digest of what it says, whenever it was read (`at` aside). A
    source that re-reads every few seconds mostly finds what it found before; a head that
    holds it then gets only its new time (`kept_at`), never a reading that changed."""
    said = reading
    if isinstance(reading, msgspec.Struct) and hasattr(reading, "at"):
        said = msgspec.structs.replace(reading, at=0.0)
    try:
        data = _ENCODER.encode(said)
    except TypeError:  # a field msgpack cannot hold: its repr says as much
        data = repr(said).encode()
    return hashlib.blake2b(data, digest_size=12, key=_VERSION_SALT).hexdigest()


def part_versions(node: NodeSnapshot, *, summary: bool) -> dict[str, str]:
    """The version of each steady part of `node` as it is served: summarized for the fleet
    view (`summarize`), whole otherwise."""
    versions = {}
    for part in STEADY_PARTS:
        reading = getattr(node, part)
        if reading is None:
            continue
        key = (node.node, part, summary)
        found = _PART_VERSIONS.get(key)
        if found is None or found[0] is not reading:
            if len(_PART_VERSIONS) >= _MOST_PART_VERSIONS:
                _PART_VERSIONS.clear()
            served = _SUMMARIES.get(part, _same)(reading) if summary else reading
            found = _PART_VERSIONS[key] = (reading, part_version(served))
        versions[part] = found[1]
    return versions


def held_parts(text: str) -> dict[str, str]:
    """`bmc:V,fabric:V` (a head's `have`) to {part: version}; anything else is left out."""
    held = {}
    for item in text.split(",")[: len(STEADY_PARTS)]:
        part, sep, version = item.partition(":")
        if sep and part in STEADY_PARTS and 0 < len(version) <= _VERSION_CHARS:
            held[part] = version
    return held


def have_query(held: dict[str, str]) -> str:
    """{part: version} as a head sends it in `have`."""
    return ",".join(f"{part}:{version}" for part, version in held.items())


# A watch: a head asks `?watch=SECONDS` and an agent that streams answers with this type,
# then writes a frame each time what it serves changes (at most once in SECONDS, and a beat
# at least every 1.5 x SECONDS while nothing does), as a Kubernetes watch streams its
# objects. A frame is a header line, `json LENGTH` or `gzip LENGTH`, then LENGTH bytes: the
# summary, with the parts logic of a poll (the agent remembers what it sent on this
# connection). LENGTH 0 is a beat: what was sent last still stands. An agent that does not
# stream answers the same request as a poll.
WATCH_TYPE = "application/x-gpuconsole-frames"
FRAME_HEADER_MAX = 32  # bytes of a header line, its newline included
WATCH_MIN_S = 0.1
WATCH_MAX_S = 60.0
BEAT = b"json 0\n"


def frame(payload: bytes, *, packed: bool) -> bytes:
    """One frame of a watch: `payload` (gzip when `packed`) behind its header."""
    return b"%s %d\n%s" % (b"gzip" if packed else b"json", len(payload), payload)


# Port counters whose movement the fleet's views judge (fabric problems on the wallboard).
_JUDGED = frozenset(r.counter.removeprefix("netdev.") for r in ERROR_RULES) | frozenset(
    r.counter for r in CONGESTION_RULES
)


class AgentReading(msgspec.Struct, frozen=True):
    """What the agent source returns: the node as its agent (or Prometheus) sees it.

    Rates come computed by the agent (it saw every counter); the head only keeps history.
    """

    at: float
    url: str
    node: NodeSnapshot
    summary: bool = False  # the fleet-view summary, not every detail

    def counters(self) -> Iterator[CounterSample]:
        return iter(())

    def series(self) -> Iterator[tuple[Key, float]]:
        # chained in C: a head records a thousand nodes' fifty series a second
        node = self.node
        parts = (node.nvml, node.bmc, node.fabric, node.tenancy)
        return itertools.chain.from_iterable([p.series() for p in parts if p is not None])


def _summary_gpu(gpu: GpuReading) -> GpuReading:
    # The fleet view colours a GPU by GPM's SM activity only where NVML has no utilization.
    gpm = None
    if gpu.gpm is not None and gpu.gpm.sm_util_pct is not None:
        gpm = GpmMetrics(sm_util_pct=gpu.gpm.sm_util_pct)
    return msgspec.structs.replace(
        gpu,
        nvlinks=(),
        unsupported=(),
        gpm=gpm,
        mig_instances=tuple(msgspec.structs.replace(m, gpm=None) for m in gpu.mig_instances),
    )


def _summary_bmc(bmc: BmcReading) -> BmcReading:
    # Sensors that are not nominal keep the BMC's health what it is; the newest SEL record
    # is what a panel shows.
    return msgspec.structs.replace(
        bmc,
        sensors=tuple(s for s in bmc.sensors if s.health is not SensorHealth.OK),
        sel_recent=bmc.sel_recent[-1:],
    )


def _summary_port(port: FabricPort) -> FabricPort:
    stats = port.netdev_stats
    if stats is not None:  # its state, not its counters
        stats = NetdevStats(stats.ifname, stats.operstate, stats.carrier, stats.mtu)
    return msgspec.structs.replace(
        port, counters=(), hw_counters=(), counters_ext=(), netdev_stats=stats
    )


def _summary_fabric(fabric: FabricReading) -> FabricReading:
    devices = tuple(
        msgspec.structs.replace(d, ports=tuple(_summary_port(p) for p in d.ports), levels=())
        for d in fabric.devices
    )
    return msgspec.structs.replace(fabric, devices=devices, gpus=())


def _same(reading: object) -> object:
    return reading


_SUMMARIES: dict[str, Callable[[Any], object]] = {"bmc": _summary_bmc, "fabric": _summary_fabric}


def _judged(key: Key) -> bool:
    return key[0] == "fabric" and key[-1] in _JUDGED


def summarize(node: NodeSnapshot) -> NodeSnapshot:
    """What the fleet view and the wallboard read of a node, small for a thousand nodes.

    Kept: every GPU's gauges, ECC, PCIe link, MIG layout and processes (who uses it);
    the BMC's totals and any sensor that is not nominal; every port's state without its
    counters; the rates and deltas of error counters that moved; tenancy, which decides
    owners. Left out for the drill-down, which asks the agent for everything: NVLink
    readings, GPM pipes, the topology matrix, nominal sensors, raw counters, GPU-NIC
    affinity and NIC-NIC levels.
    """
    nvml = node.nvml
    if nvml is not None:
        nvml = msgspec.structs.replace(
            nvml, gpus=tuple(_summary_gpu(g) for g in nvml.gpus), gpu_topology=()
        )
    bmc = _summary_bmc(node.bmc) if node.bmc is not None else None
    fabric = _summary_fabric(node.fabric) if node.fabric is not None else None
    deltas = {k: v for k, v in node.deltas.items() if v and _judged(k)}
    rates = {k: v for k, v in node.rates.items() if _judged(k) and (v or k in deltas)}
    return msgspec.structs.replace(
        node, nvml=nvml, bmc=bmc, fabric=fabric, rates=rates, deltas=deltas, history=None
    )
