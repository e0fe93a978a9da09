"""Scrapes of the agent for one 8-GPU DGX H100: latency p50/p99 and scrapes per second.

The agent runs in a child process (as in production) over the simulator; a client in
this process scrapes /metrics over loopback, sequentially, for a fixed number of rounds.
The hub publishes a new snapshot every second, so some scrapes render and most reuse.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

ROUNDS = 2000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _scrape(port: int) -> tuple[list[float], float, int]:
    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as session:
        for _ in range(200):  # wait for the first snapshot
            try:
                async with session.get(url) as response:
                    body = await response.read()
                    if b"DCGM_FI_DEV_GPU_UTIL{" in body:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        latencies = []
        began = time.perf_counter()
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            async with session.get(url) as response:
                body = await response.read()
            latencies.append(time.perf_counter() - t0)
        wall = time.perf_counter() - began
    return latencies, wall, len(body)


def main() -> None:
    port = _free_port()
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "XDG_STATE_HOME": state}
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuconsole",
                "agent",
                "--demo",
                "--nodes",
                "1",
                "--listen",
                f"127.0.0.1:{port}",
            ],
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
    print("Agent scrape of one 8-GPU DGX H100 (sequential, loopback)")
    print(f"  body {size / 1024:.1f} KiB; {ROUNDS} scrapes")
    print(f"  latency p50 {p50:.2f} ms, p99 {p99:.2f} ms; {ROUNDS / wall:.0f} scrapes/s")
    print("  target: p99 under 10 ms")


if __name__ == "__main__":
    main()
