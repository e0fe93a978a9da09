"""The demo cluster plays a flaky NVLink: GPU 6 of dgxa-001 (in Slurm job 4712) goes from fit
to watch as its link's error counters climb, to drain once the link has retrained three
times, and the default alert rules fire for it as it goes (its verdict's 2 minutes on)."""

from __future__ import annotations

import asyncio

from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.alerts.rules import DEFAULT_RULES
from gpuconsole.alerts.state import FIRING
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sim.cluster import DEMO_CLUSTER, demo_hub

T0 = 1_796_000_000.0
NODE = "dgxa-001"
FLAKY = "0000:87:00.0"  # dgxa-001's GPU 6


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _play(seconds: int) -> list[tuple[Action, str, frozenset[str]]]:
    """The demo node polled once a second from its start: at each second GPU 6's verdict
    (action and summary) and the alerts that fire on that GPU."""
    clock = Clock()
    [spec] = [s for s in DEMO_CLUSTER if s.name == NODE]
    hub = demo_hub(
        specs=[spec], clock=clock, start=T0, events=False, bmc=False, fabric=False, tenancy=False
    )
    engine = AlertEngine(DEFAULT_RULES, clock=clock)
    seen: list[tuple[Action, str, frozenset[str]]] = []

    def look(snapshot: FleetSnapshot) -> None:
        engine.evaluate(snapshot)
        node = snapshot.node(NODE)
        assert node is not None
        verdict = gpu_verdict(node, FLAKY)
        uuid = next(g.uuid for g in node.gpus if g.pci_bus_id == FLAKY)
        firing = frozenset(
            a.rule
            for a in engine.alerts.values()
            if a.state == FIRING and uuid in (a.labels.get("uuid"), a.labels.get("UUID"))
        )
        seen.append((verdict.action, verdict.summary, firing))

    def step() -> None:
        look(hub.publish())
        clock.now += 1.0

    last = asyncio.run(hub.poll_once(rounds=seconds + 1, between=step))
    look(last)
    return seen


def test_the_demo_s_flaky_nvlink_goes_from_fit_to_watch_to_drain_and_alerts() -> None:
    seen = _play(220)
    actions = [action for action, _summary, _firing in seen]
    watch = actions.index(Action.WATCH)
    drain = actions.index(Action.DRAIN)
    # the source reads the link counters every 30 polls (at 0, 29, 59 and 89 s): the first
    # round after the link started failing (20 s in), and the first after its third
    # retrain (80 s in)
    assert (watch, drain) == (29, 89), (watch, drain)
    assert set(actions[:watch]) == {Action.FIT}
    assert set(actions[watch:drain]) == {Action.WATCH}
    assert set(actions[drain:]) == {Action.DRAIN}
    assert (
        "NVLink 0:" in seen[watch][1] and "drain and reseat if they keep climbing" in seen[watch][1]
    )
    assert "3 recovery" in seen[drain][1] and "the link keeps retraining" in seen[drain][1]
    firing = [names for _a, _s, names in seen]
    assert "GpuNvLinkErrorsClimbing" in firing[watch] and not firing[watch - 1]
    assert "GpuNvLinkRetraining" not in firing[drain - 1]
    assert "GpuNvLinkRetraining" in firing[drain]
    # the verdict pages once it has called for drain 2 minutes
    assert "GpuNotFitForWork" not in firing[drain + 119]
    assert "GpuNotFitForWork" in firing[drain + 120]
