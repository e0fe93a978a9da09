"""Alert rules: the condition language, `for` and hysteresis, config errors, the state file,
`gpuconsole rules` checked by the real promtool, and the engine on a running hub."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuconsole import config
from gpuconsole.alerts.condition import ConditionError, Sample, parse
from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.alerts.prometheus import duration, rules_file
from gpuconsole.alerts.rules import DEFAULT_RULES, build_rules
from gpuconsole.alerts.state import StateFile
from gpuconsole.config import ConfigError
from gpuconsole.readings.alerts import AlertState
from gpuconsole.readings.nvml import EccReading
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.wiring import alert_rules, sim_hub, watch_alerts
from tests.alert_fixtures import (
    NODE,
    SYSFS_BUS,
    UUID,
    fired_as_promtool_fires,
    fleet,
    promtool_test_rules,
)
from tests.peers import require_program


def samples(name: str, *rows: tuple[dict[str, str], float]) -> dict[str, list[Sample]]:
    return {name: [Sample(name, tuple(sorted(labels.items())), value) for labels, value in rows]}


# --- the condition language ----------------------------------------------------------------


def test_a_condition_keeps_the_series_its_matchers_and_comparison_hold_for() -> None:
    cond = parse('DCGM_FI_DEV_GPU_TEMP{Hostname=~"dgx-0.*", gpu!="3"} >= 87')
    found = cond.evaluate(
        samples(
            "DCGM_FI_DEV_GPU_TEMP",
            ({"Hostname": "dgx-001", "gpu": "1"}, 90.0),
            ({"Hostname": "dgx-001", "gpu": "3"}, 95.0),
            ({"Hostname": "xdgx-001", "gpu": "2"}, 95.0),  # regexes are anchored, as PromQL's
            ({"Hostname": "dgx-002", "gpu": "0"}, 86.9),
        )
    )
    assert [dict(s.labels)["gpu"] for s in found] == ["1"]


def test_and_on_keeps_the_left_series_that_match_on_the_named_labels() -> None:
    cond = parse(
        "node_infiniband_state_id != 4 and on(node, device, port) "
        'gpuconsole_fabric_port_info{role="compute"} == 1'
    )
    port = {"node": "n", "device": "mlx5_0", "port": "1"}
    storage = {"node": "n", "device": "mlx5_9", "port": "1"}
    by_name = {
        **samples("node_infiniband_state_id", (port, 1.0), (storage, 1.0)),
        **samples(
            "gpuconsole_fabric_port_info",
            ({**port, "role": "compute"}, 1.0),
            ({**storage, "role": "storage"}, 1.0),
        ),
    }
    [down] = cond.evaluate(by_name)
    assert dict(down.labels)["device"] == "mlx5_0" and down.value == 1.0


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "empty"),
        ("rate(x[5m]) > 1", "a comparison"),
        ("x > 1 or y > 2", "'and'"),
        ("x{a=1} > 2", '"quoted"'),
        ('x{a=~"("} > 2', "bad regular expression"),
        ("x > y", "a number"),
        ("x > 1e999", "finite"),
        ("and > 1", "a metric name"),
        # what Python's regular expressions read and Prometheus's (Go's RE2) do not
        ('x{a=~"(?=dgx).*"} > 2', r"\(\?= .*Prometheus"),
        ('x{a=~"(?<!x)a"} > 2', r"\(\?<! .*Prometheus"),
        ('x{a=~"(a)\\\\1"} > 2', r"\\1 .*Prometheus"),
        ('x{a=~"a++"} > 2', r"\+\+ .*Prometheus"),
        ('x{a=~"(?>a)"} > 2', r"\(\?> .*Prometheus"),
        ('x{a=~"a\\\\Z"} > 2', r"\\Z .*Prometheus"),
        ('x{a=~"[[:digit:]]"} > 2', r"\[: .*Prometheus"),
        # a string as PromQL reads it: an escape it does not know is an error, not dropped
        ('x{a="d\\q"} > 2', r"unknown escape sequence \\q"),
        ('x{a="d\ne"} > 2', "a newline"),
    ],
)
def test_a_condition_outside_the_subset_says_where_and_what_was_expected(
    text: str, said: str
) -> None:
    with pytest.raises(ConditionError, match=said):
        parse(text)


def test_a_condition_prints_as_it_parses() -> None:
    text = 'a{b="c\\"d", e!~"f.*"} > 2.5 and on(b) g <= 3'
    assert parse(parse(text).text()) == parse(text)
    escaped = 'a{b="tab\\there\\nand \\u00e9\\x41", e=~"\\\\d+\\\\.\\\\w"} > 1'
    cond = parse(escaped)
    assert [m.value for m in cond.first.terms[0].matchers] == ["tab\there\nand \u00e9A", r"\d+\.\w"]
    assert parse(cond.text()) == cond
    assert "\n" not in cond.text()  # a newline is written as PromQL reads one: \n


def test_a_regular_expression_matches_as_prometheus_matches_it() -> None:
    """Go's \\d, \\w and \\s are ASCII; Python's are Unicode unless told."""
    cond = parse('x{a=~"\\\\d+"} > 0')
    found = cond.evaluate(samples("x", ({"a": "12"}, 1.0), ({"a": "\u0661\u0662"}, 1.0)))
    assert [dict(s.labels)["a"] for s in found] == ["12"]


# --- rules in the config ----------------------------------------------------------------------


def rules_from(toml: str) -> tuple[str, ...]:
    return tuple(r.name for r in alert_rules(config.parse(toml)))


def test_the_defaults_need_no_config_and_an_alert_table_adds_or_replaces() -> None:
    names = rules_from("")
    assert {"GpuNotFitForWork", "NodeNotFitForWork", "GpuLost", "GpuRowRemapPending",
            "GpuUncorrectableEcc", "PowerSupplyFailed", "FanFailed", "FabricRailDown",
            "SourceStale", "FabricManagerDown"} <= set(names)  # fmt: skip
    toml = """
[[alert]]
name = "GpuLost"
expr = "gpuconsole_gpu_lost == 1"
for_s = 30
severity = "warning"
[[alert]]
name = "HotInlet"
expr = "gpuconsole_bmc_inlet_temperature_celsius > 35"
"""
    rules = {r.name: r for r in alert_rules(config.parse(toml))}
    assert len(rules) == len(names) + 1
    assert rules["GpuLost"].for_s == 30 and rules["GpuLost"].severity.value == "warning"
    assert rules_from(
        '[alerts]\ndefaults = false\n[[alert]]\nname = "X"\nexpr = "gpuconsole_gpu_lost > 0"\n'
    ) == ("X",)


def test_a_bad_rule_gets_a_message_that_names_the_entry_its_line_and_what_is_wrong(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        """\
[[alert]]
name = "Hot"
expr = "DCGM_FI_DEV_GPU_TEMP >> 90"
[[alert]]
name = "Cool"
expr = "DCGM_FI_DEV_GPU_TEMP > 90"
clear = 95
labels = { severity = "page" }
annotations = { summary = "{{ range $labels }}x{{ end }}" }
[[alert]]
name = "Hot"
expr = "x > 1"
"""
    )
    with pytest.raises(ConfigError) as raised:
        alert_rules(config.load(path))
    assert sorted(raised.value.problems) == sorted(
        [
            f"{path}:3: [[alert]] #1 expr: 'DCGM_FI_DEV_GPU_TEMP >> 90': at character 23: "
            "expected a number, found '> 90'",
            f"{path}:7: [[alert]] #2 clear: 95 is above the firing threshold 90: it must not be",
            f"{path}:8: [[alert]] #2 labels: severity is set by the severity key",
            f"{path}:9: [[alert]] #2 annotations: summary: only {{{{ $labels.NAME }}}} and "
            "{{ $value }} are expanded; other templates are not",
            f"{path}:11: [[alert]] #3 name: another [[alert]] is named 'Hot' already",
        ]
    )


def test_a_rule_over_a_series_the_exporter_never_writes_is_refused_with_the_name_it_meant(
    tmp_path: Path,
) -> None:
    """Rules are evaluated over the exporter's series alone: a misspelt metric would never
    fire, and nobody would know until the night it should have."""
    path = tmp_path / "config.toml"
    path.write_text(
        '[[alert]]\nname = "Hot"\nexpr = "DCGM_FI_DEV_GPU_TEMPP > 90"\n'
        '[[alert]]\nname = "Climb"\n'
        'expr = "gpuconsole_gpu_lost == 1 and increase(gpuconsole_nvlink_errors_total[5m]) > 0"\n'
    )
    with pytest.raises(ConfigError) as raised:
        alert_rules(config.load(path))
    assert raised.value.problems == (
        f"{path}:3: [[alert]] #1 expr: DCGM_FI_DEV_GPU_TEMPP is not a series gpuconsole "
        "exports (did you mean 'DCGM_FI_DEV_GPU_TEMP'?)",
        f"{path}:6: [[alert]] #2 expr: gpuconsole_nvlink_errors_total is not a series "
        "gpuconsole exports (did you mean 'gpuconsole_gpu_nvlink_errors_total'?)",
    )


def test_every_default_rule_reads_series_the_exporter_writes() -> None:
    from gpuconsole.export.names import series_names

    known = series_names()
    assert "DCGM_FI_DEV_GPU_TEMP" in known and "node_infiniband_state_id" in known
    assert "GPU_I_PROFILE" not in known  # a label, not a series
    for rule in DEFAULT_RULES:
        assert set(rule.condition.metrics) <= known, rule.name


def test_config_check_and_rules_say_a_bad_condition_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[[alert]]\nname = "Hot"\nexpr = "DCGM_FI_DEV_GPU_TEMP > hot"\n')
    for args in (["config", "check"], ["rules"]):
        done = subprocess.run(
            [sys.executable, "-m", "gpuconsole", *args, "-c", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done
        assert f"{path}:3: [[alert]] #1 expr:" in done.stderr
        assert "expected a number" in done.stderr and "Traceback" not in done.stderr


# --- for, hysteresis --------------------------------------------------------------------------


def test_an_alert_waits_out_its_for_then_fires() -> None:
    [rule] = build_rules(
        [config.AlertRuleConfig(name="Lost", expr="gpuconsole_gpu_lost == 1", for_s=60)],
        defaults=False,
    )
    engine = AlertEngine([rule])
    assert engine.evaluate(fleet(1000.0, lost=True)) == []
    assert [a.state for a in engine.active()] == [AlertState.PENDING]
    assert engine.evaluate(fleet(1059.0, lost=True)) == []
    [fired] = engine.evaluate(fleet(1060.0, lost=True))
    assert fired.state == "firing" and fired.alert.labels["uuid"] == UUID
    # a pending alert whose condition stops holding is dropped, never resolved
    engine.evaluate(fleet(1061.0, lost=False))
    assert engine.active() == ()


def test_a_clear_threshold_keeps_an_alert_firing_until_the_reading_falls_below_it() -> None:
    [rule] = build_rules(
        [config.AlertRuleConfig(name="Hot", expr="DCGM_FI_DEV_GPU_TEMP > 90", clear=85)],
        defaults=False,
    )
    engine = AlertEngine([rule])
    assert [c.state for c in engine.evaluate(fleet(1.0, temp_c=91))] == ["firing"]
    assert engine.evaluate(fleet(2.0, temp_c=88)) == []  # below 90, above 85: still firing
    assert engine.evaluate(fleet(3.0, temp_c=89)) == []
    assert [a.value for a in engine.active()] == [89.0]
    assert [c.state for c in engine.evaluate(fleet(4.0, temp_c=84))] == ["resolved"]
    # below 90 again after it cleared: nothing fires
    assert engine.evaluate(fleet(5.0, temp_c=88)) == []


def test_keep_firing_for_rides_out_a_flap() -> None:
    [rule] = build_rules(
        [
            config.AlertRuleConfig(
                name="Lost", expr="gpuconsole_gpu_lost == 1", keep_firing_for_s=30
            )
        ],
        defaults=False,
    )
    engine = AlertEngine([rule])
    assert [c.state for c in engine.evaluate(fleet(100.0, lost=True))] == ["firing"]
    assert engine.evaluate(fleet(110.0)) == []
    assert engine.evaluate(fleet(120.0, lost=True)) == []  # back within 30 s: one alert
    assert engine.evaluate(fleet(149.0)) == []  # not held from here: 30 s more, as Prometheus
    assert engine.evaluate(fleet(178.0)) == []
    assert [c.state for c in engine.evaluate(fleet(179.0))] == ["resolved"]


def test_no_rule_fires_on_a_node_whose_sources_have_not_been_read() -> None:
    from gpuconsole.alerts.engine import ready
    from gpuconsole.readings.base import SourceStatus
    from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot

    waiting = NodeSnapshot(NODE, statuses=(SourceStatus(NODE, "nvml", False),))
    assert not ready(FleetSnapshot(1, 1.0, (waiting,)))
    assert ready(fleet(1.0))


# --- the state file ---------------------------------------------------------------------------


def test_a_corrupt_state_file_is_moved_aside_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "alerts-agent.json"
    path.write_text('{"version": 1, "alerts": [{"rule": 5, "state": "firing"}], "told": {}}')
    engine = AlertEngine(DEFAULT_RULES, state_file=StateFile(path))
    assert engine.problem is not None
    assert "is not a file gpuconsole wrote" in engine.problem
    assert "alerts[0].rule must be a string" in engine.problem
    assert (tmp_path / "alerts-agent.json.corrupt").exists() and not path.exists()
    # and it goes on: the next change is written whole
    engine.evaluate(fleet(1.0, lost=True))
    engine.save()
    again = AlertEngine(DEFAULT_RULES, state_file=StateFile(path))
    assert again.problem is None
    # the lost GPU, and its verdict and its node's (reboot the node)
    assert {a.name for a in again.active()} == {"GpuLost", "GpuNotFitForWork", "NodeNotFitForWork"}


def test_a_state_file_that_is_not_json_at_all_is_said_too(tmp_path: Path) -> None:
    path = tmp_path / "alerts.json"
    path.write_bytes(b"\x00\xff not json")
    engine = AlertEngine(DEFAULT_RULES, state_file=StateFile(path))
    assert engine.problem is not None and str(path) in engine.problem


# --- Prometheus -------------------------------------------------------------------------------


def test_durations_are_written_as_prometheus_reads_them() -> None:
    assert [duration(s) for s in (0.5, 15, 60, 90, 3600, 5400)] == [
        "500ms", "15s", "1m", "1m30s", "1h", "1h30m"
    ]  # fmt: skip


def promtool_check(tmp_path: Path, text: str) -> str:
    promtool = require_program("promtool", "apt-get install prometheus")
    path = tmp_path / "rules.yml"
    path.write_text(text)
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_accepts_the_default_rules_gpuconsole_rules_prints(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "rules", "-c", str(tmp_path / "none.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "no such config file" in done.stderr
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "rules", "-c", str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    said = promtool_check(tmp_path, done.stdout)
    assert f"SUCCESS: {len(DEFAULT_RULES)} rules found" in said
    assert "gpuconsole_gpu_verdict >= 2" in done.stdout
    assert "keep_firing_for: 5m" in done.stdout


def test_promtool_accepts_configured_rules_with_hysteresis_labels_and_odd_text(
    tmp_path: Path,
) -> None:
    toml = """
[[alert]]
name = "Hot"
expr = 'DCGM_FI_DEV_GPU_TEMP{Hostname=~"dgx-.*"} > 90'
clear = 85
for_s = 90
severity = "critical"
labels = { team = "infra" }
annotations = { summary = "GPU {{ $labels.gpu }} at {{ $value }} °C: \\"hot\\"\\nnow" }
"""
    text = rules_file(alert_rules(config.parse(toml)))
    said = promtool_check(tmp_path, text)
    assert "SUCCESS" in said
    assert (
        '(DCGM_FI_DEV_GPU_TEMP{Hostname=~\\"dgx-.*\\"} > 90) or '
        '(DCGM_FI_DEV_GPU_TEMP{Hostname=~\\"dgx-.*\\"} > 85 and '
        "ignoring(alertname, alertstate, severity, team) "
        'ALERTS{alertname=\\"Hot\\", alertstate=\\"firing\\"})'
    ) in text


def test_a_duration_prometheus_cannot_read_is_refused_and_one_it_rounds_is_kept_as_it_reads_it(
    tmp_path: Path,
) -> None:
    """`for` and `keep_firing_for` as Prometheus reads them: whole milliseconds, and no
    longer than a week (1e300 s printed a duration promtool refuses); the engine waits
    what `gpuconsole rules` prints."""
    path = tmp_path / "config.toml"
    path.write_text(
        '[[alert]]\nname = "Hot"\nexpr = "DCGM_FI_DEV_GPU_TEMP > 90"\nfor_s = 1e300\n'
        '[[alert]]\nname = "Lost"\nexpr = "gpuconsole_gpu_lost == 1"\nkeep_firing_for_s = 1e12\n'
    )
    with pytest.raises(ConfigError) as raised:
        alert_rules(config.load(path))
    assert raised.value.problems == (
        f"{path}:4: [[alert]] #1 for_s must be at most 604800",
        f"{path}:8: [[alert]] #2 keep_firing_for_s must be at most 604800",
    )
    toml = '[[alert]]\nname = "Hot"\nexpr = "DCGM_FI_DEV_GPU_TEMP > 90"\nfor_s = 0.0004\n'
    [rule] = [r for r in alert_rules(config.parse(toml)) if r.name == "Hot"]
    assert rule.for_s == 0.0  # Prometheus reads "for: 0s": it fires at once, as the engine
    assert "for:" not in rules_file([rule])
    longest = config.parse(toml.replace("0.0004", "604800"))
    [rule] = [r for r in alert_rules(longest) if r.name == "Hot"]
    text = rules_file([rule])
    assert "for: 168h" in text and "SUCCESS" in promtool_check(tmp_path, text)


def test_promtool_keeps_firing_for_as_long_as_the_engine_does(tmp_path: Path) -> None:
    """keep_firing_for counts from the first evaluation the condition no longer holds at,
    as Prometheus counts it (the engine counted from the last one it held at, and resolved
    one evaluation early); a new hold starts the count again."""
    toml = (
        '[alerts]\ndefaults = false\n[[alert]]\nname = "Lost"\n'
        'expr = "gpuconsole_gpu_lost == 1"\nkeep_firing_for_s = 180\n'
    )
    rules = alert_rules(config.parse(toml))
    engine = AlertEngine(rules)
    lost = [1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    fired = []
    for minute, held in enumerate(lost):
        engine.evaluate(fleet(60.0 * minute, lost=bool(held)))
        fired.append(any(a.state == "firing" for a in engine.alerts.values()))
    assert [int(f) for f in fired] == [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0]
    (tmp_path / "rules.yml").write_text(rules_file(rules))
    labels = {"gpu": "5", "node": NODE, "uuid": UUID, "severity": "warning"}
    checks = [
        {"eval_time": f"{m}m", "alertname": "Lost", "exp_alerts": [{"exp_labels": labels}] * f}
        for m, f in enumerate(fired)
    ]
    series = f'gpuconsole_gpu_lost{{gpu="5", node="{NODE}", uuid="{UUID}"}}'
    spec = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series, "values": " ".join(map(str, lost))}],
                "alert_rule_test": checks,
            }
        ],
    }
    promtool_test_rules(tmp_path, json.dumps(spec))


def test_a_rules_labels_are_expanded_as_prometheus_expands_them(tmp_path: Path) -> None:
    """A label's {{ $labels.X }} and {{ $value }} are filled in, as Prometheus fills them
    in evaluating `gpuconsole rules`; one that comes out empty is no label. Labels and
    annotations read the series' labels alone."""
    toml = """
[alerts]
defaults = false
[[alert]]
name = "Hot"
expr = "DCGM_FI_DEV_GPU_TEMP > 90"
labels = { where = "{{ $labels.Hostname }}/{{ $labels.gpu }}", gone = "{{ $labels.nothing }}" }
annotations = { summary = "{{ $labels.Hostname }}: [{{ $labels.where }}{{ $labels.severity }}]" }
"""
    rules = alert_rules(config.parse(toml))
    engine = AlertEngine(rules)
    engine.evaluate(fleet(0.0, temp_c=95.0))
    [alert] = engine.alerts.values()
    assert alert.labels["where"] == f"{NODE}/5" and "gone" not in alert.labels
    # an annotation reads the series' labels, not the rule's: Prometheus's $labels
    assert alert.annotations["summary"] == f"{NODE}: []"
    (tmp_path / "rules.yml").write_text(rules_file(rules))
    labels = {k: v for k, v in alert.labels.items() if k != "alertname"}
    series = (
        "DCGM_FI_DEV_GPU_TEMP{"
        + ", ".join(
            f"{k}={json.dumps(v)}" for k, v in labels.items() if k not in ("where", "severity")
        )
        + "}"
    )
    spec = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series, "values": "95"}],
                "alert_rule_test": [
                    {
                        "eval_time": "0m",
                        "alertname": "Hot",
                        "exp_alerts": [
                            {"exp_labels": labels, "exp_annotations": {"summary": f"{NODE}: []"}}
                        ],
                    }
                ],
            }
        ],
    }
    promtool_test_rules(tmp_path, json.dumps(spec))


def test_a_label_with_no_value_is_no_label_of_the_alert() -> None:
    """Prometheus holds no label with an empty value (a scrape drops it), so its alerts
    have none; Alertmanager drops them too: the engine's alerts do as well."""
    [rule] = [r for r in DEFAULT_RULES if r.name == "GpuNotFitForWork"]
    labels = rule.alert_labels((("action", "drain"), ("gpu", "0000:c3:00.0"), ("uuid", "")), 2.0)
    assert labels == {
        "action": "drain",
        "gpu": "0000:c3:00.0",
        "severity": "critical",
        "alertname": "GpuNotFitForWork",
    }


def test_value_in_a_template_is_written_as_prometheus_writes_it(tmp_path: Path) -> None:
    """{{ $value }} as Go prints a float (fmt's %v: the shortest digits, an exponent from
    1e+06 and below 1e-04), so that an extrapolated increase reads alike in both."""
    toml = (
        '[alerts]\ndefaults = false\n[[alert]]\nname = "Hot"\n'
        'expr = "DCGM_FI_DEV_GPU_TEMP > 0"\nannotations = { summary = "at {{ $value }}" }\n'
    )
    rules = alert_rules(config.parse(toml))
    values = [95.0, 2.5454545454545454, 1234567.0, 0.00001, 123456.7, 1e21, 0.5]
    from gpuconsole.alerts.rules import expand

    texts = [expand("{{ $value }}", {}, v) for v in values]
    assert texts == [
        "95",
        "2.5454545454545454",
        "1.234567e+06",
        "1e-05",
        "123456.7",
        "1e+21",
        "0.5",
    ]
    (tmp_path / "rules.yml").write_text(rules_file(rules))
    labels = {"Hostname": NODE, "severity": "warning"}
    spec = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{NODE}"}}',
                        "values": " ".join(repr(v) for v in values),
                    }
                ],
                "alert_rule_test": [
                    {
                        "eval_time": f"{m}m",
                        "alertname": "Hot",
                        "exp_alerts": [
                            {"exp_labels": labels, "exp_annotations": {"summary": f"at {text}"}}
                        ],
                    }
                    for m, text in enumerate(texts)
                ],
            }
        ],
    }
    promtool_test_rules(tmp_path, json.dumps(spec))


def test_promtool_runs_the_hysteresis_as_the_engine_does(tmp_path: Path) -> None:
    """The printed rule, run by promtool's rule tests over the same readings the engine
    sees: fires above 90, holds at 88, clears at 84."""
    toml = '[alerts]\ndefaults = false\n[[alert]]\nname = "Hot"\nexpr = "DCGM_FI_DEV_GPU_TEMP > 90"\nclear = 85\n'
    rules = alert_rules(config.parse(toml))
    (tmp_path / "rules.yml").write_text(rules_file(rules))
    promtool_test_rules(
        tmp_path,
        """\
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'DCGM_FI_DEV_GPU_TEMP{gpu="0"}'
        values: '91 88 84 88'
    alert_rule_test:
      - {eval_time: 0m, alertname: Hot, exp_alerts: [{exp_labels: {gpu: "0", severity: warning}}]}
      - {eval_time: 1m, alertname: Hot, exp_alerts: [{exp_labels: {gpu: "0", severity: warning}}]}
      - {eval_time: 2m, alertname: Hot, exp_alerts: []}
      - {eval_time: 3m, alertname: Hot, exp_alerts: []}
""",
    )
    [rule] = rules
    engine = AlertEngine([rule])
    fired = []
    for minute, value in enumerate((91, 88, 84, 88)):
        engine.evaluate(fleet(minute * 60.0, temp_c=value))
        fired.append(bool(engine.active()))
    assert fired == [True, True, False, False]


# --- on a running hub ------------------------------------------------------------------------


async def test_the_engine_on_a_demo_hub_puts_what_fires_in_its_snapshots() -> None:
    cfg = config.parse("[alerts]\ninterval_s = 0.2\n")
    hub = sim_hub(cfg, None, 0)
    engine = watch_alerts(cfg, hub, "test", demo=True)
    assert engine is not None and engine.receivers == [] and engine.state_file is None
    await hub.start()
    try:
        for _ in range(200):
            latest = hub.latest
            if latest is not None and any(a.state is AlertState.FIRING for a in latest.alerts):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("nothing fired in 10 s on the demo cluster (a remap waits)")
        # the row remap dgx-004's GPU waits on fires at once; the failed power supply, from
        # the BMC's series, is pending (a minute: one odd reading of a sensor is no page)
        remap = next(a for a in latest.alerts if a.name == "GpuRowRemapPending")
        assert remap.state is AlertState.FIRING and remap.node and remap.node in remap.summary
        assert remap.gpu_bus_id == "0000:61:00.0"
        psu = next(a for a in latest.alerts if a.name == "PowerSupplyFailed")
        assert psu.severity.value == "critical" and psu.state is AlertState.PENDING
        await asyncio.sleep(0.1)
        said = [e for e in hub.events() if e.kind == "alert"]
        assert any(e.message.startswith("alert GpuRowRemapPending firing: ") for e in said)
        assert not any("PowerSupplyFailed" in e.message for e in said)
    finally:
        await engine.stop()
        await hub.stop()


def test_the_series_rules_read_are_the_series_a_scrape_reads() -> None:
    """Evaluations build only the families their rules name (and skip the work of the
    rest): the samples of those families are the full body's, every one."""
    from gpuconsole.alerts.series import samples_by_name
    from gpuconsole.export.collector import build
    from tests.export_fixtures import frozen_fleet as polled_fleet

    snapshot = polled_fleet()
    wanted = {m for r in DEFAULT_RULES for m in r.condition.metrics}
    wanted |= {"node_infiniband_link_downed_total", "gpuconsole_fabric_port_severity"}
    full: dict[str, list[Sample]] = {}
    for name, labels, values, value in build(snapshot, snapshot.at).samples():
        if name in wanted:
            pairs = tuple(sorted(zip(labels, values, strict=True)))
            full.setdefault(name, []).append(Sample(name, pairs, value))
    assert samples_by_name(snapshot, wanted) == full
    for name in ("node_infiniband_state_id", "gpuconsole_bmc_psus_failed", "gpuconsole_gpu_lost",
                 "node_infiniband_link_downed_total", "gpuconsole_fabric_port_severity"):  # fmt: skip
        assert full.get(name), name


def test_each_family_asked_alone_is_the_full_bodys() -> None:
    """An evaluation skips the work of the families its rules do not read (profiling,
    NVLink traffic, MIG, health, BMC sensors, ownership, topology...): a rule that reads any
    one family of the body alone still finds every sample a scrape has of it."""
    from gpuconsole.alerts.series import samples_by_name
    from gpuconsole.export.collector import build
    from tests.export_fixtures import frozen_fleet as polled_fleet

    snapshot = polled_fleet()
    full: dict[str, list[Sample]] = {}
    for name, labels, values, value in build(snapshot, snapshot.at).samples():
        pairs = tuple(sorted(zip(labels, values, strict=True)))
        full.setdefault(name, []).append(Sample(name, pairs, value))
    # among them, families of each room's work that `Families.wants` skips where none is read
    for name in ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
                 "gpuconsole_nvlink_transmit_bytes_total", "gpuconsole_mig_instance_info",
                 "node_infiniband_port_data_received_bytes_total", "gpuconsole_gpu_health",
                 "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_FB_USED",
                 "gpuconsole_gpu_topology_info", "gpuconsole_gpu_owner_info", "ipmi_temperature_celsius",
                 "gpuconsole_bmc_health", "gpuconsole_gpu_nic_affinity_info",
                 "gpuconsole_gpu_board_temperature_celsius"):  # fmt: skip
        assert full.get(name), name
    for name, samples in full.items():
        assert samples_by_name(snapshot, {name}) == {name: samples}, name


def test_a_node_unchanged_since_the_last_evaluation_is_read_as_it_was_built() -> None:
    """The engine keeps each node's samples while the hub hands on the same node object:
    a node replaced by a changed one, and a series that grows with the snapshot's time
    (a source stale since a moment), read as a fresh build reads them."""
    import msgspec

    from gpuconsole.alerts.series import Series, samples_by_name
    from gpuconsole.export.collector import TIMED, build
    from tests.export_fixtures import frozen_fleet as polled_fleet

    first = polled_fleet()
    wanted = {name for name, *_ in build(first, first.at).samples()}
    node = first.nodes[0]
    stale = tuple(msgspec.structs.replace(s, ok=False, stale_since=first.at) for s in node.statuses)
    changed = msgspec.structs.replace(node, statuses=stale)
    later = msgspec.structs.replace(first, at=first.at + 30, nodes=(changed, *first.nodes[1:]))
    latest = msgspec.structs.replace(later, at=later.at + 30)
    for asked in (wanted, wanted - TIMED):  # with and without a series read at a time
        series = Series(asked)
        for snapshot in (first, later, latest, latest):
            assert series.samples(snapshot) == samples_by_name(snapshot, asked)
    series = Series(wanted)
    ages = {s.value for s in series.samples(latest)["gpuconsole_source_stale_seconds"]}
    assert 60.0 in ages  # the stale source's, read at the latest snapshot's time


def test_a_series_sample_is_reused_only_for_the_very_same_value() -> None:
    """A series read at the value it had before is its sample from then; any other value
    (an int's 0 after 0.0, -0.0 after 0.0, NaN after NaN) is a sample of its own."""
    import math

    from gpuconsole.alerts.series import _by_name

    interned: dict[tuple[str, tuple[str, ...]], dict[tuple[str, ...], Sample]] = {}
    before = None
    for value in (0.0, 0.0, -0.0, 0, 0, 1.5, 1.5, math.nan, math.nan, 2.0):
        [sample] = _by_name([("m", [(("b", "a"), ("x", "y"), value)])], interned)["m"]
        assert sample.labels == (("a", "y"), ("b", "x"))
        assert repr(sample.value) == repr(value) and type(sample.value) is type(value)
        if before is not None:
            assert (sample is before) == (repr(before.value) == repr(value) != "nan"), value
        before = sample


def test_the_verdict_rules_fire_for_drain_and_worse_and_not_for_watch() -> None:
    from gpuconsole.facts.verdict import Action

    rules = {r.name: r for r in DEFAULT_RULES}
    gpu, node = rules["GpuNotFitForWork"], rules["NodeNotFitForWork"]
    for action in Action:
        labels = {"node": NODE, "gpu": "0000:c3:00.0", "uuid": UUID, "action": action.value}
        held = gpu.condition.evaluate(samples("gpuconsole_gpu_verdict", (labels, action.rank)))
        node_labels = {"node": NODE, "action": action.value}
        on_node = node.condition.evaluate(
            samples("gpuconsole_node_verdict", (node_labels, action.rank))
        )
        wanted = action.rank >= Action.DRAIN.rank
        assert bool(held) == wanted and bool(on_node) == wanted, action
    labels = {"node": NODE, "gpu": "0000:c3:00.0", "uuid": UUID, "action": "reset_gpu"}
    [held] = gpu.condition.evaluate(samples("gpuconsole_gpu_verdict", (labels, 3.0)))
    from gpuconsole.alerts.rules import expand

    said = expand(dict(gpu.annotations)["summary"], dict(held.labels), held.value)
    assert said == f"GPU 0000:c3:00.0 on {NODE}: reset_gpu"


# Story 9, GPU 5 of dgx-007 every 30 s: fit; a double-bit error with a row remap pending
# (reset the GPU) from step 2; fit for one reading at step 8; the remap failed (return it for
# service) from step 12; fit from step 20; lost (fell off the bus) from step 28.
_PENDING = EccReading(volatile_uncorrected=1, remap_pending=True)
_FAILED = EccReading(volatile_uncorrected=1, remap_failure=True)
_STORY_9 = [None] * 2 + [_PENDING] * 6 + [None] + [_PENDING] * 3 + [_FAILED] * 8 + [None] * 8
_STEP_S = 30.0


def _story_9(step: int) -> FleetSnapshot:
    at = step * _STEP_S
    if step >= len(_STORY_9):
        return fleet(at, lost=True)
    ecc = _STORY_9[step]
    return fleet(at) if ecc is None else fleet(at, ecc=ecc)


def test_story_9_a_verdict_of_drain_or_worse_pages_once_it_has_held_2_minutes(
    tmp_path: Path,
) -> None:
    """STORIES.md 9: "a GPU's verdict is drain or worse for 2 minutes" fires, and not
    before; a verdict that eases for a moment, or worsens (another action: another series),
    pages once; it resolves by itself once the GPU is fit (2 minutes on, the same
    hysteresis); a lost GPU pages at once, its verdict 2 minutes later; a double-bit error
    alone is no page. Promtool fires the printed rules at the same steps, alike."""
    steps = [_story_9(k) for k in range(len(_STORY_9) + 6)]
    fired = fired_as_promtool_fires(tmp_path, DEFAULT_RULES, steps, _STEP_S)

    def when(rule: str, action: str | None = None) -> list[int]:
        return [
            k
            for k, now in enumerate(fired)
            if any(action in (None, a["exp_labels"].get("action")) for a in now[rule])  # type: ignore[attr-defined]
        ]

    # held from step 2 (60 s): pending 90 s, firing at 120 s, through the reading that eased;
    # the lost GPU's verdict (reset it) from step 32
    lost = len(_STORY_9)
    assert when("GpuNotFitForWork", "reset_gpu") == [*range(6, 16), *range(lost + 4, len(steps))]
    # the remap failed at step 12: that verdict fires 2 minutes on, as the first resolves
    assert when("GpuNotFitForWork", "service") == list(range(16, 24))
    assert when("GpuNotFitForWork") == [*range(6, 24), *range(lost + 4, len(steps))]
    assert when("NodeNotFitForWork") == when("GpuNotFitForWork")
    # the lost GPU pages at once; its verdict 2 minutes on
    assert when("GpuLost") == list(range(lost, len(steps)))
    # nothing pages before a verdict has held 2 minutes, but a lost GPU: the double-bit
    # error and the pending remap are warnings, at once
    pages = [k for k, now in enumerate(fired) if any(
        a["exp_labels"]["severity"] == "critical" for found in now.values() for a in found  # type: ignore[index]
    )]  # fmt: skip
    assert pages[0] == 6
    assert when("GpuUncorrectableEcc")[0] == 2 and when("GpuRowRemapPending")[0] == 2
    [unfit] = fired[6]["GpuNotFitForWork"]
    assert unfit["exp_annotations"] == {
        "summary": f"GPU {SYSFS_BUS} on {NODE}: reset_gpu",
        "description": "The GPU's verdict has called for drain or worse for 2 min; its "
        "evidence is in the console's GPU view.",
    }


def test_a_gpu_nvml_lost_before_it_was_read_is_not_fit_for_work() -> None:
    """A GPU that fell off the bus before gpuconsole started: NVML reads neither its bus id
    nor its UUID. Its own verdict (what gpuconsole_gpu_verdict and the rule of story 9 read)
    is the node's finding about it, not fit."""
    import msgspec

    snapshot = fleet(1000.0, lost=True)
    node = snapshot.nodes[0]
    assert node.nvml is not None
    unread = msgspec.structs.replace(node.nvml.gpus[0], pci_bus_id="unknown", uuid="")
    node = msgspec.structs.replace(node, nvml=msgspec.structs.replace(node.nvml, gpus=(unread,)))
    rules = tuple(r for r in DEFAULT_RULES if r.name in ("GpuNotFitForWork", "GpuLost"))
    engine = AlertEngine(rules)
    engine.evaluate(msgspec.structs.replace(snapshot, nodes=(node,)))
    fired = {a.rule: a for a in engine.alerts.values()}
    assert set(fired) == {"GpuNotFitForWork", "GpuLost"}
    assert fired["GpuNotFitForWork"].labels["action"] == "reset_gpu"
    assert fired["GpuLost"].annotations["evidence"].startswith("GPU 5: fell off the bus (XID 79)")


async def test_an_engine_with_no_receiver_looks_again_only_when_an_evaluation_is_due() -> None:
    """Without a receiver only an evaluation changes what fires: between two, an idle
    console's engine sleeps instead of waking each second to find nothing to do."""
    cfg = config.parse("[alerts]\ninterval_s = 2.5\n")
    hub = sim_hub(cfg, None, 0)
    engine = watch_alerts(cfg, hub, "test", demo=True)
    assert engine is not None and engine.receivers == []
    looks = 0
    active = engine.active

    def counted() -> tuple[object, ...]:
        nonlocal looks
        looks += 1
        return active()

    await hub.start()
    try:
        for _ in range(200):  # the first evaluation, once every source has been read
            if engine._nodes:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the engine never evaluated the demo cluster in 10 s")
        engine.active = counted  # type: ignore[method-assign]
        # an evaluation's due once in this while (every 2.5 s, or later where the first one
        # cost more than its share of a core on a busy machine)
        await asyncio.sleep(engine.paced_interval() + 1.5)
    finally:
        await engine.stop()
        await hub.stop()
    assert 1 <= looks <= 2  # at the evaluations due, not each second


async def test_an_engine_stopped_stays_stopped_while_its_hub_publishes() -> None:
    """A console stops its engine before its hub: a publish between the two does not start
    the engine again (it did, and went on evaluating a hub about to stop)."""
    cfg = config.parse("[alerts]\ninterval_s = 2.5\n")
    hub = sim_hub(cfg, None, 0)
    engine = watch_alerts(cfg, hub, "test", demo=True)
    assert engine is not None
    await hub.start()
    try:
        for _ in range(200):
            if engine._task is not None:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the engine never started in 10 s")
        await engine.stop()
        seq = hub.latest.seq if hub.latest is not None else -1
        for _ in range(100):  # until the hub has published again, or 5 s
            if hub.latest is not None and hub.latest.seq > seq:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the hub never published again in 5 s")
        assert engine._task is None
    finally:
        await engine.stop()
        await hub.stop()


def test_an_evaluation_paced_below_a_second_says_its_pace(caplog: pytest.LogCaptureFixture) -> None:
    engine = AlertEngine(DEFAULT_RULES, interval_s=0.2)
    engine.last_cpu_s, engine._nodes = 0.02, 1
    assert engine.paced_interval() == pytest.approx(0.4)
    assert "evaluating every 0.4 s instead of every 0.2 s" in caplog.text
