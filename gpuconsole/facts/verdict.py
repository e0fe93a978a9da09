"""Whether a GPU or a node is fit for work and, when not, what to do now.

The one place that judges health from every source; every view, `snapshot` and the exporter
ask it. (Shared contract: the `Action` values are what plans, alerts and series carry.)
"""

from __future__ import annotations

import enum


class Action(enum.StrEnum):
    """NVIDIA's recommended action, mildest first; a node or GPU takes its worst finding's."""

    FIT = "fit"
    WATCH = "watch"
    DRAIN = "drain"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    RESEAT = "reseat"
    SERVICE = "service"

    @property
    def rank(self) -> int:
        """0 for fit up to 6 for return to service: the value of the verdict series."""
        return _RANKS[self]


_RANKS = {action: rank for rank, action in enumerate(Action)}
