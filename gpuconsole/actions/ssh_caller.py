"""Who asked, when `gpuconsole assign` runs under sshd (a head's remote assign): the login
user, and the key it logged in with where sshd exposes it (`ExposeAuthInfo yes`)."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
from collections.abc import Mapping

from gpuconsole.actions.roles import Actor

__all__ = ["key_fingerprint", "over_ssh"]


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
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        words = line.split()
        if len(words) >= 3 and words[0] == "publickey":
            return key_fingerprint(words[2])
    return None


def over_ssh(actor: Actor, environ: Mapping[str, str]) -> Actor:
    """The local actor, marked as come in over ssh (with its key) when sshd started us.

    The role stays what the node gives the login user: the audit records the ssh login the
    node authenticated, not anything a head claims about its own operator.
    """
    if not environ.get("SSH_CONNECTION"):
        return actor
    auth = environ.get("SSH_USER_AUTH")
    fingerprint = _auth_key(auth) if auth else None
    return dataclasses.replace(actor, key_fingerprint=fingerprint, via="ssh")
