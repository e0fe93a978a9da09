"""What the views compute from snapshots, without a terminal: themes, pairings, SM map, filters."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from rich.text import Text

from gpuconsole.facts import summaries
from gpuconsole.facts.ownership import ProblemKind
from gpuconsole.hardware import model_for_pci_device, model_spec
from gpuconsole.readings.base import Event, Health, Severity
from gpuconsole.readings.fabric import AffinityFlag
from gpuconsole.tui.screens.events import EventFilter, filtered
from gpuconsole.tui.screens.smmap import assign, holders, sm_layout
from gpuconsole.tui.screens.topology import matrix, pairings
from gpuconsole.tui.themes import Palette, ThemeError, load_themes, theme_from_toml
from tests.conftest_tui import FIXED, fleet_with_rail_down, frozen_fleet

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


def test_every_dgx_h100_gpu_pairs_with_a_pix_nic_the_fabric_source_chose() -> None:
    node = frozen_fleet().node("dgx-002")  # dgx-001's GPUs are in a guest: NVML has none
    assert node is not None and node.fabric is not None
    found = pairings(node)
    assert [(p.row.index, p.nic, p.level) for p in found] == [
        (0, "mlx5_0", "PIX"), (1, "mlx5_3", "PIX"), (2, "mlx5_4", "PIX"), (3, "mlx5_5", "PIX"),
        (4, "mlx5_6", "PIX"), (5, "mlx5_9", "PIX"), (6, "mlx5_10", "PIX"), (7, "mlx5_11", "PIX"),
    ]  # fmt: skip
    assert {p.health for p in found} == {Health.OK}
    assert not any(p.crosses_sockets for p in found)


def test_a_down_rail_is_critical_and_says_where_its_gpu_falls_back() -> None:
    # story 6: rail mlx5_9 down on a new node; the fabric source flags GPU 5's pairing
    node = fleet_with_rail_down("dgx-002", "mlx5_9").node("dgx-002")
    assert node is not None
    found = {p.row.index: p for p in pairings(node)}
    five = found[5]
    assert (five.nic, five.level) == ("mlx5_9", "PIX")
    assert AffinityFlag.RAIL_DOWN in five.flags and five.health is Health.CRITICAL
    # the nearest compute rail still up, by the fabric source's own levels
    assert (five.fallback, five.fallback_level) == ("mlx5_6", "NODE")
    assert five.words() == ["its rail is down: falls back to mlx5_6 (NODE)"]
    assert {p.health for i, p in found.items() if i != 5} == {Health.OK}


def test_a_pairing_across_the_socket_link_is_critical() -> None:
    node = frozen_fleet().node("dgx-002")
    assert node is not None and node.fabric is not None
    far = tuple(
        msgspec.structs.replace(
            a, best_device="mlx5_0", best_level="SYS", flags=(AffinityFlag.CROSS_SOCKET,)
        )
        if a.pci_bus_id == "0000:c3:00.0"
        else a
        for a in node.fabric.gpus
    )
    moved = msgspec.structs.replace(node, fabric=msgspec.structs.replace(node.fabric, gpus=far))
    five = {p.row.index: p for p in pairings(moved)}[5]
    assert five.crosses_sockets and five.health is Health.CRITICAL
    assert five.words() == ["crosses the socket link"]


def test_the_matrix_reads_gpu_to_nic_paths_from_the_fabric_reading() -> None:
    node = frozen_fleet().node("dgx-002")
    assert node is not None and node.fabric is not None
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    lines = matrix(node, palette).plain.splitlines()
    header, gpu0 = lines[0].split(), lines[1].split()
    nics = [h for h in header if h.startswith("NIC")]
    assert gpu0[:9] == ["GPU0", "X", *["NV18"] * 7]
    affinity = node.fabric.gpu("0000:1b:00.0")
    assert affinity is not None
    by_device = {lv.device: lv.level for lv in affinity.levels}
    names = sorted(by_device, key=lambda d: int(d.rsplit("_", 1)[1]))  # nvidia-smi's order
    assert gpu0[9 : 9 + len(nics)] == [by_device[d] for d in names]
    assert "NODE" in gpu0  # GPU 0 to mlx5_3: same socket, another switch (not SYS)


def test_the_matrix_has_a_row_per_nic_as_nvidia_smi_topo_prints_it() -> None:
    node = frozen_fleet().node("dgx-002")
    assert node is not None and node.fabric is not None
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    lines = matrix(node, palette).plain.splitlines()
    header = lines[0].split()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    nics = [h for h in header if h.startswith("NIC")]
    gpus = [h for h in header if h.startswith("GPU")]
    assert nics and [name for name in rows if name.startswith("NIC")] == nics
    for i, nic in enumerate(nics):
        row = rows[nic]
        # symmetric: a NIC's GPU column is that GPU's NIC column, and NIC i to itself is X
        assert row[1 : 1 + len(gpus)] == [rows[g][1 + len(gpus) + i] for g in gpus]
        assert row[1 + len(gpus) + i] == "X"
        assert [row[1 + len(gpus) + j] for j in range(len(nics))] == [
            rows[other][1 + len(gpus) + i] for other in nics
        ]
    assert "PIX" in rows["NIC1"] or "PIX" in rows["NIC2"]  # a dual-port card's two halves


def test_a_node_whose_gpus_nvml_cannot_see_still_pairs_each_with_a_nic() -> None:
    node = frozen_fleet().node("dgx-001")  # every GPU in a guest
    assert node is not None
    found = pairings(node)
    assert len(found) == 8 and all(p.nic and p.level == "PIX" for p in found)
    assert {p.row.label for p in found} == {"vm acme-train-vm"}


def test_dgx_a100_gpus_pair_through_their_switch_tree() -> None:
    node = frozen_fleet().node("dgxa-002")
    assert node is not None
    assert {p.level for p in pairings(node)} == {"PXB"}


def test_sm_layout_matches_the_datasheet() -> None:
    h100, a100 = model_spec("NVIDIA H100 80GB HBM3"), model_spec("NVIDIA A100-SXM4-40GB")
    assert h100 is not None and a100 is not None
    assert sum(len(g) for g in sm_layout(h100)) == 132
    assert sum(len(g) for g in sm_layout(a100)) == 108


def test_an_h200_as_a_real_driver_names_it_has_its_datasheet() -> None:
    """NVML refuses a full H200's attributes; its SM count and map come from the model."""
    h200 = model_spec("NVIDIA H200")
    assert h200 is not None and h200.short == "H200"
    assert model_for_pci_device(0x2335) is h200
    assert sum(len(g) for g in sm_layout(h200)) == h200.sm_count == 132


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
    owners = [summaries.gpu_owner(node, g) for g in node.gpus]
    assert owners[4] == "pod team-nlp/train-llm-7b-0"
    # lost before NVML first read it (no UUID, no bus id), yet still its pod's (story 1)
    assert owners[5] == "pod team-nlp/train-llm-7b-0"
    (problem,) = summaries.ownership_problems(node)
    assert problem.kind is ProblemKind.HELD_BUT_LOST and "GPU 5 (0000:c3:00.0)" in problem.message


def test_a_passed_through_gpu_is_listed_with_its_owner_and_driver() -> None:
    node = frozen_fleet().node("dgx-004")
    assert node is not None and len(node.gpus) == 7  # NVML cannot see the guest's GPU
    rows = summaries.gpu_rows(node)
    assert [r.index for r in rows] == [0, 1, None, 2, 3, 4, 5, 6]  # PCI order
    guest = rows[2]
    assert (guest.bus_id, guest.label, guest.driver) == (
        "0000:52:00.0",
        "vm tenant-b-vm7",
        "vfio-pci",
    )
    assert guest.passthrough and guest.reading is None and guest.in_use
    # its guest runs the guest agent: the cell shows what NVML inside the guest reads
    assert guest.guest is not None and guest.guest.reading is not None
    inside = summaries.cell_text(guest.guest.reading, summaries.Metric.UTIL)
    assert summaries.row_cell_text(guest, summaries.Metric.UTIL) == inside != " ◆ "
    unread = summaries.gpu_rows(frozen_fleet().node("dgx-001"))[0]  # type: ignore[arg-type]
    assert unread.guest is None
    assert summaries.row_cell_text(unread, summaries.Metric.UTIL) == " ◆ "
    assert summaries.row_model(guest) == "NVIDIA H100 80GB HBM3"  # by its PCI device id
    assert summaries.gpu_count(node) == 8
    assert summaries.free_count(node) == 6 and summaries.in_use_count(node) == 2


def test_a_node_whose_gpus_are_all_in_a_guest_still_has_eight() -> None:
    node = frozen_fleet().node("dgx-001")
    assert node is not None and node.gpus == ()
    rows = summaries.gpu_rows(node)
    assert {r.label for r in rows} == {"vm acme-train-vm"} and len(rows) == 8
    assert summaries.node_model(node) == "NVIDIA H100 80GB HBM3"
    assert summaries.free_count(node) == 0
    assert summaries.matches(node, "acme vfio")


def test_the_node_table_has_a_row_per_gpu_with_dashes_for_what_nvml_cannot_read() -> None:
    from gpuconsole.tui.screens.node import gpu_row, owners_text

    node = frozen_fleet().node("dgx-004")
    assert node is not None
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    row = summaries.gpu_rows(node)[2]
    cells = [str(c) for c in gpu_row(node, row, palette)]
    assert cells[0] == "◆ 52:00"
    # read by its guest's agent: the guest's values, said to be the guest's
    assert row.guest is not None and row.guest.reading is not None
    assert cells[1] == f"{row.guest.reading.util_gpu_pct:.0f}%"
    assert cells[7] == "from its guest" and cells[9] == "vm tenant-b-vm7"
    assert "vm tenant-b-vm7: GPU 52:00" in owners_text(node, palette).plain
    # a guest without the agent: dashes, and why
    blind = frozen_fleet().node("dgx-001")
    assert blind is not None
    cells = [str(c) for c in gpu_row(blind, summaries.gpu_rows(blind)[0], palette)]
    assert cells[1:] == ["-", "", "-", "-", "-", "-", "vfio-pci: NVML cannot read it", "-",
                         "vm acme-train-vm"]  # fmt: skip


def _plain(renderable: object, width: int = 160) -> str:
    from rich.console import Console

    console = Console(width=width, record=True)
    console.print(renderable)
    return " ".join(console.export_text().split())


def test_gpu_detail_of_a_passed_through_gpu_says_what_the_host_knows() -> None:
    from gpuconsole.tui.screens.gpu import kv, owner_rows, unseen_box

    node = frozen_fleet().node("dgx-004")
    assert node is not None
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    row = summaries.gpu_rows(node)[2]
    now = frozen_fleet().at
    identity = _plain(unseen_box(row, palette, now))
    for expected in ("PCI bus 0000:52:00.0", "PCI device 10de:2330", "vfio-pci / vfio-pci",
                     "IOMMU group 82",
                     "read by tenant-b-vm7's agent, ",
                     "guest sees it at 0000:06:00.0",
                     "util gpu / mem", "temp gpu / HBM", "XIDs"):  # fmt: skip
        assert expected in identity, expected
    blind = frozen_fleet().node("dgx-001")
    assert blind is not None
    unread = _plain(unseen_box(summaries.gpu_rows(blind)[0], palette, now))
    assert "NVML on the host cannot read a GPU bound to vfio-pci" in unread
    owner = _plain(kv(owner_rows(node, row.owner, palette, frozen_fleet().at)))
    for expected in ("owner vm tenant-b-vm7", "tenant tenant-b", "guest state running",
                     "since", "said by libvirt"):  # fmt: skip
        assert expected in owner, expected


def test_an_nvml_gpu_shows_its_owner_tenant_since_and_source() -> None:
    from gpuconsole.tui.screens.gpu import kv, owner_rows

    node = frozen_fleet().node("dgx-002")
    assert node is not None
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    row = summaries.gpu_rows(node)[0]
    owner = row.owner
    assert owner is not None and owner.owner.since is not None
    text = _plain(kv(owner_rows(node, owner, palette, owner.owner.since + 3 * 3600)))
    assert "owner job 4711" in text and "tenant physics" in text
    assert "user bob · PID 20018" in text
    assert "3 h ago" in text and "said by the processes' cgroups" in text


def test_mig_instances_and_processes_show_their_own_owners() -> None:
    node = frozen_fleet().node("dgx-004")
    assert node is not None and node.nvml is not None
    gpu = node.nvml.gpu(6)  # MIG: a pod on GI 1, another on GI 2, GI 3 and 4 free
    assert gpu is not None
    assert summaries.gpu_owner(node, gpu) == "pod team-vision/infer-0 +1"
    assert [summaries.mig_owner(node, gpu, m.gpu_instance_id) for m in gpu.mig_instances] == [
        "pod team-vision/infer-0",
        "pod team-nlp/embed-1",
        "free",
        "free",
    ]
    owners = {p.pid: summaries.process_owner(node, gpu, p.pid) for p in gpu.processes}
    assert {pid: o.label if o else None for pid, o in owners.items()} == {
        20792: "pod team-vision/infer-0",
        20793: "pod team-nlp/embed-1",
    }
    dgx2 = frozen_fleet().node("dgx-002")
    assert dgx2 is not None and dgx2.nvml is not None
    slurm = summaries.process_owner(dgx2, dgx2.gpus[0], 20018)
    assert slurm is not None and (slurm.label, slurm.tenant) == ("job 4711", "physics")


def test_the_fleet_counts_agree_with_the_gpu_rows() -> None:
    for node in frozen_fleet().nodes:
        rows = summaries.gpu_rows(node)
        assert summaries.gpu_counts(node) == summaries.GpuCounts(
            total=len(rows),
            in_use=sum(r.in_use for r in rows),
            free=sum(r.free for r in rows),
            lost=sum(r.lost for r in rows),
            passthrough=sum(r.passthrough for r in rows),
        ), node.node


def test_ownership_problems_light_the_tenancy_facet_and_lead_the_owners_panel() -> None:
    from gpuconsole.tui.screens.node import owners_text

    fleet = frozen_fleet()
    lit = {n.node: summaries.tenancy_facet(n)[0] for n in fleet.nodes}
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
    bare = msgspec.structs.replace(
        node,
        tenancy=None,
        bmc=None,
        statuses=tuple(s for s in node.statuses if s.source not in ("tenancy", "bmc")),
    )
    assert {summaries.gpu_owner(bare, g) for g in bare.gpus} == {"-"}
    assert (
        summaries.pending_panel(bare, "bmc")
        == "no BMC configured for this node: add a [[bmc]] table"
    )
    assert summaries.pending_panel(node, "bmc") is None


def test_fleet_filter_matches_name_model_and_state() -> None:
    fleet = frozen_fleet()
    names = lambda q: [n.node for n in fleet.nodes if summaries.matches(n, q)]  # noqa: E731
    assert names("dgxa") == ["dgxa-001", "dgxa-002"]
    assert names("h100 warning") == ["dgx-004"]  # a row remap pending
    # a failed fan (dgx-002), lost GPUs (dgx-003, dgx-006), a double-bit ECC error (dgx-005),
    # a failed PSU (dgxa-001)
    assert names("critical") == ["dgx-002", "dgx-003", "dgx-005", "dgx-006", "dgxa-001"]
    assert names("lost") == ["dgx-003", "dgx-006"]


def test_event_filter_parses_keys_and_words() -> None:
    events = [
        Event(
            1.0,
            "dgx-003",
            "nvml",
            "gpu_lost",
            Severity.CRITICAL,
            "GPU 5 lost",
            5,
            gpu_bus_id="0000:c3:00.0",
        ),
        Event(2.0, "dgx-004", "nvml", "xid", Severity.WARNING, "XID 63 on GPU 2", 2, code=63),
        Event(3.0, "dgx-004", "nvml", "source_recovered", Severity.INFO, "nvml recovered"),
    ]
    flt = EventFilter.parse("node:dgx-004 xid", EventFilter())
    assert [e.at for e in filtered(events, flt)] == [2.0]
    assert [e.at for e in filtered(events, EventFilter(min_severity=Severity.WARNING))] == [
        2.0,
        1.0,
    ]
    by_bus = EventFilter.parse("gpu:c3:00.0", EventFilter())
    assert [e.at for e in filtered(events, by_bus)] == [1.0]
    # a number is the GPU the console shows by it now: with no snapshot, none is
    assert filtered(events, EventFilter.parse("gpu:5", EventFilter())) == []


def test_a_stale_fabric_source_says_so_over_its_last_pairings() -> None:
    from gpuconsole.tui.screens.topology import gpudirect_box

    node = frozen_fleet().node("dgx-002")
    assert node is not None
    stale = tuple(
        msgspec.structs.replace(s, ok=False, stale_since=FIXED - 30, error="timeout")
        if s.source == "fabric"
        else s
        for s in node.statuses
    )
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    text = gpudirect_box(msgspec.structs.replace(node, statuses=stale), palette)
    assert isinstance(text, Text)
    first = text.plain.splitlines()[0]
    assert first.startswith("fabric stale since ") and "(timeout): last reading shown" in first
    assert "GPU 0 → mlx5_0  PIX" in text.plain  # the last good pairing, still shown


def test_without_tenancy_the_counts_come_from_nvml_processes() -> None:
    node = frozen_fleet().node("dgx-002")
    assert node is not None
    bare = msgspec.structs.replace(node, tenancy=None)
    assert summaries.gpu_counts(bare) == summaries.GpuCounts(
        total=8, in_use=8, free=0, lost=0, passthrough=0
    )


def test_gpu_detail_says_which_readings_only_root_may_read() -> None:
    import asyncio

    from gpuconsole.hub import Hub
    from gpuconsole.sim.node import SimNode
    from gpuconsole.sim.nvml import SimNvml
    from gpuconsole.sim.profiles import DGX_H100
    from gpuconsole.sources.nvml.source import NvmlSource
    from gpuconsole.tui.screens.gpu import readings_box

    sim = SimNode("dgx-user", DGX_H100, scenarios=("mig:7",), start=FIXED - 60, clock=lambda: FIXED)
    hub = Hub(clock=lambda: FIXED)
    lib = SimNvml(sim, privileged=False)
    hub.add_source(NvmlSource("dgx-user", lib=lib, events=False, clock=lambda: FIXED))
    node = asyncio.run(hub.poll_once(rounds=2)).node("dgx-user")
    assert node is not None
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    rows = summaries.gpu_rows(node)
    mig = _plain(readings_box(node, rows[7], node.gpus[7], palette))
    assert "state ● ok" in mig
    assert (
        "hidden from this user GPM metrics (profiling is admin-only: RmProfilingAdminOnly=1), "
        "whole-GPU memory, MIG placement, whole-GPU process list: NVML answers these to root only"
    ) in mig
    plain = _plain(readings_box(node, rows[0], node.gpus[0], palette))
    assert "hidden from this user GPM metrics" in plain and "whole-GPU memory" not in plain


def test_the_gpu_detail_on_a_node_whose_fabric_manager_is_down_says_what_the_node_needs() -> None:
    """The GPU's own evidence is clean, so its verdict is fit; what keeps CUDA off it is its
    node's, and the detail says what that asks for beside it, not a bare 'fit for work'."""
    from gpuconsole.facts.verdict import node_verdict
    from gpuconsole.tui.screens.gpu import verdict_box

    node = frozen_fleet().node("apollo-01")  # a node with nothing wrong but this
    assert node is not None and node.nvml is not None
    gpus = tuple(msgspec.structs.replace(g, fabric_state="completed") for g in node.nvml.gpus)
    nvml = msgspec.structs.replace(node.nvml, gpus=gpus, fabric_manager_running=False)
    down = msgspec.structs.replace(node, nvml=nvml)
    assert node_verdict(down).action.words == "drain it"
    row = summaries.gpu_rows(down)[0]
    palette = Palette.from_variables(load_themes([])["gpuconsole-dark"].variables)
    text = verdict_box(down, row, palette).plain  # type: ignore[union-attr]
    lines = text.splitlines()
    assert lines[0] == "● fit for work"
    assert lines[1] == "on its node: drain it"
    assert "the NVIDIA Fabric Manager service is not running" in lines[2]
