"""The demo's DGX-1 (V100, before Ampere): the NVML source reads its hybrid cube mesh as the
published `nvidia-smi topo -m` shows it and its page retirement, from the fake library and
from the simulator alike; the demo shows GPU 2's pending retirement as "reset the GPU", the
default rules alert on it, and a reset retires the page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.alerts.rules import DEFAULT_RULES
from gpuconsole.alerts.state import FIRING
from gpuconsole.facts.verdict import Action, gpu_verdict, node_verdict
from gpuconsole.hardware import short_model
from gpuconsole.sim.node import Scenario, SimNode
from gpuconsole.sim.profiles import DGX_1V
from tests.conftest_tui import frozen_fleet
from tests.fakenvml_fixtures import FakeNvmlEnv
from tests.test_nvml_health_inputs import snapshot_all

# `nvidia-smi topo -m` of a DGX-1 with V100, GPU by GPU, as NVIDIA's and users' published
# outputs show it
PUBLISHED = (
    "X NV1 NV1 NV2 NV2 SYS SYS SYS",
    "NV1 X NV2 NV1 SYS NV2 SYS SYS",
    "NV1 NV2 X NV2 SYS SYS NV1 SYS",
    "NV2 NV1 NV2 X SYS SYS SYS NV1",
    "NV2 SYS SYS SYS X NV1 NV1 NV2",
    "SYS NV2 SYS SYS NV1 X NV2 NV1",
    "SYS SYS NV1 SYS NV1 NV2 X NV2",
    "SYS SYS SYS NV1 NV2 NV1 NV2 X",
)
RETIRING = "0000:0a:00.0"  # GPU 2


def test_the_nvml_source_reads_a_dgx1_from_the_fake_library(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    data = snapshot_all(fake_nvml_env(DGX_1V, scenarios=["retired 2"]), tmp_path, DGX_1V)
    [node] = data["nodes"]
    nvml: dict[str, Any] = node["nvml"]
    assert tuple(" ".join(row) for row in nvml["gpu_topology"]) == PUBLISHED
    gpus = nvml["gpus"]
    assert [g["name"] for g in gpus] == ["Tesla V100-SXM2-32GB"] * 8
    peers = [link["remote_pci_bus_id"] for link in gpus[0]["nvlinks"]]
    assert [link["remote_kind"] for link in gpus[0]["nvlinks"]] == ["gpu"] * 6
    assert peers == [DGX_1V.gpus[i].bus_id for i in (1, 2, 3, 3, 4, 4)]  # the JSON: NVML form
    retired = [(g["ecc"]["retired_sbe"], g["ecc"]["retired_dbe"], g["ecc"]["retired_pending"])
               for g in gpus]  # fmt: skip
    assert retired == [(0, 0, False)] * 2 + [(2, 1, True)] + [(0, 0, False)] * 5
    assert [g["ecc"]["remap_pending"] for g in gpus] == [None] * 8  # no row remapping on Volta


def test_the_demo_shows_the_dgx1_s_pending_retirement_and_alerts_on_it() -> None:
    fleet = frozen_fleet()
    node = fleet.node("dgx1-001")
    assert node is not None and node.nvml is not None
    assert tuple(" ".join(row) for row in node.nvml.gpu_topology) == PUBLISHED  # the simulator's
    verdict = gpu_verdict(node, RETIRING)
    assert verdict.action is Action.RESET_GPU
    assert verdict.advice == "reset GPU 2 (0a:00.0), then verify"
    assert "a memory page retirement is pending (3 retired): a GPU reset retires it" in (
        verdict.summary
    )
    assert node_verdict(node).action is Action.RESET_GPU
    others = [gpu_verdict(node, g).action for g in node.gpus if g.pci_bus_id != RETIRING]
    assert set(others) == {Action.FIT}
    engine = AlertEngine(DEFAULT_RULES)
    engine.evaluate(fleet)
    [pending] = [a for a in engine.alerts.values() if a.rule == "GpuRetirementPending"]
    assert pending.state == FIRING and pending.labels["Hostname"] == "dgx1-001"
    assert pending.labels["pci_bus_id"].lower().endswith("0a:00.0")


def test_a_reset_retires_the_pending_page(fake_nvml_env: FakeNvmlEnv, tmp_path: Path) -> None:
    """In the simulator and in the fake library alike: the pages stay retired, none waits,
    and the GPU is fit again (3 pages retired is what dynamic page retirement is for)."""
    node = SimNode("dgx1-001", DGX_1V, scenarios=[Scenario("retired", 2)])
    assert node.retired_pages(2) == (2, 1, True)
    assert node.reset_gpu(2)
    assert node.retired_pages(2) == (2, 1, False)  # retired now, none waiting
    assert node.retired_pages(3) == (0, 0, False)
    # before Ampere nvidia-smi resets GPU 2 only with the GPUs NVLink joins it to: all eight
    resets = [f"reset {i} at 0.5" for i in range(8)]
    env = fake_nvml_env(DGX_1V, scenarios=["retired 2", *resets], frozen_time=1.0)
    [data] = snapshot_all(env, tmp_path, DGX_1V)["nodes"]
    gpu = data["nvml"]["gpus"][2]
    ecc = gpu["ecc"]
    assert (ecc["retired_sbe"], ecc["retired_dbe"], ecc["retired_pending"]) == (2, 1, False)


def test_a_tesla_is_named_by_its_model_in_narrow_columns() -> None:
    assert short_model("Tesla V100-SXM2-32GB") == "V100"  # the datasheet's short name
    assert short_model("Tesla P100-PCIE-16GB") == "P100-P"  # none: its first word
