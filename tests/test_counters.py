"""Counters become rates in one place: wrap, reset and vanished counters."""

from gpuconsole.counters import RateTracker, counter_delta
from gpuconsole.readings.base import CounterSample


def test_a_counter_that_moves_forward_gives_its_delta() -> None:
    assert counter_delta(100, 250, 64) == 150


def test_a_32_bit_counter_that_wraps_is_followed_across_the_wrap() -> None:
    assert counter_delta(2**32 - 10, 5, 32) == 15


def test_a_counter_that_drops_far_is_a_reset_not_a_wrap() -> None:
    assert counter_delta(1_000_000, 10, 32) is None
    assert counter_delta(2**40, 10, 64) is None


def test_rates_are_per_second_and_resets_are_skipped_and_counted() -> None:
    tracker = RateTracker()
    key = ("port", "mlx5_0", "1", "rcv_bytes")
    assert tracker.update([CounterSample(key, 1000, 32)], at=10.0) == {}
    assert tracker.update([CounterSample(key, 5000, 32)], at=12.0) == {key: 2000.0}
    assert tracker.update([CounterSample(key, 7, 32)], at=13.0) == {}
    assert tracker.resets == 1
    assert tracker.update([CounterSample(key, 107, 32)], at=14.0) == {key: 100.0}


def test_a_counter_that_vanishes_and_returns_starts_afresh() -> None:
    tracker = RateTracker()
    a, b = ("a",), ("b",)
    tracker.update([CounterSample(a, 0), CounterSample(b, 0)], at=0.0)
    tracker.update([CounterSample(a, 10)], at=1.0)
    assert tracker.update([CounterSample(a, 20), CounterSample(b, 500)], at=2.0) == {a: 10.0}


def test_deltas_are_kept_for_counters_that_ask_and_only_when_they_moved() -> None:
    tracker = RateTracker()
    errors, data, quiet = ("symbol_error",), ("xmit_data",), ("link_downed",)

    def sample(err: int, sent: int, downed: int) -> list[CounterSample]:
        return [
            CounterSample(errors, err, 32, delta=True),
            CounterSample(data, sent, 64),
            CounterSample(quiet, downed, 32, delta=True),
        ]

    tracker.update(sample(2**32 - 3, 0, 4), at=10.0)
    assert tracker.deltas == {} and tracker.interval_s is None  # nothing to compare yet
    rates = tracker.update(sample(5, 9000, 4), at=12.0)  # wrapped past 2^32
    assert tracker.deltas == {errors: 8}  # not the data counter, not the one that stood
    assert tracker.interval_s == 2.0 and rates[errors] == 4.0 and rates[quiet] == 0.0
    tracker.update(sample(1, 9000, 4), at=13.0)  # a reset: no delta rather than a bogus one
    assert tracker.deltas == {} and tracker.resets == 1
