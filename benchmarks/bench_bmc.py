"""Polling 64 BMCs at once: wall time per round and this process's CPU per BMC poll.

Two fleets: 64 simulated BMCs (the demo's, through the real IPMI link code) and, where
OpenIPMI is installed, 64 ipmi_sim processes over RMCP+ through pyghmi. Figures are
medians over rounds; every BMC is polled once per round, all concurrently.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from gpuconsole.sim.bmc import sim_link
from gpuconsole.sim.cluster import build_sim_nodes, demo_cluster
from gpuconsole.sources.bmc import BmcLink, BmcPool, BmcSource, BmcTarget, open_link

BMCS = 64
ROUNDS = 15


async def _rounds(links: list[BmcLink], rounds: int) -> dict[str, float]:
    pool = BmcPool(BMCS)
    sources = [BmcSource(f"n{i}", link, pool=pool) for i, link in enumerate(links)]
    for source in sources:
        await source.start(lambda _e: None)
    await asyncio.gather(*(s.poll() for s in sources))  # log on, read SDRs and thresholds
    walls, cpus = [], []
    try:
        for _ in range(rounds):
            wall, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(s.poll() for s in sources))
            walls.append(time.perf_counter() - wall)
            cpus.append((time.process_time() - cpu) / len(sources))
    finally:
        for source in sources:
            await source.close()
    return {
        "round_ms_median": 1000 * statistics.median(walls),
        "cpu_ms_per_bmc_poll_median": 1000 * statistics.median(cpus),
    }


def simulated() -> dict[str, float]:
    nodes = build_sim_nodes(demo_cluster(BMCS))
    return asyncio.run(_rounds([sim_link(n) for n in nodes], ROUNDS))


def ipmi_sim() -> dict[str, float] | str:
    import shutil

    if shutil.which("ipmi_sim") is None:
        return "skipped: ipmi_sim not installed (apt-get install openipmi)"
    from tests.bmc_fixtures import running_ipmi_sim

    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        sims = [stack.enter_context(running_ipmi_sim(Path(folder) / f"b{i}")) for i in range(BMCS)]
        links = [
            open_link(BmcTarget(f"n{i}", "127.0.0.1", "ipmi", s.port, s.username, s.password))
            for i, s in enumerate(sims)
        ]
        return asyncio.run(_rounds(links, ROUNDS))


def _show(name: str, run: Callable[[], dict[str, float] | str]) -> None:
    result = run()
    if isinstance(result, str):
        print(f"  {name}: {result}")
        return
    print(
        f"  {name}: {result['round_ms_median']:.1f} ms per round, "
        f"{result['cpu_ms_per_bmc_poll_median']:.2f} ms CPU per BMC poll"
    )


def main() -> None:
    print(f"BMC: {BMCS} BMCs polled concurrently, {ROUNDS} rounds (medians)")
    _show("simulated BMCs", simulated)
    _show("ipmi_sim over RMCP+ (pyghmi)", ipmi_sim)


if __name__ == "__main__":
    main()
