"""Who may log in to the ssh console, and as what: authorized keys with roles, passwords,
and the server's own host key.

An authorized-keys file holds OpenSSH public-key lines, each optionally led by options as
authorized_keys(5) writes them (comma-separated, values in double quotes). `role=viewer`,
`role=operator` or `role=admin` names the role (no role: viewer); `from="PATTERNS"` limits
where the key may log in from, as OpenSSH does (addresses, `*`/`?` wildcards, CIDR, `!` to
refuse), matched against the client's address, never a looked-up name:

    role=operator,from="10.1.0.0/16,!10.1.9.9" ssh-ed25519 AAAAC3Nza... alice@laptop
    ssh-ed25519 AAAAC3Nza... noc-wall

`restrict`, `no-pty`, `pty` and the `no-*-forwarding`/`no-user-rc` restrictions are
honoured (this server never forwards and runs no rc). Any other option (`command=`,
`permitopen=`, `expiry-time=`...) is refused with the file and line rather than silently
ignored, since this server would not enforce it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
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

# One option: a name, then `="quoted"` (a quote inside escaped as \") or `=bare`, then a
# comma, or the blank that ends the options. Possessive: an unclosed quote fails, as in sshd.
_OPTION = re.compile(r'([A-Za-z0-9-]+)(?:=(?:"((?:\\"|[^"])*+)"|([^\s,"]*)))?(?:,|(?=\s)|$)')
# Restrictions this server honours because it never grants what they take away.
_NEVER_GRANTED = {"no-port-forwarding", "no-agent-forwarding", "no-x11-forwarding", "no-user-rc"}
_SUPPORTED = "role=, from=, restrict, no-pty, pty, no-port-forwarding, no-agent-forwarding, "
_SUPPORTED += "no-X11-forwarding, no-user-rc"
# One from= pattern: an IPv4 or IPv6 address, wildcards allowed, or a network; `!` refuses.
_ADDRESS_PATTERN = re.compile(r"[0-9.*?]+|[0-9A-Fa-f:.*?]*:[0-9A-Fa-f:.*?]*")


class KeyFileError(Exception):
    """An authorized-keys, password or host-key file that cannot be used; names file and line."""


@dataclass(frozen=True, slots=True)
class AuthorizedKey:
    """One authorized public key, the role it grants, its comment, where it may log in
    from, and whether it may have a terminal."""

    key: asyncssh.SSHKey
    role: Role
    comment: str
    sources: asyncssh.SSHAuthorizedKeys | None = None  # from=, as asyncssh matches it
    pty: bool = True

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key)

    def admits(self, address: str) -> bool:
        """Whether a client at `address` may use this key (its from= patterns)."""
        if self.sources is None:
            return True
        try:
            return self.sources.validate(self.key, address, address) is not None
        except ValueError:  # not an address at all: nothing a pattern could admit
            return False


def fingerprint(key: asyncssh.SSHKey) -> str:
    """The key's SHA256 fingerprint, as `ssh-keygen -l` prints it."""
    return str(key.get_fingerprint("sha256"))


class AuthorizedKeys:
    """The keys that may log in, looked up by their public blob and the client's address."""

    def __init__(self, keys: list[AuthorizedKey]) -> None:
        self._by_blob: dict[bytes, list[AuthorizedKey]] = {}
        for key in keys:
            self._by_blob.setdefault(key.key.public_data, []).append(key)

    def __len__(self) -> int:
        return sum(map(len, self._by_blob.values()))

    def knows(self, key: asyncssh.SSHKey) -> bool:
        return key.public_data in self._by_blob

    def find(self, key: asyncssh.SSHKey, address: str) -> AuthorizedKey | None:
        """The first line for this key that admits a client at `address`, as sshd picks."""
        return next((k for k in self._by_blob.get(key.public_data, []) if k.admits(address)), None)


def parse_authorized_keys(text: str, origin: str = "authorized keys") -> AuthorizedKeys:
    """Authorized keys from file text; KeyFileError names the file and the line that is wrong."""
    keys: list[AuthorizedKey] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            keys.append(_parse_line(line, f"{origin}:{number}"))
    return AuthorizedKeys(keys)


def _parse_line(line: str, where: str) -> AuthorizedKey:
    options: dict[str, str | None] = {}
    if not _looks_like_key_type(line.split(None, 1)[0]):
        options, line = _split_options(line, where)
    parts = line.split(None, 2)
    if len(parts) < 2:
        raise KeyFileError(f"{where}: expected '[OPTIONS] KEYTYPE BASE64 [comment]'")
    try:
        key = asyncssh.import_public_key(f"{parts[0]} {parts[1]}")
    except (asyncssh.KeyImportError, ValueError) as exc:
        raise KeyFileError(f"{where}: not a public key: {exc}") from None
    role, pty, sources = Role.VIEWER, True, None
    for name, value in options.items():  # in the line's order, as sshd reads them
        if name == "role":
            try:
                role = Role((value or "").lower())
            except ValueError:
                raise KeyFileError(
                    f"{where}: role {value!r} is not one of viewer, operator, admin"
                ) from None
        elif name == "from":
            sources = _sources(value or "", f"{parts[0]} {parts[1]}", where)
        elif name in ("restrict", "no-pty", "pty"):
            pty = name == "pty"
    return AuthorizedKey(key, role, parts[2] if len(parts) > 2 else "", sources, pty)


def _looks_like_key_type(word: str) -> bool:
    return word.startswith(("ssh-", "ecdsa-", "sk-")) and "=" not in word and "," not in word


def _split_options(line: str, where: str) -> tuple[dict[str, str | None], str]:
    """The options that lead a line, each checked (names in lower case), and the rest."""
    options: dict[str, str | None] = {}
    position = 0
    while position < len(line) and not line[position].isspace():
        match = _OPTION.match(line, position)
        if match is None:
            raise KeyFileError(
                f"{where}: cannot read the options at column {position + 1} "
                "(a value with a blank or comma needs double quotes, and a closing quote)"
            )
        name, quoted, bare = match.groups()
        name = name.lower()
        value = quoted.replace('\\"', '"') if quoted is not None else bare
        if name in options:
            raise KeyFileError(f"{where}: option {name!r} is given twice")
        if name in ("role", "from"):
            if not value:
                raise KeyFileError(f"{where}: option {name!r} needs a value")
        elif name in {"restrict", "no-pty", "pty"} | _NEVER_GRANTED:
            if value is not None:
                raise KeyFileError(f"{where}: option {name!r} takes no value")
        else:
            raise KeyFileError(
                f"{where}: option {name!r} is not supported: this server would not enforce "
                f"it (it supports {_SUPPORTED})"
            )
        options[name] = value
        position = match.end()
    return options, line[position:].strip()


def _sources(patterns: str, key_text: str, where: str) -> asyncssh.SSHAuthorizedKeys:
    """A from= list checked here (addresses and networks: no name is looked up), matched by
    asyncssh as OpenSSH matches it."""
    for pattern in patterns.split(","):
        bare = pattern.removeprefix("!")
        if not bare or bare != bare.strip():
            raise KeyFileError(
                f"{where}: from= {patterns!r}: patterns are separated by commas alone, "
                "without blanks, and none is empty"
            )
        if "/" in bare:
            try:
                ipaddress.ip_network(bare)
            except ValueError:
                raise KeyFileError(
                    f"{where}: from= {pattern!r} is not a network (ADDRESS/BITS, host bits 0)"
                ) from None
        elif not _ADDRESS_PATTERN.fullmatch(bare):
            raise KeyFileError(
                f"{where}: from= {pattern!r} looks like a host name; this server matches the "
                "client's address only (no name is looked up): give addresses or networks"
            )
    quoted = patterns.replace("\\", "\\\\").replace('"', '\\"')
    try:
        return asyncssh.import_authorized_keys(f'from="{quoted}" {key_text}')
    except ValueError as exc:
        raise KeyFileError(f"{where}: from= {patterns!r}: {exc}") from None


class AuthorizedKeysFile:
    """The authorized-keys file, parsed again whenever its content changes: no restart to
    add or swap a key. Content, not times: `cp -p` and `rsync -a` keep a file's times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._digest: bytes | None = None
        self._parsed: AuthorizedKeys | str = AuthorizedKeys([])  # or why the file is wrong

    def current(self) -> AuthorizedKeys:
        """The keys the file holds now; KeyFileError if it is missing or wrong (no key, no
        login)."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            self._digest = None
            raise KeyFileError(
                f"{self.path}: cannot read authorized keys: {exc.strerror}"
            ) from None
        digest = hashlib.sha256(data).digest()
        if digest != self._digest:
            self._digest = digest
            try:
                self._parsed = parse_authorized_keys(data.decode("utf-8"), str(self.path))
            except UnicodeDecodeError as exc:
                self._parsed = f"{self.path}: not UTF-8 text (byte {exc.start})"
            except KeyFileError as exc:
                self._parsed = str(exc)
        if isinstance(self._parsed, str):
            raise KeyFileError(self._parsed)
        return self._parsed


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


class Passwords:
    """The users who may log in with a password. An unknown user's password is checked
    against a decoy hash, so a refusal takes as long whether or not the user exists."""

    def __init__(self, entries: dict[str, PasswordEntry]) -> None:
        self._entries = entries
        self._decoy = hash_password(secrets.token_urlsafe(16)) if entries else ""

    def __bool__(self) -> bool:
        return bool(self._entries)

    def check(self, user: str, password: str) -> PasswordEntry | None:
        """The user's entry if the password is theirs; one scrypt either way (blocking)."""
        entry = self._entries.get(user)
        matches = verify_password(password, entry.hashed if entry else self._decoy)
        return entry if matches else None


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
