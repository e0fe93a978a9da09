"""`gpuconsole doctor`: what NVML answers this user, beside what the NVML source made of it.

Operators run it when a GPU looks wrong; the project runs it on real nodes to compare a real
driver with its fake library (`--json` from both, diffed).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from gpuconsole.readings.base import is_record, record_fields, safe_text
from gpuconsole.readings.nvml import GpuReading
from gpuconsole.sources.base import SourceUnavailable
from gpuconsole.sources.nvml.doctor import (
    Answer,
    Diagnosis,
    DoctorReport,
    Why,
    as_plain,
    identify,
)
from gpuconsole.sources.nvml.lib import load_pynvml, system_pynvml

EXIT_OK = 0  # NVML answered; what it refused is in the report
EXIT_UNAVAILABLE = 1  # no library, no driver, not permitted, or the source stopped
EXIT_HUNG = 3  # the driver did not answer within --timeout
JSON_SCHEMA = 1
VALUE_WIDTH = 160  # of one value in the text report; --json has all of it


def run_doctor(library: str, *, as_json: bool, timeout_s: float, out: TextIO) -> int:
    """Diagnose NVML through `library` (empty: the system's) and print the report."""
    try:
        lib = load_pynvml(library) if library else system_pynvml()
    except SourceUnavailable as exc:
        if as_json:
            plain = {"schema": JSON_SCHEMA, "identity": as_plain(identify(None)), "error": str(exc)}
            print(json.dumps(plain, indent=2), file=out)
        print(f"gpuconsole doctor: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    diagnosis = Diagnosis(lib)
    done: list[DoctorReport] = []
    worker = threading.Thread(
        target=lambda: done.append(diagnosis.run()), name="doctor", daemon=True
    )
    worker.start()
    worker.join(timeout_s)
    if done:
        report = done[0]
    else:
        stuck = diagnosis.stuck() or "no call in flight"
        report = diagnosis.report(f"the driver did not answer within {timeout_s:g} s: {stuck}")
    try:
        print(render_json(report) if as_json else render_text(report), file=out)
        out.flush()
    except BrokenPipeError:
        # `doctor | head`: the reader has what it wanted. Python would complain again at exit
        # flushing the same pipe, so point stdout at nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    if report.error is not None:
        print(f"gpuconsole doctor: {report.error}", file=sys.stderr)
    if not done:
        # The worker is blocked inside the driver and cannot be stopped; leave without it.
        out.flush()
        sys.stderr.flush()
        os._exit(EXIT_HUNG)
    return EXIT_OK if report.ok else EXIT_UNAVAILABLE


def render_json(report: DoctorReport) -> str:
    return json.dumps({"schema": JSON_SCHEMA, **as_plain(report)}, indent=2)


# --- the text report -------------------------------------------------------------------


def render_text(report: DoctorReport) -> str:
    return "\n".join(safe_text(line) for line in _text_lines(report))


def _text_lines(report: DoctorReport) -> Iterator[str]:
    who = report.identity
    user = f"{who.user} " if who.user else ""
    euid = f", euid {who.euid}" if who.euid != who.uid else ""
    yield f"gpuconsole doctor: NVML as {user}(uid {who.uid}{euid}) sees it"
    yield f"  library     {who.library or 'not loaded'} (nvidia-ml-py {who.pynvml_version or '?'})"
    yield (
        f"  driver      {report.driver_version or '?'}, NVML {report.nvml_version or '?'}, "
        f"CUDA {report.cuda_driver_version or '?'}"
    )
    if who.profiling_admin_only is None:
        yield f"  profiling   unknown ({who.params_note})"
    else:
        admin = "admin only" if who.profiling_admin_only else "open to every user"
        yield f"  profiling   {admin} ({who.params_note})"
    distinct = len(report.answers)
    yield f"  took        {report.seconds:.1f} s: {report.calls} NVML calls, {distinct} distinct"
    if report.error is not None:
        yield f"  FAILED      {report.error}"
    yield from _hidden(report, Why.PERMISSION, "Readings this user cannot see")
    yield from _hidden(report, Why.UNSUPPORTED, "Not supported here")
    yield from _hidden(report, Why.ERROR, "Errors")
    yield ""
    yield f"What the source made of it ({len(report.gpus)} GPUs)"
    for gpu in report.gpus:
        yield from _gpu_lines(gpu)
    if report.events:
        yield ""
        yield "Events the source raised"
        for event in report.events:
            yield f"  {event.severity.value:8} {event.kind:14} {event.message}"
    yield ""
    yield "NVML calls: function(arguments) -> return code, value type: value  [C symbols] (times)"
    phases: dict[str, list[Answer]] = {}
    for answer in report.answers:  # in the order first made; the event thread's apart
        phases.setdefault(answer.phase, []).append(answer)
    for phase, answers in phases.items():
        yield f"  {phase}"
        for answer in answers:
            yield from _answer_lines(answer)


def _hidden(report: DoctorReport, why: Why, title: str) -> Iterator[str]:
    rows = [h for h in report.hidden if h.why is why]
    yield ""
    yield f"{title}: {len(rows) or 'none'}"
    for h in rows:
        yield f"  {h.gpu or 'node':28} {h.reading:34} {h.call} {h.code_name}: {h.explanation}"


def _answer_lines(answer: Answer) -> Iterator[str]:
    call = f"{answer.function}({', '.join(answer.arguments)})"
    value = "" if answer.value is None else f": {_short(answer.value)}"
    symbols = f"   [{', '.join(answer.symbols)}]" if answer.symbols else ""
    times = f" ({answer.times} times)" if answer.times > 1 else ""
    yield f"    {call} -> {answer.code_name}, {answer.value_type}{value}{symbols}{times}"
    for entry in answer.fields:
        scope = f" scope {entry.scope_id}" if entry.scope_id else ""
        got = f" {entry.value}" if entry.value is not None else ""
        yield (
            f"        field {entry.field_id}{scope}: {entry.code_name}, "
            f"{entry.value_type_name}{got}"
        )
    for metric in answer.metrics:
        got = f" {metric.value:.6g}" if metric.value is not None else ""
        yield f"        GPM metric {metric.metric_id}: {metric.code_name}{got}"


def _short(value: Any) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 1] + "…"


def _gpu_lines(gpu: GpuReading) -> Iterator[str]:
    yield f"  GPU {gpu.index} {gpu.pci_bus_id} {gpu.name}: {gpu.state.value}"
    pairs: list[str] = []
    rows: list[str] = []
    for name, value in _flat(gpu, ""):
        if name in ("index", "pci_bus_id", "name", "state"):
            continue
        if isinstance(value, tuple) and value and is_record(value[0]):
            for i, item in enumerate(value):
                inner = " ".join(f"{k}={_scalar(v)}" for k, v in _flat(item, "") if v is not None)
                rows.append(f"    {name}[{i}]: {inner}")
        elif value is not None and value != ():
            pairs.append(f"{name}={_scalar(value)}")
    line = "   "
    for pair in pairs:
        if len(line) + len(pair) > 98:
            yield line
            line = "   "
        line += " " + pair
    if line.strip():
        yield line
    yield from rows


def _flat(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    for f in record_fields(type(value)):
        item = getattr(value, f.name)
        if is_record(item):
            yield from _flat(item, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", item


def _scalar(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if hasattr(value, "value") and not isinstance(value, int | float | str):
        return str(value.value)  # an enum
    return str(value)
