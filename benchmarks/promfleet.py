"""A fleet as a real Prometheus holds it: agents' /metrics written as OpenMetrics, backfilled
with `promtool tsdb create-blocks-from openmetrics`, served by `prometheus` on 127.0.0.1.

Each member's series are the exporter's own (gpuconsole.export.collector.node_metrics) for
the node it copies, under the member's name and GPU identities, with the `instance` and
`job` labels a scrape adds and an `up` series per target, all at one timestamp. A node is
rendered by the exporter once; members copying it get its text with their names put in,
as the simulated fleet renders agents' summaries (gpuconsole.sim.fleet).

Backfilled samples carry the time they were written, and Prometheus answers an instant
query with the newest sample of each series within its lookback delta (5 minutes by
default). The server here runs with `--query.lookback-delta` of LOOKBACK, so the console's
queries, which ask "now", find every series for that long after the backfill.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from gpuconsole.export.collector import node_metrics
from gpuconsole.export.families import Families
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sim.identity import gpu_serial, gpu_uuid, mig_uuid
from gpuconsole.sources.promql import gpu_verdict_asks, overview_queries

JOB = "gpuconsole"
LOOKBACK = "1h"
SEED = 0
_LABELS = re.compile(r"^([^{ ]+)(\{)?")


@dataclass(frozen=True)
class Member:
    """One scrape target: `node` exported under `name`, as Prometheus scraped it at
    `instance` (host:port); `up` False: a target Prometheus could not scrape; `lacks`: the
    families its agent does not export (an agent older than them)."""

    name: str
    instance: str
    node: NodeSnapshot
    up: bool = True
    lacks: frozenset[str] = frozenset()


def overview_families() -> frozenset[str]:
    """The metric names the console's overview queries select (from their own text), and
    the GPUs' health, which a round asks of the nodes not fit (`gpu_verdict_asks`)."""
    found: set[str] = set()
    for query in overview_queries():
        for alternatives in re.findall(r'__name__=~"([^"]+)"', query):
            found.update(alternatives.split("|"))
    for ask in gpu_verdict_asks():
        found.update(re.findall(r"\b(gpuconsole_[a-z_]+)\{", ask.query))
    return frozenset(found)


def identities(name: str, gpus: int) -> list[str]:
    """Everything in a simulated node's series that names it or one of its GPUs (the
    simulator's identities: the same GPU index of another node is another GPU)."""
    found = [name]
    for index in range(gpus):
        found += [gpu_uuid(name, SEED, index), gpu_serial(name, SEED, index)]
        found += [mig_uuid(name, SEED, index, slot) for slot in range(7)]
    return found


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Rendered:
    """One node's series as the exporter writes them, by family, with holes for each
    member's identities and instance."""

    HOLE = "\x00"  # never in a label value (safe_text keeps control characters out)

    def __init__(self, node: NodeSnapshot, keep: Collection[str] | None, at: float) -> None:
        out = Families()
        node_metrics(out, node, at)
        self.gpus = len(node_gpus(node))  # those passed through to a guest too
        names = identities(node.node, self.gpus)
        pattern = re.compile("|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)))
        self.order = {n: i for i, n in enumerate(names)}
        self.kinds: dict[str, tuple[str, str]] = {}  # family -> (type, help)
        self.pieces: dict[str, tuple[list[str], list[int]]] = {}
        stamp = f" {at:.3f}\n"
        for metric in out:
            if keep is not None and metric.name not in keep:
                continue
            self.kinds[metric.name] = (metric.type, metric.documentation)
            lines = []
            for sample in metric.samples:
                labels = "".join(f',{k}="{_escape(v)}"' for k, v in sorted(sample.labels.items()))
                where = f'{{instance="{self.HOLE}",job="{JOB}"{labels}}}'
                lines.append(f"{sample.name}{where} {_value(sample.value)}{stamp}")
            text = "".join(lines)
            literals: list[str] = []
            holes: list[int] = []  # -1: the instance, else the identity's place
            at_ = 0
            spots = [(m.start(), m.end(), self.order[m.group()]) for m in pattern.finditer(text)]
            spots += [(m.start(), m.end(), -1) for m in re.finditer(self.HOLE, text)]
            for start, end, which in sorted(spots):
                literals.append(text[at_:start])
                holes.append(which)
                at_ = end
            literals.append(text[at_:])
            self.pieces[metric.name] = (literals, holes)

    def family(self, name: str, instance: str, identities: Sequence[str]) -> str:
        """This family's lines for a member at `instance` named by `identities`."""
        literals, holes = self.pieces[name]
        out = [literals[0]]
        for hole, literal in zip(holes, literals[1:], strict=True):
            out.append(instance if hole < 0 else identities[hole])
            out.append(literal)
        return "".join(out)


_SAMPLE_END = re.compile(r" (\S+) (\S+)\n")


def _moved(text: str, by: float, at: float) -> str:
    """A family's lines with every value `by` more, at time `at`."""
    return _SAMPLE_END.sub(lambda m: f" {_value(float(m[1]) + by)} {at:.3f}\n", text)


def write_openmetrics(
    path: Path,
    members: Sequence[Member],
    at: float,
    keep: Collection[str] | None = None,
    *,
    moving: Collection[str] = (),
    steps: Sequence[float] = (),
    movers: Collection[str] | None = None,
) -> int:
    """Every member's series (only the families named in `keep`, when given) and `up`, at
    time `at`, as one OpenMetrics file that promtool backfills; the number of samples.
    The families in `moving` have a sample more at each of `steps` (times after `at`),
    each value 1 more than at the step before: a query at one step finds every one of
    them moved since the step before (of the members named in `movers`, when given)."""
    rendered: dict[int, _Rendered] = {}
    named: list[list[str]] = []
    for member in members:
        one = rendered.get(id(member.node))
        if one is None:
            one = rendered[id(member.node)] = _Rendered(member.node, keep, at)
        named.append(identities(member.name, one.gpus))
    families: dict[str, tuple[str, str]] = {}
    for one in rendered.values():
        for name, described in one.kinds.items():
            families.setdefault(name, described)
    samples = 0
    with path.open("w", encoding="utf-8") as out:
        out.write("# TYPE up gauge\n# HELP up Whether Prometheus could scrape the target.\n")
        for member in members:
            out.write(f'up{{instance="{member.instance}",job="{JOB}"}} {int(member.up)} {at:.3f}\n')
        samples += len(members)
        for family, (kind, doc) in families.items():
            out.write(f"# TYPE {family} {kind}\n# HELP {family} {_escape(doc)}\n")
            for member, mine in zip(members, named, strict=True):
                if not member.up or family in member.lacks:
                    continue  # a target that was not scraped has no series but up
                one = rendered[id(member.node)]
                if family in one.pieces:
                    text = one.family(family, member.instance, mine)
                    samples += text.count("\n")
                    out.write(text)
            for by, later in enumerate(steps if family in moving else (), start=1):
                for member, mine in zip(members, named, strict=True):
                    one = rendered[id(member.node)]
                    if movers is not None and member.name not in movers:
                        continue
                    if member.up and family in one.pieces and family not in member.lacks:
                        text = _moved(one.family(family, member.instance, mine), by, later)
                        samples += text.count("\n")
                        out.write(text)
        out.write("# EOF\n")
    return samples


def targets_file(path: Path, members: Sequence[Member]) -> None:
    """A file_sd file naming every member, as the console's [fleet] targets_file reads it."""
    groups = [{"targets": [m.instance], "labels": {"node": m.name}} for m in members]
    path.write_text(json.dumps(groups))


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class BackfilledPrometheus:
    """`prometheus` on 127.0.0.1 over a TSDB that promtool backfilled from an OpenMetrics
    file; everything it writes lives in a temporary folder removed on close."""

    def __init__(
        self, source: Path, *, prometheus: str = "prometheus", promtool: str = "promtool"
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="gpuconsole-prom-"))
        self.tsdb = self.folder / "tsdb"
        self.log = self.folder / "prometheus.log"
        self.url = ""
        self.backfill_s = 0.0
        self.start_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            began = time.perf_counter()
            done = subprocess.run(
                [
                    promtool,
                    "tsdb",
                    "create-blocks-from",
                    "openmetrics",
                    "-q",
                    str(source),
                    str(self.tsdb),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"promtool could not backfill {source}: {(done.stderr or done.stdout)[-2000:]}"
                )
            self.backfill_s = time.perf_counter() - began
            self._start(prometheus)
        except BaseException:
            self.close()
            raise

    def _start(self, binary: str) -> None:
        config = self.folder / "prometheus.yml"
        config.write_text("global: {scrape_interval: 1h}\n")  # it scrapes nothing
        for _attempt in range(3):  # another process may take the free port first
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            began = time.perf_counter()
            with self.log.open("ab") as out:
                self._proc = subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={self.tsdb}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        f"--query.lookback-delta={LOOKBACK}",
                        "--storage.tsdb.retention.time=30d",
                    ],
                    stdout=out,
                    stderr=out,
                )
            deadline = time.monotonic() + 120
            while self._proc.poll() is None and not _ready(url) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._proc.poll() is None and _ready(url):
                self.url = url
                self.start_s = time.perf_counter() - began
                return
            self._stop()
        raise RuntimeError(f"prometheus never started:\n{self.log.read_text()[-2000:]}")

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> BackfilledPrometheus:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def members(
    templates: Sequence[NodeSnapshot], count: int, *, first_port: int = 20000, prefix: str = "gpu"
) -> Iterator[Member]:
    """`count` members named PREFIX-00001..., each copying a template in turn (its GPUs,
    its faults), each at its own 127.0.0.1 port from `first_port` on (nothing listens
    there; only a drill-down would connect)."""
    width = max(5, len(str(count)))
    for i in range(count):
        node = templates[i % len(templates)]
        yield Member(f"{prefix}-{i + 1:0{width}d}", f"127.0.0.1:{first_port + i}", node)
