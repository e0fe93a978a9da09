"""Scrapes of the agent for one 8-GPU DGX H100: latency p50/p99, scrapes per second, and
what rendering a snapshot costs.

The agent runs in a child process (as in production) over one simulated node with all
four sources (NVML, BMC, fabric, tenancy), every GPU visible to NVML and most held by pods,
so the body has dcgm-exporter's pod labels, ipmi_* and node_infiniband_* series. A client
in this process scrapes /metrics over loopback, sequentially, for a fixed number of rounds.
The hub publishes a new snapshot every second, so some scrapes render and most reuse. A
real Prometheus, scraping every 15 s, finds a new snapshot every time and pays one render:
that is timed apart, in this process (CPU time), for that node and for the demo cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

from benchmarks.timing import cpu_us
from gpuconsole.export.agent import AgentSettings, serve
from gpuconsole.export.collector import MetricsCache
from gpuconsole.hub import Hub
from gpuconsole.model import FleetSnapshot
from gpuconsole.sim.cluster import (
    SimNodeSpec,
    add_sim_bmc_sources,
    add_sim_sources,
    build_sim_nodes,
    demo_hub,
)

ROUNDS = 2000
RENDERS = 200
# pods on seven of its eight GPUs: every DCGM sample of those carries pod labels
NODE = SimNodeSpec("dgx-003", "dgx-h100")
# what a full body has once every source has read
READY = (b"DCGM_FI_DEV_GPU_UTIL{", b"ipmi_up{", b"node_infiniband_info{", b"owner_info{")


def one_node_hub() -> Hub:
    """A hub over one simulated DGX H100 with its BMC, fabric and tenancy."""
    from gpuconsole.sim.fabric import add_sim_fabric_sources
    from gpuconsole.sim.tenancy import add_sim_tenancy_sources

    hub = Hub()
    sims = build_sim_nodes([NODE])
    add_sim_sources(hub, sims, interval_s=1.0, events=True)
    add_sim_bmc_sources(hub, sims)
    add_sim_fabric_sources(hub, sims, interval_s=2.0)
    add_sim_tenancy_sources(hub, sims, interval_s=5.0)
    return hub


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _scrape(port: int) -> tuple[list[float], float, int]:
    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as session:
        for _ in range(400):  # wait for a snapshot from every source
            try:
                async with session.get(url) as response:
                    body = await response.read()
                    if all(part in body for part in READY):
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError("the agent never served every source's series")
        latencies = []
        began = time.perf_counter()
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            async with session.get(url) as response:
                body = await response.read()
            latencies.append(time.perf_counter() - t0)
        wall = time.perf_counter() - began
    return latencies, wall, len(body)


def _render_times(snapshot: FleetSnapshot, rounds: int) -> tuple[float, float, int]:
    """(p50, p99) CPU ms of rendering `snapshot` from scratch, and the body size."""
    cache = MetricsCache(lambda: snapshot)

    def render() -> bytes:
        cache._seq = None  # forget the cached body: time a full render
        return cache.render()

    times = sorted(cpu_us(render, rounds))
    p50, p99 = statistics.median(times) / 1000, times[int(len(times) * 0.99) - 1] / 1000
    return p50, p99, len(render())


async def _polled(hub: Hub) -> FleetSnapshot:
    return await hub.poll_once(rounds=2, between=lambda: time.sleep(0.2))


def main() -> None:
    port = _free_port()
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "XDG_STATE_HOME": state}
        agent = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_agent", "--serve", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            latencies, wall, size = asyncio.run(_scrape(port))
        finally:
            agent.terminate()
            agent.wait(10)
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    print("Agent scrape of one 8-GPU DGX H100, NVML + BMC + fabric + tenancy (sequential)")
    print(f"  body {size / 1024:.1f} KiB; {ROUNDS} scrapes")
    print(f"  latency p50 {p50:.2f} ms, p99 {p99:.2f} ms; {ROUNDS / wall:.0f} scrapes/s")
    print("  target: p99 under 10 ms")
    one = asyncio.run(_polled(one_node_hub()))
    r50, r99, _size = _render_times(one, RENDERS)
    print(f"  render per snapshot (once a second), CPU: p50 {r50:.2f} ms, p99 {r99:.2f} ms")
    fleet = asyncio.run(_polled(demo_hub(events=False)))
    f50, f99, fleet_size = _render_times(fleet, RENDERS // 10)
    print(
        f"  render of the {len(fleet.nodes)}-node demo, CPU: p50 {f50:.1f} ms, p99 {f99:.1f} ms, "
        f"{fleet_size / 1024:.0f} KiB"
    )


def _serve(port: int) -> None:
    try:
        asyncio.run(serve(one_node_hub(), AgentSettings(host="127.0.0.1", port=port)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", type=int, metavar="PORT", help="run the agent (the child)")
    args = parser.parse_args()
    if args.serve is not None:
        _serve(args.serve)
    else:
        main()
