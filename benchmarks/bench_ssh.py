"""The ssh console under load: 20 concurrent sessions on the node view at 120x40, the
simulated cluster polled at 1 Hz, one server process.

Prints how long an ssh login takes to reach the fleet view with a reading drawn (the
server's first session, which may pay for what the server left to it, and the median of
the next LOGINS; target 1.5 s), the server's CPU (share of one core), its memory per
session, keystroke-to-screen latency (median, p95) and bytes sent per session per second
(median). Targets: 20 sessions within one core; at most 10 KB/s per session for the node
view. The server runs in a child process so that the clients' own work is not counted.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.bench_start import child_env
from benchmarks.timing import record

SESSIONS = 20
SIZE = (120, 40)
TARGET_CPU_PCT = 100.0  # twenty sessions within one core
TARGET_BYTES_PER_S = 10_000.0  # per session, the node view at 120x40
WINDOW_S = 20.0
LATENCY_ROUNDS = 2
LOGINS = 5
TARGET_LOGIN_S = 1.5


# --- the server (child process) -------------------------------------------------------


async def _serve(folder: Path) -> None:
    from gpuconsole.sim.cluster import demo_hub
    from gpuconsole.ssh.server import ConsoleServer, console_factory
    from gpuconsole.wiring import SshSettings

    hub = demo_hub(interval_s=1.0)
    settings = SshSettings(
        host="127.0.0.1",
        port=0,
        host_key=folder / "host_key",
        authorized_keys=folder / "authorized_keys",
        idle_timeout_s=0,
        max_sessions=SESSIONS * 2,
        max_sessions_per_key=SESSIONS,  # one key opens them all
    )
    make = console_factory(hub, theme=None, wallboard_theme=None, page_s=15, theme_dirs=[])
    server = ConsoleServer(hub, settings, make)
    await server.start()
    (folder / "port").write_text(str(server.port))
    await asyncio.to_thread(sys.stdin.read)  # until the parent closes our stdin
    await server.stop()


def serve(folder: str) -> None:
    """Entry point of the child process."""
    asyncio.run(_serve(Path(folder)))


# --- /proc readings -------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# --- the clients ----------------------------------------------------------------------


def _client_class() -> type[Any]:
    import asyncssh
    import pyte

    class Terminal(asyncssh.SSHClientSession[bytes]):  # type: ignore[misc]
        """A pyte screen fed by the session; `expect` resolves when a line matches."""

        def __init__(self) -> None:
            self.screen = pyte.Screen(*SIZE)
            self.stream = pyte.ByteStream(self.screen)
            self.received = 0
            self.chan: Any = None
            self._waiting: tuple[Callable[[str], bool], asyncio.Future[float]] | None = None

        def connection_made(self, chan: Any) -> None:
            self.chan = chan

        def data_received(self, data: bytes, datatype: Any) -> None:
            self.received += len(data)
            self.stream.feed(data)
            if self._waiting is not None:
                check, future = self._waiting
                if check(self.screen.display[0]) and not future.done():
                    future.set_result(time.perf_counter())
                    self._waiting = None

        # generous: twenty sessions painting at once on a busy shared box can take a while
        async def expect(self, check: Callable[[str], bool], timeout: float = 60.0) -> float:
            if check(self.screen.display[0]):
                return time.perf_counter()
            future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            self._waiting = (check, future)
            return await asyncio.wait_for(future, timeout)

        async def expect_screen(self, check: Callable[[str], bool], timeout: float = 60.0) -> float:
            """When some line of the screen first matches."""
            return await self.expect(
                lambda _top: any(check(line) for line in self.screen.display), timeout
            )

    return Terminal


async def _logins(port: int, key: Any, terminal: type[Any], count: int) -> list[float]:
    """Logins one after the other, each timed from the connect to dgx-001's row with its
    model (a reading drawn in the fleet view); the first is the server's first session."""
    import asyncssh

    logins: list[float] = []
    for _ in range(count):
        began = time.perf_counter()
        conn = await asyncssh.connect(
            "127.0.0.1", port, username="bench", client_keys=[key], known_hosts=None
        )
        _, term = await conn.create_session(
            terminal, term_type="xterm-256color", term_size=SIZE, encoding=None
        )
        drawn = await term.expect_screen(lambda line: "dgx-001" in line and "H100" in line)
        logins.append(drawn - began)
        conn.close()
        await conn.wait_closed()
        await asyncio.sleep(0.5)
    return logins


async def _measure(folder: Path, pid: int) -> dict[str, float]:
    import asyncssh

    key = asyncssh.read_private_key(folder / "client_key")
    port = int((folder / "port").read_text())
    terminal = _client_class()
    await asyncio.sleep(5)  # the hub's first polls, and the sources' start

    logins = await _logins(port, key, terminal, 1 + LOGINS)
    rss_before = _rss_bytes(pid)

    conns = []
    terms: list[Any] = []  # the Terminal class is made at run time: asyncssh is optional
    for _ in range(SESSIONS):
        conn = await asyncssh.connect(
            "127.0.0.1", port, username="bench", client_keys=[key], known_hosts=None
        )
        _, term = await conn.create_session(
            terminal, term_type="xterm-256color", term_size=SIZE, encoding=None
        )
        conns.append(conn)
        terms.append(term)
    for term in terms:
        await term.expect(lambda line: "Fleet" in line)
        term.chan.write(b"\r")  # Enter: the first node's view
    for term in terms:
        await term.expect(lambda line: "dgx-" in line)  # the node name in the top line
    await asyncio.sleep(3)

    cpu0, wall0 = _cpu_s(pid), time.perf_counter()
    bytes0 = [t.received for t in terms]
    await asyncio.sleep(WINDOW_S)
    cpu1, wall1 = _cpu_s(pid), time.perf_counter()
    rates = [(t.received - b) / (wall1 - wall0) for t, b in zip(terms, bytes0, strict=True)]
    rss_after = _rss_bytes(pid)

    # One user types while the other 19 watch: each session in turn opens the events view
    # (its name appears in the top line) and goes back.
    latencies: list[float] = []
    for _ in range(LATENCY_ROUNDS):
        for term in terms:
            began = time.perf_counter()
            term.chan.write(b"e")
            latencies.append(await term.expect(lambda line: "Events" in line) - began)
            term.chan.write(b"\x1b")
            await term.expect(lambda line: "Events" not in line)
            await asyncio.sleep(0.05)
    for conn in conns:
        conn.close()
    latencies.sort()
    return {
        "cpu_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0),
        "rss_per_session": (rss_after - rss_before) / SESSIONS,
        "rss_total": rss_after,
        "latency_median_ms": 1000 * statistics.median(latencies),
        "latency_p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "bytes_per_s": statistics.median(rates),
        "bytes_per_s_max": max(rates),
        "first_login_s": logins[0],
        "login_s": statistics.median(logins[1:]),
    }


def main() -> None:
    try:
        import asyncssh
        import pyte  # noqa: F401 - the clients' terminal
    except ImportError as exc:
        print(f"ssh: not available ({exc})")
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        key = asyncssh.generate_private_key("ssh-ed25519")
        (folder / "client_key").write_bytes(key.export_private_key())
        public = key.export_public_key().decode()
        (folder / "authorized_keys").write_text(f"role=operator {public}")
        root = Path(__file__).resolve().parent.parent
        child = subprocess.Popen(
            [sys.executable, "-c", f"from benchmarks.bench_ssh import serve; serve({tmp!r})"],
            cwd=root,
            env=child_env(),
            stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not (folder / "port").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            got = asyncio.run(_measure(folder, child.pid))
        finally:
            assert child.stdin is not None
            child.stdin.close()
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"ssh console: {SESSIONS} sessions, node view at {SIZE[0]}x{SIZE[1]}, 1 Hz, "
        f"{WINDOW_S:g} s window (load {load})"
    )
    login_met = max(got["first_login_s"], got["login_s"]) <= TARGET_LOGIN_S
    print(
        f"  login to fleet view: {got['first_login_s']:6.2f} s the server's first, "
        f"{got['login_s']:.2f} s median of the next {LOGINS}   "
        f"(target <= {TARGET_LOGIN_S:g} s: {_verdict(login_met)})"
    )
    record("ssh: login to fleet view", got["first_login_s"], "s", at_most=TARGET_LOGIN_S)
    cpu_met = got["cpu_pct"] < TARGET_CPU_PCT
    print(
        f"  server CPU:          {got['cpu_pct']:6.1f}% of one core   "
        f"(target < {TARGET_CPU_PCT:g}%: {_verdict(cpu_met)})"
    )
    print(
        f"  memory per session:  {got['rss_per_session'] / 2**20:6.1f} MiB"
        f"   (server RSS {got['rss_total'] / 2**20:.0f} MiB)"
    )
    print(
        f"  keystroke to screen: {got['latency_median_ms']:6.1f} ms median, "
        f"{got['latency_p95_ms']:.1f} ms p95"
    )
    bytes_met = got["bytes_per_s_max"] <= TARGET_BYTES_PER_S
    print(
        f"  bytes per session:   {got['bytes_per_s'] / 1000:6.2f} KB/s median, "
        f"{got['bytes_per_s_max'] / 1000:.2f} KB/s max   "
        f"(target <= {TARGET_BYTES_PER_S / 1000:g} KB/s: {_verdict(bytes_met)})"
    )


def _verdict(met: bool) -> str:
    return "target met" if met else "TARGET MISSED"


if __name__ == "__main__":
    main()
