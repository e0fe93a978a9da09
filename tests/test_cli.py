"""The command line: every subcommand answers, and the unbuilt ones say which issue."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuconsole.cli.main import main


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuconsole", *args], capture_output=True, text=True, timeout=60
    )


def test_snapshot_demo_prints_every_node_and_says_it_is_simulated() -> None:
    result = run("snapshot", "--demo")
    assert result.returncode == 0, result.stderr
    for node in ("dgx-001", "dgx-004", "dgxa-001", "apollo-01"):
        assert node in result.stdout
    assert "NVIDIA H100 80GB HBM3" in result.stdout
    assert "HW thermal slowdown" in result.stdout  # dgx-002 GPU 3
    assert "SIMULATED DATA" in result.stdout
    # dgx-001's eight GPUs sit in a guest, bound to vfio-pci: NVML cannot see them, the
    # table still lists each with its owner
    dgx001 = result.stdout.split("\n\n")[0].splitlines()
    guest = [line for line in dgx001 if "vfio-pci" in line]
    assert len(guest) == 8 and all(line.endswith("vm acme-train-vm") for line in guest)


def test_a_snapshot_piped_into_a_reader_that_stops_ends_quietly() -> None:
    """`gpuconsole snapshot --demo | head -1`: the reader goes away mid-table; the writer
    ends as a pipe's writer does, with no traceback."""
    # more than a pipe holds (64 KiB): the writer is still writing when its reader goes
    cmd = [sys.executable, "-m", "gpuconsole", "snapshot", "--demo", "--nodes", "64"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stdout is not None and child.stderr is not None
        first = child.stdout.readline()
        child.stdout.close()  # as head does, having read its line
        said = child.stderr.read().decode()
        code = child.wait(timeout=120)
    assert first.startswith(b"dgx-001")
    assert "Traceback" not in said and "BrokenPipeError" not in said, said
    assert code == 141, said


def test_snapshot_json_is_versioned() -> None:
    result = run("snapshot", "--demo", "--json", "--nodes", "3")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1
    assert len(data["nodes"]) == 3
    assert len(data["nodes"][0]["nvml"]["gpus"]) == 0  # dgx-001's GPUs are in a guest
    assert len(data["nodes"][1]["nvml"]["gpus"]) == 8


def test_the_ssh_server_without_its_authorized_keys_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    missing = tmp_path / "authorized_keys"
    argv = ["ssh-server", "--demo", "--listen", "127.0.0.1:0", "--authorized-keys", str(missing)]
    assert main(argv) == 2
    assert f"{missing}: cannot read authorized keys" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", ["demo", "console", "wallboard", "agent", "ssh-server", "snapshot", "config"]
)
def test_every_subcommand_has_help(command: str) -> None:
    result = run(command, "--help")
    assert result.returncode == 0 and "usage: gpuconsole" in result.stdout


def test_a_bad_config_is_an_error_with_key_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[nvml]\ninterval_s = -1\n")
    assert main(["config", "check", "-c", str(path)]) == 2
    assert "bad.toml:2: [nvml] interval_s must be at least" in capsys.readouterr().err


def test_config_example_prints_a_file_that_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "example"]) == 0
    path = tmp_path / "example.toml"
    path.write_text(capsys.readouterr().out)
    assert main(["config", "check", "-c", str(path)]) == 0


def test_snapshot_on_a_machine_without_nvml_says_so(tmp_path: Path) -> None:
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml")
    cfg = tmp_path / "c.toml"
    cfg.write_text("[host]\nname = 'gpu-node'\n")
    result = run("snapshot", "-c", str(cfg))
    assert result.returncode == 1
    assert "gpu-node" in result.stdout
    assert "STALE" in result.stdout and "libnvidia-ml.so.1 not found" in result.stdout


def test_version_prints_on_stdout_and_other_commands_do_not_read_the_package_metadata() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stdout.startswith("gpuconsole ")
    probe = subprocess.run(
        [sys.executable, "-c",
         "import sys; from gpuconsole.cli.main import build_parser; "
         "build_parser().parse_args(['config', 'example']); "
         "print('importlib.metadata' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "False"  # ~10 ms of every start, for a flag rarely given


def test_the_snapshot_table_writes_every_bus_id_one_way(capsys: pytest.CaptureFixture[str]) -> None:
    """A node with GPUs passed to a guest beside GPUs NVML reads: one BUS ID column, one form
    (sysfs's, as lspci and vfio write it), not NVML's 00000000:1B:00.0 beside 0000:52:00.0."""
    import re

    assert main(["snapshot", "--demo"]) == 0
    table = capsys.readouterr().out
    ids = re.findall(r"\b[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\b", table)
    assert ids and "vfio-pci" in table  # both kinds of row are there
    assert all(re.fullmatch(r"0000:[0-9a-f]{2}:[0-9a-f]{2}\.\d", i) for i in ids), set(ids)


def test_snapshot_json_says_who_owns_each_gpu_beside_the_readings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`jq '.nodes[] | select(.node=="dgx-003") | .derived["0000:9d:00.0"].owner'` answers
    as the console does, and the readings still read back as a capture."""
    from gpuconsole.codec import loads

    assert main(["snapshot", "--demo", "--json"]) == 0
    text = capsys.readouterr().out
    nodes = {n["node"]: n for n in json.loads(text)["nodes"]}
    dgx003 = nodes["dgx-003"]["derived"]
    gpu = dgx003["0000:9d:00.0"]
    assert gpu["owner"] == "pod team-nlp/train-llm-7b-0" and gpu["index"] == 4
    (owner,) = gpu["owners"]
    assert (owner["kind"], owner["namespace"], owner["tenant"]) == ("pod", "team-nlp", "nlp")
    assert (gpu["health"], gpu["action"], gpu["findings"], gpu["problems"]) == ("ok", "fit", [], [])
    assert gpu["nic"]["level"] == "PIX" and not gpu["nic"]["falls_back"]
    assert [p["owner"] for p in gpu["processes"]] == ["pod team-nlp/train-llm-7b-0"]
    # a guest's GPU, which NVML cannot see, is there by its bus id too
    guest = nodes["dgx-004"]["derived"]["0000:52:00.0"]
    assert guest["owner"] == "vm tenant-b-vm7" and guest["index"] is None
    # MIG instances: who holds each, and that two are free
    mig = nodes["dgx-004"]["derived"]["0000:df:00.0"]["migs"]
    assert [m["owner"] for m in mig] == ["pod team-vision/infer-0", "pod team-nlp/embed-1",
                                         "free", "free"]  # fmt: skip
    # the readings read back as a capture (for --replay), and the console derives the same
    from gpuconsole.facts.pairing import gpu_nics

    captured = loads(text)
    assert [n.node for n in captured.nodes] == list(nodes)
    fabric = captured.node("dgx-003").fabric  # type: ignore[union-attr]
    assert fabric is not None
    assert gpu["nic"]["nic"] == gpu_nics(fabric)["0000:9d:00.0"].nic


def test_each_command_built_alone_takes_and_explains_what_the_whole_parser_does() -> None:
    """The parser builds only the command it runs: each one's help and defaults must be
    what the parser of every command gives."""
    from gpuconsole.cli.main import build_parser

    def command(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
        found = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return found.choices[name]  # type: ignore[no-any-return]

    full = build_parser()
    names = list(
        next(a for a in full._actions if isinstance(a, argparse._SubParsersAction)).choices
    )
    assert {"snapshot", "console", "config", "doctor"} <= set(names)
    for name in names:
        alone = command(build_parser(name), name)
        assert alone.format_help() == command(full, name).format_help(), name
        defaults = {a.dest: a.default for a in alone._actions} | alone._defaults
        assert (
            defaults
            == {a.dest: a.default for a in command(full, name)._actions}
            | command(full, name)._defaults
        )
    assert full.format_help() == build_parser("snapshot").format_help()
