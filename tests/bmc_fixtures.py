"""Real BMC peers for the tests: ipmi_sim (OpenIPMI), and sushy-static and
sushy-emulator (sushy-tools).

They listen on 127.0.0.1 on ports picked here, run from a temporary copy of the files
under tests/data/bmc/, and are stopped (by their own pid) when the `with` block ends.
Test modules wrap them in fixtures.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.peers import require_program

DATA = Path(__file__).parent / "data" / "bmc"
IPMI_USER = "admin"
IPMI_PASSWORD = "pw7Hq2-nolog"  # IPMI passwords: 16 bytes at most here


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# An RMCP/ASF presence ping (DSP0136): BMCs answer it with a pong, before any session.
_PRESENCE_PING = bytes.fromhex("0600ff06000011be80000000")


def _wait_answering(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    """Wait until `proc` answers a presence ping on the UDP port: set up in full, both
    ports bound. (A bind test is fooled: ipmi_sim binds its LAN port, then quits when its
    console port is taken.)"""
    deadline = time.monotonic() + 10
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.1)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}")
            s.sendto(_PRESENCE_PING, ("127.0.0.1", port))
            try:
                s.recv(512)
                return
            except OSError:  # no pong yet (timeout), or refused: nothing bound yet
                continue
    raise RuntimeError(f"{what} did not answer on {port}")


def _wait_listening(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    """Wait until `proc` accepts connections on the TCP port. (A bind test is fooled
    here: a port some client's closed connection holds in TIME_WAIT cannot be bound,
    yet nothing listens on it.)"""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not start listening on {port}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class IpmiSim:
    """A running ipmi_sim with the test BMC's sensors (tests/data/bmc/node.*)."""

    port: int
    console_port: int
    workdir: Path
    proc: subprocess.Popen[bytes]
    username: str = IPMI_USER
    password: str = IPMI_PASSWORD

    def command(self, line: str) -> None:
        """An emulation command on ipmi_sim's console, e.g. sensor_set_value."""
        with socket.create_connection(("127.0.0.1", self.console_port), 2) as s:
            s.sendall(line.encode() + b"\n")
            time.sleep(0.1)
            s.recv(4096)

    def set_raw(self, sensor: int, raw: int) -> None:
        """Set a sensor's raw byte; a threshold crossed lands in the SEL."""
        self.command(f"sensor_set_value 0x20 0 {sensor} {raw} 1")

    def ipmitool(self, *args: str) -> str:
        tool = require_program("ipmitool", "apt-get install ipmitool")
        result = subprocess.run(
            [
                tool,
                "-I",
                "lanplus",
                "-C",
                "3",
                "-H",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                self.username,
                "-P",
                self.password,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return result.stdout

    def sdr_list(self) -> dict[str, str]:
        """`ipmitool sdr list` as {sensor name: reading column}."""
        out = {}
        for line in self.ipmitool("sdr", "list").splitlines():
            name, reading, _status = (part.strip() for part in line.split("|"))
            out[name] = reading
        return out

    def sensor_thresholds(self) -> dict[str, dict[str, float]]:
        """`ipmitool sensor list` thresholds as {name: {lnr, lcr, lnc, unc, ucr, unr}}."""
        keys = ("lnr", "lcr", "lnc", "unc", "ucr", "unr")
        out: dict[str, dict[str, float]] = {}
        for line in self.ipmitool("sensor", "list").splitlines():
            cells = [c.strip() for c in line.split("|")]
            out[cells[0]] = {
                k: float(v) for k, v in zip(keys, cells[4:10], strict=True) if v != "na"
            }
        return out


@dataclass(frozen=True)
class SimFiles:
    """The test BMC's files, each as text: change one to make a BMC of another kind."""

    emu: str = ""  # ipmi_sim -f: its MCs and sensors
    sdrs: str = ""  # sdrcomp's input: the SDR repository
    chassis_control: str = ""  # the chassis control script: power state

    @classmethod
    def default(cls) -> SimFiles:
        return cls(
            (DATA / "node.emu").read_text(),
            (DATA / "node.sdrs").read_text(),
            (DATA / "chassis_control.sh").read_text(),
        )


def start_ipmi_sim(workdir: Path, files: SimFiles | None = None) -> IpmiSim:
    """ipmi_sim on free ports; a port another process took first gets a retry."""
    files = files or SimFiles.default()
    for attempt in range(3):
        try:
            return _start_ipmi_sim_once(workdir, files)
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _start_ipmi_sim_once(workdir: Path, files: SimFiles) -> IpmiSim:
    sim = require_program("ipmi_sim", "apt-get install openipmi")
    sdrcomp = require_program("sdrcomp", "apt-get install openipmi")
    workdir.mkdir(parents=True, exist_ok=True)
    port, console = free_port(socket.SOCK_DGRAM), free_port()
    chassis = workdir / "chassis_control.sh"
    chassis.write_text(files.chassis_control)
    chassis.chmod(0o755)
    emu, sdrs = workdir / "node.emu", workdir / "node.sdrs"
    emu.write_text(files.emu)
    sdrs.write_text(files.sdrs)
    conf = (DATA / "lan.conf.in").read_text()
    for key, value in (
        ("@PORT@", str(port)),
        ("@CONSOLE_PORT@", str(console)),
        ("@CHASSIS@", str(chassis)),
        ("@PASSWORD@", IPMI_PASSWORD),
    ):
        conf = conf.replace(key, value)
    (workdir / "lan.conf").write_text(conf)
    state = workdir / "state"
    sdr_dir = state / "ipmi_sim" / "gpuconsole-test"
    sdr_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sdrcomp, "-8", "-o", str(sdr_dir / "sdr.20.main"), str(sdrs)],
        check=True,
        capture_output=True,
    )
    proc = subprocess.Popen(
        [sim, "-c", "lan.conf", "-f", str(emu), "-s", str(state), "-n"],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_answering(port, proc, "ipmi_sim")
    except Exception:
        _stop(proc)
        raise
    return IpmiSim(port, console, workdir, proc)


@contextlib.contextmanager
def running_ipmi_sim(workdir: Path, files: SimFiles | None = None) -> Iterator[IpmiSim]:
    """ipmi_sim for the length of a `with` block."""
    sim = start_ipmi_sim(workdir, files)
    try:
        yield sim
    finally:
        _stop(sim.proc)


# --- Redfish ---------------------------------------------------------------------------


def self_signed(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate and key for `host`, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class Sushy:
    """A running sushy-static serving a copy of one mockup tree over HTTPS."""

    port: int
    root: Path  # the served mockup; edit files to change readings
    cert: Path
    log: Path
    proc: subprocess.Popen[bytes]


def start_sushy(workdir: Path, mockup: str | Path, *, in_place: bool = False) -> Sushy:
    """sushy-static on a free port serving a copy of tests/data/bmc/redfish/`mockup` (or of
    the folder `mockup`), or with `in_place` the folder itself, which it only reads; a
    port another process took first gets a retry."""
    program = require_program("sushy-static", "pip install sushy-tools")
    root = Path(mockup) if isinstance(mockup, Path) else DATA / "redfish" / mockup
    if not in_place:
        shutil.copytree(root, workdir / "mockup")
        root = workdir / "mockup"
    cert, key = self_signed(workdir / "tls")
    for attempt in range(3):
        try:
            return _start_sushy_once(program, workdir, root, cert, key)
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _start_sushy_once(program: str, workdir: Path, root: Path, cert: Path, key: Path) -> Sushy:
    port = free_port()
    log = workdir / "sushy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                program,
                "-i",
                "127.0.0.1",
                "-p",
                str(port),
                "-m",
                str(root),
                "-c",
                str(cert),
                "-k",
                str(key),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_listening(port, proc, "sushy-static")
    except Exception:
        _stop(proc)
        raise
    return Sushy(port, root, cert, log, proc)


@contextlib.contextmanager
def running_sushy(workdir: Path, mockup: str | Path, *, in_place: bool = False) -> Iterator[Sushy]:
    """sushy-static serving mockup "modern" or "legacy" (or a folder: see start_sushy) for
    the length of a `with` block."""
    server = start_sushy(workdir, mockup, in_place=in_place)
    try:
        yield server
    finally:
        _stop(server.proc)


@dataclass
class SushyEmulator:
    """A running sushy-emulator (fake driver) that checks HTTP basic credentials."""

    port: int
    cert: Path
    username: str
    password: str
    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def running_sushy_emulator(workdir: Path, username: str, password: str) -> Iterator[SushyEmulator]:
    """sushy-emulator over HTTPS that accepts only `username` with `password`. (sushy-static
    takes any password; this one checks them against an htpasswd file.)"""
    program = require_program("sushy-emulator", "pip install sushy-tools")
    import bcrypt  # sushy-tools' own dependency, for its htpasswd file

    workdir.mkdir(parents=True, exist_ok=True)
    cert, key = self_signed(workdir / "tls")
    users = workdir / "htpasswd"
    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    users.write_text(f"{username}:{digest}\n")
    config = workdir / "emulator.conf"
    config.write_text(  # its state kept here too, not in /tmp/sushy-emulator
        f"SUSHY_EMULATOR_AUTH_FILE = {str(users)!r}\n"
        f"SUSHY_EMULATOR_STATE_DIR = {str(workdir / 'state')!r}\n"
    )
    port = free_port()
    with (workdir / "emulator.log").open("wb") as out:
        proc = subprocess.Popen(
            [
                program,
                "--config",
                str(config),
                "-i",
                "127.0.0.1",
                "-p",
                str(port),
                "--ssl-certificate",
                str(cert),
                "--ssl-key",
                str(key),
                "--fake",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_listening(port, proc, "sushy-emulator")
        yield SushyEmulator(port, cert, username, password, proc)
    finally:
        _stop(proc)
