"""Snapshots for the alert tests: one node with one GPU whose readings a test chooses, and a
real Alertmanager (Debian's prometheus-alertmanager) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuconsole.alerts.condition import Labels, duration
from gpuconsole.alerts.engine import CONTEXT, AlertEngine
from gpuconsole.alerts.prometheus import rules_file
from gpuconsole.alerts.rules import Rule
from gpuconsole.alerts.series import samples_by_name
from gpuconsole.alerts.state import FIRING
from gpuconsole.readings.base import SourceStatus
from gpuconsole.readings.nvml import (
    EccReading,
    GpuReading,
    GpuState,
    NvLinkReading,
    NvmlReading,
    RemoteKind,
)
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.readings.tenancy import PciGpu, PodDevice, TenancyReading
from tests.peers import require_program

NODE = "dgx-007"
UUID = "GPU-6a1c0e4b-0000-4000-8000-000000000005"
BUS = "00000000:C3:00.0"  # as NVML and dcgm-exporter write it
SYSFS_BUS = "0000:c3:00.0"


def fleet(
    at: float,
    *,
    lost: bool = False,
    temp_c: float = 45.0,
    fabric_manager: bool | None = None,
    seq: int | None = None,
    link_errors: tuple[int, int, int] | None = None,
    ecc: EccReading | None = None,
    throttle: tuple[str, ...] = (),
    pod: tuple[str, str] | None = None,
) -> FleetSnapshot:
    """dgx-007 at `at`, its one GPU lost or not, at `temp_c`; with `link_errors` its NVLink 0
    has counted that many replays, recoveries and CRC errors; `ecc` and `throttle` as
    given; with `pod` (namespace, name) the kubelet says that pod holds it."""
    links: tuple[NvLinkReading, ...] = ()
    if link_errors is not None:
        replay, recovery, crc = link_errors
        link = NvLinkReading(
            link=0,
            active=True,
            version=4,
            remote_kind=RemoteKind.NVSWITCH,
            replay_errors_total=replay,
            recovery_errors_total=recovery,
            crc_errors_total=crc,
        )
        links = (link,)
    gpu = GpuReading(
        5,
        UUID,
        "NVIDIA H100 80GB HBM3",
        SYSFS_BUS,  # as the NVML source keeps it; the exporter writes BUS
        state=GpuState.LOST if lost else GpuState.OK,
        temp_gpu_c=None if lost else temp_c,
        nvlinks=links,
        ecc=ecc if ecc is not None else EccReading(),
        throttle_reasons=throttle,
    )
    nvml = NvmlReading(at, "550.54.15", "12.550", "12.4", (gpu,), (), fabric_manager)
    statuses = [SourceStatus(NODE, "nvml", True, last_ok_at=at, polls=1)]
    tenancy = None
    if pod is not None:
        held = PodDevice(pod[0], pod[1], "main", "nvidia.com/gpu", UUID, UUID)
        tenancy = TenancyReading(at, gpus=(PciGpu(SYSFS_BUS, driver="nvidia", uuid=UUID),),
                                 pod_devices=(held,))  # fmt: skip
        statuses.append(SourceStatus(NODE, "tenancy", True, last_ok_at=at, polls=1))
    node = NodeSnapshot(NODE, nvml=nvml, tenancy=tenancy, statuses=tuple(statuses))
    return FleetSnapshot(seq if seq is not None else int(at), at, (node,))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """`app` on 127.0.0.1 while the block runs: its URL."""
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclass
class Alertmanager:
    """A running prometheus-alertmanager and what it holds."""

    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.loads(response.read())

    def post(self, path: str, body: Any) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read() or b"null")

    def alerts(self, name: str | None = None) -> list[dict[str, Any]]:
        """The alerts it holds as active (GET /api/v2/alerts), of alert `name` if given."""
        found: list[dict[str, Any]] = self.get("/api/v2/alerts")
        return [a for a in found if name is None or a["labels"].get("alertname") == name]


ALERTMANAGER_CONFIG = """\
route:
  receiver: "nobody"
  group_wait: 1s
receivers:
  - name: "nobody"
"""


def start_alertmanager(tmp: Path, port: int) -> Alertmanager:
    program = require_program("prometheus-alertmanager", "apt-get install prometheus-alertmanager")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "alertmanager.yml").write_text(ALERTMANAGER_CONFIG)
    log = (tmp / "alertmanager.log").open("wb")
    process = subprocess.Popen(
        [
            program,
            f"--config.file={tmp / 'alertmanager.yml'}",
            f"--storage.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    am = Alertmanager(port, process)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(
                f"alertmanager exited: {(tmp / 'alertmanager.log').read_text()[-2000:]}"
            )
        with contextlib.suppress(OSError, urllib.error.URLError):
            urllib.request.urlopen(f"{am.url}/-/ready", timeout=1).close()
            return am
        time.sleep(0.05)
    stop_alertmanager(am)
    raise AssertionError("alertmanager did not become ready in 20 s")


def stop_alertmanager(am: Alertmanager) -> None:
    if am.process is not None and am.process.poll() is None:
        am.process.terminate()
        try:
            am.process.wait(10)
        except subprocess.TimeoutExpired:
            am.process.kill()
            am.process.wait(10)


@contextlib.contextmanager
def alertmanager(tmp: Path, port: int | None = None) -> Iterator[Alertmanager]:
    am = start_alertmanager(tmp, port or free_port())
    try:
        yield am
    finally:
        stop_alertmanager(am)


def promtool_test_rules(folder: Path, spec: str, timeout_s: float = 60) -> None:
    """`promtool test rules` on the test file `spec` (YAML; JSON is YAML too), written in
    `folder` beside the rule files it names; fails the test with promtool's words."""
    promtool = require_program("promtool", "apt-get install prometheus")
    (folder / "test.yml").write_text(spec)
    done = subprocess.run(
        [promtool, "test", "rules", "test.yml"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


# What fires at one evaluation: by rule, each alert as promtool's exp_alerts writes it.
Fired = dict[str, list[dict[str, object]]]


def engine_firing(engine: AlertEngine) -> Fired:
    """What fires now, by rule (every rule of the engine), as promtool's exp_alerts writes
    it: without what the engine adds from the console's verdict, which no series carries."""
    out: Fired = {rule.name: [] for rule in engine.rules}
    for alert in engine.alerts.values():
        if alert.state == FIRING:
            labels = {k: v for k, v in alert.labels.items() if k != "alertname"}
            notes = {k: v for k, v in alert.annotations.items() if k not in CONTEXT}
            out[alert.rule].append({"exp_labels": labels, "exp_annotations": notes})
    for found in out.values():
        found.sort(key=lambda a: json.dumps(a, sort_keys=True))
    return out


def fired_as_promtool_fires(
    folder: Path, rules: Sequence[Rule], snapshots: Sequence[FleetSnapshot], step_s: float
) -> list[Fired]:
    """The engine runs `rules` over `snapshots` (the k-th at k * step_s); promtool runs the
    printed rules over the same series (built by the same builder), evaluating every
    step_s, and must find exactly the alerts the engine fires at each step, labels and
    annotations included. What fired at each step."""
    engine = AlertEngine(rules)
    wanted = {m for r in rules for m in r.condition.metrics}
    steps = len(snapshots)
    series: dict[tuple[str, Labels], list[str]] = {}
    by_step: list[Fired] = []
    for k, snapshot in enumerate(snapshots):
        assert snapshot.at == k * step_s, (k, snapshot.at)
        for name, found in samples_by_name(snapshot, wanted).items():
            for sample in found:
                values = series.setdefault((name, sample.labels), ["_"] * steps)
                values[k] = repr(sample.value)
        engine.evaluate(snapshot)
        by_step.append(engine_firing(engine))
    inputs = [
        {"series": _series_text(name, labels), "values": " ".join(_scraped(values))}
        for (name, labels), values in sorted(series.items())
    ]
    tests = [
        {"eval_time": duration(k * step_s), "alertname": r.name, "exp_alerts": by_step[k][r.name]}
        for k in range(steps)
        for r in rules
    ]
    (folder / "rules.yml").write_text(rules_file(rules))
    every = duration(step_s)
    spec = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": every,
        "tests": [{"interval": every, "input_series": inputs, "alert_rule_test": tests}],
    }
    promtool_test_rules(folder, json.dumps(spec), timeout_s=120)
    return by_step


def _scraped(values: list[str]) -> list[str]:
    """A series gone from a scrape is marked stale, as Prometheus marks it (else an instant
    query would find its last value for five more minutes)."""
    return [
        "stale" if v == "_" and k and values[k - 1] not in ("_", "stale") else v
        for k, v in enumerate(values)
    ]


def _series_text(name: str, labels: Labels) -> str:
    inner = ", ".join(f"{k}={json.dumps(v)}" for k, v in labels)
    return f"{name}{{{inner}}}"
