"""What the views compute from snapshots, without a terminal: themes, pairings, SM map, filters."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuconsole.model import Event, Health, Severity
from gpuconsole.sim.profiles import DGX_A100, DGX_H100
from gpuconsole.tui import summaries as S
from gpuconsole.tui.hardware import model_spec
from gpuconsole.tui.screens.events import EventFilter, filtered
from gpuconsole.tui.screens.smmap import assign, holders, sm_layout
from gpuconsole.tui.screens.topology import pairings
from gpuconsole.tui.themes import Palette, ThemeError, load_themes, theme_from_toml
from tests.conftest_tui import frozen_fleet

SHIPPED = {"gpuconsole-dark", "gpuconsole-light", "gpuconsole-high-contrast", "gpuconsole-ansi"}


def test_shipped_themes_load_with_a_scale_and_health_colours() -> None:
    themes = load_themes([])
    assert SHIPPED <= set(themes)
    for theme in themes.values():
        palette = Palette.from_variables(theme.variables)
        assert len(palette.scale) >= 5
        assert set(palette.health) == set(Health)
    assert themes["gpuconsole-ansi"].ansi is True


def test_the_scale_runs_cool_to_hot() -> None:
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    assert palette.heat(0.0) == palette.scale[0]
    assert palette.heat(1.0) == palette.scale[-1]
    assert palette.heat(7.0) == palette.scale[-1]
    assert palette.heat(None) == palette.dim


def test_a_user_theme_is_loaded_and_a_broken_one_names_its_key(tmp_path: Path) -> None:
    shipped = (Path(__file__).parent.parent / "gpuconsole/themes/dark.toml").read_text()
    (tmp_path / "mine.toml").write_text(shipped.replace('"gpuconsole-dark"', '"mine"'))
    (tmp_path / "broken.toml").write_text(shipped.replace("critical =", "kritical ="))
    assert "mine" in load_themes([tmp_path])
    with pytest.raises(ThemeError, match=r"health\.critical"):
        theme_from_toml(shipped.replace("critical =", "kritical ="), "broken.toml")
    with pytest.raises(ThemeError, match="not a colour"):
        theme_from_toml(shipped.replace('primary = "#5fa8ff"', 'primary = "sky"'), "x.toml")


def test_every_dgx_h100_gpu_has_a_pix_nic() -> None:
    node = frozen_fleet().node("dgx-001")
    assert node is not None
    found = pairings(node, DGX_H100)
    assert [(p.nic, p.level) for p in found][:4] == [
        ("mlx5_0", "PIX"),
        ("mlx5_3", "PIX"),
        ("mlx5_4", "PIX"),
        ("mlx5_5", "PIX"),
    ]
    assert not any(p.crosses_sockets for p in found)


def test_a_gpu_whose_nic_is_missing_is_flagged_for_crossing_the_sockets() -> None:
    node = frozen_fleet().node("dgx-001")
    assert node is not None
    no_socket1 = dataclasses.replace(DGX_H100, nics=tuple(n for n in DGX_H100.nics
                                                          if n.numa_node == 0))  # fmt: skip
    found = {p.gpu: p for p in pairings(node, no_socket1)}
    assert found[5].crosses_sockets and found[5].level == "SYS"
    assert not found[0].crosses_sockets


def test_dgx_a100_gpus_pair_through_their_switch_tree() -> None:
    node = frozen_fleet().node("dgxa-002")
    assert node is not None
    assert {p.level for p in pairings(node, DGX_A100)} == {"PXB"}


def test_sm_layout_matches_the_datasheet() -> None:
    h100, a100 = model_spec("NVIDIA H100 80GB HBM3"), model_spec("NVIDIA A100-SXM4-40GB")
    assert h100 is not None and a100 is not None
    assert sum(len(g) for g in sm_layout(h100)) == 132
    assert sum(len(g) for g in sm_layout(a100)) == 108


def test_each_mig_instance_gets_exactly_its_sms() -> None:
    node = frozen_fleet().node("dgx-004")
    assert node is not None and node.nvml is not None
    gpu = node.nvml.gpu(7)
    spec = model_spec(gpu.name if gpu else None)
    assert gpu is not None and spec is not None and gpu.mig_enabled
    owner = assign(spec, gpu)
    for k, mig in enumerate(gpu.mig_instances):
        assert sum(1 for v in owner.values() if v == k) == mig.sm_count
    assert [h.scope for h in holders(gpu)] == ["GPM, this instance"] * len(gpu.mig_instances)


def test_without_gpm_the_sm_map_says_its_figure_is_gpu_wide() -> None:
    node = frozen_fleet().node("dgxa-002")
    assert node is not None and node.nvml is not None
    gpu = node.nvml.gpu(0)
    assert gpu is not None
    (holder,) = holders(gpu)
    assert holder.instance is None and "GPU-wide" in holder.scope


def test_owners_come_from_the_tenancy_reading() -> None:
    node = frozen_fleet().node("dgx-003")
    assert node is not None
    owners = [S.gpu_owner(node, g) for g in node.gpus]
    assert owners[4] == "pod team-nlp/train-llm-7b-0"
    assert owners[5] == "unavailable (lost)"


def test_without_tenancy_or_bmc_the_views_say_what_to_configure() -> None:
    node = frozen_fleet().node("dgx-004")
    assert node is not None
    bare = dataclasses.replace(
        node,
        tenancy=None,
        bmc=None,
        statuses=tuple(s for s in node.statuses if s.source not in ("tenancy", "bmc")),
    )
    assert {S.gpu_owner(bare, g) for g in bare.gpus} == {"-"}
    assert S.pending_panel(bare, "bmc") == "no BMC configured for this node: add a [[bmc]] table"
    assert S.pending_panel(node, "bmc") is None


def test_fleet_filter_matches_name_model_and_state() -> None:
    fleet = frozen_fleet()
    names = lambda q: [n.node for n in fleet.nodes if S.matches(n, q)]  # noqa: E731
    assert names("dgxa") == ["dgxa-001", "dgxa-002"]
    assert names("h100 warning") == ["dgx-002", "dgx-004"]
    assert names("lost") == ["dgx-003"]


def test_event_filter_parses_keys_and_words() -> None:
    events = [
        Event(1.0, "dgx-003", "nvml", "gpu_lost", Severity.CRITICAL, "GPU 5 is lost", 5),
        Event(2.0, "dgx-004", "nvml", "xid", Severity.WARNING, "XID 63 on GPU 2", 2, code=63),
        Event(3.0, "dgx-004", "nvml", "source_recovered", Severity.INFO, "nvml recovered"),
    ]
    flt = EventFilter.parse("node:dgx-004 xid", EventFilter())
    assert [e.at for e in filtered(events, flt)] == [2.0]
    assert [e.at for e in filtered(events, EventFilter(min_severity=Severity.WARNING))] == [
        2.0,
        1.0,
    ]
    assert [e.at for e in filtered(events, EventFilter(gpu=5))] == [1.0]
