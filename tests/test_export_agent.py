"""The headless exporter: dcgm-exporter's names, promtool-clean, JSON snapshot, auth, TLS."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import gzip
import json
import os
import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest

from gpuconsole.config import parse_listen
from gpuconsole.export.agent import Agent, accepts_gzip
from gpuconsole.export.collector import MetricsCache, build, families
from gpuconsole.facts.inventory import short_bus_id
from gpuconsole.hub import Hub
from gpuconsole.readings.nvml import GpmMetrics, GpuReading, MigInstance, NvLinkReading, NvmlReading
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sim.cluster import demo_hub
from gpuconsole.wiring import AgentSettings
from tests.bmc_fixtures import free_port
from tests.export_fixtures import (
    frozen_body,
    frozen_fleet,
    frozen_twice_hub,
    one,
    parse,
    pick,
    render,
)
from tests.peers import require_program

FIXED = 1_796_000_000.0

# What the standard DCGM dashboard, Grafana 12239 (NVIDIA/dcgm-exporter,
# grafana/dcgm-exporter-dashboard.json), queries: each panel's title and PromQL as the
# current revision has them, with its two variables ($Hostname, then $gpu) read from
# DCGM_FI_DEV_FB_FREE; the first revision selected by `instance` and drew GPU_UTIL.
SELECT = 'Hostname=~"$Hostname", gpu=~"$gpu"'
DASHBOARD_PANELS: tuple[tuple[str, str], ...] = (
    ("GPU Temperature", f"max(DCGM_FI_DEV_GPU_TEMP{{{SELECT}}}) by (Hostname, gpu, uuid)"),
    ("GPU Avg. Temp", f"avg(DCGM_FI_DEV_GPU_TEMP{{{SELECT}}})"),
    ("GPU Power Usage", f"max(DCGM_FI_DEV_POWER_USAGE{{{SELECT}}}) by (Hostname, gpu, uuid)"),
    ("GPU Power Total", f"sum(max(DCGM_FI_DEV_POWER_USAGE{{{SELECT}}}) by (gpu))"),
    ("GPU SM Clocks", f"max(DCGM_FI_DEV_SM_CLOCK{{{SELECT}}} * 1000000) by (Hostname, UUID, gpu)"),
    (
        "GPU Utilization",
        f"max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{SELECT}}}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    ),
    (
        "Tensor Core Utilization",
        f"max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{SELECT}}}) "
        "by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    ),
    (
        "GPU Framebuffer Mem Used",
        f"max(DCGM_FI_DEV_FB_USED{{{SELECT}}}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    ),
    (
        "GPU Utilization (first revision)",
        'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    ),
)
DASHBOARD_METRICS = sorted(
    {name for _, expr in DASHBOARD_PANELS for name in re.findall(r"DCGM_FI_\w+", expr)}
    | {"DCGM_FI_DEV_FB_FREE"}
)
# Its profiling panels need GPM (Hopper and newer), as DCGM needs its profiling module.
PROFILING = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
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


def dashboard_gpus(snapshot: FleetSnapshot, metric: str) -> set[tuple[str, str, str]]:
    """(Hostname, gpu, GPU_I_ID) of every series the dashboard should draw for `metric`:
    every GPU the hosts' NVML sees, less the lost one; whole-GPU utilization not for GPUs
    in MIG mode; profiling only where there is GPM, and for each MIG instance."""
    out = set()
    for node in snapshot.nodes:
        for gpu in node.gpus:
            if gpu.lost or (metric == "DCGM_FI_DEV_GPU_UTIL" and gpu.mig_enabled):
                continue
            if metric not in PROFILING or gpu.gpm is not None:
                out.add((node.node, str(gpu.index), ""))
            for mig in gpu.mig_instances:
                if metric == "DCGM_FI_DEV_FB_USED" or (metric in PROFILING and mig.gpm):
                    out.add((node.node, str(gpu.index), str(mig.gpu_instance_id)))
        # a passthrough GPU its guest's agent reads: labelled by guest, with no host index
        for guest in node.tenancy.guest_gpus if node.tenancy else ():
            gpu = guest.reading
            if gpu is None or guest.error is not None:
                continue
            if metric not in PROFILING or gpu.gpm is not None:
                out.add((node.node, short_bus_id(guest.bus_id), ""))
    return out


def test_every_metric_the_dashboard_queries_is_there_with_its_labels() -> None:
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in DASHBOARD_METRICS
    for name in DASHBOARD_METRICS:
        expected = dashboard_gpus(snapshot, name)
        # guests hold dgx-001's eight GPUs, dgx-004's one and dgxa-002's two; one is lost;
        # two are in MIG mode. GPM: dgx-002's and dgx-003's eight, dgx-004's six.
        least = 8 + 8 + 6 if name in PROFILING else 7 * 8 - 11 - 1 - 2
        assert len({(host, gpu) for host, gpu, _ in expected}) >= least, name
        found = {
            (s.labels["Hostname"], s.labels["gpu"], s.labels.get("GPU_I_ID", ""))
            for s in metrics[name]
        }
        assert found == expected, name
        for sample in metrics[name]:
            assert set(DCGM_LABELS) <= set(sample.labels), (name, sample)
            if sample.labels.get("GPU_I_ID"):
                assert re.fullmatch(r"\d+g\.\d+gb", sample.labels["GPU_I_PROFILE"]), sample
    # the profiling panels are ratios (Grafana's percentunit, 0..1), as from dcgm-exporter
    for name in PROFILING:
        assert all(0.0 <= s.value <= 1.0 for s in metrics[name]), name
        assert any(s.value > 0.05 for s in metrics[name]), name


T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[T | None]], timeout: float = 60.0) -> T:
    """The first answer of `check` that is not None, asking until `timeout` seconds pass."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            answer = await check()
            if answer is not None:
                return answer
        assert asyncio.get_running_loop().time() < deadline, "never came"
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def prometheus(target: str, folder: Path, rules: Sequence[Path] = ()) -> AsyncIterator[str]:
    """A Prometheus server scraping `target` and evaluating `rules` (alerting-rules files)
    every second; yields its URL."""
    binary = require_program("prometheus", "apt-get install prometheus")
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: {json.dumps([str(r) for r in rules])}\n"
        f"scrape_configs: [{{job_name: gpuconsole, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    log = folder / "prometheus.log"
    for _attempt in range(3):  # another process may take the free port before Prometheus
        port = free_port()
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                stdout=out,
                stderr=out,
            )
        url = f"http://127.0.0.1:{port}"

        async def ready(url: str = url, proc: asyncio.subprocess.Process = proc) -> bool | None:
            if proc.returncode is not None:
                return False
            return (await get(f"{url}/-/ready"))[0] == 200 or None

        try:
            if await eventually(ready):
                yield url
                return
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
    raise AssertionError(f"prometheus never started:\n{log.read_text()[-2000:]}")


async def promql(url: str, expr: str) -> list[dict[str, Any]]:
    """The series of an instant query: each a {"metric": labels, "value": [time, text]}."""
    status, body, _ = await get(f"{url}/api/v1/query", params={"query": expr})
    assert status == 200, body
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
    return result


async def test_prometheus_draws_every_panel_of_the_dcgm_dashboard(tmp_path: Path) -> None:
    hub = frozen_twice_hub()
    snapshot = hub.latest
    assert snapshot is not None
    server = Agent(hub, AgentSettings(port=0))
    await server.start()
    try:
        async with prometheus(f"127.0.0.1:{server.port}", tmp_path) as url:
            gpus = len(dashboard_gpus(snapshot, "DCGM_FI_DEV_FB_FREE"))

            async def scraped() -> bool | None:
                found = await promql(url, "count(DCGM_FI_DEV_FB_FREE)")
                count = float(found[0]["value"][1]) if found else 0.0
                return True if count == gpus else None

            await eventually(scraped)
            # the variables, as Grafana fills them when "All" is chosen
            _, body, _ = await get(
                f"{url}/api/v1/label/Hostname/values", params={"match[]": "DCGM_FI_DEV_FB_FREE"}
            )
            hosts = json.loads(body)["data"]
            assert set(hosts) == {n.node for n in snapshot.nodes if n.gpus}
            any_host = "|".join(hosts)
            _, body, _ = await get(
                f"{url}/api/v1/label/gpu/values",
                params={"match[]": f'DCGM_FI_DEV_FB_FREE{{Hostname=~"{any_host}"}}'},
            )
            any_gpu = "|".join(json.loads(body)["data"])
            _, body, _ = await get(  # the first revision's: the scrape target
                f"{url}/api/v1/label/instance/values", params={"match[]": "DCGM_FI_DEV_GPU_TEMP"}
            )
            [instance] = json.loads(body)["data"]
            for title, expr in DASHBOARD_PANELS:
                query = expr.replace("$Hostname", any_host).replace("$gpu", any_gpu)
                query = query.replace("$instance", instance)
                series = await promql(url, query)
                assert series, title
                [name] = re.findall(r"DCGM_FI_\w+", expr)
                if " by (gpu)" in expr or "avg(" in expr:  # one figure for the whole fleet
                    assert len(series) == 1 and float(series[0]["value"][1]) > 0, title
                    continue
                drawn = {
                    (m["Hostname"], m["gpu"], m.get("GPU_I_ID", ""))
                    for m in (s["metric"] for s in series)
                }
                assert drawn == dashboard_gpus(snapshot, name), title
            # the clock panel shows Hz: the exporter's MHz times a million
            gpu = snapshot.nodes[1].gpus[0]
            [clock] = await promql(url, f'DCGM_FI_DEV_SM_CLOCK{{UUID="{gpu.uuid}"}} * 1000000')
            assert gpu.sm_clock_mhz is not None
            assert float(clock["value"][1]) == gpu.sm_clock_mhz * 1e6
    finally:
        await server.stop()


def _profiled_node() -> FleetSnapshot:
    """One Hopper with GPM and a MIG instance, one A100 without GPM, and counter rates."""
    gpm = GpmMetrics(
        graphics_util_pct=80.0,
        sm_util_pct=60.0,
        sm_occupancy_pct=30.0,
        tensor_util_pct=45.0,
        fp64_util_pct=1.0,
        fp32_util_pct=12.0,
        fp16_util_pct=7.5,
        dram_bw_util_pct=55.0,
        pcie_tx_bytes_per_s=2.0e9,
        pcie_rx_bytes_per_s=3.0e9,
        nvlink_tx_bytes_per_s=4.0e10,
        nvlink_rx_bytes_per_s=5.0e10,
    )
    mig = MigInstance(1, 0, "MIG-1", "3g.40gb", 3, 60, gpm=GpmMetrics(graphics_util_pct=20.0))
    links = (NvLinkReading(0, True, tx_kib_total=1, rx_kib_total=1),
             NvLinkReading(1, True, tx_kib_total=1, rx_kib_total=1))  # fmt: skip
    hopper = GpuReading(0, "GPU-h", "NVIDIA H100 80GB HBM3", "00000000:1B:00.0", gpm=gpm,
                        nvlinks=links, mig_instances=(mig,))  # fmt: skip
    ampere = GpuReading(1, "GPU-a", "NVIDIA A100-SXM4-80GB", "00000000:43:00.0", nvlinks=links)
    nvml = NvmlReading(FIXED, None, None, None, (hopper, ampere))
    rates = {
        ("gpu", "GPU-a", "pcie_tx_bytes"): 1.5e9,
        ("gpu", "GPU-a", "pcie_rx_bytes"): 2.5e9,
        ("gpu", "GPU-a", "nvlink", "0", "tx_kib"): 1024.0,
        ("gpu", "GPU-a", "nvlink", "0", "rx_kib"): 2048.0,
        ("gpu", "GPU-a", "nvlink", "1", "tx_kib"): 1024.0,
        ("gpu", "GPU-a", "nvlink", "1", "rx_kib"): 3072.0,
    }
    node = NodeSnapshot(node="n1", nvml=nvml, rates=rates)
    return FleetSnapshot(seq=1, at=FIXED, nodes=(node,))


def test_profiling_metrics_are_ratios_and_bytes_per_second_from_their_own_source() -> None:
    metrics = parse(render(_profiled_node()))

    def value(name: str, **labels: str) -> float:
        return one(metrics[name], **labels).value

    ratios = {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.80,  # GPM's graphics utilization, not SM activity
        "DCGM_FI_PROF_SM_ACTIVE": 0.60,
        "DCGM_FI_PROF_SM_OCCUPANCY": 0.30,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.45,
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.01,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.12,
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.075,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.55,
    }
    for name, ratio in ratios.items():
        [whole] = [s for s in metrics[name] if "GPU_I_ID" not in s.labels]  # the A100: none
        assert whole.labels["UUID"] == "GPU-h" and whole.value == pytest.approx(ratio), name
    assert value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", GPU_I_ID="1") == pytest.approx(0.2)
    # bytes per second: GPM's where it has them, else NVML's counters (the A100)
    assert value("DCGM_FI_PROF_PCIE_TX_BYTES", UUID="GPU-h") == 2.0e9
    assert value("DCGM_FI_PROF_NVLINK_RX_BYTES", UUID="GPU-h") == 5.0e10
    assert value("DCGM_FI_PROF_PCIE_TX_BYTES", UUID="GPU-a") == 1.5e9
    assert value("DCGM_FI_PROF_PCIE_RX_BYTES", UUID="GPU-a") == 2.5e9
    assert value("DCGM_FI_PROF_NVLINK_TX_BYTES", UUID="GPU-a") == 2048.0 * 1024
    assert value("DCGM_FI_PROF_NVLINK_RX_BYTES", UUID="GPU-a") == 5120.0 * 1024
    # DCGM's NVLink "total" is a rate in MiB/s over every link and both directions
    assert value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", UUID="GPU-a") == 7168.0 / 1024
    assert not pick(metrics["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"], UUID="GPU-h")  # one poll
    # nothing is known of reserved memory here: no series rather than a zero
    assert "DCGM_FI_DEV_FB_RESERVED" not in metrics


async def test_metrics_carry_dcgm_names_and_labels(agent: Agent) -> None:
    status, body, headers = await get(f"http://127.0.0.1:{agent.port}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
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
    assert data["schema_version"] == 1 and len(data["nodes"]) == 10  # the demo cluster


async def raw_get(url: str, **headers: str) -> tuple[int, bytes, Mapping[str, str]]:
    """The answer as it came over the wire: gzip left packed; header names in any case."""
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.get(url, headers=headers, skip_auto_headers=["Accept-Encoding"]) as response,
    ):
        return response.status, await response.read(), response.headers.copy()


async def test_the_snapshot_is_gzipped_once_for_every_client_that_asks(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed: list[bytes] = []
    compress = gzip.compress

    def counted(data: bytes, *args: Any, **kwargs: Any) -> bytes:
        packed.append(data)
        return compress(data, *args, **kwargs)

    monkeypatch.setattr(gzip, "compress", counted)
    url = f"http://127.0.0.1:{agent.port}/api/v1/snapshot?view=summary&node=dgx-002"
    _, plain, headers = await raw_get(url)
    assert "Content-Encoding" not in headers and headers["Vary"] == "Accept-Encoding"
    answers = [await raw_get(url, **{"Accept-Encoding": "gzip, deflate"}) for _ in range(3)]
    for status, body, headers in answers:
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(body) == plain
    assert len(packed) == 1  # three heads, one compression
    assert len(answers[0][1]) * 4 < len(plain)
    # a client that refuses gzip gets JSON
    _, body, headers = await raw_get(url, **{"Accept-Encoding": "gzip;q=0, identity"})
    assert body == plain and "Content-Encoding" not in headers


@pytest.mark.parametrize(
    ("header", "takes"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("deflate, GZIP;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip;q=0.0, identity", False),
        ("*, gzip;q=0", False),
        ("identity;q=1, *;q=0.1", True),
        ("identity", False),
        ("", False),
        ("x-gzip-ish", False),
    ],
)
def test_which_clients_take_gzip(header: str, takes: bool) -> None:
    assert accepts_gzip(header) is takes


async def test_a_client_holding_the_latest_snapshot_is_told_so_without_a_body() -> None:
    """An ETag per rendering: 304 while the hub has published nothing new, 200 after."""
    hub = Hub()
    hub.add_node("dgx-001")
    hub.publish()
    server = Agent(hub, AgentSettings(port=0))
    await server.start()
    url = f"http://127.0.0.1:{server.port}/api/v1/snapshot?view=summary&node=dgx-001"
    try:
        status, body, headers = await raw_get(url)
        etag = headers["ETag"]
        assert status == 200 and json.loads(body)["nodes"][0]["node"] == "dgx-001"
        status, body, headers = await raw_get(url, **{"If-None-Match": etag})
        assert (status, body, headers["ETag"]) == (304, b"", etag)
        assert (await raw_get(url, **{"If-None-Match": 'W/"other", ' + etag}))[0] == 304
        full = url.replace("summary", "full")
        assert (await raw_get(full, **{"If-None-Match": etag}))[0] == 200  # another body
        hub.publish()
        status, _, headers = await raw_get(url, **{"If-None-Match": etag})
        assert status == 200 and headers["ETag"] != etag
    finally:
        await server.stop()


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


class Steps:
    """A clock the test sets, and a hub whose newest snapshot the test publishes."""

    def __init__(self) -> None:
        self.now = 0.0
        self.latest: FleetSnapshot | None = None

    def publish(self) -> int:
        seq = self.latest.seq + 1 if self.latest is not None else 1
        self.latest = FleetSnapshot(seq, FIXED + seq, ())
        return seq


def shown(body: bytes) -> int:
    """Which of the Steps' snapshots a body was rendered from."""
    [line] = [x for x in body.decode().splitlines() if x.startswith("gpuconsole_snapshot_")]
    return round(float(line.split()[-1]) - FIXED)


def test_a_steady_scraper_gets_a_body_rendered_just_before_it_comes() -> None:
    t = Steps()
    cache = MetricsCache(lambda: t.latest, clock=lambda: t.now)
    for at in (0.0, 15.0, 30.0):  # Prometheus every 15 s; the hub publishes in between
        t.now = at
        seq = t.publish()
        assert shown(cache.render("10.0.0.9")) == seq  # rendered as the scrape came
    assert cache.renders == 3
    assert cache.ahead_at("10.0.0.9") == pytest.approx(45.0 - cache.lead_s)
    t.now = 44.5
    t.publish()
    t.now = 44.8
    cache.render_ahead()
    assert cache.renders == 4
    t.now = 44.9
    newest = t.publish()  # the hub publishes once more in the last instants
    t.now = 45.0
    assert shown(cache.render("10.0.0.9")) == newest - 1 and cache.renders == 4  # no wait
    t.now = 45.5
    assert shown(cache.render("10.0.0.7")) == newest and cache.renders == 5  # then current
    # rendered already: still this body for the scrape, whatever comes meanwhile
    t.now = 59.8
    cache.render_ahead()
    t.now = 59.9
    newest = t.publish()
    t.now = 60.0
    assert shown(cache.render("10.0.0.9")) == newest - 1 and cache.renders == 5
    # a scrape much later than foretold gets the newest, rendered as it comes
    t.now = 74.8
    t.publish()
    cache.render_ahead()
    t.now = 76.0
    newest = t.publish()
    assert shown(cache.render("10.0.0.9")) == newest


def test_no_render_ahead_for_an_irregular_or_a_hasty_scraper() -> None:
    t = Steps()
    t.publish()
    cache = MetricsCache(lambda: t.latest, clock=lambda: t.now)
    for at in (0.0, 5.0, 20.0, 21.0):
        t.now = at
        cache.render("irregular")
    for at in (30.0, 30.1, 30.2, 30.3):
        t.now = at
        cache.render("hasty")  # the same body: no render needed anyway
    assert cache.ahead_at("irregular") is None and cache.ahead_at("hasty") is None
    assert cache.ahead_at("never seen") is None and cache.renders == 1


async def test_the_agent_renders_ahead_of_a_steady_scrapers_next_scrape() -> None:
    hub = frozen_hub()
    server = Agent(hub, AgentSettings(port=0))
    now = [0.0]
    server.metrics = MetricsCache(lambda: hub.latest, clock=lambda: now[0])
    await server.start()
    try:
        for at in (0.0, 15.0, 30.0):
            now[0] = at
            assert (await get(f"http://127.0.0.1:{server.port}/metrics"))[0] == 200
        [handle] = server._ahead.values()  # for 127.0.0.1, 14.8 s from the last scrape
        assert handle.when() - asyncio.get_running_loop().time() == pytest.approx(14.8, abs=2)
    finally:
        await server.stop()
    assert handle.cancelled()


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
