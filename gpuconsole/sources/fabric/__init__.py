"""The fabric source: RDMA ports from sysfs, their netdevs over rtnetlink, GPU-NIC affinity."""

from gpuconsole.sources.fabric.source import FabricSource

__all__ = ["FabricSource"]
