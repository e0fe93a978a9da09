"""FleetSnapshot.node(name): a view's way to a node by name, in a fleet of thousands."""

from __future__ import annotations

import copy

import msgspec

from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot


def _fleet(names: list[str]) -> FleetSnapshot:
    return FleetSnapshot(seq=1, at=0.0, nodes=tuple(NodeSnapshot(n) for n in names))


def test_each_node_is_found_by_its_name_and_an_unknown_name_is_none() -> None:
    names = [f"node-{i:05d}" for i in range(10_000)]
    fleet = _fleet(names)
    assert [fleet.node(n) for n in names] == list(fleet.nodes)
    assert all(fleet.node(n) is node for n, node in zip(names, fleet.nodes, strict=True))
    assert fleet.node("node-10000") is None and fleet.node("") is None


def test_two_nodes_of_one_name_give_the_first() -> None:
    fleet = FleetSnapshot(seq=1, at=0.0, nodes=(NodeSnapshot("a", profile="first"),
                                                NodeSnapshot("a", profile="second")))  # fmt: skip
    found = fleet.node("a")
    assert found is not None and found.profile == "first"


def test_a_snapshot_made_from_another_finds_its_own_nodes() -> None:
    fleet = _fleet(["a", "b"])
    assert fleet.node("b") is fleet.nodes[1]  # asked once: what it found is kept
    other = msgspec.structs.replace(fleet, nodes=(NodeSnapshot("c"), NodeSnapshot("b")))
    assert other.node("a") is None and other.node("b") is other.nodes[1]
    made = copy.copy(fleet)
    assert made == fleet and made.node("b") is made.nodes[1]


def test_what_it_keeps_to_find_nodes_is_not_part_of_the_snapshot() -> None:
    fleet = _fleet(["a", "b"])
    fleet.node("a")
    assert fleet == _fleet(["a", "b"]) and repr(fleet) == repr(_fleet(["a", "b"]))
    assert msgspec.structs.asdict(fleet).keys() == msgspec.structs.asdict(_fleet([])).keys()
