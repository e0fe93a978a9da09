"""[[bmc]] in the config file, secrets kept out of sight, and power as an audited action."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuconsole import config
from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.power import PowerRequest, power
from gpuconsole.actions.roles import ActionRefused, Actor, Role
from gpuconsole.config import ConfigError
from gpuconsole.readings.bmc import PowerState
from gpuconsole.sim.bmc import sim_link
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.profiles import get_profile
from gpuconsole.sources.bmc import BmcSource, PowerAction
from gpuconsole.wiring import bmc_sources
from tests.bmc_fixtures import IpmiSim, running_ipmi_sim

TWO = """
[host]
name = "dgx-017"

[[bmc]]
host = "10.0.0.17"
username = "admin"
password_file = "/etc/gpuconsole/bmc-17"

[[bmc]]
node = "dgx-018"
host = "10.0.0.18"
protocol = "redfish"
verify_tls = false
"""


def test_bmc_entries_are_read_with_their_defaults() -> None:
    cfg = config.parse(TWO)
    first, second = cfg.bmc
    assert (first.node, first.host, first.protocol, first.port) == ("", "10.0.0.17", "ipmi", 0)
    assert (second.node, second.protocol, second.verify_tls) == ("dgx-018", "redfish", False)
    assert config.parse(config.example()) == config.Config()


def test_an_error_names_the_entry_key_and_line() -> None:
    with pytest.raises(ConfigError, match=r"config:13: \[\[bmc\]\] #2 protocol 'http' is not one"):
        config.parse(TWO.replace('protocol = "redfish"', 'protocol = "http"'))
    with pytest.raises(ConfigError, match=r"config:10: \[\[bmc\]\] #2 needs a host"):
        config.parse(TWO.replace('host = "10.0.0.18"', ""))
    twice = '[[bmc]]\nnode = "a"\nhost = "h1"\n[[bmc]]\nnode = "a"\nhost = "h2"\n'
    with pytest.raises(ConfigError, match=r"config:5: \[\[bmc\]\] #2 node: node 'a' already has"):
        config.parse(twice)


def test_a_bad_password_value_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as err:
        config.parse('[[bmc]]\nhost = "h"\npassword = 12345678\n')
    assert "[[bmc]] #1 password must be a string" in str(err.value)
    assert "12345678" not in str(err.value)
    cfg = config.parse('[[bmc]]\nhost = "h"\npassword = "hunter2-x"\n')
    assert "hunter2-x" not in repr(cfg)


def test_a_password_file_readable_by_others_gets_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "bmc-pass"
    secret.write_text("file-secret-1\n")
    secret.chmod(0o644)
    cfg = config.parse(f'[[bmc]]\nnode = "n1"\nhost = "127.0.0.1"\npassword_file = "{secret}"\n')
    with caplog.at_level(logging.WARNING):
        (source,) = bmc_sources(cfg)
    assert "readable by others" in caplog.text and "chmod 600" in caplog.text
    assert "file-secret-1" not in caplog.text + repr(source.link)
    secret.chmod(0o600)
    caplog.clear()
    bmc_sources(cfg)
    assert "readable by others" not in caplog.text


# --- power -----------------------------------------------------------------------------


@pytest.fixture
def sim_source() -> Iterator[BmcSource]:
    sim = SimNode("dgx-005", get_profile("dgx-h100"))
    source = BmcSource("dgx-005", sim_link(sim), simulated=True)
    yield source
    asyncio.run(source.close())  # a poll after the action's close started its thread again


def ask(source: BmcSource, audit: AuditLog, role: Role, confirm: str) -> str:
    request = PowerRequest("dgx-005", PowerAction.OFF, Actor("ana", role), confirm)

    async def go() -> str:
        await source.start(lambda _e: None)
        try:
            return await power(request, source, audit)
        finally:
            await source.close()

    return asyncio.run(go())


def test_a_viewer_is_refused_and_the_refusal_is_audited(
    sim_source: BmcSource, tmp_path: Path
) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    with pytest.raises(ActionRefused, match="viewer may not act"):
        ask(sim_source, audit, Role.VIEWER, "dgx-005")
    with pytest.raises(ActionRefused, match="does not match the node name"):
        ask(sim_source, audit, Role.OPERATOR, "dgx-05")
    records = audit.records()
    assert [(r["user"], r["role"], r["outcome"]) for r in records] == [
        ("ana", "viewer", "refused"),
        ("ana", "operator", "refused"),
    ]
    assert oct((tmp_path / "audit.jsonl").stat().st_mode & 0o777) == "0o600"


def test_an_operator_powers_off_and_the_bmc_says_so(sim_source: BmcSource, tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    assert ask(sim_source, audit, Role.OPERATOR, "dgx-005") == "off"
    reading = asyncio.run(sim_source.poll())
    assert reading.power_state is PowerState.OFF
    started, record = audit.records()  # asked before the BMC was, then what it answered
    assert started["action"] == "power off" and started["outcome"] == "started"
    assert record["action"] == "power off" and record["outcome"] == "ok"
    assert record["target"] == "dgx-005 (sim://dgx-005-bmc)" and record["time"]


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[IpmiSim]:
    with running_ipmi_sim(tmp_path / "ipmi_sim") as sim:
        yield sim


def test_the_power_command_reaches_a_real_bmc_and_is_audited(bmc: IpmiSim, tmp_path: Path) -> None:
    secret = tmp_path / "pass"
    secret.write_text(bmc.password + "\n")
    secret.chmod(0o600)
    cfg = tmp_path / "c.toml"
    audit = tmp_path / "actions" / "audit.jsonl"
    # journal and audit log named, so nothing lands in the machine's shared state folder
    cfg.write_text(
        f'[actions]\njournal = "{tmp_path / "actions" / "journal.db"}"\naudit_log = "{audit}"\n'
        f'[[bmc]]\nnode = "dgx-017"\nhost = "127.0.0.1"\nport = {bmc.port}\n'
        f'username = "{bmc.username}"\npassword_file = "{secret}"\n'
    )
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuconsole", "power", *args, "-c", str(cfg)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            stdin=subprocess.DEVNULL,
        )

    refused = run("dgx-017", "off", "--confirm", "dgx-018")
    assert refused.returncode == 3 and "does not match" in refused.stderr
    assert "Chassis Power is on" in bmc.ipmitool("chassis", "power", "status")
    done = run("dgx-017", "off", "--confirm", "dgx-017")
    assert done.returncode == 0, done.stderr
    assert "Chassis Power is off" in bmc.ipmitool("chassis", "power", "status")
    records = AuditLog(audit).records()
    assert [r["outcome"] for r in records] == ["refused", "started", "ok"]
    assert bmc.password not in json.dumps(records) + done.stdout + done.stderr
