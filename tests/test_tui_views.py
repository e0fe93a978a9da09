"""What the views compute from snapshots, without a terminal: themes, pairings, SM map, filters."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuconsole.model import Event, Health, Severity
from gpuconsole.ownership import ProblemKind
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
    node = frozen_fleet().node("dgx-002")  # dgx-001's GPUs are in a guest: NVML has none
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
    node = frozen_fleet().node("dgx-002")
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
    gpu = node.nvml.gpu(6)  # the eighth GPU, NVML's 6th: GPU 2 is in tenant-b-vm7
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
    # lost before NVML first read it (no UUID, no bus id), yet still its pod's (story 1)
    assert owners[5] == "pod team-nlp/train-llm-7b-0"
    (problem,) = S.ownership_problems(node)
    assert problem.kind is ProblemKind.HELD_BUT_LOST and "GPU 5 (0000:c3:00.0)" in problem.message


def test_a_passed_through_gpu_is_listed_with_its_owner_and_driver() -> None:
    node = frozen_fleet().node("dgx-004")
    assert node is not None and len(node.gpus) == 7  # NVML cannot see the guest's GPU
    rows = S.gpu_rows(node)
    assert [r.index for r in rows] == [0, 1, None, 2, 3, 4, 5, 6]  # PCI order
    guest = rows[2]
    assert (guest.bus_id, guest.label, guest.driver) == (
        "0000:52:00.0",
        "vm tenant-b-vm7",
        "vfio-pci",
    )
    assert guest.passthrough and guest.reading is None and guest.in_use
    assert S.row_cell_text(guest, S.Metric.UTIL) == " ◆ "
    assert S.row_model(guest) == "NVIDIA H100 80GB HBM3"  # by its PCI device id
    assert S.gpu_count(node) == 8 and S.free_count(node) == 6 and S.in_use_count(node) == 2


def test_a_node_whose_gpus_are_all_in_a_guest_still_has_eight() -> None:
    node = frozen_fleet().node("dgx-001")
    assert node is not None and node.gpus == ()
    rows = S.gpu_rows(node)
    assert {r.label for r in rows} == {"vm acme-train-vm"} and len(rows) == 8
    assert S.node_model(node) == "NVIDIA H100 80GB HBM3"
    assert S.free_count(node) == 0
    assert S.matches(node, "acme vfio")


def test_the_node_table_has_a_row_per_gpu_with_dashes_for_what_nvml_cannot_read() -> None:
    from gpuconsole.tui.screens.node import gpu_row, owners_text

    node = frozen_fleet().node("dgx-004")
    assert node is not None
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    cells = [str(c) for c in gpu_row(node, S.gpu_rows(node)[2], palette)]
    assert cells[0] == "◆ 52:00"
    assert cells[1:] == ["-", "", "-", "-", "-", "-", "vfio-pci: NVML cannot read it", "-",
                         "vm tenant-b-vm7"]  # fmt: skip
    assert "vm tenant-b-vm7: GPU 52:00" in owners_text(node, palette).plain


def test_gpu_detail_of_a_passed_through_gpu_says_what_the_host_knows() -> None:
    from rich.console import Console

    from gpuconsole.tui.screens.gpu import unseen_box

    node = frozen_fleet().node("dgx-004")
    assert node is not None
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    console = Console(width=160, record=True)
    console.print(unseen_box(S.gpu_rows(node)[2], palette, now=frozen_fleet().at))
    text = " ".join(console.export_text().split())
    for expected in ("PCI bus 0000:52:00.0", "PCI device 10de:2330", "vfio-pci / vfio-pci",
                     "IOMMU group 82", "owner vm tenant-b-vm7, since", "tenant tenant-b",
                     "guest state running (libvirt)",
                     "NVML on the host cannot read a GPU bound to vfio-pci"):  # fmt: skip
        assert expected in text, expected


def test_ownership_problems_light_the_tenancy_facet_and_lead_the_owners_panel() -> None:
    from gpuconsole.tui.screens.node import owners_text

    fleet = frozen_fleet()
    lit = {n.node: S.tenancy_facet(n)[0] for n in fleet.nodes}
    assert lit["dgx-003"] is Health.CRITICAL  # its lost GPU is still held by a pod
    assert lit["dgx-002"] is Health.OK
    node = fleet.node("dgx-003")
    assert node is not None
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    first = owners_text(node, palette).plain.splitlines()[0]
    assert first.startswith("✖ pod team-nlp/train-llm-7b-0 holds GPU 5")


def test_every_shipped_theme_has_a_passthrough_colour_of_its_own() -> None:
    for theme in load_themes([]).values():
        palette = Palette.from_variables(theme.variables)
        assert palette.passthrough.bgcolor is not None
        assert palette.passthrough not in palette.scale


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
