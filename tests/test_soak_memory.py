"""Memory stays flat on a console that runs for days: caches keyed by readings let go of
what a node no longer has once its next reading comes."""

from __future__ import annotations

import gc

import msgspec

from gpuconsole.facts import summaries
from gpuconsole.facts.ownership import Ownership
from tests.conftest_tui import frozen_fleet


def ownerships() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Ownership))


def test_the_fleet_counts_keep_no_owners_a_node_no_longer_has() -> None:
    node = frozen_fleet().node("dgx-002")
    assert node is not None and node.tenancy is not None
    counts = summaries.gpu_counts(node)
    before = ownerships()
    for n in range(50):  # each tenancy poll a new reading: owners resolved afresh
        later = msgspec.structs.replace(node, tenancy=msgspec.structs.replace(node.tenancy, at=n))
        assert summaries.gpu_counts(later) == counts
    # node_ownership answers with a node's last two Ownerships; older ones are never asked
    # about again, so counts kept for them (say 4,096 by id(), whatever the fleet's size)
    # would keep every owner of every GPU they listed: ~27 MiB for the demo fleet, and
    # still filling after the history rings are full
    assert ownerships() <= before + 2
