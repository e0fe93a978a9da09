"""An IPMI BMC's answers as untrusted input: whatever comes back on the wire, the BMC's
status says what went wrong in words, never a Python error from inside the IPMI client."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from gpuconsole.hub import Hub
from gpuconsole.sources.bmc import BmcSource, BmcTarget, open_link


@contextlib.contextmanager
def answering(reply: bytes) -> Iterator[int]:
    """A UDP port on 127.0.0.1 that answers every datagram with `reply`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                _data, sender = sock.recvfrom(4096)
            except TimeoutError:
                continue
            sock.sendto(reply, sender)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        sock.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"\x06\x00\xff\x07\x00",  # RMCP, an IPMI 1.5 session header cut after its auth type
        b"\x06\x00\xff\x07\x00\x00\x00\x00\x00",  # cut inside its sequence number
    ],
)
def test_a_cut_short_answer_is_said_to_be_unreadable(reply: bytes) -> None:
    with answering(reply) as port:
        target = BmcTarget("dgx-017", "127.0.0.1", "ipmi", port, "admin", "pw")
        hub = Hub()
        hub.add_source(BmcSource("dgx-017", open_link(target), timeout_s=10))
        snapshot = asyncio.run(hub.poll_once())
    status = snapshot.nodes[0].status("bmc")
    assert status is not None and not status.ok
    assert status.error == (
        f"BmcError: ipmi://127.0.0.1:{port}: an answer the IPMI client could not read "
        "(unpack requires a buffer of 4 bytes)"
    )
