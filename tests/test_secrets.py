"""BMC passwords never leave the config: configured inline and in a file, for
BMCs that answer, refuse the password or do not answer, they are searched for in the logs
(every logger, DEBUG), the console's screens, the JSON snapshot, /metrics, the audit log
and every file the process writes to its state folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuconsole import codec, config
from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.power import PowerRequest, power
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.export.agent import Agent
from gpuconsole.hub import Hub
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sources.bmc import BmcSource, PowerAction
from gpuconsole.wiring import AgentSettings, node_hub
from tests.bmc_fixtures import IPMI_PASSWORD, IpmiSim, free_port, running_ipmi_sim
from tests.waiting import until

IN_FILE = "Sekr1t-f1le-77"  # dgx-018's password, in a password_file
WRONG = "Wr0ng-pw-5150"  # dgx-019's, which its BMC refuses
REDFISH = "rf-Pass-4242"  # dgx-020's, a Redfish BMC that does not answer


@pytest.fixture
def bmcs(tmp_path: Path) -> Iterator[tuple[IpmiSim, IpmiSim, IpmiSim]]:
    with (
        running_ipmi_sim(tmp_path / "a") as a,
        running_ipmi_sim(tmp_path / "b") as b,
        running_ipmi_sim(tmp_path / "c") as c,
    ):
        b.ipmitool("user", "set", "password", "2", IN_FILE)
        b.password = IN_FILE
        yield a, b, c


def bmc_table(node: str, port: int, **keys: str | int | bool) -> str:
    """One [[bmc]] table: a BMC on this machine, polled every second, with `keys` besides."""
    table = {"node": node, "host": "127.0.0.1", "port": port, "interval_s": 1, "timeout_s": 5}
    lines = [f"{key} = {json.dumps(value)}" for key, value in (table | keys).items()]
    return "\n[[bmc]]\n" + "\n".join(lines) + "\n"


def config_text(a: IpmiSim, b: IpmiSim, c: IpmiSim, password_file: Path) -> str:
    head = """
[host]
name = "head"
[nvml]
enabled = false
[fabric]
enabled = false
[tenancy]
enabled = false
"""
    return (
        head
        + bmc_table("dgx-017", a.port, username=a.username, password=IPMI_PASSWORD)
        + bmc_table("dgx-018", b.port, username=b.username, password_file=str(password_file))
        + bmc_table("dgx-019", c.port, username=c.username, password=WRONG)
        + bmc_table(
            "dgx-020",
            free_port(),
            protocol="redfish",
            username="root",
            password=REDFISH,
            verify_tls=False,
            timeout_s=1,
        )
    )


SECRETS = (IPMI_PASSWORD, IN_FILE, WRONG, REDFISH)


def assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shows in {where}"


@contextlib.asynccontextmanager
async def agent_for(hub: Hub) -> AsyncIterator[str]:
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    try:
        yield f"http://127.0.0.1:{agent.port}"
    finally:
        await agent.stop()


async def screens_of(snapshot: FleetSnapshot) -> dict[str, str]:
    """What the console shows: the fleet, each node, the events; as exported SVG text."""
    from gpuconsole.tui.app import ConsoleApp

    app = ConsoleApp(None, start_hub=False, snapshot=snapshot, theme_dirs=[], cursor_blink=False)
    shown: dict[str, str] = {}
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        shown["fleet"] = app.export_screenshot()
        for node in snapshot.nodes:
            app.jump("node", node.node)
            await pilot.pause()
            shown[node.node] = app.export_screenshot()
        app.jump("events")
        await pilot.pause()
        shown["events"] = app.export_screenshot()
    return shown


async def test_bmc_passwords_show_nowhere(
    bmcs: tuple[IpmiSim, IpmiSim, IpmiSim],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b, c = bmcs
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    secret_file = tmp_path / "bmc-018.pw"
    secret_file.write_text(IN_FILE + "\n")
    secret_file.chmod(0o600)
    caplog.set_level(logging.DEBUG)
    cfg = config.parse(config_text(a, b, c, secret_file), tmp_path / "config.toml")
    hub = node_hub(cfg)
    bodies: dict[str, str] = {}
    await hub.start()
    try:

        def settled() -> bool:
            snapshot = hub.latest
            if snapshot is None:
                return False
            statuses = {n.node: n.status("bmc") for n in snapshot.nodes if n.node != "head"}
            return (
                all(s is not None and s.polls > 0 for s in statuses.values())
                and statuses["dgx-017"].ok  # type: ignore[union-attr]
                and statuses["dgx-018"].ok  # type: ignore[union-attr]
            )

        await until(settled, timeout=30)
        snapshot = hub.latest
        assert snapshot is not None
        errors = {n.node: n.status("bmc").error for n in snapshot.nodes if n.node != "head"}  # type: ignore[union-attr]
        assert "refused the user name or password" in (errors["dgx-019"] or "")
        assert errors["dgx-020"]  # the Redfish BMC that does not answer says so
        async with agent_for(hub) as url, aiohttp.ClientSession() as client:
            for path in ("/metrics", "/api/v1/snapshot?view=full", "/api/v1/snapshot"):
                async with client.get(url + path) as answer:
                    assert answer.status == 200, path
                    bodies[path] = await answer.text()
        # an audited power action on a configured BMC
        control = next(s for s in hub.sources if isinstance(s, BmcSource) and s.node == "dgx-018")
        audit = AuditLog(state / "gpuconsole" / "audit.jsonl")
        request = PowerRequest("dgx-018", PowerAction.ON, Actor("ops", Role.OPERATOR), "dgx-018")
        await power(request, control, audit)
    finally:
        await hub.stop()
    assert "ipmi_dcmi_power_watts" in bodies["/metrics"] or "gpuconsole" in bodies["/metrics"]
    for path, body in bodies.items():
        assert_no_secret(path, body)
    assert_no_secret("the JSON snapshot", codec.dumps(snapshot))
    for name, svg in (await screens_of(snapshot)).items():
        assert_no_secret(f"the console's {name} screen", svg)
    assert_no_secret("the logs", caplog.text)
    assert "refused the user name or password" in caplog.text  # the logs did say why
    assert_no_secret("repr(config)", repr(cfg))
    assert_no_secret("repr(sources)", repr([vars(s) for s in hub.sources]))
    written = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name == "audit.jsonl" for p in written)
    for file in written:
        assert_no_secret(str(file), file.read_bytes().decode("utf-8", "replace"))


def test_a_config_error_about_a_password_never_echoes_it(tmp_path: Path) -> None:
    bad: list[tuple[str, Any]] = [
        ('[[bmc]]\nhost = "h"\npassword = 918273645\n', "918273645"),
        (f'[[bmc]]\nhost = "h"\npassword = ["{WRONG}"]\n', WRONG),
        (f'[[bmc]]\nhost = "h"\npassword = "{WRONG}"\npassword_file = "/x"\n', WRONG),
        (f'[[bmc]]\nhost = "h"\npassword = "{WRONG}"\npasword = "{REDFISH}"\n', REDFISH),
    ]
    for text, secret in bad:
        with pytest.raises(config.ConfigError) as caught:
            config.parse(text, tmp_path / "config.toml")
        assert secret not in str(caught.value), str(caught.value)


def test_the_agents_basic_auth_password_shows_in_no_repr() -> None:
    """The agent's settings reach log lines and tracebacks as a repr: its password stays out,
    said only to be set."""
    settings = AgentSettings(basic_auth_user="prom", basic_auth_password="hunter2-secret")
    shown = repr(settings)
    assert "hunter2-secret" not in shown
    assert "basic_auth_user='prom'" in shown and "basic_auth_password=<set>" in shown
    assert "basic_auth_password=None" in repr(AgentSettings())
