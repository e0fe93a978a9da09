"""`gpuconsole agent --guest`: inside a KVM guest, tell the host what NVML reads of the GPUs
passed through to it, and nothing else.

Read-only and NVML only: the guest's hub runs the NVML source alone; there is no action, no
HTTP, no config from the host. It answers on a virtio-vsock port (the host reaches it by the
guest's context id, without any guest network), or on a unix socket, the same bytes: what a
test or a virtio-serial bridge uses. The protocol and what `share` leaves out are in
`gpuconsole.sources.tenancy.guest_agent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterable

from gpuconsole.hub import Hub
from gpuconsole.readings.nvml import NvmlReading
from gpuconsole.sources.tenancy.guest_agent import REQUEST, guest_answer

__all__ = ["GuestAgent", "serve_guest"]

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0
MAX_CLIENTS = 8  # one host asks; a few at once is plenty


class GuestAgent:
    """Answers the host's requests from the hub's latest NVML reading."""

    def __init__(self, hub: Hub, share: Iterable[str]) -> None:
        self.hub = hub
        self.share = frozenset(share)
        self._server: asyncio.AbstractServer | None = None
        self._clients = asyncio.Semaphore(MAX_CLIENTS)

    def reading(self) -> NvmlReading | None:
        snapshot = self.hub.latest
        if snapshot is None or not snapshot.nodes:
            return None
        return snapshot.nodes[0].nvml

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._clients.locked():
            writer.close()
            return
        async with self._clients:
            try:
                line = await asyncio.wait_for(reader.readuntil(b"\n"), REQUEST_TIMEOUT_S)
                if line == REQUEST:
                    reading = self.reading()
                    if reading is not None:
                        writer.write(guest_answer(reading, self.share))
                        await writer.drain()
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass  # not our host, or gone: nothing to answer
            except OSError as exc:
                log.debug("guest agent: answering failed: %s", exc)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def start_vsock(self, port: int) -> None:
        """Listen on the guest's vsock port, for the host (context id 2) to connect."""
        family = getattr(socket, "AF_VSOCK", None)
        if family is None:
            raise OSError("this Python has no AF_VSOCK")
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((getattr(socket, "VMADDR_CID_ANY", 0xFFFFFFFF), port))
            sock.listen(MAX_CLIENTS)
        except OSError:
            sock.close()
            raise
        self._server = await asyncio.start_server(self._handle, sock=sock, limit=256)

    async def start_unix(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._server = await asyncio.start_unix_server(self._handle, path, limit=256)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


async def serve_guest(hub: Hub, share: Iterable[str], *, port: int, unix: str | None) -> None:
    """Run the guest's NVML hub and answer the host until cancelled."""
    agent = GuestAgent(hub, share)
    try:
        if unix is not None:
            await agent.start_unix(unix)
        else:
            await agent.start_vsock(port)
        await hub.start()
        await asyncio.Event().wait()
    finally:
        await agent.stop()
        await hub.stop()
