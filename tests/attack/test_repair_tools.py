"""The tools a remediation runs (nvidia-smi, scontrol) tried as hostile or broken ones: what
they print reaches the journal and the screen without a raw escape sequence, one that hangs
is stopped, one that is missing says what to run by hand, and the arguments are the
documented ones."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.drivers.repair import NvidiaSmiDriver, SlurmDriver, run_tool
from gpuconsole.actions.plan import Step, StepKind

BUS = "0000:c3:00.0"


def tool(folder: Path, name: str, body: str) -> Path:
    """An executable shell script named `name` in `folder`."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


async def test_a_reset_tool_printing_escapes_fails_with_them_written_out(bin_dir: Path) -> None:
    tool(
        bin_dir,
        "nvidia-smi",
        "printf 'Unable to reset \\033]0;owned\\007\\033[2J GPU\\n'\nexit 3\n",
    )
    step = Step(StepKind.GPU_RESET, None, "reset", gpus=(BUS,))
    with pytest.raises(StepFailed) as failed:
        await NvidiaSmiDriver().run(step)
    text = str(failed.value)
    assert f"`nvidia-smi -r -i {BUS}` failed (3): Unable to reset" in text
    assert "\x1b" not in text and "\x07" not in text


async def test_a_tool_that_hangs_is_stopped(bin_dir: Path) -> None:
    tool(bin_dir, "scontrol", "exec sleep 30\n")
    with pytest.raises(StepFailed, match=r"did not finish within 0\.5 s"):
        await run_tool(["scontrol", "update"], timeout_s=0.5)


async def test_a_missing_tool_says_what_to_run_by_hand(bin_dir: Path) -> None:
    with pytest.raises(StepFailed, match="nvidia-smi-nonesuch not found: run `nvidia-smi"):
        await NvidiaSmiDriver("nvidia-smi-nonesuch").run(
            Step(StepKind.GPU_RESET, None, "reset", gpus=(BUS,))
        )


async def test_slurm_is_drained_and_resumed_with_scontrol_s_own_arguments(
    bin_dir: Path, tmp_path: Path
) -> None:
    said = tmp_path / "argv"
    tool(bin_dir, "scontrol", f'for a in "$@"; do echo "$a"; done >> {said}\n')
    driver = SlurmDriver("dgx-003")
    step = Step(StepKind.SLURM_DRAIN, None, "drain", gpus=(BUS,))
    assert await driver.run(step) == "Slurm node dgx-003 draining"
    assert await driver.undo(step) == "Slurm node dgx-003 resumed"
    assert said.read_text().splitlines() == [
        "update",
        "nodename=dgx-003",
        "state=drain",
        f"reason=gpuconsole remediation of {BUS}",
        "update",
        "nodename=dgx-003",
        "state=resume",
    ]
