"""Waiting for a condition in an async test, bounded, instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Return once `predicate()` holds; fail the test if it does not within `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
