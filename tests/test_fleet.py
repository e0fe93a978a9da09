"""The fleet a head reads: members from the config and file_sd, real agents, replays."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.cli.main import read_capture
from gpuconsole.config import ConfigError, FleetConfig, parse
from gpuconsole.sources.agents import AgentSource
from gpuconsole.sources.promql import PromQLSource, overview_queries
from gpuconsole.sources.targets import FleetMember, parse_agent
from gpuconsole.wiring import console_hub, members, ssh_target


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("dgx-001=http://10.1.0.1:9400", FleetMember("dgx-001", "http://10.1.0.1:9400")),
        ("http://dgx-002:9400", FleetMember("dgx-002", "http://dgx-002:9400")),
        ("dgx-003:9400", FleetMember("dgx-003", "http://dgx-003:9400")),
    ],
)
def test_agent_entries(entry: str, expected: FleetMember) -> None:
    assert parse_agent(entry) == expected


def test_a_targets_file_in_prometheus_file_sd_form(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    path.write_text(
        json.dumps(
            [
                {"targets": ["10.1.0.7:9400"], "labels": {"node": "dgx-007", "ssh": "ops@dgx-007"}},
                {"targets": ["dgx-008:9400", "dgx-009:9400"]},
            ]
        )
    )
    cfg = FleetConfig(agents=("dgx-007=http://10.1.0.7:9400",), targets_file=str(path))
    assert members(cfg) == [
        FleetMember("dgx-007", "http://10.1.0.7:9400"),
        FleetMember("dgx-008", "http://dgx-008:9400"),
        FleetMember("dgx-009", "http://dgx-009:9400"),
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not JSON"),
        ('{"targets": []}', "list of target groups"),
        ('[{"labels": {}}]', "group 0 has no targets"),
    ],
)
def test_a_bad_targets_file_is_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        members(FleetConfig(targets_file=str(path)))


def test_agents_sharing_a_host_are_distinct_nodes(tmp_path: Path) -> None:
    """One host, several agents (ports): named host:port unless a label names them."""
    path = tmp_path / "targets.json"
    path.write_text(
        json.dumps(
            [
                {"targets": ["gpu-host:9401", "gpu-host:9402"]},
                {"targets": ["gpu-host:9403"], "labels": {"node": "dgx-003"}},
                {"targets": ["dgx-004:9400"]},
            ]
        )
    )
    cfg = FleetConfig(agents=("http://gpu-host:9401",), targets_file=str(path))
    assert [(m.node, m.address) for m in members(cfg)] == [
        ("gpu-host:9401", "gpu-host:9401"),  # the same agent twice is one member
        ("gpu-host:9402", "gpu-host:9402"),
        ("dgx-003", "gpu-host:9403"),
        ("dgx-004", "dgx-004:9400"),
    ]


def test_a_config_with_agents_makes_a_head() -> None:
    cfg = parse('[fleet]\nagents = ["a=http://127.0.0.1:1", "b=http://127.0.0.1:2"]\n')
    hub = console_hub(cfg)
    assert sorted(s.node for s in hub.sources) == ["a", "b"]
    assert {s.kind for s in hub.sources} == {"remote"}
    assert {type(s) for s in hub.sources} == {AgentSource}


def test_a_config_with_a_prometheus_reads_the_overview_from_it() -> None:
    cfg = parse(
        '[fleet]\nagents = ["http://127.0.0.1:1", "http://127.0.0.1:2"]\n'
        'prometheus = "http://127.0.0.1:9090"\nprometheus_selector = \'job="gpu"\'\n'
    )
    hub = console_hub(cfg)
    sources = [s for s in hub.sources if isinstance(s, PromQLSource)]
    assert [(s.node, s.instance) for s in sources] == [
        ("127.0.0.1:1", "127.0.0.1:1"),
        ("127.0.0.1:2", "127.0.0.1:2"),
    ]
    assert [s.agent.url for s in sources] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert all(', job="gpu"' in q for q in overview_queries('job="gpu"'))


@pytest.fixture(scope="module")
def two_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """Two `gpuconsole agent --demo` processes on this host, shared by the module's tests."""
    ports = [free_port(), free_port()]
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("agents"))}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuconsole",
                "agent",
                "--demo",
                "--nodes",
                "1",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    try:
        import urllib.request

        for port in ports:
            for _ in range(100):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready") as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                time.sleep(0.1)
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def test_snapshot_on_a_head_reads_every_agent(two_agents: list[int], tmp_path: Path) -> None:
    cfg = tmp_path / "head.toml"
    agents = ", ".join(f'"n{i}=http://127.0.0.1:{p}"' for i, p in enumerate(two_agents))
    cfg.write_text(f'[fleet]\nagents = [{agents}, "gone=http://127.0.0.1:{free_port()}"]\n')
    result = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "--json", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    nodes = {n["node"]: n for n in data["nodes"]}
    assert sorted(nodes) == ["gone", "n0", "n1"]
    for name in ("n0", "n1"):
        # the agent's node (dgx-001) as the agent read it; its GPUs may be passed through
        assert nodes[name]["nvml"]["driver_version"] == "550.90.07"
        assert nodes[name]["profile"] == "dgx-h100"
        assert {s["source"]: s["ok"] for s in nodes[name]["statuses"]}["remote"] is True
    gone = {s["source"]: s for s in nodes["gone"]["statuses"]}["remote"]
    assert gone["ok"] is False and "unreachable" in gone["error"]


def test_two_agents_on_one_host_in_a_targets_file_are_two_nodes(
    two_agents: list[int], tmp_path: Path
) -> None:
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{p}" for p in two_agents]}]))
    cfg = tmp_path / "head.toml"
    cfg.write_text(f'[fleet]\ntargets_file = "{targets}"\n')
    result = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "--json", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    nodes = {n["node"]: n for n in json.loads(result.stdout)["nodes"]}
    # each named as its agent names its node; both agents name theirs dgx-001, so the second
    # keeps the name its address gives it
    assert sorted(nodes) == sorted(["dgx-001", f"127.0.0.1:{two_agents[1]}"])
    for node in nodes.values():
        assert {s["source"]: s["ok"] for s in node["statuses"]}["remote"] is True
        assert node["profile"] == "dgx-h100"


def _agent(port: int, nodes: int, state: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuconsole", "agent", "--demo"),
            *("--nodes", str(nodes), "--listen", f"127.0.0.1:{port}"),
        ],
        env={**os.environ, "XDG_STATE_HOME": str(state)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_agents_given_by_url_only_are_read_under_their_own_names(tmp_path: Path) -> None:
    """A plain URL: the head reads every node its agent serves, named as the agent names it."""
    port = free_port()
    agent = _agent(port, 3, tmp_path)
    try:
        import urllib.request

        for _ in range(150):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready") as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        gone = free_port()
        cfg = tmp_path / "head.toml"
        cfg.write_text(f'[fleet]\nagents = ["http://127.0.0.1:{port}", "127.0.0.1:{gone}"]\n')
        result = subprocess.run(
            [sys.executable, "-m", "gpuconsole", "snapshot", "--json", "-c", str(cfg)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        # an action on a node so named reaches it over ssh at its agent's host
        assert ssh_target(parse(cfg.read_text()), "dgx-002").host == "127.0.0.1"
    finally:
        agent.terminate()
        agent.wait(10)
    nodes = {n["node"]: n for n in json.loads(result.stdout)["nodes"]}
    assert sorted(nodes) == sorted(["dgx-001", "dgx-002", "dgx-003", f"127.0.0.1:{gone}"])
    for name in ("dgx-002", "dgx-003"):
        assert {s["source"]: s["ok"] for s in nodes[name]["statuses"]}["remote"] is True
        assert len(nodes[name]["nvml"]["gpus"]) == 8
    # an agent that does not answer keeps its address for a name, and says why
    down = {s["source"]: s for s in nodes[f"127.0.0.1:{gone}"]["statuses"]}["remote"]
    assert down["ok"] is False and "unreachable" in down["error"]


def test_config_example_shows_both_forms_of_an_agent() -> None:
    from gpuconsole.config import example, parse

    fleet = example().split("\n[fleet]\n")[1].split("\n[")[0]
    assert '"http://' in fleet and "=http://" in fleet
    parse('[fleet]\nagents = ["http://10.1.0.1:9400", "dgx-002=http://10.1.0.2:9400"]\n')


def test_a_capture_replays(tmp_path: Path) -> None:
    capture = tmp_path / "dgx.json"
    result = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "--demo", "--json", "--nodes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    capture.write_text(result.stdout)
    snapshot = read_capture(capture)
    assert [n.node for n in snapshot.nodes] == ["dgx-001", "dgx-002"]
    assert snapshot.simulated
    capture.write_text('{"schema_version": 1, "nodes": 5}')
    with pytest.raises(ConfigError, match="not a gpuconsole snapshot"):
        read_capture(capture)


async def test_a_replay_says_replay_and_when_it_was_captured_and_ages_as_of_then(
    tmp_path: Path, utc: None
) -> None:
    """`demo --replay FILE` an hour after the capture: REPLAY and the capture's date and
    time, not STALE; each node's "seen" is its age when the capture was made."""
    from gpuconsole import format as fmt
    from gpuconsole.codec import dumps
    from gpuconsole.facts import summaries
    from gpuconsole.tui.app import ConsoleApp
    from gpuconsole.tui.widgets.row_table import RowTable
    from gpuconsole.tui.widgets.status_bar import StatusBar
    from tests.conftest_tui import frozen_fleet

    capture = tmp_path / "capture.json"
    capture.write_text(dumps(frozen_fleet()))
    snapshot = read_capture(capture)
    app = ConsoleApp(
        None, start_hub=False, snapshot=snapshot, theme_dirs=[], cursor_blink=False, replay=True
    )
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        bar = str(app.screen.query_one(StatusBar).render())
        table = app.screen.query_one("#fleet-table", RowTable)
        seen = [str(table.get_row_at(i)[-1]) for i in range(table.row_count)]
    assert "REPLAY" in bar and "SIMULATED" in bar
    assert f"captured {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(snapshot.at))}" in bar
    assert "STALE" not in bar and "ago" not in bar
    expected = [fmt.age(summaries.oldest_ok(n), snapshot.at) for n in snapshot.nodes]
    assert seen and seen == expected


def test_agents_are_asked_their_names_once_and_an_action_goes_by_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head names URL-only members at start; an assign on one of them later (from the
    console's loop) must not ask the network again, and finds the node by the same name."""
    import gpuconsole.sources.agents as agents_mod
    from gpuconsole import wiring

    asked: list[int] = []

    async def named(listed: list[FleetMember], _wait_s: float) -> list[FleetMember]:
        asked.append(len(listed))
        return [FleetMember(node="dgx-777", url=m.url) for m in listed]

    monkeypatch.setattr(agents_mod, "named_by_agents", named)
    monkeypatch.setattr(wiring, "_NAMED", {})
    cfg = parse('[fleet]\nagents = ["http://10.255.0.7:9400"]\n')
    assert [m.node for m in wiring.named_members(cfg.fleet)] == ["dgx-777"]
    assert ssh_target(cfg, "dgx-777").host == "10.255.0.7"
    assert asked == [1]  # once, at the start
