"""Evaluating the default alert rules over a 1,000-node fleet: CPU per evaluation, beside
what building the whole exporter body's series costs (an evaluation builds only the families
its rules read), and how often the engine then evaluates: it keeps evaluations under
CPU_SHARE of a core, so a head with a large fleet evaluates less often than interval_s.

The fleet is the demo cluster polled twice (NVML, BMC, fabric, tenancy), its nodes repeated
under new names up to 1,000; evaluated first for as long as the longest increase window (10
minutes), every TARGET_INTERVAL_S, so that every window is full, as on a head that has run
that long; then published every interval_s with every node polled since (the paced figure),
and with none (an evaluation then reuses each node's samples). Target: a 1,000-node head
still evaluates every 15 s or sooner.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import msgspec

from benchmarks.timing import cpu_us
from gpuconsole.alerts.engine import CPU_SHARE, AlertEngine
from gpuconsole.alerts.rules import DEFAULT_RULES
from gpuconsole.config import DEFAULTS
from gpuconsole.export.collector import build
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sim.cluster import demo_hub

NODES = 1000
ROUNDS = 5
TARGET_INTERVAL_S = 15.0


def fleet_of(nodes: int) -> FleetSnapshot:
    demo = asyncio.run(demo_hub(events=False).poll_once(rounds=2, between=lambda: time.sleep(0.2)))
    many = tuple(
        msgspec.structs.replace(demo.nodes[i % len(demo.nodes)], node=f"node-{i:04d}")
        for i in range(nodes)
    )
    return msgspec.structs.replace(demo, nodes=many)


def published(
    fleet: FleetSnapshot, rounds: int, every_s: float, polled: bool
) -> list[FleetSnapshot]:
    """The fleet as the hub publishes it `every_s` apart: with every node polled in
    between (each node a new snapshot object, of the same readings), or none (the hub
    hands an unchanged node on as the same object)."""
    return [
        msgspec.structs.replace(
            fleet,
            at=fleet.at + every_s * (i + 1),
            nodes=tuple(msgspec.structs.replace(n) for n in fleet.nodes) if polled else fleet.nodes,
        )
        for i in range(rounds)
    ]


def main() -> None:
    fleet = fleet_of(NODES)
    engine = AlertEngine(DEFAULT_RULES)
    engine.evaluate(fleet)  # the first evaluation creates the alerts; later ones update them
    longest = max(r for rule in DEFAULT_RULES for _m, r in rule.condition.ranges)
    filling = published(fleet, int(longest // TARGET_INTERVAL_S) + 1, TARGET_INTERVAL_S, False)
    for snapshot in filling:
        engine.evaluate(snapshot)  # every window full, as on a head that has run that long
    fleet = filling[-1]
    every = DEFAULTS.alerts.interval_s
    polled = iter(published(fleet, ROUNDS + 1, every, polled=True))
    engine.evaluate(next(polled))  # the first of every node polled anew
    evaluate = statistics.median(cpu_us(lambda: engine.evaluate(next(polled)), ROUNDS)) / 1000
    since = msgspec.structs.replace(fleet, at=fleet.at + every * (ROUNDS + 1))
    quiet = iter(published(since, ROUNDS + 1, every, polled=False))
    engine.evaluate(next(quiet))  # the nodes as they will stay
    unchanged = statistics.median(cpu_us(lambda: engine.evaluate(next(quiet)), ROUNDS)) / 1000
    series = statistics.median(cpu_us(lambda: build(fleet, fleet.at), ROUNDS)) / 1000
    paced = max(DEFAULTS.alerts.interval_s, evaluate / 1000 / CPU_SHARE)
    firing = sum(1 for a in engine.active() if a.state.value == "firing")
    print(f"Alert rules ({len(DEFAULT_RULES)} defaults) over {NODES} nodes, CPU medians")
    print(
        f"  evaluation {evaluate:.0f} ms with every node polled since the last "
        f"(the whole exporter body's series {series:.0f} ms, {evaluate / series:.2f}x); "
        f"{unchanged:.0f} ms with none; {firing} alerts firing"
    )
    met = paced <= TARGET_INTERVAL_S
    print(
        f"  kept under {CPU_SHARE * 100:g} % of a core: an evaluation every {paced:.1f} s "
        f"([alerts] interval_s = {DEFAULTS.alerts.interval_s:g})   (<= {TARGET_INTERVAL_S:g} s: "
        f"{'target met' if met else 'TARGET MISSED'})"
    )


if __name__ == "__main__":
    main()
