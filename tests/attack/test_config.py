"""The config file as a hurried operator writes it: every value the program would refuse
is refused by `config check` first, all of them at once, and at start each is a clear
message naming the key, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuconsole.cli.main import build_parser, main

# Each mistake, and what `config check` must say about it.
MISTAKES = {
    '[nvml]\nlibrary = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.l"\n': (
        "[nvml] library: NVML library /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.l cannot be loaded"
    ),
    '[actions]\nstate_dir = "/var/lib/gpu\\u0000console"\n': (
        "[actions] state_dir must not hold a NUL character"
    ),
    '[ssh]\npassword_file = "/etc/gpuconsole/passwd\\u0000"\n': (
        "[ssh] password_file must not hold a NUL character"
    ),
    '[fleet]\ntargets_file = "/etc/prometheus/\\u0000targets.json"\n': (
        "[fleet] targets_file must not hold a NUL character"
    ),
    '[ssh]\nhost_key = "\\u0000/var/lib/gpuconsole/key"\n': (
        "[ssh] host_key must not hold a NUL character"
    ),
    '[agent]\nlisten = "localhost:99999"\n': (
        "[agent] listen: listen address 'localhost:99999': port out of range"
    ),
    '[fleet]\nagents = ["not a url"]\n': (
        "[fleet] agents[0]: agent URL 'http://not a url': 'not a url' is not a host name"
    ),
    '[ui]\ntheme = "nope"\n': "[ui] theme: no theme 'nope'",
    '[fleet]\nprometheus = "prometheus:9090"\n': (
        "[fleet] prometheus: 'prometheus:9090': the scheme must be http or https"
    ),
}


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["config", "check", "-c", str(path)])
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("text", MISTAKES)
def test_config_check_refuses_what_the_program_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    code, said = check(path, capsys)
    assert code == 2 and len(said) == 1 and MISTAKES[text] in said[0], said


def test_config_check_says_every_mistake_of_a_file_not_only_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # one table each: TOML does not allow a table twice
    tables: dict[str, list[str]] = {}
    for text in MISTAKES:
        table, _, line = text.partition("\n")
        tables.setdefault(table, []).append(line)
    path = tmp_path / "config.toml"
    path.write_text("".join(f"{table}\n{''.join(lines)}" for table, lines in tables.items()))
    code, said = check(path, capsys)
    assert code == 2
    for expected in MISTAKES.values():
        assert sum(expected in line for line in said) == 1, (expected, said)
    assert len(said) == len(MISTAKES)


def test_an_ssh_listen_address_without_a_port_is_the_ssh_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuconsole.config import load
    from gpuconsole.wiring import ssh_settings

    path = tmp_path / "config.toml"
    path.write_text('[ssh]\nlisten = "127.0.0.1"\n')
    assert check(path, capsys) == (0, [])
    settings = ssh_settings(load(path))
    assert (settings.host, settings.port) == ("127.0.0.1", 2222)


def test_a_key_with_control_characters_is_named_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[hub]\n"\\u001b]0;owned\\u0007" = 1\n')
    code, said = check(path, capsys)
    assert code == 2 and "\x1b" not in "".join(said) and "unknown key" in said[0], said


# Each mistake at start, by the command that would trip on it.
AT_START = [
    ('[nvml]\nlibrary = "/nope/libnvidia-ml.so.1"\n', ["snapshot"], "[nvml] library"),
    ('[actions]\nstate_dir = "/var/lib/a\\u0000b"\n', ["assign", "--recover"], "state_dir"),
    ('[fleet]\ntargets_file = "/t\\u0000.json"\n', ["snapshot"], "targets_file"),
    ('[fleet]\nagents = ["not a url"]\n', ["snapshot"], "[fleet] agents[0]"),
    ('[ssh]\nhost_key = "/k\\u0000"\n', ["ssh-server", "--demo", "--listen", "127.0.0.1:0"],
     "host_key"),
    ('[ssh]\npassword_file = "/p\\u0000"\n', ["ssh-server", "--demo", "--listen", "127.0.0.1:0"],
     "password_file"),
    ('[agent]\nlisten = "localhost:99999"\n', ["agent", "--demo"], "[agent] listen"),
    ('[ui]\ntheme = "nope"\n', ["ssh-server", "--demo", "--listen", "127.0.0.1:0"], "[ui] theme"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "command", "key"), AT_START)
def test_each_mistake_stops_the_command_with_a_message_naming_the_key(
    tmp_path: Path, text: str, command: list[str], key: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "gpuconsole", *command, "-c", str(path)],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"),
                 "XDG_CONFIG_HOME": str(tmp_path / "config")},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command} ran on with {text!r}")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "gpuconsole: config error: " in result.stderr and key in result.stderr


@pytest.mark.parametrize("command", ["demo", "console", "wallboard"])
def test_an_unknown_theme_on_the_command_line_is_said_on_screen(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([command, "--theme", "nope"])
    assert stop.value.code == 2
    said = capsys.readouterr().err
    assert "argument --theme: no theme 'nope'" in said and "gpuconsole-dark" in said


def test_config_check_reads_the_ssh_key_and_password_files_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys, passwords = tmp_path / "authorized_keys", tmp_path / "passwords"
    keys.write_text(
        'role=operator,from="10.9.9.9",no-such-option ssh-ed25519 '
        "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    passwords.write_text("alice:root:scrypt$x$y\n")
    passwords.chmod(0o600)
    path = tmp_path / "config.toml"
    path.write_text(f'[ssh]\nauthorized_keys = "{keys}"\npassword_file = "{passwords}"\n')
    code, said = check(path, capsys)
    assert code == 2 and len(said) == 2, said
    assert f"[ssh] authorized_keys: {keys}:1:" in said[0] and "no-such-option" in said[0]
    assert f"[ssh] password_file: {passwords}:1: role 'root' is not known" in said[1]
