"""`gpuconsole power`: a node's BMC powers it on, off, soft off or reset; the request is
checked, confirmed by the node's name and audited (gpuconsole.actions.power)."""

from __future__ import annotations

import asyncio
import sys

from gpuconsole.actions.power import PowerRequest, power
from gpuconsole.actions.roles import ActionRefused, local_actor
from gpuconsole.actions.store import action_store, demo_store
from gpuconsole.config import Config
from gpuconsole.sources.bmc import BmcError, PowerAction
from gpuconsole.wiring import bmc_sources, demo_bmc_source

__all__ = ["run_power"]


def run_power(cfg: Config, node: str, state: str, confirm: str | None, *, demo: bool) -> int:
    """The whole command; returns its exit status (0 requested, 1 failed, 2 usage, 3 refused)."""
    actor = local_actor()
    if demo:
        simulated = demo_bmc_source(cfg, node)
        if simulated is None:
            print(f"gpuconsole power: no simulated node {node!r}", file=sys.stderr)
            return 2
        source = simulated
        actor = actor.for_demo()
    else:
        found = [s for s in bmc_sources(cfg) if s.node == node]
        if not found:
            print(f"gpuconsole power: no [[bmc]] for node {node!r}", file=sys.stderr)
            return 2
        source = found[0]
    if confirm is None and sys.stdin.isatty():
        confirm = input(f"Power {state} {node}: type the node name to confirm: ")
    request = PowerRequest(node, PowerAction(state), actor, (confirm or "").strip())
    audit = (demo_store() if demo else action_store(cfg.actions)).audit()

    async def run() -> str:
        await source.start(lambda _event: None)
        try:
            return await power(request, source, audit)
        finally:
            await source.close()

    try:
        answer = asyncio.run(run())
    except ActionRefused as exc:
        print(f"gpuconsole power: refused: {exc}", file=sys.stderr)
        return 3
    except BmcError as exc:
        print(f"gpuconsole power: failed: {exc}", file=sys.stderr)
        return 1
    print(f"{node}: power {state} requested through {source.label} ({answer})")
    return 0
