"""The tenancy source: who holds each GPU, from PCI, libvirt, QEMU, the kubelet and /proc."""

from gpuconsole.sources.tenancy.source import TenancySource
from gpuconsole.sources.tenancy.tenants import TenantRules

__all__ = ["TenancySource", "TenantRules"]
