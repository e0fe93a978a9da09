"""The headless exporter: dcgm-exporter's names, promtool-clean, JSON snapshot, auth, TLS."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import functools
import json
import os
import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest

from gpuconsole.export.agent import Agent, AgentSettings, parse_listen
from gpuconsole.export.collector import MetricsCache, build, families
from gpuconsole.hub import Hub
from gpuconsole.model import FleetSnapshot
from gpuconsole.sim.cluster import demo_hub
from tests.export_fixtures import frozen_body, frozen_fleet
from tests.peers import require_program

FIXED = 1_796_000_000.0

# The metrics the standard DCGM dashboard (Grafana 12239) queries.
DASHBOARD_METRICS = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
)
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id")


@functools.cache
def frozen_hub() -> Hub:
    """The demo polled once at FIXED, shared by the tests that only read what it holds."""
    hub = demo_hub(clock=lambda: FIXED, start=FIXED - 120, events=False)
    # a thread of its own, so that async tests (already inside a loop) can call it too
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, hub.poll_once()).result()
    return hub


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    hub = frozen_hub()
    server = Agent(hub, AgentSettings(port=0))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def get(url: str, **kwargs: object) -> tuple[int, str, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.get(url, **kwargs) as response:  # type: ignore[arg-type]
        return response.status, await response.text(), dict(response.headers)


def samples(body: str, name: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith(name + "{")]


async def test_metrics_carry_dcgm_names_and_labels(agent: Agent) -> None:
    status, body, headers = await get(f"http://127.0.0.1:{agent.port}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    snapshot = agent.hub.latest
    assert snapshot is not None
    # every GPU the hosts' NVML sees (guests hold dgx-001's 8, dgx-004's 1, dgxa-002's 2),
    # the lost one and those in MIG mode (no whole-GPU utilization) aside
    visible = [g for node in snapshot.nodes for g in node.gpus if not (g.lost or g.mig_enabled)]
    assert len(visible) >= 8 * 7 - 11 - 1 - 2
    for name in DASHBOARD_METRICS:
        lines = samples(body, name)
        assert len(lines) >= len(visible), name
        for label in DCGM_LABELS:
            assert f'{label}="' in lines[0], (name, label)
    util = samples(body, "DCGM_FI_DEV_GPU_UTIL")
    assert any(
        'Hostname="dgx-002"' in line and 'modelName="NVIDIA H100 80GB HBM3"' in line
        for line in util
    )
    mig = [line for line in samples(body, "gpuconsole_mig_instance_info") if "dgx-004" in line]
    assert len(mig) == 4 and any('profile="3g.40gb"' in line for line in mig)
    assert 'gpuconsole_source_up{node="dgx-001",source="nvml"} 1.0' in body
    assert 'gpuconsole_node_simulated{node="dgx-001"} 1.0' in body


async def test_gpm_becomes_dcgm_profiling_metrics_on_hopper_only() -> None:
    hub = demo_hub(interval_s=0.1, events=False)
    await hub.start()
    try:
        for _ in range(50):
            await asyncio.sleep(0.1)
            body = MetricsCache(lambda: hub.latest).render().decode()
            active = samples(body, "DCGM_FI_PROF_SM_ACTIVE")
            if any('GPU_I_ID="' in line and "dgx-004" in line for line in active):
                break
    finally:
        await hub.stop()
    active = samples(body, "DCGM_FI_PROF_SM_ACTIVE")
    assert any('Hostname="dgx-002"' in line for line in active)
    assert not any('Hostname="dgxa-002"' in line for line in active)  # A100: no GPM
    mig = [line for line in active if 'GPU_I_ID="' in line and 'Hostname="dgx-004"' in line]
    assert len(mig) == 4
    values = [float(line.rsplit(" ", 1)[1]) for line in active]
    assert all(0.0 <= v <= 1.0 for v in values)


async def test_a_throttled_gpu_and_a_pending_remap_are_visible(agent: Agent) -> None:
    _, body, _ = await get(f"http://127.0.0.1:{agent.port}/metrics")
    assert any(
        'node="dgx-002"' in line and 'gpu="3"' in line and 'reason="hw_thermal_slowdown"' in line
        for line in samples(body, "gpuconsole_gpu_throttle_reason")
    )
    pending = [
        line
        for line in samples(body, "DCGM_FI_DEV_ROW_REMAP_PENDING")
        if 'Hostname="dgx-004"' in line and 'gpu="2"' in line
    ]
    assert pending and pending[0].endswith(" 1.0")


# promtool's lint objects to two things dcgm-exporter itself emits and dashboards query:
# the camelCase label `modelName` and the word "counter" in DCGM_FI_DEV_PCIE_REPLAY_COUNTER.
DCGM_LINTS = (
    "label names should be written in 'snake_case' not 'camelCase'",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'",
)


def promtool_problems(body: str) -> list[str]:
    promtool = require_program("promtool", "apt-get install prometheus")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
    )
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == (3 if problems else 0), problems
    return problems


async def test_promtool_finds_nothing_but_dcgm_exporters_own_names(agent: Agent) -> None:
    _, body, _ = await get(f"http://127.0.0.1:{agent.port}/metrics")
    problems = promtool_problems(body)
    assert problems, "expected dcgm-exporter's modelName label to be linted"
    assert [p for p in problems if not any(lint in p for lint in DCGM_LINTS)] == []
    assert all(p.startswith("DCGM_FI_") for p in problems)


def test_promtool_passes_bmc_fabric_and_ownership_series_too() -> None:
    body = frozen_body()  # two polls: rates, pods, MIG owners, problems
    for prefix in ("ipmi_", "node_infiniband_", "gpuconsole_gpu_owner_info", "gpuconsole_bmc_"):
        assert f"\n{prefix}" in body, prefix
    problems = promtool_problems(body)
    assert [p for p in problems if not any(lint in p for lint in DCGM_LINTS)] == []


async def test_the_agent_serves_ipmi_and_infiniband_series(agent: Agent) -> None:
    _, body, _ = await get(f"http://127.0.0.1:{agent.port}/metrics")
    assert samples(body, "ipmi_fan_speed_rpm") and samples(body, "ipmi_up")
    assert samples(body, "node_infiniband_port_data_received_bytes_total")
    assert samples(body, "gpuconsole_gpu_owner_info")


async def test_promtool_accepts_gpuconsoles_own_metrics(agent: Agent) -> None:
    _, body, _ = await get(f"http://127.0.0.1:{agent.port}/metrics")
    ours = "\n".join(
        line
        for line in body.splitlines()
        if line.split(" ")[min(2, len(line.split(" ")) - 1)].startswith("gpuconsole_")
        or line.startswith("gpuconsole_")
    )
    assert "gpuconsole_gpu_info" in ours
    assert promtool_problems(ours + "\n") == []


async def test_the_json_snapshot_is_served_and_versioned(agent: Agent) -> None:
    status, body, _ = await get(f"http://127.0.0.1:{agent.port}/api/v1/snapshot")
    assert status == 200
    data = json.loads(body)
    assert data["schema_version"] == 1 and len(data["nodes"]) == 7


async def test_health_and_readiness(agent: Agent) -> None:
    assert (await get(f"http://127.0.0.1:{agent.port}/-/healthy"))[0] == 200
    assert (await get(f"http://127.0.0.1:{agent.port}/-/ready"))[0] == 200


async def test_not_ready_before_the_first_poll() -> None:
    server = Agent(demo_hub(events=False), AgentSettings(port=0))
    await server.start()
    try:
        assert (await get(f"http://127.0.0.1:{server.port}/-/ready"))[0] == 503
        assert (await get(f"http://127.0.0.1:{server.port}/api/v1/snapshot"))[0] == 503
    finally:
        await server.stop()


async def test_a_scrape_never_polls_hardware() -> None:
    hub = frozen_hub()
    polls_before = [s.status.polls for n in hub._nodes.values() for s in n.sources]
    cache = MetricsCache(lambda: hub.latest)
    first = cache.render()
    for _ in range(20):
        assert cache.render() is first  # rendered once per snapshot
    assert [s.status.polls for n in hub._nodes.values() for s in n.sources] == polls_before


async def test_basic_auth_guards_everything_but_healthy() -> None:
    hub = frozen_hub()
    server = Agent(hub, AgentSettings(port=0, basic_auth_user="prom", basic_auth_password="s3cret"))
    await server.start()
    url = f"http://127.0.0.1:{server.port}"
    good = "Basic " + base64.b64encode(b"prom:s3cret").decode()
    bad = "Basic " + base64.b64encode(b"prom:wrong").decode()
    try:
        assert (await get(f"{url}/metrics"))[0] == 401
        assert (await get(f"{url}/metrics", headers={"Authorization": bad}))[0] == 401
        assert (await get(f"{url}/metrics", headers={"Authorization": good}))[0] == 200
        assert (await get(f"{url}/-/healthy"))[0] == 200
    finally:
        await server.stop()


async def test_tls(tmp_path: Path) -> None:
    openssl = require_program("openssl", "apt-get install openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    hub = frozen_hub()
    server = Agent(hub, AgentSettings(port=0, tls_cert=cert, tls_key=key))
    await server.start()
    try:
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        status, body, _ = await get(f"https://127.0.0.1:{server.port}/metrics", ssl=context)
        assert status == 200 and "DCGM_FI_DEV_GPU_UTIL" in body
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        (":9500", ("0.0.0.0", 9500)),
        ("[::1]:9401", ("::1", 9401)),
        ("localhost", ("localhost", 9400)),
    ],
)
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


def test_a_bad_listen_address_is_refused() -> None:
    with pytest.raises(ValueError, match="port must be a number"):
        parse_listen("127.0.0.1:http")


async def test_the_agent_command_serves_the_demo(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuconsole",
        "agent",
        "--demo",
        "--nodes",
        "2",
        "--listen",
        f"127.0.0.1:{port}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path)},
    )
    try:
        body = ""
        for _ in range(100):
            try:
                status, body, _ = await get(f"http://127.0.0.1:{port}/metrics")
                # dgx-001's eight GPUs are passed through to a guest: NVML sees dgx-002's
                if status == 200 and len(re.findall(r"^DCGM_FI_DEV_GPU_UTIL\{", body, re.M)) == 8:
                    break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        assert len(re.findall(r"^DCGM_FI_DEV_GPU_UTIL\{", body, re.M)) == 8
    finally:
        proc.terminate()
        await proc.wait()


def test_the_fast_exposition_is_byte_for_byte_what_prometheus_client_writes() -> None:
    snapshot = frozen_fleet()
    ours = build(snapshot, now=FIXED).text()
    theirs = generate_latest(_Fixed(snapshot))
    assert ours == theirs and b"ipmi_fan_speed_rpm{" in ours


class _Fixed:
    """prometheus_client's own renderer over the same families, on a fixed clock."""

    def __init__(self, snapshot: FleetSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        return families(self.snapshot, now=FIXED)
