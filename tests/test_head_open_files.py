"""A head that watches its agents holds a connection open per agent: it raises its own
limit on open files as far as that needs, and where the hard limit is short it polls the
agents past it (saying so), rather than letting them go stale on "Too many open files"."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# Each case runs in a child: a lowered hard limit cannot be raised again in this process.
_CHILD = textwrap.dedent(
    """
    import json, logging, resource, sys
    from gpuconsole.wiring import watch_slots
    soft, hard = (int(v) for v in sys.argv[1:3])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("gpuconsole.wiring").addHandler(handler)
    slots = watch_slots(1000, 64)
    print(json.dumps({"slots": slots, "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                      "logged": logged}))
    """
)


def _child(soft: int, hard: int) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(soft), str(hard)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_head_of_a_thousand_agents_raises_a_soft_limit_of_1024_and_watches_them_all() -> None:
    got = _child(1024, 4096)
    assert got == {"slots": 1000, "soft": 1000 + 64 + 256, "logged": []}


def test_a_hard_limit_too_low_for_every_watch_polls_the_rest_and_says_how_to_raise_it() -> None:
    got = _child(512, 1024)
    assert got["soft"] == 1024
    assert got["slots"] == 1024 - 64 - 256
    (message,) = got["logged"]  # type: ignore[misc]
    assert "704 of 1000 agents are read through a watch, the rest polled" in message
    assert "LimitNOFILE=" in message
