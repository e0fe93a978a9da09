"""SVG snapshots of every console view on frozen simulated data, at 120x40 and 80x24.

Update with `make test-snapshot-update` (pytest --snapshot-update); files live in snapshots/.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytest_textual_snapshot")

from tests.conftest_tui import fleet_with_rail_down, frozen_fleet

SIZES = {"wide": (120, 40), "small": (80, 24)}


def goto(view: str, node: str | None = None, gpu: int | None = None) -> Callable[[Any], Any]:
    async def run_before(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.jump(view, node, gpu)
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", SIZES)
def test_fleet(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(console_app(), terminal_size=SIZES[size])


@pytest.mark.parametrize("size", SIZES)
def test_node(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(
        console_app(), terminal_size=SIZES[size], run_before=goto("node", "dgx-004")
    )


def test_node_whose_gpus_are_all_in_a_guest(snap_compare: Any, console_app: Any) -> None:
    assert snap_compare(console_app(), terminal_size=(120, 40), run_before=goto("node", "dgx-001"))


def test_node_with_an_ownership_problem(snap_compare: Any, console_app: Any) -> None:
    assert snap_compare(console_app(), terminal_size=(120, 40), run_before=goto("node", "dgx-003"))


@pytest.mark.parametrize("size", SIZES)
def test_gpu_detail(snap_compare: Any, console_app: Any, size: str) -> None:
    # NVML's GPU 2 on dgx-004 is its fourth (GPU 2 is in a guest): the one with ECC errors
    app = console_app(frozen_fleet())
    assert snap_compare(app, terminal_size=SIZES[size], run_before=goto("gpu", "dgx-004", 2))


def test_gpu_detail_passed_through(snap_compare: Any, console_app: Any) -> None:
    from gpuconsole.tui.screens.gpu import GpuScreen

    async def run_before(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.jump("node", "dgx-004")
        pilot.app.push_screen(GpuScreen("dgx-004", bus_id="0000:52:00.0"))
        await pilot.pause()

    assert snap_compare(console_app(), terminal_size=(120, 40), run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_topology(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(console_app(), terminal_size=SIZES[size],
                        run_before=goto("topology", "dgxa-001"))  # fmt: skip


@pytest.mark.parametrize("size", SIZES)
def test_sm_map_mig(snap_compare: Any, console_app: Any, size: str) -> None:
    app = console_app(frozen_fleet())
    assert snap_compare(app, terminal_size=SIZES[size], run_before=goto("smmap", "dgx-004", 6))


@pytest.mark.parametrize("size", SIZES)
def test_events(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(console_app(), terminal_size=SIZES[size], run_before=goto("events"))


@pytest.mark.parametrize("size", SIZES)
def test_help(snap_compare: Any, console_app: Any, size: str) -> None:
    assert snap_compare(console_app(), terminal_size=SIZES[size], press=["question_mark"])


def test_gpu_lost(snap_compare: Any, console_app: Any) -> None:
    assert snap_compare(
        console_app(), terminal_size=(120, 40), run_before=goto("gpu", "dgx-003", 5)
    )


def test_sm_map_ampere_gpu_wide(snap_compare: Any, console_app: Any) -> None:
    assert snap_compare(console_app(), terminal_size=(120, 40),
                        run_before=goto("smmap", "dgxa-002", 3))  # fmt: skip


def test_topology_dgx_h100(snap_compare: Any, console_app: Any) -> None:
    # dgx-004: a GPU in a guest (NVML cannot see it; the fabric source finds it on PCI)
    assert snap_compare(console_app(), terminal_size=(120, 40),
                        run_before=goto("topology", "dgx-004"))  # fmt: skip


def test_topology_rail_down(snap_compare: Any, console_app: Any) -> None:
    # story 6: rail mlx5_9 down on dgx-002, GPU 5's pairing flagged in red
    app = console_app(fleet_with_rail_down("dgx-002", "mlx5_9"))
    assert snap_compare(app, terminal_size=(120, 40), run_before=goto("topology", "dgx-002"))


def test_fleet_filtered_by_temperature(snap_compare: Any, console_app: Any) -> None:
    assert snap_compare(console_app(), terminal_size=(120, 40),
                        press=["m", "slash", "d", "g", "x", "-", "0", "enter"])  # fmt: skip


@pytest.mark.parametrize(
    "theme", ["gpuconsole-light", "gpuconsole-high-contrast", "gpuconsole-ansi"]
)
def test_fleet_themes(snap_compare: Any, console_app: Any, theme: str) -> None:
    assert snap_compare(console_app(theme=theme), terminal_size=(120, 40))


def test_too_small(snap_compare: Any, console_app: Any) -> None:
    assert snap_compare(console_app(), terminal_size=(70, 20))
