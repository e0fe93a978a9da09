"""The one way benchmarks time things: CPU time per call, in microseconds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def cpu_us(fn: Callable[[], Any], rounds: int) -> list[float]:
    """CPU time of each of `rounds` calls of `fn`, in microseconds."""
    samples = []
    for _ in range(rounds):
        began = time.process_time_ns()
        fn()
        samples.append((time.process_time_ns() - began) / 1000.0)
    return samples
