"""Run every benchmark in turn and print its figures."""

from __future__ import annotations

import importlib
import platform
import sys
from pathlib import Path

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
