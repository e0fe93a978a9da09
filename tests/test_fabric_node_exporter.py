"""The agent's node_infiniband_* series on node_exporter's and procfs's own sysfs trees
(../shared/fixtures): the same names, labels, values and types as node_exporter prints."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuconsole import config
from gpuconsole import wiring as hubs
from gpuconsole.export.agent import Agent
from gpuconsole.wiring import AgentSettings
from tests.fabric_fixtures import shared_fixture, ttar_sysfs

NODE = "ib-node"
# (name, labels, value) of each sample
Series = set[tuple[str, frozenset[tuple[str, str]], float]]


def node_infiniband(text: str, node: str | None = None) -> tuple[Series, dict[str, str]]:
    """The node_infiniband_* samples of an exposition and their types; with `node`, each
    sample must carry node="<node>", which is then left out."""
    series: Series = set()
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("node_infiniband_"):
                continue
            labels = dict(sample.labels)
            if node is not None:
                assert labels.pop("node", None) == node, sample
            key = (sample.name, frozenset(labels.items()), sample.value)
            assert key not in series, f"{sample} twice"
            series.add(key)
            types[sample.name] = family.type
    return series, types


def node_exporter_types(names: set[str]) -> dict[str, str]:
    """node_exporter's types (collector/infiniband_linux.go): every *_total a counter, the
    info, state, rate and lifespan series gauges."""
    return {n: "counter" if n.endswith("_total") else "gauge" for n in names}


async def agent_metrics(sysfs: Path) -> str:
    """/metrics of an agent whose node reads RDMA devices under `sysfs`, as configured."""
    cfg = config.parse(
        f"[host]\nname = '{NODE}'\nsysfs_root = '{sysfs}'\n"
        "[nvml]\nenabled = false\n[tenancy]\nenabled = false\n"
        "[fabric]\nnetlink = false\n"
    )
    hub = hubs.node_hub(cfg, one_shot=True)
    await hub.poll_once()
    agent = Agent(hub, AgentSettings(port=0))
    await agent.start()
    try:
        url = f"http://127.0.0.1:{agent.port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            return await response.text()
    finally:
        await agent.stop()


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("node-exporter-ib", "e2e-output-infiniband.txt"),
        ("procfs-ib", "expected.prom"),
    ],
)
async def test_every_node_infiniband_series_of_node_exporters_own_fixtures_comes_out_the_same(
    tmp_path: Path, fixture: str, expected: str
) -> None:
    want, want_types = node_infiniband(shared_fixture(fixture, expected).read_text())
    assert want
    # expected.prom has no TYPE lines: its types are node_exporter's
    known = {n: t for n, t in want_types.items() if t != "unknown"}
    want_types = node_exporter_types(set(want_types)) | known
    got, got_types = node_infiniband(await agent_metrics(ttar_sysfs(fixture, tmp_path)), NODE)
    assert sorted(want - got) == [] and sorted(got - want) == []
    assert got_types == want_types
