"""The [fabric] config section, and the node hub it builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuconsole import config
from gpuconsole import wiring as hubs
from gpuconsole.config import ConfigError
from gpuconsole.sources.fabric import FabricSource
from tests.fabric_fixtures import dgx_h100_slice


def test_roles_are_a_table_of_known_role_names(tmp_path: Path) -> None:
    cfg = config.parse(
        '[fabric]\ninterval_s = 5\nroles = { mlx5_1 = "storage", "mlx5_2/1" = "management" }\n'
    )
    assert cfg.fabric.interval_s == 5.0
    assert cfg.fabric.roles == {"mlx5_1": "storage", "mlx5_2/1": "management"}
    path = tmp_path / "c.toml"
    path.write_text('[fabric]\nenabled = true\nroles = { mlx5_1 = "storge" }\n')
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert str(err.value) == (
        f"{path}:3: [fabric] roles 'storge' is not one of compute, storage, management"
    )
    with pytest.raises(ConfigError, match=r":2: \[fabric\] roles must be a table of strings"):
        config.parse("[fabric]\nroles = { mlx5_1 = 3 }\n")


def test_the_example_documents_fabric_and_parses_back() -> None:
    text = config.example()
    assert "[fabric]" in text and "roles = {}" in text
    assert config.parse(text) == config.Config()


async def test_the_node_hub_reads_fabric_under_the_configured_sysfs_root(tmp_path: Path) -> None:
    dgx_h100_slice(tmp_path / "sys")
    cfg = config.parse(
        f"[host]\nname = 'dgx-017'\nsysfs_root = '{tmp_path / 'sys'}'\n"
        "[nvml]\nenabled = false\n[fabric]\nnetlink = false\nroles = { mlx5_6 = 'storage' }\n"
    )
    hub = hubs.node_hub(cfg)
    (source,) = [s for s in hub.sources if s.kind == "fabric"]
    assert isinstance(source, FabricSource)
    node = (await hub.poll_once()).nodes[0]
    assert node.node == "dgx-017" and node.fabric is not None
    assert [(p.device, p.role.value) for p in node.fabric.ports] == [
        ("mlx5_0", "compute"),
        ("mlx5_1", "storage"),
        ("mlx5_6", "storage"),
    ]
