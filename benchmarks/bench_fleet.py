"""The head reading 1,000 agents at 1 Hz: how long a sweep of every node takes, head CPU per
node update, resident memory, what publishing a fleet snapshot costs, and bytes on the wire.

The agents are a child process: 1,000 aiohttp servers on loopback, each serving the
`/api/v1/snapshot?view=summary` of a node of the demo cluster (NVML, BMC, fabric and
tenancy, 6 to 8 GPUs) as `gpuconsole agent` serves it, with its ETag, its gzip when asked
and 304 when the head holds it already. What each serves changes every second: the
demo cluster runs for FRAMES seconds first (NVML every second, fabric every 2 s, BMC and
tenancy every 5 s) and each agent serves those seconds in turn, from its own offset. The
head is a child of its own (its resident memory is a head's alone), with the hub
`gpuconsole console` builds on a head: a AgentSource per agent, one client capped at 64
connections, every node read once a second. Run with
agents that send plain JSON and with agents that gzip (as `gpuconsole agent` does for a
client that asks, as the head does); each both as agents of the previous version (every
part every time, and no verdict: the head judges each node) and as agents that leave out
the parts the head says it holds and send the node's verdict. The wire
figure is what the agents sent, per poll: per node per second at 1 Hz.

Figures are medians over two-second windows of the steady state, after every node has
answered once. Of the head's CPU, decoding is what AgentSource.parse took in it. The child shares the machine, so on a small box the head competes with a
thousand agents' worth of serving; compare figures from one run.

`GPUCONSOLE_BENCH_PROFILE=N` runs each head under cProfile and prints its N costliest
functions (by their own time, then by time inclusive) after the run's figures: the profiler
slows the head, so those runs' figures are not the head's. `--runs` picks runs by label
(`gzip-parts-polled,gzip-parts-watched`), since a whole pass takes about five minutes.

Targets: the head under one core, under 100 ms per fleet update, under 500 MB
resident; the verdicts of every node of each published snapshot (facts.verdict.judge_fleet,
as a console takes each snapshot: the nodes it changed judged, with what the fleet's health
and sort read of them, after which a view finds any node's verdict with a look-up) under 5 %
of that publish's own time (hub.publish(), which merges the nodes that changed): the agents
judge their nodes and send the verdict, the head checks each verdict new since as it judges
the node (how many a publish checked is printed) and shows it. Their share of all the head's
CPU is printed too. A head reading agents of the previous version, which send no verdict,
judges each node it changed from its readings: that share is printed, with no target (the
head's CPU target holds it). The demo's verdicts move as counters climb: a summary sends the words
of its findings afresh every WORDS_HELD_S of the node's time, and the frames span several
of those. For comparison, all-smi documents 256 nodes at a 6 s interval.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from aiohttp import web

from benchmarks.timing import record
from gpuconsole.config import FleetConfig
from gpuconsole.export.agent import Body, accepts_gzip, respond, snapshot_body
from gpuconsole.facts import verdict as verdict_module
from gpuconsole.facts.ownership import node_ownership
from gpuconsole.facts.verdict import WORDS_HELD_S, forget_verdicts, judge_fleet
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.agents import (
    BEAT,
    WATCH_TYPE,
    frame,
    held_parts,
    part_versions,
)
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.readings.verdict import CarriedVerdict
from gpuconsole.sources.agents import AgentSource
from gpuconsole.wiring import fleet_hub

NODES = 1000
SECONDS = 20
# seconds of the demo cluster that every agent serves in turn: several times as long as a
# summary holds the words of its verdict's findings, so that those move as in a real fleet
FRAMES = 3 * round(WORDS_HELD_S)
SWEEP_LIMIT_S = 60.0
WINDOW_S = 2.0  # several of the hub's 0.2 s publishes, so counts do not jitter
CONNECTIONS = 64
CPU_TARGET_CORES = 1.0
UPDATE_TARGET_MS = 100.0
RSS_TARGET_MB = 500.0
WIRE_TARGET_KIB = 10.0
VERDICT_SHARE = 0.05  # the verdicts of every node of a snapshot, of its publish time
LIGHT_TARGET_CORES = 0.35  # a head that any codec could make: decoding alone cannot get there
LIGHT_RSS_MB = 250.0
PAGE = os.sysconf("SC_PAGE_SIZE")
PROFILE_ENV = "GPUCONSOLE_BENCH_PROFILE"  # N: profile each head, print its N costliest calls
# each run: (gzip, parts and verdicts, watched), by its label
RUNS = {
    "json-whole-polled": (False, False, False),
    "json-parts-polled": (False, True, False),
    "gzip-whole-polled": (True, False, False),
    "gzip-parts-polled": (True, True, False),
    "gzip-parts-watched": (True, True, True),
}
T = TypeVar("T")


async def _record(seconds: int) -> list[FleetSnapshot]:
    from gpuconsole.sim.cluster import demo_hub

    hub = demo_hub(start=time.time() - 120, events=False)
    await hub.start()
    try:
        await asyncio.sleep(5.5)  # every source has answered, and twice for rates
        shots = []
        for _ in range(seconds):
            await asyncio.sleep(1.0)
            assert hub.latest is not None
            shots.append(hub.latest)
        return shots
    finally:
        await hub.stop()


Frame = tuple[dict[str, str], dict[str, bytes], bytes]


def _part_frames(shots: list[FleetSnapshot]) -> list[list[Frame]]:
    """For each node of the demo cluster that NVML sees GPUs on, and each second: its parts'
    versions, the body an agent serves a head holding each set of those parts (by the parts
    held, joined with ','), and the body an agent of the previous version serves (every
    part, no versions)."""
    names = [n.node for n in shots[0].nodes if n.gpus]
    out = []
    for name in names:
        frames = []
        for shot in shots:
            node = shot.node(name)
            assert node is not None
            versions = part_versions(node, summary=True)
            subsets = [
                tuple(p for i, p in enumerate(versions) if mask >> i & 1)
                for mask in range(1 << len(versions))
            ]
            bodies = {
                ",".join(held): snapshot_body(
                    shot, name, summary=True, have={p: versions[p] for p in held}
                )
                for held in subsets
            }
            frames.append((versions, bodies, snapshot_body(shot, name, summary=True)))
        out.append(frames)
    return out


def _write_frames(path: Path) -> None:
    """The demo cluster's frames (_part_frames) as JSON text, to `path`."""
    logging.getLogger("gpuconsole").setLevel(logging.ERROR)
    stored = _part_frames(asyncio.run(_record(FRAMES)))
    path.write_text(
        json.dumps(
            [
                [[v, {k: b.decode() for k, b in bodies.items()}, p.decode()] for v, bodies, p in t]
                for t in stored
            ]
        )
    )


# --- the child: a thousand agents ---------------------------------------------------------


def _without_verdicts(body: str) -> str:
    """A body as an agent of the previous version serves it: no verdict, the head judges."""
    document = json.loads(body)
    for node in document["nodes"]:
        node.pop("verdict", None)
    return json.dumps(document, allow_nan=False)


async def _serve_agents(
    frames_file: Path, nodes: int, compress: bool, parts: bool, watch: bool = False
) -> None:
    # per node and second: its parts' versions, its bodies by the parts a head holds,
    # and the body of an agent of the previous version
    frames = [
        [
            (
                versions,
                {held: Body(raw.encode(), f'W/"{n}-{f}"') for held, raw in bodies.items()},
                Body((plain if parts else _without_verdicts(plain)).encode(), f'W/"{n}-{f}"'),
            )
            for f, (versions, bodies, plain) in enumerate(texts)
        ]
        for n, texts in enumerate(json.loads(frames_file.read_text()))
    ]
    for _, bodies, plain in (one for texts in frames for one in texts):
        for body in (*bodies.values(), plain):
            body.packed()  # each agent gzips on its own machine: not this process's work
    index: dict[int, int] = {}
    answers: dict[int, int] = {}
    sent = [0]

    async def stream(request: web.Request, i: int) -> web.StreamResponse:
        # as the agent's watch: a frame each second (the second its frames change, at this
        # agent's own moment in it), parts the head holds on this connection left out
        period = float(request.query["watch"])
        packed = compress and accepts_gzip(request.headers.get("Accept-Encoding", ""))
        held = held_parts(request.query.get("have", "")) if parts else None
        response = web.StreamResponse(headers={"Content-Type": WATCH_TYPE})
        await response.prepare(request)
        texts, last = frames[i % len(frames)], None
        try:
            while True:
                f = (int(time.time()) + i) % len(texts)
                versions, bodies, plain = texts[f]
                out, status = BEAT, 304
                if f != last:
                    body = plain
                    if held is not None:
                        body = bodies[",".join(p for p in versions if held.get(p) == versions[p])]
                        held = dict(versions)
                    out, status, last = (
                        frame(body.packed() if packed else body.raw, packed=packed),
                        200,
                        f,
                    )
                answers[status] = answers.get(status, 0) + 1
                sent[0] += len(out)
                await response.write(out)
                await asyncio.sleep(period - time.time() % period + (i % 1000) / 1000 * period)
        except ConnectionError:
            return response

    async def snapshot(request: web.Request) -> web.StreamResponse:
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        i = index.get(port, 0)
        if watch and "watch" in request.query:
            return await stream(request, i)
        texts = frames[i % len(frames)]
        versions, bodies, plain = texts[(int(time.time()) + i) % len(texts)]
        asked = request.query.get("have")
        body = plain
        if parts and asked is not None:  # as the agent's _snapshot picks what to leave out
            held = held_parts(asked)
            body = bodies[",".join(p for p in versions if held.get(p) == versions[p])]
        if not compress:  # an agent that sends JSON whatever the head takes
            headers = request.headers.copy()
            headers.popall("Accept-Encoding", None)
            request = request.clone(headers=headers)
        response = respond(body, request)
        answers[response.status] = answers.get(response.status, 0) + 1
        sent[0] += len(response.body) if isinstance(response.body, bytes) else 0
        return response

    app = web.Application()
    app.router.add_get("/api/v1/snapshot", snapshot)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ports = []
    for i in range(nodes):
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        index[port] = i
        ports.append(port)
    print(json.dumps(ports), flush=True)
    # serve until the parent closes our stdin, then say how we answered
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print(json.dumps({**answers, -1: sent[0]}), flush=True)  # -1: bytes sent
    await runner.cleanup()


# --- the head ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    sweep_s: float | None  # None: never every node fresh at once
    fresh: int  # nodes fresh at the end
    updates_per_s: float
    cores: float
    cpu_per_update_ms: float
    publish_ms: float
    poll_ms: float
    rss_mb: float
    gc_cores: float  # of `cores`, in the cyclic garbage collector
    # judging every node of each published snapshot, as a console does (a node the publish
    # did not change is remembered), and judging all of them afresh
    verdict_ms: float = float("nan")
    verdict_nodes: float = float("nan")  # nodes a publish changed that were looked at
    rebuilt_nodes: float = float("nan")  # nodes a publish changed
    verdict_cold_ms: float = float("nan")
    verdict_of_head: float = float("nan")  # judging, as a share of all the head's CPU
    verdict_checked: float = float("nan")  # verdicts new since checked in judging, per publish
    verdict_of_publish: float = float("nan")  # median over publishes: verdicts / publish
    unchanged: float = float("nan")  # share of polls the agent answered 304
    # of `cores`, reading agents' JSON into readings (AgentSource.parse) as the head runs
    decode_cores: float = float("nan")
    peak_rss_mb: float = float("nan")  # the head's process, over its run
    wire_kib: float = float("nan")  # bytes the agents sent per poll: per node per second


class _GcClock:
    """Seconds spent in the garbage collector, for as long as it is installed."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
        else:
            self.spent += time.process_time() - self._began


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 1e6


def _landed(hub: Hub) -> tuple[int, int]:
    """(nodes with a fresh reading, readings landed so far) over the whole fleet."""
    fresh = landed = 0
    for node in hub.latest.nodes if hub.latest is not None else ():
        status = node.status("remote")
        if status is not None:
            fresh += status.ok
            landed += status.polls - status.failures
    return fresh, landed


def _timed(
    fn: Callable[[], FleetSnapshot],
    into: list[float],
    judged: list[float],
    changed: list[int],
    built: list[int],
) -> Callable[[], FleetSnapshot]:
    # this thread's CPU: the head decodes in worker threads meanwhile
    def publish() -> FleetSnapshot:
        began = time.thread_time()
        snapshot = fn()
        published = time.thread_time()
        into.append((published - began) * 1000)
        # who owns each GPU is resolved once per change for every consumer (the fleet's
        # counts, the exporter): a console has it before it judges
        for node in snapshot.nodes:
            node_ownership(node)
        resolved = time.thread_time()
        looked = judge_fleet(snapshot)  # as a console takes each snapshot, before any view asks
        judged.append((time.thread_time() - resolved) * 1000)
        changed.append(looked)
        rebuilt = snapshot.rebuilt
        built.append(
            len(rebuilt.positions) + rebuilt.steady.count(1) if rebuilt else len(snapshot.nodes)
        )
        return snapshot

    return publish


def _clocked(parse: Callable[[bytes], T], spent: list[float]) -> Callable[[bytes], T]:
    """`parse`, adding the CPU each call takes to spent[0]."""

    def clocked(body: bytes) -> T:
        began = time.thread_time()
        try:
            return parse(body)
        finally:
            spent[0] += time.thread_time() - began

    return clocked


def _counted(
    check: Callable[[NodeSnapshot, CarriedVerdict], T], calls: list[int]
) -> Callable[[NodeSnapshot, CarriedVerdict], T]:
    """`check` (facts.verdict._carried: a verdict an agent sent, new since, checked as it
    is judged), counting its calls in calls[0]."""

    def counted(node: NodeSnapshot, carried: CarriedVerdict) -> T:
        calls[0] += 1
        return check(node, carried)

    return counted


def _judged_afresh_ms(snapshot: FleetSnapshot) -> float:
    """Every node of a snapshot judged with nothing remembered: the median of 5 rounds."""
    spent = []
    for _ in range(5):
        forget_verdicts()
        for node in snapshot.nodes:
            node_ownership(node)
        began = time.thread_time()
        judge_fleet(snapshot)
        spent.append((time.thread_time() - began) * 1000)
    return statistics.median(spent)


async def _head(ports: list[int], seconds: int) -> Figures:
    agents = tuple(f"n{i:04d}=http://127.0.0.1:{port}" for i, port in enumerate(ports))
    cfg = FleetConfig(agents=agents, interval_s=1.0, timeout_s=5.0, max_connections=CONNECTIONS)
    hub = fleet_hub(cfg, HubSettings(publish_gap_s=0.2, max_backoff_s=5.0))
    publishes: list[float] = []
    judged: list[float] = []
    changed: list[int] = []
    built: list[int] = []
    hub.publish = _timed(hub.publish, publishes, judged, changed, built)  # type: ignore[method-assign]
    # decoding as the head does it, cache misses and all: the codec line's figure is of
    # one node's frames read over and over
    decoding = [0.0]
    for source in hub.sources:
        if isinstance(source, AgentSource):
            source.parse = _clocked(source.parse, decoding)  # type: ignore[method-assign,assignment]
    # a verdict new since is checked as the publish's nodes are judged: counted
    checking = [0]
    verdict_module._carried = _counted(verdict_module._carried, checking)  # type: ignore[assignment]
    began = time.perf_counter()
    collector = _GcClock()
    gc.callbacks.append(collector)
    await hub.start()
    try:
        # a head that cannot keep up never has every node fresh at once: measure it anyway
        while _landed(hub)[0] < len(ports) and time.perf_counter() - began < SWEEP_LIMIT_S:
            await asyncio.sleep(0.05)
        sweep = time.perf_counter() - began if _landed(hub)[0] == len(ports) else None
        publishes.clear()
        judged.clear()
        changed.clear()
        built.clear()
        cores, per_update, rates, rss, collecting, decoded = [], [], [], [], [], []
        _, landed = _landed(hub)
        head_cpu = time.process_time()
        cpu, wall, in_gc = time.process_time(), time.perf_counter(), collector.spent
        in_decoding, in_checked = decoding[0], checking[0]
        for _ in range(max(1, round(seconds / WINDOW_S))):
            await asyncio.sleep(WINDOW_S)
            now_cpu, now_wall = time.process_time(), time.perf_counter()
            _, now_landed = _landed(hub)
            used, spent, moved = now_cpu - cpu, now_wall - wall, now_landed - landed
            cores.append(used / spent)
            rates.append(moved / spent)
            per_update.append(used * 1000 / max(1, moved))
            rss.append(_rss_mb())
            collecting.append((collector.spent - in_gc) / spent)
            decoded.append((decoding[0] - in_decoding) / spent)
            cpu, wall, landed, in_gc = now_cpu, now_wall, now_landed, collector.spent
            in_decoding = decoding[0]
        head_ms = (time.process_time() - head_cpu) * 1000
        of_head = sum(judged) / head_ms if head_ms else float("nan")
        checked = (checking[0] - in_checked) / max(1, len(publishes))
        fresh, _ = _landed(hub)
        polls = [
            s.last_poll_s * 1000
            for n in (hub.latest.nodes if hub.latest is not None else ())
            for s in n.statuses
            if s.source == "remote" and s.last_poll_s is not None
        ]
        cold = _judged_afresh_ms(hub.latest) if hub.latest is not None else float("nan")
    finally:
        gc.callbacks.remove(collector)
        await hub.stop()
    return Figures(
        sweep_s=sweep,
        fresh=fresh,
        updates_per_s=statistics.median(rates),
        cores=statistics.median(cores),
        cpu_per_update_ms=statistics.median(per_update),
        publish_ms=statistics.median(publishes) if publishes else float("nan"),
        poll_ms=statistics.median(polls) if polls else float("nan"),
        rss_mb=statistics.median(rss),
        gc_cores=statistics.median(collecting),
        decode_cores=statistics.median(decoded),
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        verdict_ms=statistics.median(judged) if judged else float("nan"),
        verdict_nodes=statistics.median(changed) if changed else float("nan"),
        rebuilt_nodes=statistics.median(built) if built else float("nan"),
        verdict_cold_ms=cold,
        verdict_of_head=of_head,
        verdict_checked=checked,
        verdict_of_publish=statistics.median(
            v / p for v, p in zip(judged, publishes, strict=False) if p > 0
        )
        if judged
        else float("nan"),
    )


def _profiled(run: Callable[[], T], top: int) -> T:
    """`run` under cProfile; its `top` costliest functions, by their own time and then by
    time inclusive, printed to stderr, and the whole profile written to a file it names
    (for pstats' callers and callees)."""
    import cProfile
    import pstats

    # its default clock, the wall's: a CPU clock is a system call per function entered,
    # which slows the head to a tenth. Waiting for the agents shows as the loop's select.
    profile = cProfile.Profile()
    try:
        return profile.runcall(run)
    finally:
        kept = Path(tempfile.gettempdir()) / f"bench_fleet-head-{os.getpid()}.prof"
        profile.dump_stats(kept)
        print(f"  the head's profile: {kept}", file=sys.stderr)
        stats = pstats.Stats(profile, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)


def _run(
    frames_file: Path, nodes: int, seconds: int, compress: bool, parts: bool, watch: bool
) -> Figures:
    command = [sys.executable, "-m", "benchmarks.bench_fleet", "--serve", str(frames_file)]
    command += ["--nodes", str(nodes)] + (["--gzip"] if compress else [])
    command += ([] if parts else ["--whole"]) + (["--watch"] if watch else [])
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    try:
        ports = child.stdout.readline()
        # the head in a process of its own: its resident memory is a head's alone, not what
        # this process read before (the frames, the codec's timing, the runs before it)
        head = [sys.executable, "-m", "benchmarks.bench_fleet", "--head", "-"]
        head += ["--seconds", str(seconds)]
        measured = subprocess.run(head, input=ports, capture_output=True, text=True, check=True)
        if os.environ.get(PROFILE_ENV):
            print(measured.stderr, end="")
        figures = Figures(**json.loads(measured.stdout.splitlines()[-1]))
        child.stdin.close()
        answers = {int(k): v for k, v in json.loads(child.stdout.readline() or "{}").items()}
        sent = answers.pop(-1, 0)
        if answers:
            polls = sum(answers.values())
            figures = dataclasses.replace(
                figures, unchanged=answers.get(304, 0) / polls, wire_kib=sent / polls / 1024
            )
        return figures
    finally:
        if not child.stdin.closed:
            child.stdin.close()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _codec_ms(frames: list[list[bytes]]) -> tuple[float, float]:
    """CPU per node update, in ms, of reading an agent's summary (JSON to a NodeSnapshot):
    as the head reads it (AgentSource.parse, parts sent unchanged reused), and the whole
    document (codec.loads)."""
    from gpuconsole.codec import loads
    from gpuconsole.sources.agents import AgentClient

    def timed(read: Callable[[int, bytes], object]) -> float:
        spent = []
        for _ in range(5):
            began = time.process_time()
            for i, texts in enumerate(frames):
                for body in texts:
                    read(i, body)
            spent.append((time.process_time() - began) * 1000 / sum(map(len, frames)))
        return statistics.median(spent)

    client = AgentClient()
    sources = [AgentSource(f"n{i}", "http://127.0.0.1:1", client) for i in range(len(frames))]
    head = timed(lambda i, body: sources[i].parse(body))
    whole = timed(lambda i, body: loads(body))
    return head, whole


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def main(nodes: int = NODES, seconds: int = SECONDS, runs: tuple[str, ...] = tuple(RUNS)) -> None:
    # a head that falls behind logs every stale node; the figures say it once
    logging.getLogger("gpuconsole").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as folder:
        # the demo cluster runs in a child of its own: the head's process holds the head
        frames_file = Path(folder) / "frames.json"
        command = [sys.executable, "-m", "benchmarks.bench_fleet", "--record", str(frames_file)]
        subprocess.run(command, check=True)
        frames = [
            [plain.encode() for _, _, plain in texts]
            for texts in json.loads(frames_file.read_text())
        ]
        bodies = [Body(b, "") for texts in frames for b in texts]
        raw = statistics.median(len(b.raw) for b in bodies)
        packed = statistics.median(len(b.packed()) for b in bodies)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"Head reading {nodes:,} agents at 1 Hz ({CONNECTIONS} connections, summaries "
            f"that change every second; {os.cpu_count()} CPUs, load {load})"
        )
        print(
            f"  summary per node: median {raw / 1024:.1f} KiB JSON, {packed / 1024:.1f} KiB "
            f"gzip; {nodes:,} nodes at 1 Hz: {raw * nodes / 1e6:.0f} MB/s, gzip "
            f"{packed * nodes / 1e6:.1f} MB/s"
        )
        head_ms, whole_ms = _codec_ms(frames)
        print(
            f"  codec per node update: as the head reads {head_ms:.3f} ms, the whole document "
            f"{whole_ms:.3f} ms; {nodes:,} nodes at 1 Hz: {head_ms * nodes / 1000:.2f} cores"
        )
        del frames, bodies
        gc.collect()
        peaks: list[float] = []
        # agents that do not stream answer the head's watch as a poll: it polls them
        for compress, parts, watch in (RUNS[run] for run in runs):
            f = _run(frames_file, nodes, seconds, compress, parts, watch)
            peaks.append(f.peak_rss_mb)
            label = ("gzip" if compress else "json") + (
                ", parts" if parts else ", whole, judged here"
            )
            label += ", watched" if watch else ", polled"
            label += f"; load {os.getloadavg()[0]:.1f}"
            sweep = (
                f"{f.sweep_s:.2f} s"
                if f.sweep_s is not None
                else f"not within {SWEEP_LIMIT_S:g} s ({f.fresh} of {nodes} fresh at the end)"
            )
            print(
                f"  [{label}] first sweep of every node {sweep}; steady "
                f"{f.updates_per_s:.0f} updates/s, poll {f.poll_ms:.0f} ms wall; head CPU "
                f"{f.cores:.2f} cores ({f.gc_cores:.2f} in GC), {f.cpu_per_update_ms:.2f} ms "
                f"per node update; publish {f.publish_ms:.1f} ms; RSS {f.rss_mb:.0f} MB; "
                f"{f.unchanged:.0%} of polls answered 304; {f.wire_kib:.1f} KiB per node per "
                f"second on the wire, under {WIRE_TARGET_KIB:g}: {_verdict(f.wire_kib <= WIRE_TARGET_KIB)}"
            )
            # a head that falls behind uses less CPU than 1 Hz would take: judge what 1 Hz
            # costs at the CPU each update took
            at_1hz = f.cpu_per_update_ms * nodes / 1000
            print(
                f"         CPU at 1 Hz {at_1hz:.2f} cores, under {CPU_TARGET_CORES:g}: "
                f"{_verdict(at_1hz < CPU_TARGET_CORES)}"
                f"; keeps 1 Hz: {_verdict(f.updates_per_s >= 0.95 * nodes)}"
                f"; publish under {UPDATE_TARGET_MS:g} ms: "
                f"{_verdict(f.publish_ms < UPDATE_TARGET_MS)}"
                f"; RSS under {RSS_TARGET_MB:g} MB: {_verdict(f.rss_mb < RSS_TARGET_MB)}"
            )
            print(
                f"         verdicts of every node per publish {f.verdict_ms:.2f} ms (the "
                f"{f.rebuilt_nodes:.0f} nodes it changed judged, {f.verdict_nodes:.0f} looked at, "
                f"{f.verdict_checked:.1f} verdicts new since checked), "
                f"{f.verdict_of_publish:.1%} of the publish's time ({f.publish_ms:.1f} ms), "
                f"under {VERDICT_SHARE:.0%}: "
                # agents of the previous version send no verdict: the head judges each node
                # it changed from its readings, which the target is not about
                f"{_verdict(f.verdict_of_publish <= VERDICT_SHARE) if parts else 'no target'}; "
                f"{f.verdict_of_head:.1%} of the head's CPU (decode, merge, publish); all "
                f"{nodes:,} judged afresh {f.verdict_cold_ms:.1f} ms"
            )
            if compress and parts and not watch:  # the same agents, polled: as before the watch
                record(f"head at {nodes:,} agents polled: CPU at 1 Hz", at_1hz, "cores")
                record(f"head at {nodes:,} agents polled: RSS", f.rss_mb, "MB")
            if compress and parts and watch:  # how a head and `gpuconsole agent` talk
                record(f"head at {nodes:,} agents: CPU at 1 Hz", at_1hz, "cores",
                       at_most=LIGHT_TARGET_CORES)  # fmt: skip
                record(f"head at {nodes:,} agents: RSS", f.rss_mb, "MB", at_most=LIGHT_RSS_MB)
                record(f"head at {nodes:,} agents: publish", f.publish_ms, "ms",
                       at_most=UPDATE_TARGET_MS)  # fmt: skip
                record("wire per node per second", f.wire_kib, "KiB", at_most=WIRE_TARGET_KIB)
                record(f"head at {nodes:,} agents: verdicts of publish time",
                       f.verdict_of_publish * 100, "%", at_most=VERDICT_SHARE * 100)  # fmt: skip
            # what the head would take were decoding free: its CPU less what decoding took
            # in it (at 1 Hz, as the CPU figure above)
            decoding = f.decode_cores / f.cores * at_1hz if f.cores else float("nan")
            print(
                f"         under {LIGHT_TARGET_CORES:g} cores: "
                f"{_verdict(at_1hz <= LIGHT_TARGET_CORES)}; RSS under {LIGHT_RSS_MB:g} MB: "
                f"{_verdict(f.rss_mb <= LIGHT_RSS_MB)}; of the CPU, decoding {decoding:.2f} "
                f"cores (AgentSource.parse), all else {at_1hz - decoding:.2f}"
            )
            if compress and parts and watch:
                record(f"head at {nodes:,} agents: CPU apart from decoding",
                       at_1hz - decoding, "cores")  # fmt: skip
    print(f"  peak RSS of a head over every run: {max(peaks):.0f} MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", metavar="FILE", help="serve the frames in FILE (the child)")
    parser.add_argument("--record", metavar="FILE", help="write the frames to FILE (a child)")
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--seconds", type=int, default=SECONDS)
    parser.add_argument("--gzip", action="store_true", help="the child sends gzip")
    parser.add_argument(
        "--whole",
        action="store_true",
        help="the child sends every part and no verdict, as agents did before",
    )
    parser.add_argument("--watch", action="store_true", help="the child streams a watch")
    parser.add_argument(
        "--runs",
        default=",".join(RUNS),
        help=f"the runs to make, by label, comma-separated (default: all: {','.join(RUNS)})",
    )
    parser.add_argument(
        "--head", metavar="-", help="be the head (a child): read the agents' ports on stdin"
    )
    args = parser.parse_args()
    if args.record:
        _write_frames(Path(args.record))
    elif args.head:
        logging.getLogger("gpuconsole").setLevel(logging.ERROR)
        ports = json.loads(sys.stdin.readline())
        profiled = int(os.environ.get(PROFILE_ENV) or 0)
        if profiled:
            read = _profiled(lambda: asyncio.run(_head(ports, args.seconds)), profiled)
        else:
            read = asyncio.run(_head(ports, args.seconds))
        print(json.dumps(dataclasses.asdict(read)))
    elif args.serve:
        asyncio.run(
            _serve_agents(Path(args.serve), args.nodes, args.gzip, not args.whole, args.watch)
        )
    else:
        picked = tuple(r for r in args.runs.split(",") if r)
        unknown = [r for r in picked if r not in RUNS]
        if unknown:
            parser.error(f"no run {', '.join(unknown)}; runs: {', '.join(RUNS)}")
        main(args.nodes, args.seconds, picked)
