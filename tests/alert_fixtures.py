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
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

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
