"""A console open all day keeps what it shows, not what it showed (the soak run's growth)."""

from __future__ import annotations

import gc
from typing import Any

import msgspec
from textual.widgets._footer import FooterKey

from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.screens.events import EventsScreen


def footer_keys() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, FooterKey))


async def test_walking_between_views_leaves_no_old_footer_keys(console_app: Any) -> None:
    app: ConsoleApp = console_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        shown = footer_keys()
        for _ in range(8):
            await pilot.press("e")
            await pilot.pause()
            assert isinstance(app.screen, EventsScreen)
            await pilot.press("escape")
            await pilot.pause()
        # Textual's footer data-binds each key it composes and kept every one (20 a visit)
        assert footer_keys() <= shown + 15


def moving(snapshot: FleetSnapshot, frame: int) -> FleetSnapshot:
    """`snapshot` a second later: every GPU's utilization and power moved, as on a busy node."""

    def node(n: NodeSnapshot) -> NodeSnapshot:
        if n.nvml is None:
            return n
        gpus = tuple(
            msgspec.structs.replace(g, util_gpu_pct=float((frame * 7 + k * 13) % 100),
                                power_w=100.0 + frame + k)
            for k, g in enumerate(n.nvml.gpus)
        )  # fmt: skip
        return msgspec.structs.replace(n, nvml=msgspec.structs.replace(n.nvml, gpus=gpus))

    nodes = tuple(node(n) for n in snapshot.nodes)
    return msgspec.structs.replace(snapshot, seq=snapshot.seq + frame, nodes=nodes)


async def test_a_console_drawing_every_second_leaves_its_frames_to_die_young(
    console_app: Any,
) -> None:
    """Each frame's segments and strips live until the next frame: the collector need not
    look at them, nor move them into the generations its full passes walk."""
    before = gc.get_threshold()
    app: ConsoleApp = console_app(freeze_heap=True)
    passes: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            passes.append(info["generation"])

    async with app.run_test(size=(200, 50)) as pilot:
        app.jump("node", "dgx-002")
        await pilot.pause()
        frozen = app.snapshot
        assert frozen is not None
        gc.callbacks.append(note)
        try:
            for frame in range(1, 31):  # half a minute of the node view
                app.show_snapshot(moving(frozen, frame))
                await pilot.pause()
        finally:
            gc.callbacks.remove(note)
        # Python's own threshold (700 new objects) ran the collector about every other frame
        assert len(passes) <= 3
    assert gc.get_threshold() == before  # the process's collector as it was, once it ends
