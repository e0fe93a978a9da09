"""The Redfish BMC source on DMTF's public mockups (Redfish-Publications), data nobody here
wrote: served as they are by sushy-static, read in place from ../shared/fixtures/.

A test that needs a resource to fail serves a copy in its own temporary folder, with that
resource's file removed (sushy-static answers 404) or not JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.samples import Sample

from gpuconsole import config
from gpuconsole import format as fmt
from gpuconsole.facts.summaries import bmc_panel, bmc_schema
from gpuconsole.facts.verdict import Action, node_verdict
from gpuconsole.hub import Hub
from gpuconsole.readings.base import Health, PartStatus, Severity
from gpuconsole.readings.bmc import BmcReading, PowerState, SensorKind
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sources.bmc import BmcError, BmcSource, BmcTarget, PowerAction, open_link
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.node import NodeScreen
from gpuconsole.tui.widgets.panel import Panel
from gpuconsole.wiring import console_hub
from tests.bmc_fixtures import Sushy, running_sushy
from tests.export_fixtures import one, parse, pick, render
from tests.peers import require_peer
from tests.test_export_agent import promtool_problems

FIXTURES = Path(__file__).parents[1].parent / "shared" / "fixtures"
MOCKUPS = FIXTURES / "redfish-dmtf" / "mockups"
NAMES = ("public-rackmount1", "public-bladed", "public-localstorage", "public-smartnic")
NODE = "rf-node"
NEWER = ("Sensors", "ThermalSubsystem", "PowerSubsystem", "EnvironmentMetrics")


def mockup(name: str) -> Path:
    """A DMTF mockup tree, read in place; skip (or fail under GPUCONSOLE_REQUIRE_PEERS=1)
    where ../shared/fixtures is not there."""
    tree = MOCKUPS / name
    require_peer(
        f"DMTF Redfish mockup {name}",
        (tree / "index.json").is_file(),
        f"{MOCKUPS} (real fixtures from other projects; see ../shared/fixtures/README.md)",
    )
    return tree


class Servers(dict[str, Sushy]):
    """sushy-static serving each mockup in place, started on first use."""

    def __init__(self, stack: contextlib.ExitStack, tmp: pytest.TempPathFactory) -> None:
        super().__init__()
        self._stack, self._tmp = stack, tmp

    def __missing__(self, name: str) -> Sushy:
        tree = mockup(name)
        server = self._stack.enter_context(
            running_sushy(self._tmp.mktemp(name), tree, in_place=True)
        )
        self[name] = server
        return server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with contextlib.ExitStack() as stack:
        yield Servers(stack, tmp_path_factory)


@contextlib.contextmanager
def serving_copy(tmp_path: Path, name: str) -> Iterator[Sushy]:
    """sushy-static serving a copy of a mockup in `tmp_path`, to change before reading."""
    tree = tmp_path / name
    shutil.copytree(mockup(name), tree)
    for path in (tree, *tree.rglob("*")):  # the fixtures are read-only, the copy is not
        path.chmod(path.stat().st_mode | 0o200)
    with running_sushy(tmp_path / "sushy", tree, in_place=True) as server:
        yield server


def target(server: Sushy, system: str = "") -> BmcTarget:
    return BmcTarget(
        NODE,
        "127.0.0.1",
        "redfish",
        server.port,
        "admin",
        "any-password",  # sushy-static takes any
        ca_file=str(server.cert),
        timeout_s=10.0,
        system=system,
    )


def poll(server: Sushy, system: str = "") -> FleetSnapshot:
    """One poll through the hub, as every view sees it."""
    hub = Hub()
    hub.add_source(BmcSource(NODE, open_link(target(server, system))))
    return asyncio.run(hub.poll_once())


def node_of(snapshot: FleetSnapshot) -> NodeSnapshot:
    node = snapshot.node(NODE)
    assert node is not None
    return node


def reading(server: Sushy, system: str = "") -> BmcReading:
    node = node_of(poll(server, system))
    status = node.status("bmc")
    assert status is not None and status.ok, status
    assert node.bmc is not None
    return node.bmc


def metrics_of(snapshot: FleetSnapshot) -> dict[str, list[Sample]]:
    return parse(render(snapshot))


def edit(tree: Path, resource: str, **fields: object) -> None:
    path = tree / resource / "index.json"
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


# --- one resource down is one part not read --------------------------------------------


@pytest.mark.parametrize(
    ("name", "resource", "broken", "still"),
    [
        ("public-localstorage", "Thermal", "HTTP 404", dict(power_w=344.0, psus_present=1)),
        ("public-localstorage", "Power", "HTTP 404", dict(inlet_c=25.0, fans_present=2)),
        ("public-rackmount1", "Sensors", "HTTP 404", dict(fans_present=4, psus_present=1)),
        (
            "public-rackmount1",
            "PowerSubsystem",
            "the body is not JSON",
            dict(power_w=374.0, inlet_c=24.8, fans_present=4),
        ),
        (
            "public-rackmount1",
            "ThermalSubsystem",
            "HTTP 404",
            dict(power_w=374.0, exhaust_c=40.5, psus_present=1),
        ),
    ],
)
def test_one_resource_down_is_that_part_not_read_and_the_rest_stays(
    tmp_path: Path, name: str, resource: str, broken: str, still: dict[str, float]
) -> None:
    with serving_copy(tmp_path, name) as server:
        index = server.root / "Chassis" / "1U" / resource / "index.json"
        if broken == "HTTP 404":
            index.unlink()
        else:
            index.write_text('{"Id": "PowerSubsystem", ')  # cut short
        snapshot = poll(server)
    node = node_of(snapshot)
    status = node.status("bmc")
    assert status is not None and status.ok  # not the whole BMC stale
    bmc = node.bmc
    assert bmc is not None
    assert bmc.unread == (PartStatus(f"Chassis/1U/{resource}", False, broken),)
    assert {key: getattr(bmc, key) for key in still} == still
    assert bmc.power_state is PowerState.ON
    assert bmc_panel(node).startswith(f"not read: Chassis/1U/{resource}\n")
    part = one(metrics_of(snapshot)["gpuconsole_bmc_part_up"], part=f"Chassis/1U/{resource}")
    assert part.value == 0.0


# --- several ComputerSystems -------------------------------------------------------------

BLADES = [f"/redfish/v1/Systems/529QB945{n}R6" for n in range(4)]


def test_a_manager_of_several_systems_reads_every_chassis_and_says_to_choose_one(
    served: Servers,
) -> None:
    server = served["public-bladed"]
    bmc = reading(server)
    assert len(bmc.of_kind(SensorKind.TEMPERATURE)) == 5  # the enclosure's and 4 blades'
    assert (bmc.power_w, bmc.inlet_c, bmc.fans_present, bmc.fans_failed) == (1285.0, 24.0, 8, 1)
    assert bmc.power_state is PowerState.UNKNOWN
    (power,) = bmc.unread
    assert power.part == "power" and all(url in power.detail for url in BLADES)
    link = open_link(target(server))
    with pytest.raises(BmcError) as error:
        link.set_power(PowerAction.SOFT)
    assert str(error.value).startswith(
        f"redfish://127.0.0.1:{server.port}: power soft not sent: 4 systems, none chosen: "
        'set system = "<one of them>" in this [[bmc]] entry: '
    )
    assert all(url in str(error.value) for url in BLADES)
    link.close()


def test_the_configured_system_is_the_one_power_reads_and_acts_on(served: Servers) -> None:
    server = served["public-bladed"]
    bmc = reading(server, system=BLADES[2])
    assert bmc.power_state is PowerState.ON and bmc.unread == ()
    link = open_link(target(server, system=BLADES[2]))
    try:
        assert link.set_power(PowerAction.SOFT) == "softoff"
    finally:
        link.close()
    posted = server.log.read_text()
    assert f"POST {BLADES[2]}/Actions/ComputerSystem.Reset" in posted
    assert '"ResetType": "GracefulShutdown"' in posted
    link = open_link(target(server, system=BLADES[2]))
    try:
        assert link.set_power(PowerAction.CYCLE) == "cycle"
    finally:
        link.close()
    assert '"ResetType": "PowerCycle"' in server.log.read_text()
    wrong = reading(server, system="/redfish/v1/Systems/nonesuch")
    assert wrong.unread[0].detail.startswith(
        "system /redfish/v1/Systems/nonesuch is not on this BMC; it has /redfish/v1/Systems/"
    )


def test_a_host_and_its_dpu_power_is_the_hosts(served: Servers) -> None:
    bmc = reading(served["public-smartnic"])
    assert bmc.power_state is PowerState.ON
    assert bmc.part("power") == PartStatus("power", True, "Systems/437XR1138R2: on")


def test_the_system_key_of_a_bmc_entry_chooses_what_gpuconsole_power_acts_on(
    served: Servers, tmp_path: Path
) -> None:
    server = served["public-bladed"]
    path = tmp_path / "c.toml"
    head = (
        f'[actions]\njournal = "{tmp_path / "journal.db"}"\n'
        f'audit_log = "{tmp_path / "audit.jsonl"}"\n'
        f'[[bmc]]\nnode = "{NODE}"\nhost = "127.0.0.1"\nport = {server.port}\n'
        f'protocol = "redfish"\nusername = "admin"\npassword = "any-password"\n'
        f'ca_file = "{server.cert}"\n'
    )

    def power_soft(system: str) -> subprocess.CompletedProcess[str]:
        path.write_text(head + (f'system = "{system}"\n' if system else ""))
        command = ["power", NODE, "soft", "--confirm", NODE, "-c", str(path)]
        return subprocess.run(
            [sys.executable, "-m", "gpuconsole", *command],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
            stdin=subprocess.DEVNULL,
        )

    unchosen = power_soft("")
    assert unchosen.returncode == 1
    assert "power soft not sent: 4 systems, none chosen" in unchosen.stderr
    assert all(url in unchosen.stderr for url in BLADES)
    chosen = power_soft(BLADES[1])
    assert chosen.returncode == 0, chosen.stderr
    assert f"POST {BLADES[1]}/Actions/ComputerSystem.Reset" in server.log.read_text()
    assert config.load(path).bmc[0].system == BLADES[1]
    path.write_text(head + 'system = "529QB9451R6"\n')  # the Id alone: not its URL
    _cfg, problems = config.load_all(path)
    assert len(problems) == 1 and problems[0].endswith(
        "'529QB9451R6' is not a Redfish system: give its URL, /redfish/v1/Systems/ID, with "
        'protocol = "redfish"'
    )


# --- fans, excerpts, places, absent sensors, ids ----------------------------------------


def test_a_fan_in_percent_is_a_fan_and_at_0_percent_a_failed_one(tmp_path: Path) -> None:
    with serving_copy(tmp_path, "public-rackmount1") as server:
        edit(server.root, "Chassis/1U/Sensors/FanBay1", Reading=0)
        snapshot = poll(server)
    bmc = node_of(snapshot).bmc
    assert bmc is not None
    fan = bmc.sensor("Chassis Fan #1")
    assert fan is not None and (fan.kind, fan.value, fan.unit) == (SensorKind.FAN, 0.0, "%")
    assert (bmc.fans_present, bmc.fans_failed) == (4, 1)
    assert bmc.health.value == "critical"
    metrics = metrics_of(snapshot)
    assert one(metrics["ipmi_fan_speed_ratio"], name="Chassis Fan #1").value == 0.0
    assert one(metrics["ipmi_fan_speed_ratio"], name="CPU #1 Fan Speed").value == 0.45
    assert one(metrics["gpuconsole_bmc_fans_failed"]).value == 1.0


def test_the_verdict_names_the_failed_fan_with_its_reading_and_the_psu_that_warns(
    served: Servers,
) -> None:
    # bladed: System Fan 2 at 0 RPM, Critical (Story 2: "FAN 3 at 0 RPM", the number that
    # proves it); smartnic and rackmount1: PSU Bay 1 with a Health of Warning, rackmount1's
    # with a PowerSupplyPredictiveFailure condition, no sensor of its own saying so
    bladed = node_of(poll(served["public-bladed"]))
    fans = [f for f in node_verdict(bladed).findings if f.source == "bmc" and "fan" in f.code]
    assert [(f.code, f.text, f.severity, f.action) for f in fans] == [
        ("fan_failed", "1 of 8 fans failed: System Fan 2 at 0 RPM", Severity.CRITICAL,
         Action.SERVICE)
    ]  # fmt: skip
    smartnic = node_of(poll(served["public-smartnic"]))
    assert smartnic.bmc is not None and smartnic.bmc.health is Health.WARNING
    assert [(f.code, f.subject, f.severity, f.action) for f in node_verdict(smartnic).findings] == [
        ("unit_warning", "BMC Power Supply Bay 1", Severity.WARNING, Action.WATCH)
    ]
    rackmount = node_of(poll(served["public-rackmount1"]))
    warned = [f.text for f in node_verdict(rackmount).findings if f.code == "unit_warning"]
    assert warned == [
        "Power Supply Bay 1 reports a warning: Power supply 'PSU 1' has a predicted failure "
        "condition."
    ]
    # the deprecated schema carries a PSU's health on its sensor: said once, there
    old = node_of(poll(served["public-localstorage"]))
    codes = [f.code for f in node_verdict(old).findings if f.subject.endswith("Power Supply Bay")]
    assert codes == ["sensor_warning"]


def test_environment_metrics_excerpts_are_not_sensors_of_their_own(served: Servers) -> None:
    bmc = reading(served["public-rackmount1"])
    totals = [s for s in bmc.of_kind(SensorKind.POWER) if s.context == "total"]
    assert [(s.sensor_id, s.value) for s in totals] == [("1U/TotalPower", 374.0)]
    assert not [s for s in bmc.sensors if "EnvironmentMetrics" in s.sensor_id]
    ids = [s.sensor_id for s in bmc.sensors]
    assert len(ids) == len(set(ids))


def test_the_inlet_is_the_intake_not_the_room(served: Servers) -> None:
    bmc = reading(served["public-rackmount1"])
    room = bmc.sensor("Ambient Temperature")
    assert room is not None and room.value == 22.5 and room.context == "room"
    assert (bmc.inlet_c, bmc.exhaust_c) == (24.8, 40.5)  # IntakeTemp, ExhaustTemp


def test_an_absent_psus_sensors_keep_the_series_names_of_a_present_ones(served: Servers) -> None:
    metrics = metrics_of(poll(served["public-rackmount1"]))

    def family(name: str) -> str:
        return next(m for m, samples in metrics.items() if pick(samples, name=name))

    for reading_name in ("Input Power", "12V Output Voltage", "Input Current", "Energy"):
        present, pulled = f"Power Supply #1 {reading_name}", f"Power Supply #2 {reading_name}"
        assert family(pulled) == family(present), reading_name
    pulled_power = one(metrics["ipmi_power_watts"], name="Power Supply #2 Input Power")
    assert math.isnan(pulled_power.value)


def test_two_chassis_with_the_same_sensor_id_are_two_sensors(served: Servers) -> None:
    snapshot = poll(served["public-smartnic"])
    bmc = node_of(snapshot).bmc
    assert bmc is not None
    by_id = {s.sensor_id: s for s in bmc.sensors}
    assert {"1U/CPUFan1", "Card1/CPUFan1"} <= set(by_id)
    assert {"1U/TotalPower", "Card1/TotalPower", "Card2/TotalPower"} <= set(by_id)
    assert by_id["Card1/CPUFan1"].value == 80.0 and by_id["1U/CPUFan1"].value == 80.0
    metrics = metrics_of(snapshot)
    fans = pick(metrics["ipmi_fan_speed_ratio"], name="CPU #1 Fan Speed")
    assert sorted(s.labels["id"] for s in fans) == ["1U/CPUFan1", "Card1/CPUFan1"]
    cards = pick(metrics["ipmi_temperature_celsius"], name="Card Temperature")
    assert sorted(s.labels["id"] for s in cards) == ["Card1/CardTemp", "Card2/CardTemp"]


def test_where_both_schemas_are_there_the_newer_is_read_and_it_says_so(served: Servers) -> None:
    bmc = node_of(poll(served["public-rackmount1"])).bmc
    assert bmc is not None
    assert bmc.power_w == 374.0  # Sensors/TotalPower; the deprecated Power says 344
    assert not [s for s in bmc.sensors if "/Temperatures/" in s.sensor_id]
    left = {p.part: p.detail for p in bmc.parts if not p.enabled}
    assert left == {
        "Chassis/1U/Thermal": "deprecated: Sensors and ThermalSubsystem read instead",
        "Chassis/1U/Power": "deprecated: Sensors and PowerSubsystem read instead",
    }
    assert bmc_schema(bmc) == "Sensors read, not Thermal/Power"
    old = reading(served["public-localstorage"])  # the deprecated schema alone
    assert (old.power_w, old.inlet_c, old.fans_present, old.psus_present) == (344.0, 25.0, 2, 1)
    assert {p.part for p in old.parts if p.part.startswith("Chassis/")} == {
        "Chassis/1U/Thermal",
        "Chassis/1U/Power",
    }
    assert bmc_schema(old) == "Thermal/Power read"


# --- the BMC panel, `gpuconsole snapshot` and /metrics agree ----------------------------


@pytest.mark.parametrize("name", NAMES)
async def test_the_panel_the_snapshot_and_the_metrics_agree(
    served: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    server = served[name]
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[host]\nname = "{NODE}"\n[nvml]\nenabled = false\n[fabric]\nenabled = false\n'
        "[tenancy]\nenabled = false\n"
        f'[[bmc]]\nhost = "127.0.0.1"\nport = {server.port}\nprotocol = "redfish"\n'
        f'username = "admin"\npassword = "any-password"\nca_file = "{server.cert}"\n'
    )
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    monkeypatch.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
    table = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert table.returncode == 0, table.stderr
    snapshot = await console_hub(config.load(cfg), one_shot=True).poll_once()
    app = ConsoleApp(None, start_hub=False, snapshot=snapshot, cursor_blink=False, theme_dirs=[])
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("enter")  # the node: its BMC panel
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        widget = app.screen.query_one("#panel-bmc", Panel)
        panel, subtitle = str(widget.text), str(widget.border_subtitle or "")
        screen = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
    body = render(snapshot)
    assert promtool_problems(body) == []  # the same linter Prometheus users run
    metrics = parse(body)

    def value(metric: str) -> float | None:
        found = pick(metrics.get(metric, []), node=NODE)
        return found[0].value if found else None

    fans, fans_failed = value("gpuconsole_bmc_fans"), value("gpuconsole_bmc_fans_failed")
    psus, psus_failed = value("gpuconsole_bmc_psus"), value("gpuconsole_bmc_psus_failed")
    unfed = value("gpuconsole_bmc_psus_no_input")
    assert fans is not None and fans_failed is not None
    assert psus is not None and psus_failed is not None and unfed is not None
    power_on = value("ipmi_chassis_power_state")
    said = {
        "power": f"power {'unknown' if power_on is None else 'on' if power_on else 'off'}",
        "watts": fmt.watts(value("gpuconsole_bmc_power_watts")),
        "inlet": f"inlet {fmt.celsius(value('gpuconsole_bmc_inlet_temperature_celsius'))}",
        "exhaust": f"exhaust {fmt.celsius(value('gpuconsole_bmc_exhaust_temperature_celsius'))}",
        "fans": f"fans {int(fans - fans_failed)}/{int(fans)} ok",
        "psus": f"PSUs {int(psus - psus_failed - unfed)}/{int(psus)} ok",
    }
    for view, text in (("panel", panel), ("snapshot", table.stdout)):
        for what, words in said.items():
            assert words in text, (view, what, words, text)
    parts = metrics["gpuconsole_bmc_part_up"]
    unread = [s.labels["part"] for s in parts if not s.value]
    in_table = [
        line.split("not read: ", 1)[1].split(": ", 1)[0]
        for line in table.stdout.splitlines()
        if "not read: " in line
    ]
    assert in_table == unread
    if unread:  # the panel's first line names them, and it shows on the screen
        assert panel.splitlines()[0] == "not read: " + ", ".join(unread)
        assert panel.splitlines()[0] in screen
    else:
        assert "not read" not in panel
    # which schema was read: the panel's subtitle, on the screen and in the snapshot
    kinds = {s.labels["part"].rsplit("/", 1)[-1] for s in parts if "/" in s.labels["part"]}
    read = [
        words
        for words, names in (("Sensors", NEWER), ("Thermal/Power", ("Thermal", "Power")))
        if kinds & set(names)
    ]
    assert subtitle.startswith(" and ".join(read) + " read"), (subtitle, kinds)
    assert subtitle in screen and f"({subtitle})" in table.stdout


# --- the BMC's clock -------------------------------------------------------------------


def _stamp(at: float, offset_h: int) -> str:
    """A Redfish date-time (whole seconds, with a UTC offset) for Unix time `at`."""
    zone = dt.timezone(dt.timedelta(hours=offset_h))
    return dt.datetime.fromtimestamp(int(at), zone).isoformat()


@pytest.mark.parametrize(
    ("skew_h", "clock"),
    [(-50.0, "LogService"), (50.0, "LogService"), (-50.0, "Manager")],
)
def test_sel_times_are_on_this_hosts_clock_whatever_the_bmc_clock_says(
    tmp_path: Path, skew_h: float, clock: str
) -> None:
    # rackmount1's system log, its LogService's DateTime 50 h off this host's clock: entry 1
    # stamped 10 min before the BMC's now (news), entry 2 stamped 30 h before it (history,
    # past the verdict's 24 h). By the BMC's clock taken as this host's, a BMC 50 h behind
    # hides the fresh record, and one 50 h ahead makes the old one news. A LogService that
    # gives no DateTime is on its Manager's clock.
    log = "Systems/437XR1138R2/LogServices/Log1"
    now = time.time()
    bmc_now = now + skew_h * 3600
    with serving_copy(tmp_path, "public-rackmount1") as server:
        if clock == "LogService":
            edit(server.root, log, DateTime=_stamp(bmc_now, 6), DateTimeLocalOffset="+06:00")
        else:
            service = json.loads((server.root / log / "index.json").read_text())
            del service["DateTime"], service["DateTimeLocalOffset"]
            (server.root / log / "index.json").write_text(json.dumps(service))
            edit(server.root, "Managers/BMC", DateTime=_stamp(bmc_now, 6))
        listing = server.root / log / "Entries" / "index.json"
        entries = json.loads(listing.read_text())
        fresh, old = entries["Members"]
        # without its UTC offset: the BMC's local time, at its DateTimeLocalOffset (+06:00)
        fresh["Created"] = _stamp(bmc_now - 600, 6)[:19]
        old["Created"] = _stamp(bmc_now - 30 * 3600, 0)
        listing.write_text(json.dumps(entries))
        hub = Hub()
        hub.add_source(BmcSource(NODE, open_link(target(server))))
        snapshot = asyncio.run(hub.poll_once())
    bmc = node_of(snapshot).bmc
    assert bmc is not None and bmc.clock_skew_s is not None
    assert abs(bmc.clock_skew_s - skew_h * 3600) < 3
    assert [e.record_id for e in bmc.sel_recent] == [1, 2]
    assert abs(bmc.sel_recent[0].at - (now - 600)) < 3  # type: ignore[operator]
    assert abs(bmc.sel_recent[1].at - (now - 30 * 3600)) < 3  # type: ignore[operator]
    sel = [f.text for f in node_verdict(node_of(snapshot)).findings if f.code == "sel_critical"]
    assert sel == [f"BMC event log at {fmt.clock_time(bmc.sel_recent[0].at)}: "
                   "Temperature threshold exceeded"]  # fmt: skip
    # shown where it matters: an event says the BMC's clock is off, and which way
    way = "behind" if skew_h < 0 else "ahead of"
    said = [e.message for e in snapshot.events if e.kind == "clock_skew"]
    assert said == [
        f"bmc clock 2 d {way} this host's: its event log times are corrected by it; set its "
        "time (NTP)"
    ]
