"""Who may log in to the ssh console, and as what: authorized keys with roles, passwords,
and the server's own host key.

An authorized-keys file holds OpenSSH public-key lines. A line may start with one option,
`role=viewer`, `role=operator` or `role=admin` (quotes allowed), as OpenSSH options do;
a line that names no role is a viewer:

    role=operator ssh-ed25519 AAAAC3Nza... alice@laptop
    ssh-ed25519 AAAAC3Nza... noc-wall

Other OpenSSH options (`from=`, `command=`...) are refused with the line's number rather
than silently ignored, since this server would not enforce them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from gpuconsole.actions.roles import Role
from gpuconsole.config import ConfigError, read_secret

log = logging.getLogger(__name__)

_OPTION = re.compile(r'^role=(?:"([^"]*)"|([A-Za-z]+))$')


class KeyFileError(Exception):
    """An authorized-keys, password or host-key file that cannot be used; names file and line."""


@dataclass(frozen=True, slots=True)
class AuthorizedKey:
    """One authorized public key, the role it grants and its comment."""

    key: asyncssh.SSHKey
    role: Role
    comment: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key)


def fingerprint(key: asyncssh.SSHKey) -> str:
    """The key's SHA256 fingerprint, as `ssh-keygen -l` prints it."""
    return str(key.get_fingerprint("sha256"))


class AuthorizedKeys:
    """The keys that may log in, looked up by their public blob."""

    def __init__(self, keys: list[AuthorizedKey]) -> None:
        self._by_blob = {k.key.public_data: k for k in keys}

    def __len__(self) -> int:
        return len(self._by_blob)

    def find(self, key: asyncssh.SSHKey) -> AuthorizedKey | None:
        return self._by_blob.get(key.public_data)


def parse_authorized_keys(text: str, origin: str = "authorized keys") -> AuthorizedKeys:
    """Authorized keys from file text; KeyFileError names the line that is wrong."""
    keys: list[AuthorizedKey] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split(None, 1)
        role = Role.VIEWER
        if not _looks_like_key_type(words[0]):
            role = _role_option(words[0], f"{origin}:{number}")
            line = words[1] if len(words) > 1 else ""
        parts = line.split(None, 2)
        if len(parts) < 2:
            raise KeyFileError(f"{origin}:{number}: expected 'KEYTYPE BASE64 [comment]'")
        try:
            key = asyncssh.import_public_key(f"{parts[0]} {parts[1]}")
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise KeyFileError(f"{origin}:{number}: not a public key: {exc}") from None
        keys.append(AuthorizedKey(key, role, parts[2] if len(parts) > 2 else ""))
    return AuthorizedKeys(keys)


def _looks_like_key_type(word: str) -> bool:
    return word.startswith(("ssh-", "ecdsa-", "sk-")) and "=" not in word


def _role_option(word: str, where: str) -> Role:
    for option in word.split(","):
        match = _OPTION.match(option)
        if match is None:
            raise KeyFileError(
                f"{where}: option {option.split('=')[0]!r} is not supported; "
                "only role=viewer|operator|admin"
            )
        value = match.group(1) or match.group(2) or ""
        try:
            return Role(value.lower())
        except ValueError:
            raise KeyFileError(
                f"{where}: role {value!r} is not one of viewer, operator, admin"
            ) from None
    raise KeyFileError(f"{where}: empty option")  # pragma: no cover - split never empties


def load_authorized_keys(path: Path) -> AuthorizedKeys:
    """The authorized-keys file; a missing file is an error (no key, no login)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read authorized keys: {exc.strerror}") from None
    return parse_authorized_keys(text, str(path))


# --- passwords (off unless a file is configured) ----------------------------------------

_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


@dataclass(frozen=True, slots=True)
class PasswordEntry:
    """One user who may log in with a password, the role it grants, and the scrypt hash."""

    user: str
    role: Role
    hashed: str

    def check(self, password: str) -> bool:
        return verify_password(password, self.hashed)


def hash_password(password: str) -> str:
    """`scrypt$SALT$HASH` (base64) for a password file line."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, **_SCRYPT)
    return "scrypt$" + base64.b64encode(salt).decode() + "$" + base64.b64encode(digest).decode()


def verify_password(password: str, hashed: str) -> bool:
    kind, _, rest = hashed.partition("$")
    salt_text, _, digest_text = rest.partition("$")
    if kind != "scrypt" or not digest_text:
        return False
    try:
        salt, digest = base64.b64decode(salt_text), base64.b64decode(digest_text)
    except ValueError:
        return False
    got = hashlib.scrypt(password.encode(), salt=salt, **_SCRYPT)
    return hmac.compare_digest(got, digest)


def load_passwords(path: Path) -> dict[str, PasswordEntry]:
    """`USER:ROLE:scrypt$SALT$HASH` lines (see `gpuconsole ssh-server --hash-password`)."""
    try:
        text = read_secret(path, "[ssh] password_file")
    except ConfigError as exc:
        raise KeyFileError(str(exc)) from None
    entries: dict[str, PasswordEntry] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, role_text, hashed = [*line.split(":", 2), "", ""][:3]
        try:
            role = Role((role_text or "viewer").lower())
        except ValueError:
            raise KeyFileError(f"{path}:{number}: role {role_text!r} is not known") from None
        if not user or not hashed.startswith("scrypt$"):
            raise KeyFileError(f"{path}:{number}: expected USER:ROLE:scrypt$SALT$HASH")
        entries[user] = PasswordEntry(user, role, hashed)
    return entries


# --- the host key ----------------------------------------------------------------------


def load_or_create_host_key(path: Path) -> asyncssh.SSHKey:
    """The server's host key: generated (ed25519, mode 0600) on first start, then reused."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = asyncssh.generate_private_key("ssh-ed25519")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process won the race: use its key
            pass
        else:
            with os.fdopen(fd, "wb") as out:
                out.write(key.export_private_key("openssh"))
            log.info("generated host key %s (%s)", path, fingerprint(key))
            return key
    mode = path.stat().st_mode
    if mode & 0o077:
        raise KeyFileError(f"{path}: host key is readable by others; chmod 600 it")
    try:
        return asyncssh.read_private_key(path)
    except (asyncssh.KeyImportError, OSError) as exc:
        raise KeyFileError(f"{path}: cannot read host key: {exc}") from None
