"""The agent's HTTP server tried as an attacker would: connections held half-sent,
requests that are not HTTP, credentials in any bytes. It keeps answering scrapes and says
each cause once, never a traceback per client."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import resource
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuconsole.config import ConfigError
from gpuconsole.export.agent import WATCHES_PER_PEER, Agent
from gpuconsole.hub import Hub
from gpuconsole.readings.agents import WATCH_TYPE
from gpuconsole.wiring import AgentSettings
from tests.bmc_fixtures import free_port
from tests.peers import require_program

# The systemd default: 1,024 descriptors, and the attack that filled them: 1,100 half-sent
# requests. Here the same proportion on a smaller scale, so the test stays fast.
FDS = 128
HALF_SENT = FDS * 1100 // 1024


def scrape(url: str, timeout: float, context: ssl.SSLContext | None = None) -> tuple[int, float]:
    """(status, seconds) of one GET; status 0 when it did not answer in `timeout`."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            response.read()
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = 0
    return status, time.monotonic() - started


# What a slow client sends and then holds: the start of a request's headers, or (to a TLS
# agent) the first bytes of a TLS record, its handshake never finished.
STALLED = {
    "http": b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
    "https": b"\x16\x03\x01",
}


def stalled(port: int, scheme: str) -> socket.socket | None:
    """A connection that starts and never finishes (None when turned away at once)."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        sock.sendall(STALLED[scheme])
    except OSError:
        return None
    sock.setblocking(False)
    return sock


def still_open(sock: socket.socket) -> bool:
    """Whether the server still holds this connection (as a slowloris finds out)."""
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


@dataclass
class FewFds:
    """An agent process with FDS descriptors: where it listens and where it logs."""

    url: str
    port: int
    log: Path
    context: ssl.SSLContext | None


@pytest.fixture(params=["http", "https"])
def agent_with_few_fds(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FewFds]:
    """`gpuconsole agent --demo` in a process of its own with FDS descriptors."""
    scheme = request.param
    port = free_port()
    log = tmp_path / "agent.log"
    config = tmp_path / "config.toml"
    context = None
    if scheme == "https":
        files = request.getfixturevalue("tls_files")
        config.write_text(f'[agent]\ntls_cert = "{files["cert"]}"\ntls_key = "{files["key"]}"\n')
        context = ssl.create_default_context(cafile=str(files["cert"]))
        context.check_hostname = False
    else:
        config.write_text("")

    def few_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FDS, FDS))

    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuconsole", "agent", "--demo", "--nodes", "1",
             "-c", str(config), "--listen", f"127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=few_fds,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path)},
        )  # fmt: skip
    url = f"{scheme}://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while scrape(f"{url}/-/healthy", 1, context)[0] != 200:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the agent did not start"
            time.sleep(0.1)
        yield FewFds(url, port, log, context)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_scrapes_answer_while_more_stalled_connections_are_held_than_there_are_fds(
    agent_with_few_fds: FewFds,
) -> None:
    agent = agent_with_few_fds
    scheme = agent.url.partition(":")[0]
    held: list[socket.socket] = []
    answers = []
    try:
        for _ in range(3):
            # the attacker keeps its count up: each connection the agent closed, it opens again
            for sock in held:
                if not still_open(sock):
                    sock.close()
            held = [sock for sock in held if sock.fileno() != -1]
            while len(held) < HALF_SENT:
                sock = stalled(agent.port, scheme)
                if sock is None:
                    break
                held.append(sock)
            answers.append(scrape(f"{agent.url}/metrics", 2.0, agent.context))
    finally:
        for sock in held:
            sock.close()
    assert all(status == 200 and took < 2.0 for status, took in answers), answers
    lines = agent.log.read_text(errors="replace").splitlines()
    assert len(lines) < 20, "\n".join(lines[:40])
    assert not any("Traceback" in line for line in lines)


@pytest.fixture
async def guarded_agent() -> AsyncIterator[Agent]:
    hub = Hub()
    hub.add_node("dgx-017")
    await hub.poll_once()
    server = Agent(
        hub, AgentSettings(port=0, basic_auth_user="prom", basic_auth_password="pässwörd")
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def status_of(port: int, raw: bytes) -> int:
    """The status line's code the agent answers `raw` (a whole request) with."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 5)
        return int(line.split()[1])
    finally:
        writer.close()


def authorization(credentials: bytes) -> bytes:
    return b"Authorization: Basic " + base64.b64encode(credentials) + b"\r\n"


def get(path: str, *headers: bytes) -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + b"".join(headers) + b"\r\n"


async def test_basic_auth_takes_a_non_ascii_password_and_refuses_any_other(
    guarded_agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    port = guarded_agent.port
    assert port is not None
    with caplog.at_level(logging.DEBUG):
        right = await status_of(port, get("/metrics", authorization("prom:pässwörd".encode())))
        latin1 = await status_of(
            port, get("/metrics", authorization("prom:pässwörd".encode("latin-1")))
        )
        wrong = await status_of(port, get("/metrics", authorization(b"prom:wrong")))
        stranger = await status_of(port, get("/metrics", authorization("prøm:x".encode())))
        not_utf8 = await status_of(port, get("/metrics", authorization(b"\xff\xfe:\x80")))
        raw_header = await status_of(
            port, get("/metrics", "Authorization: Basic p\xe4ss\r\n".encode())
        )
    assert (right, latin1, wrong, stranger, not_utf8, raw_header) == (200, 401, 401, 401, 401, 401)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_flood_of_bad_requests_is_one_line_in_the_log(
    guarded_agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    port = guarded_agent.port
    assert port is not None
    with caplog.at_level(logging.DEBUG):
        answers = [
            await status_of(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
            for _ in range(50)
        ]
    assert answers == [400] * 50
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and said[0].exc_info is None, [r.getMessage() for r in said]
    assert "(and" not in said[0].getMessage()  # held back until the minute is over


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A certificate with its key, another key, an encrypted key and a file of garbage."""
    openssl = require_program("openssl", "apt-get install openssl")
    folder = tmp_path_factory.mktemp("tls")
    files = {name: folder / f"{name}.pem" for name in ("cert", "key", "other", "encrypted")}

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(files["key"]),
        "-out", str(files["cert"]), "-days", "1", "-subj", "/CN=127.0.0.1")  # fmt: skip
    run("genrsa", "-out", str(files["other"]), "2048")
    run("genrsa", "-aes128", "-passout", "pass:secret", "-out", str(files["encrypted"]), "2048")
    files["garbage"] = folder / "garbage.pem"
    files["garbage"].write_text("this is not a key\n")
    files["missing"] = folder / "missing.pem"
    return files


@pytest.mark.parametrize("key", ["missing", "garbage"])
def test_the_agent_names_a_tls_key_it_cannot_use(
    tmp_path: Path, tls_files: dict[str, Path], key: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[agent]\nlisten = "127.0.0.1:{free_port()}"\n'
        f'tls_cert = "{tls_files["cert"]}"\ntls_key = "{tls_files[key]}"\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "agent", "--demo", "-c", str(config)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"[agent] tls_key {tls_files[key]}:" in result.stderr
    assert "cannot listen" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("cert", "key", "said"),
    [
        ("missing", "key", "tls_cert {missing}: cannot read: No such file or directory"),
        ("garbage", "key", "tls_cert {garbage}: holds no PEM certificate"),
        ("key", "key", "tls_cert {key}: holds no PEM certificate"),
        ("cert", "missing", "tls_key {missing}: cannot read: No such file or directory"),
        ("cert", "garbage", "tls_key {garbage}: holds no PEM private key"),
        ("cert", "cert", "tls_key {cert}: holds no PEM private key"),
        ("cert", "other", "tls_key {other}: not the key of tls_cert {cert}"),
        (
            "cert",
            "encrypted",
            "tls_key {encrypted}: the key is encrypted; give the agent an unencrypted key "
            "(mode 0600)",
        ),
    ],
)
def test_what_is_wrong_with_a_tls_file_is_said_with_its_name(
    tls_files: dict[str, Path], cert: str, key: str, said: str
) -> None:
    from gpuconsole.export.agent import tls_context

    settings = AgentSettings(tls_cert=tls_files[cert], tls_key=tls_files[key])
    with pytest.raises(ConfigError) as error:
        tls_context(settings)
    assert str(error.value) == "[agent] " + said.format(**tls_files)


def test_every_server_unit_raises_the_descriptor_limit() -> None:
    units = sorted((Path(__file__).parents[2] / "contrib" / "systemd").glob("*.service"))
    assert units
    for unit in units:
        text = unit.read_text()
        limits = [line for line in text.splitlines() if line.startswith("LimitNOFILE=")]
        assert limits and int(limits[0].partition("=")[2]) >= 8192, unit.name


async def test_a_peer_past_its_share_of_watches_is_answered_as_a_poll_and_scrapes_still_answer(
    guarded_agent: Agent,
) -> None:
    """A watch holds its connection as long as its head runs: a peer that opens more than
    its share gets plain answers (a head then polls), and the agent's connections stay
    free for scrapes and other heads."""
    port = guarded_agent.port
    assert port is not None
    auth = authorization("prom:pässwörd".encode())
    held: list[asyncio.StreamWriter] = []
    kinds: list[bytes] = []
    try:
        for _ in range(WATCHES_PER_PEER + 2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            held.append(writer)
            writer.write(get("/api/v1/snapshot?view=summary&watch=1", auth))
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            kinds.append(next(line for line in head.split(b"\r\n") if b"Content-Type" in line))
        assert kinds[:WATCHES_PER_PEER] == [b"Content-Type: " + WATCH_TYPE.encode()] * 4
        assert all(b"application/json" in kind for kind in kinds[WATCHES_PER_PEER:]), kinds
        status, _ = await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/-/healthy", 5)
        assert status == 200
    finally:
        for writer in held:
            writer.close()
