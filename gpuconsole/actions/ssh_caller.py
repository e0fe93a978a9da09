"""Who asked, when `gpuconsole assign` runs under sshd (a head's remote assign): the login
user, by this process's uid, and what sshd's environment says of the login: where from and,
where sshd exposes it (`ExposeAuthInfo yes`), with which key.

None of that environment is proof: SSH_CONNECTION is a variable like any other and sshd
writes SSH_USER_AUTH as a file the login user owns. It is kept as the login's word, which
sshd's own log (`Accepted publickey for USER from ADDR port PORT ssh2: TYPE SHA256:...`)
confirms or not; the uid is the only thing this process can vouch for.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import ipaddress
from collections.abc import Mapping
from pathlib import Path

from gpuconsole import paths
from gpuconsole.actions.roles import Actor

__all__ = ["key_fingerprint", "over_ssh"]

AUTH_FILE_BYTES = 65536  # of SSH_USER_AUTH: one line per method the login passed


def key_fingerprint(blob_b64: str) -> str | None:
    """SHA256:... of an OpenSSH public key's base64 blob, as `ssh-keygen -l` prints it."""
    try:
        blob = base64.b64decode(blob_b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def _auth_key(path: str) -> str | None:
    """The fingerprint of the last public key in sshd's SSH_USER_AUTH file."""
    try:  # sshd writes a few lines, as a regular file: anything else names no key
        data = paths.read_own_file(Path(path), AUTH_FILE_BYTES)
    except (OSError, paths.NotOwnFile):
        return None
    lines = data.decode("utf-8", "replace").splitlines()
    for line in reversed(lines):
        words = line.split()
        if len(words) >= 3 and words[0] == "publickey":
            return key_fingerprint(words[2])
    return None


def _client(connection: str) -> str:
    """'from ADDR port PORT' of SSH_CONNECTION ('ADDR PORT ADDR PORT'); '' if it is not one."""
    words = connection.split()
    if len(words) != 4 or not words[1].isdigit() or len(words[1]) > 5:
        return ""
    try:
        address = ipaddress.ip_address(words[0])
    except ValueError:
        return ""
    return f"from {address} port {int(words[1])}"


def over_ssh(actor: Actor, environ: Mapping[str, str]) -> Actor:
    """The local actor, marked as come in over ssh, with what sshd's environment says of
    the login (`ssh_login`, unverified), when sshd started us.

    The user and role stay what the node gives this process's uid: the audit records the
    login the node let in, not anything a head or the environment claims.
    """
    connection = environ.get("SSH_CONNECTION")
    if not connection:
        return actor
    said = [_client(connection) or "SSH_CONNECTION unreadable"]
    auth = environ.get("SSH_USER_AUTH")
    fingerprint = _auth_key(auth) if auth else None
    if fingerprint:
        said.append(f"key {fingerprint}")
    said.append("as the login's environment says")
    return dataclasses.replace(actor, via="ssh", ssh_login=", ".join(said))
