"""What the fuzz tests share: their hypothesis settings, strategies for any JSON
value, and a change in one random place of a JSON document."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

Json = Any


def fuzz_settings(max_examples: int, *also_suppress: HealthCheck) -> settings:
    """Settings for a fuzz test: `max_examples` runs, replayable, without deadline or database."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, *also_suppress],
    )


FINITE = st.floats(allow_nan=False, allow_infinity=False)


def scalars(text: st.SearchStrategy[str]) -> st.SearchStrategy[Json]:
    """Any JSON scalar, with strings drawn from `text`."""
    return st.none() | st.booleans() | st.integers() | FINITE | text


def json_trees(
    leaves: st.SearchStrategy[Json], keys: st.SearchStrategy[str], max_leaves: int = 8
) -> st.SearchStrategy[Json]:
    """Any JSON value built of `leaves`, in lists and objects keyed by `keys`."""
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
        max_leaves=max_leaves,
    )


TREES = json_trees(scalars(st.text(max_size=12)), st.text(max_size=8))


def walk(draw: st.DrawFn, holder: Json, key: Json, stop_one_in: int) -> tuple[Json, Json]:
    """From `holder[key]` down into random children, until a scalar or (one time in
    `stop_one_in`) sooner: the holder and key of the place it stopped at."""
    while True:
        value = holder[key]
        children = (
            list(value)
            if isinstance(value, dict)
            else list(range(len(value)))
            if isinstance(value, list)
            else []
        )
        if not children or draw(st.integers(0, stop_one_in - 1)) == 0:
            return holder, key
        holder, key = value, draw(st.sampled_from(children))


def change_one_place(
    draw: st.DrawFn,
    root: dict[Any, Json],
    key: Json,
    stop_one_in: int,
    new: Callable[[Json], st.SearchStrategy[Json]],
) -> None:
    """Walk from `root[key]` to a random place and remove it (a key of an object below
    `root`) or replace its value with one drawn from `new(old value)`."""
    holder, key = walk(draw, root, key, stop_one_in)
    if holder is not root and isinstance(holder, dict) and draw(st.booleans()):
        del holder[key]
    else:
        holder[key] = draw(new(holder[key]))
