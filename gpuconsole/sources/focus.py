"""Which nodes a head reads in full: the ones its consoles show.

A head reads the overview of every node (a summary from each agent, or Prometheus); while a
console shows a node, that node's agent is read in full. Several consoles on one hub (the
ssh server's sessions) each hold their own node. This module stays light: a node's own
console imports it, and never needs the HTTP client the agent sources bring.
"""

from __future__ import annotations

import sys
import weakref

from gpuconsole.hub import Hub

# hub -> viewer -> the node that viewer drilled into (consoles sharing one hub: ssh sessions)
_FOCUSED: weakref.WeakKeyDictionary[Hub, dict[int, str]] = weakref.WeakKeyDictionary()


def focus(hub: Hub, node: str | None, viewer: object = None) -> None:
    """Read every detail of `node` from its agent (`viewer`, a console, drilled into it),
    and only the overview of the nodes no viewer is in; None: `viewer` left its node."""
    held = _FOCUSED.setdefault(hub, {})
    if "gpuconsole.sources.agents" not in sys.modules:
        return  # no agent is read in this process (a node's own console): nothing to do
    from gpuconsole.sources.agents import RemoteSource
    from gpuconsole.sources.promql import PromQLSource

    if node is None:
        held.pop(id(viewer), None)
    else:
        held[id(viewer)] = node
    wanted = set(held.values())
    for source in hub.sources:
        if isinstance(source, RemoteSource | PromQLSource):
            source.detail = source.node in wanted
