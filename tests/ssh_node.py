"""A node reached over ssh, for the tests of remote actions: a minimal sshd on 127.0.0.1 (an
asyncssh server in a thread of the test process, with its own host key and one authorized
key) whose sessions run the requested command in a shell, as sshd does (with `--demo` added,
like a ForceCommand wrapper, so that the node's executor acts on the simulator under the
test's state folder); and a head's config that reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
import pytest

from gpuconsole.actions.over_ssh import SshTarget

__all__ = [
    "NODE",
    "NODE_COMMAND",
    "ExecServer",
    "Keys",
    "head_config",
    "known_line",
    "make_keys",
    "node_target",
    "serve_node",
]

NODE = "dgx-003"  # of the demo cluster
NODE_COMMAND = f"{shlex.quote(sys.executable)} -m gpuconsole"


@dataclass
class ExecServer:
    """An sshd-like exec server: public-key login, each session's command run by a shell,
    its output relayed line by line; `drop_after_step` cuts the connection once the first
    step is done, as a network failure would, and stops reading the command's output."""

    state: Path  # the node's XDG_STATE_HOME: its simulated worlds, journal and audit log
    host_key: asyncssh.SSHKey
    authorized: asyncssh.SSHKey
    drop_after_step: bool = False
    # a node that is not the simulator: its command runs as it is (no --demo), after `wrap`
    # (an environment, another user: what a login on a real node gets)
    demo: bool = True
    wrap: str = ""
    port: int = 0
    commands: list[str] = field(default_factory=list)
    children: list[asyncio.subprocess.Process] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _thread: threading.Thread | None = None
    _acceptor: asyncssh.SSHAcceptor | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop.close()

    def wait_children(self, timeout: float = 20.0) -> list[int | None]:
        """Wait for every command the server ran to exit; their exit statuses."""

        async def wait() -> list[int | None]:
            return [await asyncio.wait_for(c.wait(), timeout) for c in self.children]

        return asyncio.run_coroutine_threadsafe(wait(), self._loop).result(timeout + 5)

    async def _listen(self) -> None:
        self._acceptor = await asyncssh.listen(
            "127.0.0.1",
            0,
            server_host_keys=[self.host_key],
            authorized_client_keys=asyncssh.import_authorized_keys(
                self.authorized.export_public_key().decode()
            ),
            process_factory=self._session,
            encoding=None,
        )
        self.port = self._acceptor.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        assert self._acceptor is not None
        self._acceptor.close()
        await self._acceptor.wait_closed()
        for child in self.children:
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()

    async def _session(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        command = process.command or ""
        self.commands.append(command)
        # what sshd tells the command: where the login came from, and (ExposeAuthInfo) the
        # key it used; a login shell, as sshd runs it
        self.state.mkdir(parents=True, exist_ok=True)
        auth = self.state / "ssh-user-auth"
        auth.write_text(f"publickey {self.authorized.export_public_key().decode()}")
        env = {
            **os.environ,
            "XDG_STATE_HOME": str(self.state),
            "SSH_CONNECTION": f"127.0.0.1 40000 127.0.0.1 {self.port}",
            "SSH_USER_AUTH": str(auth),
        }
        read, write = os.pipe()
        child = await asyncio.create_subprocess_shell(
            self.wrap + command + (" --demo" if self.demo else ""),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        os.close(write)
        self.children.append(child)
        loop = asyncio.get_running_loop()
        out = asyncio.StreamReader()
        pipe, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(out), os.fdopen(read, "rb")
        )
        assert child.stderr is not None
        errors = asyncio.create_task(_relay(child.stderr, process.stderr))
        async for line in out:
            process.stdout.write(line)
            if self.drop_after_step and b'"state": "done"' in line:
                # the connection goes (after what was sent, so the test knows what the head
                # saw): the head hears nothing more, and the command's next write meets a
                # closed pipe, as under sshd
                process.channel.get_connection().close()
                pipe.close()
                return
        pipe.close()
        await errors
        process.exit(await child.wait())


async def _relay(source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]) -> None:
    async for line in source:
        with contextlib.suppress(asyncssh.Error, OSError):
            sink.write(line)


@dataclass
class Keys:
    client: Path  # the operator's private key file
    client_key: asyncssh.SSHKey
    host_key: asyncssh.SSHKey
    known_hosts: Path


def make_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Keys:
    """The operator's key, the node's host key, and a known_hosts file not yet written."""
    # the operator's own ~/.ssh and agent stay out of it
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    client = asyncssh.generate_private_key("ssh-ed25519")
    path = tmp_path / "id_ed25519"
    client.write_private_key(path)
    path.chmod(0o600)
    return Keys(
        path, client, asyncssh.generate_private_key("ssh-ed25519"), tmp_path / "known_hosts"
    )


@contextlib.contextmanager
def serve_node(
    tmp_path: Path, keys: Keys, *, demo: bool = True, wrap: str = ""
) -> Iterator[ExecServer]:
    """The node, listening, its host key in the head's known_hosts."""
    server = ExecServer(tmp_path / "state", keys.host_key, keys.client_key, demo=demo, wrap=wrap)
    server.start()
    keys.known_hosts.write_text(known_line(server.port, keys.host_key))
    try:
        yield server
    finally:
        server.stop()


def known_line(port: int, key: asyncssh.SSHKey) -> str:
    return f"[127.0.0.1]:{port} {key.export_public_key().decode()}"


def head_config(tmp_path: Path, keys: Keys, port: int, *, command: str = NODE_COMMAND) -> Path:
    """A head's config file: it is not dgx-003, and its fleet has dgx-003 at 127.0.0.1:PORT."""
    path = tmp_path / "head.toml"
    path.write_text(
        f"""
[host]
name = "head"
[fleet]
agents = ["{NODE}=http://127.0.0.1:9"]
[actions]
state_dir = "{tmp_path / "head"}"
[remote]
destinations = {{ "{NODE}" = "127.0.0.1:{port}" }}
identity_files = ["{keys.client}"]
known_hosts = "{keys.known_hosts}"
command = {json.dumps(command)}
connect_timeout_s = 5
"""
    )
    return path


def node_target(keys: Keys, port: int, command: str = NODE_COMMAND) -> SshTarget:
    """The node served on 127.0.0.1:`port`, as a head's config would name it."""
    return SshTarget(
        NODE,
        "127.0.0.1",
        port,
        identity_files=(str(keys.client),),
        known_hosts=str(keys.known_hosts),
        command=command,
        connect_timeout_s=5.0,
    )
