"""The soak run: the demo fleet with faults coming and going, one ssh session
typing, and Prometheus-style scrapes of /metrics, for a long while (30 minutes unless
told). Not a bench_*.py: `make bench` does not run it; `make bench-soak` does.

Prints, as it goes and at the end: the server's resident memory and Python heap over
time, its asyncio tasks and threads (no leaks), the ssh session's keystroke-to-screen
time, and events posted against events recorded and scraped (none lost). The server runs
in a child process so that the client's own work (a terminal emulator, an HTTP client) is
not counted.

Memory is judged once what is bounded has filled: the history rings (after
history_points seconds) and Textual's style cache (an lru_cache that keeps the caches of
views long closed, up to its bound; the ssh user opens the Events view every second until
it is full). Over the rest it must be flat: a trend above MAX_TREND_MIB_PER_H says
GROWING and the run fails (exit status 1), as it does when an event is lost.

    python -m benchmarks.soak --minutes 8 --history-points 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIZE = (120, 40)
SAMPLE_S = 10.0  # the child's memory/task/event sample period
SCRAPE_S = 5.0  # how often /metrics is scraped, as Prometheus would
KEYSTROKE_S = 15.0  # how often the ssh user opens the events view and goes back
CHAOS_S = 12.0  # how often a fault starts or ends somewhere in the fleet
HISTORY_POINTS = 300  # [hub] history_points' default: the rings fill in 300 s at 1 Hz
WARM_KEYSTROKE_S = 1.0  # the ssh user's pace until the bounded caches are full
MAX_TREND_MIB_PER_H = 5.0  # resident memory's trend, once warm, above which it is growing


# --- the server (child process) -------------------------------------------------------


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Chaos:
    """Faults that start and end in the simulated fleet: GPUs falling off the bus and
    coming back, thermal throttling, BMCs that go silent."""

    KINDS = ("xid79", "thermal", "bmcsilent")

    def __init__(self, nodes: list[Any], seed: int = 11) -> None:
        self.nodes = nodes
        self.rng = random.Random(seed)
        self.active: list[tuple[Any, Any]] = []
        self.flips = 0

    def flip(self) -> None:
        from gpuconsole.sim.node import Scenario

        if self.active and (len(self.active) >= 3 or self.rng.random() < 0.5):
            node, scenario = self.active.pop(self.rng.randrange(len(self.active)))
            node.scenarios = tuple(s for s in node.scenarios if s is not scenario)
        else:
            node = self.rng.choice(self.nodes)
            kind = self.rng.choice(self.KINDS)
            gpu = 0 if kind == "bmcsilent" else self.rng.randrange(len(node.profile.gpus))
            scenario = Scenario(kind, gpu, node.elapsed())
            node.scenarios = (*node.scenarios, scenario)
            self.active.append((node, scenario))
        self.flips += 1


async def _serve(folder: Path, history_points: int, trace: bool) -> None:
    # Textual's, bounded: it keeps the styles cache of every widget it drew, up to maxsize
    # entries (textual issue 6665); the soak fills it before judging memory.
    from textual._styles_cache import StylesCache

    from gpuconsole.export.agent import Agent
    from gpuconsole.hub import Hub, HubSettings
    from gpuconsole.sim.cluster import (
        add_sim_bmc_sources,
        add_sim_sources,
        build_sim_nodes,
        demo_cluster,
    )
    from gpuconsole.sim.fabric import add_sim_fabric_sources
    from gpuconsole.sim.tenancy import add_sim_tenancy_sources
    from gpuconsole.ssh.server import ConsoleServer, console_factory
    from gpuconsole.wiring import AgentSettings, SshSettings

    if trace:
        import tracemalloc

        tracemalloc.start(8)
    baseline: Any = None
    # demo_hub's fleet, built here so that the chaos can reach the simulated nodes
    hub = Hub(HubSettings(history_points=history_points))
    sims = build_sim_nodes(demo_cluster())
    add_sim_sources(hub, sims, interval_s=1.0, events=True)
    add_sim_bmc_sources(hub, sims)
    add_sim_fabric_sources(hub, sims, interval_s=2.0)
    add_sim_tenancy_sources(hub, sims, interval_s=5.0)
    posted = [0]
    lock = threading.Lock()
    record = hub.post_event

    def counting(event: Any) -> None:  # sources take hub.post_event at start: count there
        with lock:
            posted[0] += 1
        record(event)

    hub.post_event = counting  # type: ignore[method-assign]

    settings = SshSettings(
        host="127.0.0.1",
        port=0,
        host_key=folder / "host_key",
        authorized_keys=folder / "authorized_keys",
        idle_timeout_s=0,
    )
    make = console_factory(hub, theme=None, wallboard_theme=None, page_s=15, theme_dirs=[])
    server = ConsoleServer(hub, settings, make, start_hub=False)
    await hub.start()
    await server.start()
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    (folder / "ports").write_text(json.dumps({"ssh": server.port, "http": agent.port}))
    chaos = Chaos(sims)
    samples = (folder / "samples.jsonl").open("a", buffering=1)
    taken: list[dict[str, Any]] = []
    began = time.monotonic()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def parent_done() -> None:  # the parent closed our stdin
        loop.remove_reader(sys.stdin.fileno())
        stop.set()

    loop.add_reader(sys.stdin.fileno(), parent_done)

    def sample(final: bool = False) -> None:
        snapshot = hub.latest
        recorded = sum(c[3] for c in snapshot.event_counts) if snapshot is not None else 0
        with lock:
            sent = posted[0]
        styles = StylesCache.get_inner_outer.cache_info()
        line = {
            "t": time.monotonic() - began,
            "rss": _rss_bytes(),
            "blocks": sys.getallocatedblocks(),  # Python's objects: no allocator noise
            "styles": (styles.currsize, styles.maxsize),
            "kept": (len(hub.events()), hub.settings.event_log_size),  # the event log
            "tasks": len(asyncio.all_tasks()),
            "threads": threading.active_count(),
            "fds": _fds(),
            "sessions": len(server.sessions),
            "posted": sent,
            "recorded": recorded,
            "flips": chaos.flips,
            "final": final,
        }
        samples.write(json.dumps(line) + "\n")
        taken.append(line)

    next_chaos, next_sample = CHAOS_S, SAMPLE_S
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass
        elapsed = time.monotonic() - began
        if elapsed >= next_chaos:
            chaos.flip()
            next_chaos += CHAOS_S
        if elapsed >= next_sample:
            sample()
            next_sample += SAMPLE_S
        if trace and baseline is None and taken and warm(taken, history_points + 30.0):
            baseline = tracemalloc.take_snapshot()
    # Freeze: no more polls, so posted, recorded and scraped can be compared exactly.
    for source in hub.sources:
        source.interval_s = 3600.0
    await hub.stop()
    await asyncio.sleep(0.5)  # events posted from threads land on the loop
    hub.publish()
    sample(final=True)
    if trace and baseline is not None:
        grown = tracemalloc.take_snapshot().compare_to(baseline, "lineno")
        lines = [str(stat) for stat in grown[:15]]
        (folder / "memory.txt").write_text("\n".join(lines) + "\n")
    (folder / "frozen").write_text("1")
    while not (folder / "done").exists():
        await asyncio.sleep(0.1)
    await agent.stop()
    await server.stop()
    samples.close()


def warm(samples: list[dict[str, Any]], rings_full_s: float) -> bool:
    """Whether what is bounded had filled by the last sample: the history rings, and
    Textual's style cache (full, or no longer growing for a minute)."""
    last = samples[-1]
    if last["t"] < rings_full_s:
        return False
    entries, bound = last["styles"]
    if entries >= bound:
        return True
    before = [s for s in samples if s["t"] <= last["t"] - 60]
    return bool(before) and before[-1]["styles"][0] == entries


def serve(folder: str, history_points: int = HISTORY_POINTS, trace: bool = False) -> None:
    """Entry point of the child process."""
    asyncio.run(_serve(Path(folder), history_points, trace))


# --- the client: one ssh user, one scraper --------------------------------------------


@dataclass
class Client:
    """What the parent saw: keystroke times, scrapes, the last scraped event total."""

    latencies_ms: list[float] = field(default_factory=list)
    scrapes: int = 0
    scrape_failures: int = 0
    scraped_events: float = 0.0
    scrape_ms: list[float] = field(default_factory=list)
    warm_at_s: float | None = None  # the server's time when what is bounded had filled


EVENTS_LINE = re.compile(r"^gpuconsole_events_total\{[^}]*\}\s+([0-9.e+]+)$", re.M)


async def _scrape(url: str, client: Client) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        began = time.perf_counter()
        try:
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as answer:
                body = await answer.text()
                if answer.status != 200:
                    raise RuntimeError(f"HTTP {answer.status}")
        except Exception:
            client.scrape_failures += 1
            return
        client.scrape_ms.append(1000 * (time.perf_counter() - began))
        client.scrapes += 1
        client.scraped_events = sum(float(v) for v in EVENTS_LINE.findall(body))


def _terminal_class() -> type[Any]:
    import asyncssh
    import pyte

    class Terminal(asyncssh.SSHClientSession[bytes]):  # type: ignore[misc]
        def __init__(self) -> None:
            self.screen = pyte.Screen(*SIZE)
            self.stream = pyte.ByteStream(self.screen)
            self.chan: Any = None
            self.closed = asyncio.Event()

        def connection_made(self, chan: Any) -> None:
            self.chan = chan

        def data_received(self, data: bytes, datatype: Any) -> None:
            self.stream.feed(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.closed.set()

        async def expect(self, text: str, present: bool = True, timeout: float = 60) -> None:
            deadline = time.monotonic() + timeout
            while (text in self.screen.display[0]) != present:
                if time.monotonic() > deadline or self.closed.is_set():
                    raise RuntimeError(f"the session never showed {text!r}")
                await asyncio.sleep(0.02)

    return Terminal


def _mib(n: float) -> str:
    return f"{n / 2**20:7.1f} MiB"


def _slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per hour."""
    if len(points) < 3:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return (
        3600 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    )


async def _drive(
    folder: Path, minutes: float, rings_full_s: float
) -> tuple[Client, list[dict[str, Any]]]:
    import asyncssh

    ports = json.loads((folder / "ports").read_text())
    key = asyncssh.read_private_key(folder / "client_key")
    client = Client()
    conn = await asyncssh.connect(
        "127.0.0.1", ports["ssh"], username="soak", client_keys=[key], known_hosts=None
    )
    _, term = await conn.create_session(
        _terminal_class(), term_type="xterm-256color", term_size=SIZE, encoding=None
    )
    await term.expect("Fleet")
    metrics = f"http://127.0.0.1:{ports['http']}/metrics"
    end = time.monotonic() + 60 * minutes
    next_scrape = next_key = time.monotonic()
    seen = 0
    samples: list[dict[str, Any]] = []
    print(
        f"{'t':>6}  {'server RSS':>11}  {'py blocks':>9}  {'styles':>6}  {'tasks':>5}  "
        f"{'threads':>7}  {'fds':>4}  {'posted':>7}  {'recorded':>8}  {'scraped':>7}  "
        f"{'faults':>6}  keystroke"
    )
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_scrape:
            await _scrape(metrics, client)
            next_scrape += SCRAPE_S
        if now >= next_key:
            began = time.perf_counter()
            term.chan.write(b"e")
            await term.expect("Events")
            client.latencies_ms.append(1000 * (time.perf_counter() - began))
            term.chan.write(b"\x1b")
            await term.expect("Events", present=False)
            if client.warm_at_s is None:  # filling Textual's style cache
                next_key = time.monotonic() + WARM_KEYSTROKE_S
            else:
                next_key += KEYSTROKE_S
        lines = (folder / "samples.jsonl").read_text().splitlines()
        for line in lines[seen:]:
            s = json.loads(line)
            samples.append(s)
            if client.warm_at_s is None and warm(samples, rings_full_s):
                client.warm_at_s = s["t"]
                next_key = time.monotonic() + KEYSTROKE_S
                print(f"-- warm at {s['t']:.0f} s: memory is judged from here --")
            last = f"{client.latencies_ms[-1]:6.0f} ms" if client.latencies_ms else ""
            print(
                f"{s['t']:6.0f}  {_mib(s['rss'])}  {s['blocks'] / 1000:8.0f}k  "
                f"{s['styles'][0]:6d}  {s['tasks']:5d}  {s['threads']:7d}  {s['fds']:4d}  "
                f"{s['posted']:7d}  {s['recorded']:8d}  {client.scraped_events:7.0f}  "
                f"{s['flips']:6d}  {last}",
                flush=True,
            )
        seen = len(lines)
        await asyncio.sleep(0.2)
    term.chan.write(b"q")
    await asyncio.wait_for(term.closed.wait(), 30)
    conn.close()
    return client, samples


def run(minutes: float, history_points: int = HISTORY_POINTS, trace: bool = False) -> int:
    try:
        import asyncssh
        import pyte  # noqa: F401 - the client's terminal
    except ImportError as exc:
        print(f"soak: not available ({exc})")
        return 1
    print(
        f"soak: the demo fleet (8 nodes, NVML/BMC/fabric/tenancy) with a fault starting or "
        f"ending every {CHAOS_S:g} s, one ssh session opening the events view every "
        f"{KEYSTROKE_S:g} s, /metrics scraped every {SCRAPE_S:g} s; {minutes:g} minutes; "
        f"history rings of {history_points} points (full after about {history_points} s).\n"
        f"Until the rings and Textual's style cache are full the events view is opened every "
        f"{WARM_KEYSTROKE_S:g} s; memory is judged from then on (flat: a trend within "
        f"{MAX_TREND_MIB_PER_H:g} MiB/h)\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        key = asyncssh.generate_private_key("ssh-ed25519")
        (folder / "client_key").write_bytes(key.export_private_key())
        (folder / "authorized_keys").write_text(f"role=viewer {key.export_public_key().decode()}")
        root = Path(__file__).resolve().parent.parent
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from benchmarks.soak import serve; serve({tmp!r}, {history_points}, {trace})",
            ],
            cwd=root,
            stdin=subprocess.PIPE,
            stderr=(folder / "server.log").open("wb"),
        )
        try:
            deadline = time.monotonic() + 60
            while not (folder / "ports").exists():
                if child.poll() is not None or time.monotonic() > deadline:
                    print((folder / "server.log").read_text()[-2000:])
                    return 1
                time.sleep(0.1)
            client, samples = asyncio.run(_drive(folder, minutes, history_points + 30.0))
            sessions_after = samples[-1]["sessions"] if samples else -1
            assert child.stdin is not None
            child.stdin.close()  # freeze the server: no more polls
            deadline = time.monotonic() + 60
            while not (folder / "frozen").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            http = json.loads((folder / "ports").read_text())["http"]
            asyncio.run(_scrape(f"http://127.0.0.1:{http}/metrics", client))
            final = json.loads((folder / "samples.jsonl").read_text().splitlines()[-1])
            (folder / "done").write_text("1")
            try:  # tracemalloc's comparison takes minutes on a loaded machine
                child.wait(timeout=600 if trace else 60)
            except subprocess.TimeoutExpired:
                print("(the server did not end in time: killed; its figures above stand)")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        ok = _summary(samples, final, client, sessions_after, rings_full_s=history_points + 30.0)
        traced = folder / "memory.txt"
        if traced.exists():
            print("\nwhere memory grew once what is bounded had filled (tracemalloc, top 15):")
            print(traced.read_text())
    return 0 if ok else 1


def _summary(
    samples: list[dict[str, Any]],
    final: dict[str, Any],
    client: Client,
    sessions: int,
    *,
    rings_full_s: float,
) -> bool:
    """Print what the run showed; whether memory stayed flat and no event was lost."""
    warm_at = client.warm_at_s
    steady = [s for s in samples if warm_at is not None and s["t"] >= warm_at]
    if len(steady) < 3:
        steady = samples
    rss = [s["rss"] for s in steady]
    trend = _slope_per_hour([(s["t"], s["rss"]) for s in steady]) / 2**20
    half = _slope_per_hour([(s["t"], s["rss"]) for s in steady[len(steady) // 2 :]]) / 2**20
    blocks = _slope_per_hour([(s["t"], s["blocks"]) for s in steady]) / 1000
    tasks = [s["tasks"] for s in steady]
    threads = [s["threads"] for s in steady]
    lat = sorted(client.latencies_ms)
    styles, kept = samples[-1]["styles"], samples[-1]["kept"]
    print(
        "\nsummary ("
        + (
            f"memory judged from {warm_at:.0f} s, once what is bounded had filled)"
            if warm_at is not None
            else "the run ended before what is bounded had filled: memory not judged)"
        )
    )
    print(
        f"  resident memory:   {_mib(rss[0]).strip()} at {steady[0]['t']:.0f} s -> "
        f"{_mib(rss[-1]).strip()} at {steady[-1]['t']:.0f} s (min {_mib(min(rss)).strip()}, "
        f"max {_mib(max(rss)).strip()}); trend {trend:+.1f} MiB/h (second half {half:+.1f})"
    )
    print(
        f"  Python heap:       {steady[0]['blocks'] / 1000:.0f}k -> "
        f"{steady[-1]['blocks'] / 1000:.0f}k allocated blocks; trend {blocks:+.0f}k blocks/h"
    )
    print(
        f"  bounded:           history rings full at ~{rings_full_s:.0f} s; "
        f"Textual's style cache {styles[0]}/{styles[1]} entries; "
        f"event log {kept[0]}/{kept[1]} events (a few hundred bytes each: not waited for)"
    )
    flat = warm_at is not None and trend <= MAX_TREND_MIB_PER_H
    window = f"over {(steady[-1]['t'] - steady[0]['t']) / 60:.0f} min once warm"
    if warm_at is None:
        verdict = "NOT JUDGED: the run ended while bounded caches were still filling"
    elif flat:
        verdict = f"flat: {trend:+.1f} MiB/h {window} (within {MAX_TREND_MIB_PER_H:g})"
    else:
        verdict = f"GROWING: {trend:+.1f} MiB/h {window} (flat is within {MAX_TREND_MIB_PER_H:g})"
    print(f"  memory:            {verdict}")
    print(
        f"  asyncio tasks:     {min(tasks)}..{max(tasks)} (first {tasks[0]}, last {tasks[-1]}); "
        f"threads {min(threads)}..{max(threads)}; fds {steady[0]['fds']}..{steady[-1]['fds']}"
    )
    intact = final["posted"] == final["recorded"] == int(client.scraped_events)
    print(
        f"  events (frozen):   posted {final['posted']}, recorded {final['recorded']}, "
        f"scraped {client.scraped_events:.0f}; " + ("none lost" if intact else "MISMATCH")
    )
    print(f"  faults started or ended: {final['flips']}")
    if lat:
        print(
            f"  ssh keystroke:     {len(lat)} rounds, median {statistics.median(lat):.0f} ms, "
            f"max {lat[-1]:.0f} ms; session open throughout: {sessions == 1}"
        )
    print(
        f"  scrapes:           {client.scrapes} ok, {client.scrape_failures} failed, median "
        f"{statistics.median(client.scrape_ms) if client.scrape_ms else 0:.0f} ms"
    )
    return flat and intact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long (default 30)")
    parser.add_argument(
        "--history-points",
        type=int,
        default=HISTORY_POINTS,
        help="points per history ring (default 300, the config's): fewer fill sooner, so a "
        "short run can show memory levelling off",
    )
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="tracemalloc in the server: print where memory grew once the rings were full "
        "(slows the server down)",
    )
    args = parser.parse_args(argv)
    return run(args.minutes, args.history_points, args.trace_memory)


if __name__ == "__main__":
    sys.exit(main())
