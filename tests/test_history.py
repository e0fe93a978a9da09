"""History rings are bounded, and a snapshot's view does not move afterwards."""

from gpuconsole.history import HistoryStore


def test_a_ring_keeps_only_its_capacity() -> None:
    store = HistoryStore(capacity=3)
    store.record((("k",), float(value)) for value in range(10))
    assert store.values(("k",)) == (7.0, 8.0, 9.0)
    assert store.view().series("k") == (7.0, 8.0, 9.0)


def test_a_view_shows_history_as_of_its_snapshot() -> None:
    store = HistoryStore(capacity=4)
    key = ("gpu", "GPU-1", "power_w")
    store.record([(key, 1.0), (key, 2.0)])
    view = store.view()
    store.record([(key, 3.0)])
    assert view.series(*key) == (1.0, 2.0)
    assert store.view().series(*key) == (1.0, 2.0, 3.0)
    assert view.series("gpu", "GPU-2", "power_w") == ()


def test_a_view_older_than_the_ring_loses_what_was_overwritten() -> None:
    store = HistoryStore(capacity=2)
    key = ("k",)
    store.record([(key, 1.0), (key, 2.0)])
    view = store.view()
    store.record([(key, 3.0)])
    assert view.series(*key) == (2.0,)


def test_a_thousand_nodes_of_history_fit_in_under_50_mb() -> None:
    """A head at 1,000 agents keeps some forty series a node, 300 points each: 4 bytes a
    point, and gauges read back as they were written to 7 digits."""
    store = HistoryStore(capacity=300)
    keys = [("gpu", f"GPU-{i}", "power_w") for i in range(40)]
    store.record((key, 251.875) for key in keys)
    store.record((key, 123.456) for key in keys)
    assert store.nbytes * 1000 < 50e6
    assert store.view().series(*keys[0])[0] == 251.875
    assert abs(store.view().series(*keys[0])[1] - 123.456) < 123.456e-7
