r"""Text from outside never reaches an operator's terminal as escape sequences.

A GPU name from the driver, a BMC's SEL text, a pod name from the kubelet, a port name from
sysfs, anything an agent or a capture says: each can hold escape sequences. OSC 52 writes the
operator's clipboard, OSC 0 renames the window, CSI 2J wipes the screen. Where such text
enters, each control character is written out (ESC as the four characters \x1b), so every
output shows that something odd was there and no terminal obeys it; JSON stays exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from gpuconsole import codec
from gpuconsole.cli.main import read_capture
from gpuconsole.cli.table import render_table
from gpuconsole.export import names
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.base import Event, is_record, record_fields
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sim.bmc import SimIpmiSession
from gpuconsole.sim.fakenvml import PROFILE_ENV
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.profiles import get_profile
from gpuconsole.sources.agents import AgentClient, AgentSource
from gpuconsole.sources.bmc import BmcSource
from gpuconsole.sources.bmc.ipmi import IpmiLink, IpmiSensorData
from gpuconsole.sources.bmc.sel import SelCursor
from gpuconsole.sources.fabric.source import FabricSource
from gpuconsole.sources.promql import build_node, parse_overview
from gpuconsole.sources.tenancy import TenancySource
from gpuconsole.ssh.server import ConsoleServer, console_factory
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.events import EventsScreen
from gpuconsole.tui.screens.gpu import GpuScreen
from gpuconsole.tui.screens.node import NodeScreen
from gpuconsole.tui.wallboard import PAGES, WallboardApp
from gpuconsole.wiring import SshSettings
from tests.bmc_fixtures import running_sushy
from tests.conftest_tui import FIXED, frozen_fleet
from tests.fabric_fixtures import FakeSysfs, set_value
from tests.fakenvml_fixtures import FakeNvmlEnv
from tests.tenancy_fixtures import FakeHost, PodSpec, kubelet_server
from tests.test_agents_source import serve
from tests.test_bmc_redfish import read as read_bmc
from tests.test_bmc_redfish import source as redfish_source
from tests.test_ssh_console import Keys, login, open_terminal
from tests.waiting import until

CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"  # OSC 52: "evil" onto the operator's clipboard
TITLE = "\x1b]0;owned\x07"  # OSC 0: the operator's window title
WIPE = "\x1b[2J"  # CSI 2J: the operator's screen erased
HOSTILE = CLIPBOARD + TITLE + WIPE
SHOWN = r"\x1b]52;c;ZXZpbA==\x07"  # what the operator reads in its place
# What no output may hold: C0 controls but the newline between lines, DEL, C1, bidi controls.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# What a terminal would have obeyed, in the bytes a session sends.
OBEYED = (b"\x1b]52;", b"\x1b]0;owned", b"\x1b[2J")

SIZE = (160, 50)


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a reading, a snapshot or an event, keys of mappings included."""
    if isinstance(value, str):
        yield value
    elif is_record(value):
        for f in record_fields(type(value)):
            if f.name != "history":
                yield from strings_in(getattr(value, f.name))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from strings_in(key)
            yield from strings_in(item)
    elif isinstance(value, tuple | list):
        for item in value:
            yield from strings_in(item)


def assert_safe(value: Any) -> list[str]:
    """No string in `value` holds a control character; the strings that show one escaped."""
    raw = [s for s in strings_in(value) if UNSAFE.search(s)]
    assert not raw, f"control characters in {raw[:5]}"
    return [s for s in strings_in(value) if SHOWN[:8] in s]


def assert_shown_safely(text: str) -> None:
    """Text an operator reads: nothing a terminal acts on, and the odd text visible."""
    assert not UNSAFE.findall(text), f"control characters reach the terminal: {text!r:.300}"
    assert SHOWN[:4] in text  # ESC, written out


def assert_not_obeyed(sent: bytes) -> None:
    """Nothing a terminal would obey in what a session sent."""
    for sequence in OBEYED:
        assert sequence not in sent, f"the terminal was sent {sequence!r}"


def screen_text(app: Any) -> str:
    """What the terminal shows now: every segment the screen sends, line by line."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


# --- what an agent (or a capture of one) says -----------------------------------------

# The JSON fields that name things an operator reads, each given the hostile text.
POISONED = frozenset(
    {
        "name",  # GPUs, guests, sensors, HCAs
        "serial",
        "driver_version",
        "pod",
        "namespace",
        "container",
        "comm",
        "user",
        "cgroup",
        "event",  # SEL
        "sensor",
        "message",  # events
        "error",
        "board_id",
        "fw_ver",
        "rate_text",
        "model",
        "detail",
    }
)


def poison(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {
            k: HOSTILE + v if k in POISONED and isinstance(v, str) else poison(v)
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [poison(v) for v in doc]
    return doc


def hostile_document() -> dict[str, Any]:
    """dgx-003 (a guest, pods, processes, a lost GPU, its BMC and fabric) as its agent
    would serve it, with hostile text in every name, in keys, lists, events and errors."""
    fleet = frozen_fleet()
    node = fleet.node("dgx-003")
    assert node is not None
    events = tuple(e for e in fleet.events if e.node == node.node)
    doc = poison(codec.snapshot_json(msgspec.structs.replace(fleet, nodes=(node,), events=events)))
    part = doc["nodes"][0]
    gpu = part["nvml"]["gpus"][0]
    gpu["throttle_reasons"] = [*gpu["throttle_reasons"], HOSTILE]  # a list of strings
    gpu["serial"] = "\u202e" + gpu["serial"] + "\x9b2J"  # a bidi override, an 8-bit CSI
    part["last_xid"] = {**part["last_xid"], HOSTILE + "GPU-x": 79}  # a mapping's key
    part["rates"] = {**part["rates"], f"gpu/{HOSTILE}/power_w": 1.0}  # a counter path
    part["statuses"][0] = {**part["statuses"][0], "ok": False, "error": HOSTILE + "BMC says no"}
    doc["event_counts"] = [[node.node, HOSTILE, "info", 1]]
    return doc


@pytest.fixture
def capture(tmp_path: Path) -> FleetSnapshot:
    """The hostile document read back as `--replay` reads a capture."""
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(hostile_document()))
    return read_capture(path)


def test_a_capture_replays_with_every_string_escaped(capture: FleetSnapshot) -> None:
    shown = assert_safe(capture)
    node = capture.nodes[0]
    assert node.gpus[0].name == SHOWN + r"\x1b]0;owned\x07\x1b[2JNVIDIA H100 80GB HBM3"
    assert node.gpus[0].throttle_reasons[-1].startswith(SHOWN)
    serial = node.gpus[0].serial or ""
    assert serial.startswith("\\u202e" + SHOWN) and serial.endswith("\\x9b2J")
    assert any(key.startswith(SHOWN) for key in node.last_xid)
    assert any(SHOWN in part for key in node.rates for part in key)
    assert len(shown) > 20  # names, pods, processes, sensors, SEL, ports, events, errors


def test_a_snapshot_written_to_json_and_read_back_is_equal(capture: FleetSnapshot) -> None:
    text = codec.dumps(capture)
    data = json.loads(text)  # valid JSON, every string as it was shown
    assert "\\u001b" not in text and "\\u0007" not in text
    assert codec.loads(text) == capture
    assert codec.dumps(codec.loads(text)) == text
    assert data["nodes"][0]["nvml"]["gpus"][0]["name"].startswith(SHOWN)


def test_the_snapshot_table_shows_what_a_capture_says_escaped(capture: FleetSnapshot) -> None:
    table = render_table(capture)
    assert_shown_safely(table)
    assert "STALE: " + SHOWN in table  # the agent's own source error, shown as it was sent


async def test_every_console_view_shows_it_escaped(capture: FleetSnapshot, utc: None) -> None:
    app = ConsoleApp(
        None,
        start_hub=False,
        snapshot=capture,
        clock=lambda: FIXED,
        cursor_blink=False,
        theme_dirs=[],
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert_shown_safely(screen_text(app))  # the fleet: the GPUs' model
        await pilot.press("e")
        assert isinstance(app.screen, EventsScreen)
        await pilot.pause()
        assert_shown_safely(screen_text(app))  # SEL and the lost GPU, as the agent said
        await pilot.press("escape", "enter")
        assert isinstance(app.screen, NodeScreen)
        await pilot.pause()
        assert_shown_safely(screen_text(app))  # driver, source error, pods, SEL
        await pilot.press("enter")
        assert isinstance(app.screen, GpuScreen)
        await pilot.pause()
        assert_shown_safely(screen_text(app))  # name, serial, throttle, owner


async def test_every_wallboard_page_shows_it_escaped(capture: FleetSnapshot, utc: None) -> None:
    app = WallboardApp(None, snapshot=capture, page_s=60, theme_dirs=[], start_hub=False)
    async with app.run_test(size=SIZE) as pilot:
        seen = []
        for _ in PAGES:
            await pilot.pause()
            text = screen_text(app)
            assert not UNSAFE.findall(text), f"page {app.page_index}: {text!r:.300}"
            seen.append(text)
            app.next_page()
            app.render_page()
        assert any(SHOWN[:4] in text for text in seen)


@contextlib.asynccontextmanager
async def hostile_agent(doc: Any, status: int = 200) -> AsyncIterator[str]:
    """An agent on 127.0.0.1 that answers every request with `doc`."""

    async def answer(request: web.Request) -> web.Response:
        text = doc if isinstance(doc, str) else json.dumps(doc)
        return web.Response(status=status, text=text, content_type="application/json")

    runner, port = await serve(answer)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def head_of(url: str) -> Hub:
    head = Hub(HubSettings(publish_gap_s=0.05, max_backoff_s=0.5))
    head.add_source(AgentSource("dgx-003", url, AgentClient(2), interval_s=0.2, timeout_s=2.0))
    return head


async def test_an_agents_text_reaches_the_head_escaped() -> None:
    async with hostile_agent(hostile_document()) as url:
        snapshot = await head_of(url).poll_once()
    assert len(assert_safe(snapshot)) > 20
    assert any(SHOWN in e.message for e in snapshot.events)  # re-posted from the agent's


async def test_an_agents_error_page_reaches_the_head_escaped() -> None:
    async with hostile_agent(HOSTILE + "Internal error", status=500) as url:
        snapshot = await head_of(url).poll_once()
    status = snapshot.nodes[0].status("remote")
    assert status is not None and not status.ok
    assert status.error is not None and SHOWN in status.error
    assert_safe(snapshot)
    assert_shown_safely(render_table(snapshot))


@contextlib.asynccontextmanager
async def head_server(tmp_path: Path, keys: Keys) -> AsyncIterator[ConsoleServer]:
    """A head's ssh server over the hostile agent, its wallboard turning pages quickly."""
    async with hostile_agent(hostile_document()) as url:
        head = head_of(url)
        settings = SshSettings(
            host="127.0.0.1",
            port=0,
            host_key=tmp_path / "state" / "host_key",
            authorized_keys=keys.file,
            idle_timeout_s=0,
        )
        make = console_factory(head, theme=None, wallboard_theme=None, page_s=0.2, theme_dirs=[])
        server = ConsoleServer(head, settings, make)
        await server.start()
        try:
            await until(lambda: head.latest is not None and head.latest.nodes[0].gpus != ())
            yield server
        finally:
            await server.stop()


async def test_an_operators_ssh_session_shows_an_agents_text_escaped(tmp_path: Path) -> None:
    keys = Keys(tmp_path)
    async with head_server(tmp_path, keys) as server, login(server, keys.operator) as conn:
        term = await open_terminal(conn, *SIZE)
        await term.wait_for("dgx-003", "1 lost")
        assert_not_obeyed(term.raw)  # the fleet: the GPUs' model
        term.send("\r")  # the node
        await term.wait_for("owners")
        assert_not_obeyed(term.raw)
        term.send("e")  # its events
        await term.wait_for("\u203a Events", "SEL")
        assert_not_obeyed(term.raw)
        assert term.screen.title != "owned"
        assert SHOWN[:4] in term.text
        term.send("q")
        await term.closed()


async def test_a_wallboards_ssh_session_shows_an_agents_text_escaped(tmp_path: Path) -> None:
    keys = Keys(tmp_path)
    async with (
        head_server(tmp_path, keys) as server,
        login(server, keys.viewer, "wallboard") as conn,
    ):
        board = await open_terminal(conn, *SIZE)
        for page in range(1, len(PAGES) + 1):
            await board.wait_for(f"page {page}/{len(PAGES)}")
            assert_not_obeyed(board.raw)
        board.send("q")
        await board.closed()


# --- what each source reads ---------------------------------------------------------------


def test_a_gpu_name_from_the_driver_is_escaped_in_snapshot_and_its_json(
    tmp_path: Path, fake_nvml_env: FakeNvmlEnv
) -> None:
    env = fake_nvml_env("dgx-h100")
    profile = Path(env[PROFILE_ENV])
    lines = profile.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("name "))
    lines[first] = f"name {HOSTILE}NVIDIA H100"  # GPU 0's name, as the driver gives it
    profile.write_text("\n".join(lines) + "\n")
    config = tmp_path / "node.toml"
    config.write_text(
        "[host]\nname = 'gpu-node'\n[fabric]\nenabled = false\n[tenancy]\nenabled = false\n"
    )

    def snapshot(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "gpuconsole", "snapshot", "-c", str(config), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert_shown_safely(snapshot())
    text = snapshot("--json")
    assert "\\u001b" not in text
    captured = codec.loads(text)
    assert captured.nodes[0].gpus[0].name == SHOWN + r"\x1b]0;owned\x07\x1b[2JNVIDIA H100"
    assert codec.loads(codec.dumps(captured)) == captured


class HostileBmc(SimIpmiSession):
    """A simulated BMC whose first sensor and newest SEL record carry hostile text."""

    def sensor_data(self) -> list[IpmiSensorData]:
        sensors = list(super().sensor_data())
        sensors[0] = dataclasses.replace(sensors[0], name=HOSTILE + sensors[0].name)
        return sensors

    def _records(self) -> list[dict[str, Any]]:
        records = super()._records()
        newest = {**records[-1], "record_id": len(records) + 1}
        return [*records, {**newest, "component": HOSTILE + "PSU", "event": HOSTILE + "Failure"}]


def test_a_redfish_bmcs_text_is_escaped_and_its_nodes_json_stays_readable(tmp_path: Path) -> None:
    with running_sushy(tmp_path / "bmc", "modern") as bmc:
        path = bmc.root / "Chassis/DGX/Sensors/Inlet_Temp/index.json"
        doc = json.loads(path.read_text())
        doc["Name"] = HOSTILE + "Inlet Temp\ud800"  # a lone surrogate: no UTF-8 can hold it
        path.write_text(json.dumps(doc))
        path = bmc.root / "Systems/DGX/LogServices/EventLog/Entries/index.json"
        doc = json.loads(path.read_text())
        doc["Members"][1]["Message"] = HOSTILE + "PSU 3 input lost\ud800"
        path.write_text(json.dumps(doc))
        events: list[Event] = []
        cursor = SelCursor(last_record_id=0, loaded=True)
        reading = asyncio.run(read_bmc(redfish_source(bmc, sel_cursor=cursor), events))
    # what the node's agent serves: JSON that every reader (orjson) reads back as it was
    fleet = FleetSnapshot(1, FIXED, (NodeSnapshot("dgx-h100-01", bmc=reading),))
    assert codec.loads(codec.dumps(fleet)) == fleet
    assert reading.sensor(SHOWN + r"\x1b]0;owned\x07\x1b[2JInlet Temp\ud800") is not None
    assert (
        reading.sel_recent[-1].message == SHOWN + r"\x1b]0;owned\x07\x1b[2JPSU 3 input lost\ud800"
    )
    assert [e.message for e in events if e.kind == "sel"][-1].startswith("SEL: " + SHOWN)
    assert_safe(reading)
    assert_safe(events)


def test_a_redfish_bmcs_system_names_are_escaped_where_gpuconsole_power_lists_them(
    tmp_path: Path,
) -> None:
    with running_sushy(tmp_path / "bmc", "modern") as bmc:
        path = bmc.root / "Systems/index.json"
        doc = json.loads(path.read_text())
        doc["Members"].append({"@odata.id": "/redfish/v1/Systems/" + HOSTILE + "\u202e"})
        path.write_text(json.dumps(doc))
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f'[actions]\njournal = "{tmp_path / "journal.db"}"\n'
            f'audit_log = "{tmp_path / "audit.jsonl"}"\n'
            f'[[bmc]]\nnode = "dgx-h100-01"\nhost = "127.0.0.1"\nport = {bmc.port}\n'
            f'protocol = "redfish"\nusername = "admin"\npassword = "x"\nca_file = "{bmc.cert}"\n'
        )
        command = ["power", "dgx-h100-01", "soft", "--confirm", "dgx-h100-01", "-c", str(cfg)]
        result = subprocess.run(
            [sys.executable, "-m", "gpuconsole", *command],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
        )
        reading = asyncio.run(read_bmc(redfish_source(bmc)))
    # a link no request can carry is one part not read: the sensors stand
    assert reading.power_w == 6120.0 and reading.power_state.value == "unknown"
    assert assert_safe(reading) and [p.part for p in reading.unread][:1] == [
        "Systems/" + SHOWN + r"\x1b]0;owned\x07\x1b[2J\u202e"
    ]
    assert result.returncode == 1
    assert "2 systems, none chosen" in result.stderr
    assert "/redfish/v1/Systems/" + SHOWN in result.stderr  # shown, not obeyed
    assert not UNSAFE.search(result.stdout + result.stderr)
    # each user appends to audit.USER.jsonl beside the configured name
    audit = [path.read_text() for path in tmp_path.glob("audit*.jsonl")]
    assert audit and any(audit)
    assert_safe("".join(audit))


async def test_a_bmcs_sensor_names_and_sel_text_are_escaped_in_readings_and_events() -> None:
    sim = SimNode("dgx-900", get_profile("dgx-h100"), clock=lambda: FIXED, start=FIXED - 120)
    session = HostileBmc(sim)
    link = IpmiLink("sim://dgx-900-bmc", lambda: session)
    source = BmcSource(sim.name, link, sel_cursor=SelCursor(last_record_id=0, loaded=True))
    events: list[Event] = []
    await source.start(events.append)
    try:
        reading = await source.poll()
    finally:
        await source.close()
    assert assert_safe(reading)
    assert reading.sensors[0].name.startswith(SHOWN)
    assert reading.sel_recent[-1].message.startswith(SHOWN)
    sel = [e for e in events if e.kind == "sel"]
    assert sel and SHOWN in sel[-1].message
    assert_safe(events)


async def test_names_and_values_from_sysfs_are_escaped_in_fabric_readings_and_events(
    tmp_path: Path,
) -> None:
    fs = FakeSysfs(tmp_path)
    fs.numa(0, "0-55", 0)
    device = "mlx5_" + CLIPBOARD  # a folder name may hold any byte but / and NUL
    port = fs.hca(
        device,
        ("pci0000:15", "0000:15:01.0", "0000:18:00.0"),
        numa=0,
        rate="400 Gb/sec (4X NDR)" + TITLE,
        netdev="ib" + WIPE,
        counters={"port_rcv_data" + WIPE: 5},
    )
    (port.parent.parent / "board_id").write_text(HOSTILE + "MT_0000000838\n")
    source = FabricSource("n1", sysfs_root=str(tmp_path), netlink=False)
    events: list[Event] = []
    await source.start(events.append)
    try:
        first = await source.poll()
        set_value(port, "state", "1: DOWN", folder=".")
        second = await source.poll()
    finally:
        await source.close()
    assert first.devices[0].name == "mlx5_" + SHOWN
    assert assert_safe(first) and assert_safe(second)
    down = [e for e in events if e.kind == "link_down"]
    assert down and SHOWN in down[0].message
    assert_safe(events)


async def test_process_and_pod_names_are_escaped_in_tenancy_readings_and_events(
    tmp_path: Path,
) -> None:
    uuid = "GPU-1a7f1b2c-3d4e-5f60-7182-93a4b5c6d7e8"
    host = FakeHost(tmp_path / "node")
    host.pci("0000:1b:00.0", driver="nvidia", group=30)
    host.nvidia_info("0000:1b:00.0", uuid, minor=0, model=HOSTILE + "H100")
    host.process(500, cgroup="/user.slice/" + TITLE, comm="python" + CLIPBOARD)
    sock = tmp_path / "kubelet.sock"
    async with kubelet_server(sock) as kubelet:
        source = TenancySource(
            "node-1",
            sysfs_root=host.sysfs_root,
            proc_root=host.proc_root,
            libvirt_uri="",
            kubelet_socket=str(sock),
            passwd_file=str(host.passwd),
        )
        events: list[Event] = []
        await source.start(events.append)
        try:
            first = await source.poll()
            pod = PodSpec("team-" + WIPE, "train" + CLIPBOARD, [("c", "nvidia.com/gpu", [uuid])])
            kubelet.pods = [pod]
            second = await source.poll()
        finally:
            await source.close()
    assert first.processes[0].comm == "python" + SHOWN
    assert first.gpus[0].model is not None and first.gpus[0].model.startswith(SHOWN)
    assert second.pod_devices[0].pod == "train" + SHOWN
    assert assert_safe(first) and assert_safe(second)
    held = [e for e in events if e.kind == "ownership"]
    assert held and SHOWN in held[-1].message
    assert_safe(events)


def test_labels_from_prometheus_are_escaped_in_the_overview() -> None:
    place = {"instance": "10.0.0.7:9400", "node": "dgx-7"}
    values = [
        {"metric": {"__name__": "up", "instance": place["instance"]}, "value": [FIXED, "1"]},
        {
            "metric": {"__name__": names.DCGM_GPU_TEMP[0], "gpu": "0", **place},
            "value": [FIXED, "41"],
        },
    ]
    gpu = {"gpu": "0", "uuid": "GPU-7", "pci_bus_id": "00000000:18:00.0", "model": HOSTILE}
    info = [
        {"metric": {"__name__": names.GPU_INFO[0], **place, **gpu}, "value": [FIXED, "1"]},
        {
            "metric": {"__name__": names.BMC_INFO[0], **place, "bmc": "ipmi://" + TITLE},
            "value": [FIXED, "1"],
        },
    ]
    overview = parse_overview(values, info)
    _name, found = overview.pick(place["instance"], "dgx-7")
    node = build_node("dgx-7", found, overview.at)
    assert node.gpus[0].name.startswith(SHOWN)
    assert node.bmc is not None and node.bmc.bmc == r"ipmi://\x1b]0;owned\x07"
    assert_safe(node)
