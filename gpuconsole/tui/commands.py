"""The command palette's jump list (`:` or ctrl+p): every view, node and GPU by name."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from gpuconsole.tui.app import ConsoleApp


class JumpCommands(Provider):
    """Views, nodes and GPUs of the latest snapshot as palette entries."""

    def _targets(self) -> Iterator[tuple[str, str, str, str | None, int | None]]:
        """(label, help, view, node, gpu) for every place the console can show."""
        app = cast("ConsoleApp", self.app)
        yield "fleet", "every node at a glance", "fleet", None, None
        yield "events", "XID, ECC, throttle and source events", "events", None, None
        snapshot = app.snapshot
        if snapshot is None:
            return
        for node in snapshot.nodes:
            yield node.node, "node view", "node", node.node, None
            yield (
                f"{node.node} topology",
                "topo -m matrix and PCIe tree",
                "topology",
                node.node,
                None,
            )
            for gpu in node.gpus:
                label = f"{node.node} gpu {gpu.index}"
                yield label, f"GPU detail ({gpu.name})", "gpu", node.node, gpu.index
                yield f"{label} sm map", "SM layout, MIG and GPM", "smmap", node.node, gpu.index

    def _go(self, view: str, node: str | None, gpu: int | None) -> None:
        cast("ConsoleApp", self.app).jump(view, node, gpu)

    async def discover(self) -> Hits:
        for label, help_text, view, node, gpu in self._targets():
            if view in ("fleet", "events", "node"):
                yield DiscoveryHit(label, partial(self._go, view, node, gpu), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, help_text, view, node, gpu in self._targets():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(self._go, view, node, gpu),
                          help=help_text)  # fmt: skip
