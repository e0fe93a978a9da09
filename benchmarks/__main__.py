"""Run every benchmark in turn and print its figures, then the headline figures in one table."""

from __future__ import annotations

import importlib
import platform
import sys
from pathlib import Path

from benchmarks.timing import FIGURES, summary

BENCHES = sorted(f"benchmarks.{path.stem}" for path in Path(__file__).parent.glob("bench_*.py"))


def main() -> int:
    print(
        f"gpuconsole benchmarks on {platform.node()} ({platform.machine()}, "
        f"Python {platform.python_version()})\n"
    )
    for name in BENCHES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            print(f"{name}: not available ({exc})\n")
            continue
        module.main()
        print()
    # each benchmark keeps its headline figures with benchmarks.timing.record()
    print("Summary (medians; ratios from peers measured in the same run)")
    print(summary() if FIGURES else "  no benchmark recorded a headline figure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
