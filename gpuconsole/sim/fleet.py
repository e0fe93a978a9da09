"""A large simulated fleet, simulated where a head meets a real one: as its agents' summaries.

Each node of the fleet is an AgentSource, as on a head reading a thousand agents, with a
client that answers from here instead of over HTTP: the node's summary body (the JSON an
agent serves at /api/v1/snapshot?view=summary), rendered from one fully simulated node of
its profile with the node's own name, GPU identities, clock and moving gauges. The head
decodes, merges and draws those bodies with its own code. Only a node a viewer opens
(Hub.focus) is simulated in full, as a head reads every detail of a focused node's agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import math
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
from yarl import URL

from gpuconsole.codec import dumps, snapshot_json
from gpuconsole.facts.verdict import carry_verdict
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.agents import summarize
from gpuconsole.readings.base import Event, Severity
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sim.cluster import SimNodeSpec, demo_hub
from gpuconsole.sim.identity import gpu_serial, gpu_uuid, mig_uuid
from gpuconsole.sim.node import Scenario
from gpuconsole.sim.plans import plan_for
from gpuconsole.sim.profiles import get_profile
from gpuconsole.sources.agents import (
    MAX_BODY_BYTES,
    AgentClient,
    AgentSource,
    Answer,
    quiet_collector,
)
from gpuconsole.sources.base import EmitEvent

# The templates' clock: far from any real time, so that their timestamps are told apart
# from every other number and moved to the node's own clock when a body is rendered.
_BASE = 4_000_000_000.0
_NEAR_BASE = 10_000_000.0
# The templates are read this long after their simulation starts, as a head meets nodes
# that have been running: a node's instants (a process's start, a guest's since, a SEL
# record) lie this far further back from the reading than from the simulation's start.
_LEAD_S = 120.0
# The times in a body that say when it was read: they move with each rendering. Every other
# time is an instant of the node's own (a start, a since, a record's time), fixed once.
_READ_TIMES = frozenset({"at", "last_ok_at"})
# The GPU gauges that move from one second to the next, and how far around the template's.
_GAUGES: dict[str, tuple[float, float, float]] = {  # field: (swing, lowest, highest)
    "util_gpu_pct": (0.25, 1.0, 100.0),
    "util_mem_pct": (0.25, 0.0, 100.0),
    "power_w": (0.15, 0.0, 1.0e4),
    "temp_gpu_c": (0.06, 20.0, 95.0),
    "temp_hbm_c": (0.06, 20.0, 105.0),
}
_WAVE = tuple(math.sin(2 * math.pi * k / 60) for k in range(60))
# Nodes simulated in full at once: those open in some console, and a few just left.
DETAILED_NODES = 4
# How often a node simulated in full publishes at most (a console's hub: 0.2 s)
DETAIL_PUBLISH_GAP_S = 0.02
# The pipe its bodies come back over: room for a whole body
PIPE_BYTES = 1 << 20
# How long the first answers may wait for the templates on a busy machine.
FIRST_ANSWER_S = 10.0
# Nodes a head refreshes each second in the simulated fleet; a larger one refreshes slower.
UPDATES_PER_S = 1000
# A fleet larger than UPDATES_PER_S has its agents start this many at a time, each batch
# this long after the one before (or once the head's loop is free again), so that its rows
# are drawn as they arrive; a smaller one starts at once.
START_BATCH = 500
START_GAP_S = 0.1


def refresh_s(nodes: int, interval_s: float = 1.0) -> float:
    """How often each node of a simulated fleet of `nodes` is read: `interval_s`, or slower
    where the fleet would need more than UPDATES_PER_S reads a second."""
    return max(interval_s, nodes / UPDATES_PER_S)


@dataclass(frozen=True, slots=True)
class _Slot:
    """A place in a template body that each rendering fills: a time, a gauge or a name."""

    # "time" (offset from the body's clock), "instant" (offset from the simulation's start),
    # "gauge", "memory" (a GPU's memory in use) or "name" (per node)
    kind: str
    offset: float = 0.0
    field: str = ""
    gpu: int = 0
    value: float = 0.0
    name: str = ""


class _Template:
    """A node's summary body as text with slots, rendered for any node of its profile."""

    def __init__(self, data: dict[str, Any], names: Sequence[str]) -> None:
        slots: list[_Slot] = []

        def mark(slot: _Slot) -> str:
            slots.append(slot)
            return f"@@{len(slots) - 1}@@"

        node = data["nodes"][0]
        gpus = (node.get("nvml") or {}).get("gpus") or []
        for position, gpu in enumerate(gpus):
            for key in _GAUGES:
                value = gpu.get(key)
                if isinstance(value, int | float) and value > 0:
                    gpu[key] = mark(_Slot("gauge", field=key, gpu=position, value=float(value)))
            used = gpu.get("mem_used_bytes")
            if isinstance(used, int) and used > 0:
                gpu["mem_used_bytes"] = mark(_Slot("memory", gpu=position, value=float(used)))

        def timestamps(value: Any, key: str = "", record: bool = False) -> Any:
            if isinstance(value, float) and abs(value - _BASE) < _NEAR_BASE:
                read = key in _READ_TIMES and not record
                return mark(_Slot("time" if read else "instant", offset=value - _BASE))
            if isinstance(value, dict):
                return {k: timestamps(v, k, record) for k, v in value.items()}
            if isinstance(value, list):  # a SEL record's "at" is when it happened
                return [timestamps(v, key, record or key == "sel_recent") for v in value]
            return value

        text = json.dumps(timestamps(data), separators=(",", ":"), allow_nan=False)
        present = sorted((n for n in set(names) if n and n in text), key=len, reverse=True)
        self.present = frozenset(present)
        alternatives = [r'"@@(\d+)@@"'] + [f"({'|'.join(re.escape(n) for n in present)})"] * bool(
            present
        )
        pieces = re.split("|".join(alternatives), text)
        step = 1 + len(alternatives)
        self.literals: list[str] = pieces[::step]
        self.holes: list[_Slot] = []
        for i in range(1, len(pieces), step):
            number, name = pieces[i], pieces[i + 1] if present else None
            self.holes.append(
                slots[int(number)] if number is not None else _Slot("name", name=name or "")
            )
        self.gpus = len(gpus)

    def render(self, names: dict[str, str], now: float, phase: int, started: float) -> bytes:
        """The body for the node whose identities `names` maps from the template's, at `now`,
        its gauges moved along the node's own `phase`, its instants those of a node simulated
        from `started` (as the node is when a viewer opens it), none after `now`."""
        second = int(now)
        out = [self.literals[0]]
        for hole, literal in zip(self.holes, self.literals[1:], strict=True):
            if hole.kind == "time":
                out.append(f"{now + hole.offset:.3f}")
            elif hole.kind == "instant":
                # what the template's sources first saw as they read it (a driver bound, an
                # allocation) a head first sees as it starts
                at = started if hole.offset >= 0 else started + _LEAD_S + hole.offset
                out.append(f"{min(now, at):.3f}")
            elif hole.kind == "memory":  # each node's jobs hold their own share, steadily
                out.append(
                    str(int(hole.value * (0.85 + 0.15 * _WAVE[(7 * phase + 13 * hole.gpu) % 60])))
                )
            elif hole.kind == "gauge":
                swing, low, high = _GAUGES[hole.field]
                wave = _WAVE[(second + phase + 7 * hole.gpu) % 60]
                value = min(high, max(low, hole.value * (1 + swing * wave)))
                out.append(f"{value:.1f}")
            else:
                out.append(names.get(hole.name, hole.name))
            out.append(literal)
        return "".join(out).encode()


_Identity = tuple[str, int, int]  # what names a node: ("name"|"uuid"|"serial"|"mig", GPU, slot)


def _identities(gpus: int) -> list[_Identity]:
    """Everything in a node's body that names it: its name, and its GPUs' UUIDs, serials and
    MIG devices' UUIDs (the same GPU index of another node is another GPU)."""
    found: list[_Identity] = [("name", 0, 0)]
    for index in range(gpus):
        found += [("uuid", index, 0), ("serial", index, 0)]
        found += [("mig", index, slot) for slot in range(7)]
    return found


def _identity(which: _Identity, name: str, seed: int) -> str:
    """That identity of the node `name`."""
    kind, index, slot = which
    if kind == "name":
        return name
    if kind == "uuid":
        return gpu_uuid(name, seed, index)
    if kind == "serial":
        return gpu_serial(name, seed, index)
    return mig_uuid(name, seed, index, slot)


def _template_spec(specs: Sequence[SimNodeSpec], profile: str) -> SimNodeSpec:
    """The node a profile's template is simulated as: one whose GPUs the host's NVML sees
    (not passed through to a guest), without a scenario, so that the fleet looks calm."""
    described = get_profile(profile)
    for spec in specs:
        if spec.profile == profile and not plan_for(spec.name, described).vfio_gpus:
            return SimNodeSpec(spec.name, profile)
    return SimNodeSpec(f"{profile}-template", profile)


class FleetSim:
    """A simulated fleet's bodies: every node's summary from its profile's template, and
    the full snapshot of a node simulated in full while a viewer has it open."""

    def __init__(
        self,
        specs: Sequence[SimNodeSpec],
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.specs = {s.name: s for s in specs}
        self.seed = seed
        self.clock = clock
        self.started = clock()
        self._order = {name: i for i, name in enumerate(self.specs)}
        self._phase = {name: (i * 13) % 60 for i, name in enumerate(self.specs)}
        # per profile: the template, and the identities it shows with how each is made
        self._templates: dict[str, tuple[_Template, list[tuple[str, _Identity]]]] = {}
        self._names: dict[str, dict[str, str]] = {}  # per node: the template's names -> its own
        self._preparing: asyncio.Task[None] | None = None
        self._worker: asyncio.Future[asyncio.subprocess.Process] | None = None
        self._asking = asyncio.Lock()
        self._answering: dict[str, asyncio.Future[tuple[int, bytes]]] = {}
        self._batches: list[asyncio.Future[None]] = []
        self._releasing: asyncio.Task[None] | None = None

    async def prepare(self) -> None:
        """Simulate one node of each profile once, for the templates (once, however many
        nodes ask)."""
        if self._preparing is None:
            self._preparing = asyncio.ensure_future(self._prepare())
        await asyncio.shield(self._preparing)

    async def _prepare(self) -> None:
        profiles = sorted({s.profile for s in self.specs.values()})
        chosen = [_template_spec(list(self.specs.values()), p) for p in profiles]
        now = [_BASE]
        hub = demo_hub(
            specs=chosen, seed=self.seed, clock=lambda: now[0], start=_BASE - _LEAD_S, events=False
        )
        shot = await hub.poll_once()
        for spec in chosen:
            found = shot.node(spec.name)
            assert found is not None
            # with its verdict, as an agent sends it
            body = FleetSnapshot(shot.seq, shot.at, (summarize(carry_verdict(found)),), (), ())
            which = _identities(len(get_profile(spec.profile).gpus))
            names = [_identity(w, spec.name, self.seed) for w in which]
            template = _Template(snapshot_json(body, sparse=True), names)
            # each node then hashes only the identities its body shows (no MIG UUIDs where
            # the template has no MIG device): a thousand nodes' first answers wait on them
            shown = [(n, w) for n, w in zip(names, which, strict=True) if n in template.present]
            self._templates[spec.profile] = (template, shown)

    async def start_turn(self, node: str) -> None:
        """Wait until `node`'s agent is up: in a fleet past UPDATES_PER_S, the first
        START_BATCH nodes at once and the rest a batch at a time after the templates, as a
        fleet that comes up over a few seconds. All at once, a head handles ten thousand
        first answers before it draws any."""
        batch = self._order[node] // START_BATCH
        if batch == 0 or len(self._order) <= UPDATES_PER_S:
            return
        if self._releasing is None:
            loop = asyncio.get_running_loop()
            count = (len(self._order) - 1) // START_BATCH
            self._batches = [loop.create_future() for _ in range(count)]
            self._releasing = asyncio.ensure_future(self._release())
            self._releasing.add_done_callback(_retrieve)
        await asyncio.shield(self._batches[batch - 1])

    async def _release(self) -> None:
        await self.prepare()
        for batch in self._batches:
            # a timer, not a loop turn: the batch before has been handled and drawn first
            await asyncio.sleep(START_GAP_S)
            if not batch.done():
                batch.set_result(None)

    def phase(self, node: str) -> float:
        """Where in each second (0 to 1) `node` answers, spread evenly over the fleet."""
        return self._order[node] / len(self._order)

    def summary(self, node: str, now: float) -> bytes:
        """The summary body `node`'s agent would serve at `now` (after prepare())."""
        spec = self.specs[node]
        template, shown = self._templates[spec.profile]
        own = self._names.get(node)
        if own is None:  # hashed once per node, not once a second
            own = self._names[node] = {n: _identity(w, node, self.seed) for n, w in shown}
        return template.render(own, now, self._phase[node], self.started)

    def warm(self) -> None:
        """Start the process that simulates opened nodes in full, before one is opened."""
        if self._worker is None:
            self._worker = asyncio.ensure_future(self._start_worker())
            self._worker.add_done_callback(_retrieve)

    async def _start_worker(self) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuconsole.sim.fleet",
            str(self.seed),
            repr(self.started),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,  # a console owns the terminal
        )

    def open(self, node: str, timeout_s: float) -> None:
        """Start simulating `node` in full now, where an event loop runs (a console opened
        it); its source's next read then finds it running."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        asyncio.ensure_future(self.detail(node, timeout_s)).add_done_callback(_retrieve)

    async def detail(self, node: str, timeout_s: float) -> tuple[int, bytes]:
        """`node`'s full snapshot body and its number, simulated in full (from the first
        asking) in a process of its own, as its own agent would: the head's loop, busy with
        a thousand summaries, never waits on the simulator's threads and files. Who asks
        while the node is being asked for gets that answer (a node opened, then read)."""
        asking = self._answering.get(node)
        if asking is None:
            asking = self._answering[node] = asyncio.ensure_future(self._ask(node, timeout_s))
            asking.add_done_callback(_retrieve)
            asking.add_done_callback(lambda done: self._answered_by(node, done))
        return await asyncio.shield(asking)

    def _answered_by(self, node: str, done: asyncio.Future[tuple[int, bytes]]) -> None:
        if self._answering.get(node) is done:
            del self._answering[node]

    async def _ask(self, node: str, timeout_s: float) -> tuple[int, bytes]:
        spec = self.specs[node]
        request = {"name": spec.name, "profile": spec.profile, "timeout_s": timeout_s}
        request["scenarios"] = [[s.kind, s.gpu, s.at_s] for s in spec.scenarios]
        async with self._asking:  # one question at a time on the pipe
            self.warm()
            assert self._worker is not None
            worker = await self._worker
            assert worker.stdin is not None and worker.stdout is not None
            try:
                worker.stdin.write(json.dumps(request).encode() + b"\n")
                await worker.stdin.drain()
                line = (await worker.stdout.readline()).decode()
                if not line:
                    raise ConnectionError("the simulated agent exited")
                head = line.split(" ", 1)
                if head[0] == "error":  # it said why, and still answers
                    raise ValueError(f"simulated agent: {head[1].strip()}")
                body = await worker.stdout.readexactly(int(head[1]))
            except (asyncio.CancelledError, OSError, asyncio.IncompleteReadError):
                await self._stop_worker()  # half a conversation: start afresh next time
                raise
            return int(head[0]), body

    async def _stop_worker(self) -> None:
        started, self._worker = self._worker, None
        if started is None:
            return
        try:
            worker = await started
        except Exception:
            return
        if worker.stdin is not None:
            worker.stdin.close()
        try:
            await asyncio.wait_for(worker.wait(), 5.0)
        except TimeoutError:
            worker.kill()
            await worker.wait()

    async def close(self) -> None:
        if self._releasing is not None:
            self._releasing.cancel()
        for batch in self._batches:  # whoever still waits to start is told to go on (and stops)
            if not batch.done():
                batch.set_result(None)
        await self._stop_worker()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


# --- the process that simulates opened nodes in full --------------------------------------

_detailed: OrderedDict[str, Hub] = OrderedDict()


def _preload() -> None:
    """Import what simulating a node in full imports (its BMC, fabric and tenancy, netlink's
    pyroute2): now, while nobody waits, not when an operator opens the first node."""
    import pyroute2  # noqa: F401

    import gpuconsole.sim.bmc
    import gpuconsole.sim.fabric
    import gpuconsole.sim.tenancy
    import gpuconsole.sources.bmc  # noqa: F401


def _serve(seed: int, started: float) -> None:
    """Answer each request line on stdin (a node to simulate in full) with "SEQ LENGTH" and
    that node's full snapshot body, until stdin closes."""
    _preload()
    # A node's body (~150 KB) in the pipe at once: the head's loop, a batch of a thousand
    # summaries per turn, reads what the pipe holds once a turn (64 KB by default).
    with contextlib.suppress(AttributeError, OSError):  # Linux's; elsewhere 64 KB turns
        fcntl.fcntl(sys.stdout.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="sim nodes", daemon=True).start()
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            spec = SimNodeSpec(
                request["name"],
                request["profile"],
                tuple(Scenario(k, g, a) for k, g, a in request["scenarios"]),
            )
            shot = asyncio.run_coroutine_threadsafe(
                _full_snapshot(spec, seed, started, float(request["timeout_s"])), loop
            ).result()
        except Exception as exc:  # the head shows it as the node's stale reason
            out.write(f"error {type(exc).__name__}: {exc}".replace("\n", " ").encode() + b"\n")
            out.flush()
            continue
        cut = tuple(carry_verdict(n) for n in shot.nodes if n.node == spec.name)
        events = tuple(e for e in shot.events if e.node == spec.name)
        shot = msgspec.structs.replace(shot, nodes=cut, events=events, event_counts=())
        body = dumps(shot).encode()
        out.write(f"{shot.seq} {len(body)}\n".encode() + body)
        out.flush()
    for hub in list(_detailed.values()):
        asyncio.run_coroutine_threadsafe(hub.stop(), loop).result(10)


async def _full_snapshot(
    spec: SimNodeSpec, seed: int, started: float, timeout_s: float
) -> FleetSnapshot:
    """The node simulated in full: its snapshot once every source answered once, or what
    it has after `timeout_s`."""
    hub = _detailed.get(spec.name)
    if hub is None:
        # published as soon as each source lands: the head waits on this one node alone
        settings = HubSettings(publish_gap_s=DETAIL_PUBLISH_GAP_S)
        hub = demo_hub(specs=[spec], seed=seed, start=started, settings=settings)
        await hub.start()
        _detailed[spec.name] = hub
        while len(_detailed) > DETAILED_NODES:
            _, oldest = _detailed.popitem(last=False)
            await oldest.stop()
    _detailed.move_to_end(spec.name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shot = hub.latest
        found = shot.node(spec.name) if shot is not None else None
        if shot is not None and found is not None and all(s.polls for s in found.statuses):
            return shot
        await asyncio.sleep(0.05)
    if hub.latest is None:
        raise TimeoutError(f"the simulated {spec.name} has not answered yet")
    return hub.latest


class SimAgentClient(AgentClient):
    """The fleet's agents, answered from the simulation: what AgentSource asks of a real
    agent (a summary, or the full snapshot of a node opened), with its ETag and 304."""

    def __init__(self, fleet: FleetSim, interval_s: float = 1.0) -> None:
        super().__init__(1)
        self.fleet = fleet
        self.interval_s = interval_s
        self._spread: set[str] = set()
        self._answered: set[str] = set()

    async def release(self) -> None:
        self._users -= 1
        if self._users <= 0:
            await self.fleet.close()

    async def get(
        self,
        url: str | URL,
        timeout_s: float,
        *,
        peer: str = "agent",
        limit: int = MAX_BODY_BYTES,
        etag: str | None = None,
    ) -> Answer:
        query = parse_qs(urlsplit(str(url)).query)
        node, view = query["node"][0], query.get("view", ["summary"])[0]
        if view == "full":
            seq, body = await self.fleet.detail(node, timeout_s * 0.9)
            tag = f'W/"{node}-full-{seq}"'
            return Answer(None if etag == tag else body, tag)
        await self.fleet.prepare()
        if node in self._answered and node not in self._spread:
            # Real agents answer at their own moments; a fleet that all answers at once
            # would hold the head's loop (and its console) for each whole sweep.
            self._spread.add(node)
            self.fleet.warm()  # read more than once: a running console, not a one-shot
            await asyncio.sleep(self.fleet.phase(node) * self.interval_s * 0.8)
        self._answered.add(node)
        now = self.fleet.clock()
        tag = f'W/"{node}-{int(now // self.interval_s)}"'
        if etag == tag:
            return Answer(None, tag)
        return Answer(self.fleet.summary(node, now), tag)


class SimAgentSource(AgentSource):
    """An AgentSource of the simulated fleet: the same reads, decoding and merging; opened
    (Hub.focus), it has its node's full simulation started at once, as a real node's
    agent is already running when a console opens it, rather than at its next read."""

    _detail = False

    # Opened, a node is read every second whatever the fleet's refresh, as a console reads
    # the node it shows.
    OPENED_INTERVAL_S = 1.0

    @property
    def interval_s(self) -> float:
        return min(self._interval_s, self.OPENED_INTERVAL_S) if self._detail else self._interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        self._interval_s = value

    async def start(self, emit: EmitEvent) -> None:
        await super().start(emit)
        if isinstance(self._client, SimAgentClient):
            await self._client.fleet.start_turn(self.node)

    @property
    def detail(self) -> bool:
        return self._detail

    @detail.setter
    def detail(self, value: bool) -> None:
        opened = value and not self._detail
        self._detail = value
        if opened and isinstance(self._client, SimAgentClient):
            self._client.fleet.open(self.node, self.timeout_s * 0.9)


def fleet_hub(
    specs: Sequence[SimNodeSpec],
    *,
    seed: int = 0,
    interval_s: float = 1.0,
    timeout_s: float = 5.0,
    settings: HubSettings | None = None,
    clock: Callable[[], float] = time.time,
) -> Hub:
    """A head's hub over a simulated fleet (not started): an AgentSource per node, each
    reading `interval_s` or slower, as refresh_s() says for the fleet's size."""
    quiet_collector()  # as a head's fleet_hub does: a thousand readings replaced each second
    hub = Hub(settings, clock=clock)
    every = refresh_s(len(specs), interval_s)
    client = SimAgentClient(FleetSim(specs, seed=seed, clock=clock), every)
    for spec in specs:
        hub.add_node(spec.name, simulated=True, profile=spec.profile)
        hub.add_source(
            SimAgentSource(
                spec.name,
                f"sim://{spec.name}",
                client,
                interval_s=every,
                # the first answers wait for the templates, simulated once at start
                timeout_s=max(timeout_s, every, FIRST_ANSWER_S),
                watch=False,  # the simulated fleet answers reads, as an agent that polls
                clock=clock,
            )
        )
    if every > interval_s:
        hub.post_event(
            Event(
                clock(),
                specs[0].name,
                "sim",
                "refresh",
                Severity.INFO,
                f"simulated fleet of {len(specs):,} nodes: each node refreshes every "
                f"{every:g} s ({UPDATES_PER_S:,} nodes a second)",
            )
        )
    return hub


if __name__ == "__main__":
    _serve(int(sys.argv[1]), float(sys.argv[2]))
