"""The OpenSSH client renders the console: `ssh` under tmux, read back with capture-pane;
directly, and through a jump host (ProxyJump)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import asyncssh
import pytest

from gpuconsole.sim.cluster import demo_hub
from gpuconsole.ssh.server import ConsoleServer, console_factory
from gpuconsole.wiring import SshSettings
from tests.peers import require_program
from tests.waiting import until

pytestmark = pytest.mark.peer("openssh")


class Tmux:
    """A private tmux server (its own socket) with one window at a fixed size."""

    def __init__(self, tmux: str, folder: Path) -> None:
        self.base = [tmux, "-S", str(folder / "tmux.sock"), "-f", "/dev/null"]

    async def run(self, *args: str) -> str:
        done = await asyncio.to_thread(
            subprocess.run, [*self.base, *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout

    async def start(self, command: str) -> None:
        await self.run("new-session", "-d", "-s", "t", "-x", "120", "-y", "40", command)

    async def screen(self) -> str:
        return await self.run("capture-pane", "-p", "-t", "t")

    async def wait_for(self, *needles: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = await self.screen()
            if all(n in text for n in needles):
                return text
            await asyncio.sleep(0.2)
        raise AssertionError(f"{needles} never appeared; the pane:\n{text}")

    async def alive(self) -> bool:
        return "t" in (await self.run("list-sessions", "-F", "#{session_name}")).split()

    async def stop(self) -> None:
        await self.run("kill-server")


class JumpHost(asyncssh.SSHServer):
    """A bastion that lets any key in and forwards TCP (what ProxyJump asks of it), noting
    where to."""

    forwarded: ClassVar[list[tuple[str, int]]] = []

    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return True

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> bool:
        self.forwarded.append((dest_host, dest_port))
        return dest_host == "127.0.0.1"


@contextlib.asynccontextmanager
async def openssh_setup(tmp_path: Path) -> AsyncIterator[tuple[ConsoleServer, Path, Tmux]]:
    ssh = require_program("ssh", "apt install openssh-client")
    tmux_path = require_program("tmux", "apt install tmux")
    key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "id_ed25519"
    key_file.write_bytes(key.export_private_key())
    key_file.chmod(0o600)
    (tmp_path / "authorized_keys").write_text(f"role=operator {key.export_public_key().decode()}")
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host *\n"
        f"  IdentityFile {key_file}\n  IdentitiesOnly yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        "  BatchMode yes\n"
    )
    hub = demo_hub(nodes=3, events=False, bmc=False, fabric=False, tenancy=False)
    settings = SshSettings(
        host="127.0.0.1",
        port=0,
        host_key=tmp_path / "host_key",
        authorized_keys=tmp_path / "authorized_keys",
        idle_timeout_s=0,
    )
    make = console_factory(hub, theme=None, wallboard_theme=None, page_s=15, theme_dirs=[])
    server = ConsoleServer(hub, settings, make)
    tmux = Tmux(tmux_path, tmp_path)
    await server.start()
    try:
        yield server, Path(ssh), tmux
    finally:
        await tmux.stop()
        await server.stop()


async def quit_and_wait(server: ConsoleServer, tmux: Tmux) -> None:
    """Press q; the session ends, and with it ssh and the tmux window."""
    await tmux.run("send-keys", "-t", "t", "q")
    deadline = time.monotonic() + 10
    while await tmux.alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not await tmux.alive()
    await until(lambda: not server.sessions)


async def test_openssh_under_tmux_renders_the_console(tmp_path: Path) -> None:
    async with openssh_setup(tmp_path) as (server, ssh, tmux):
        await tmux.start(f"{ssh} -F {tmp_path / 'ssh_config'} -t -p {server.port} ops@127.0.0.1")
        pane = await tmux.wait_for("Fleet", "dgx-002", "dgx-003", "cells: util %")
        assert "SIMULATED" in pane
        [session] = server.sessions
        assert session.app.size == (120, 40)
        await tmux.run("send-keys", "-t", "t", "m")  # a key reaches the app through OpenSSH
        await tmux.wait_for("cells: temp")
        await quit_and_wait(server, tmux)


async def test_openssh_reaches_the_console_through_a_jump_host(tmp_path: Path) -> None:
    JumpHost.forwarded.clear()
    jump_key = asyncssh.generate_private_key("ssh-ed25519")
    jump = await asyncssh.create_server(JumpHost, "127.0.0.1", 0, server_host_keys=[jump_key])
    jump_port = jump.sockets[0].getsockname()[1]
    try:
        async with openssh_setup(tmp_path) as (server, ssh, tmux):
            await tmux.start(
                f"{ssh} -F {tmp_path / 'ssh_config'} -t -J bastion@127.0.0.1:{jump_port} "
                f"-p {server.port} ops@127.0.0.1"
            )
            await tmux.wait_for("Fleet", "dgx-002")
            # the console came through the bastion, not straight to the port
            assert JumpHost.forwarded == [("127.0.0.1", server.port)]
            await tmux.run("send-keys", "-t", "t", "e")
            await tmux.wait_for("\u203a Events")  # the breadcrumb, not the footer key
            await quit_and_wait(server, tmux)
    finally:
        jump.close()
        await jump.wait_closed()
