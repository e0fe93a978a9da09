"""Tenants from configuration: a namespace, a guest, a Slurm account or a user names one."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass

Rules = tuple[tuple[str, str], ...]  # (glob pattern, tenant), first match wins


def _rules(table: Mapping[str, str]) -> Rules:
    return tuple(table.items())


def _match(rules: Rules, value: str | None) -> str | None:
    if not value:
        return None
    for pattern, tenant in rules:
        if fnmatch.fnmatchcase(value, pattern):
            return tenant
    return None


@dataclass(frozen=True, slots=True)
class TenantRules:
    """Glob patterns to tenant names, per kind of owner, in the order the config gives."""

    namespaces: Rules = ()
    domains: Rules = ()
    accounts: Rules = ()
    users: Rules = ()

    @classmethod
    def from_tables(
        cls,
        *,
        namespaces: Mapping[str, str] | None = None,
        domains: Mapping[str, str] | None = None,
        accounts: Mapping[str, str] | None = None,
        users: Mapping[str, str] | None = None,
    ) -> TenantRules:
        return cls(
            _rules(namespaces or {}),
            _rules(domains or {}),
            _rules(accounts or {}),
            _rules(users or {}),
        )

    def namespace(self, namespace: str) -> str | None:
        """A Kubernetes namespace's tenant."""
        return _match(self.namespaces, namespace)

    def guest(self, name: str, metadata_tenant: str | None = None) -> str | None:
        """A guest's tenant: what its libvirt metadata says, else its name's pattern."""
        return metadata_tenant or _match(self.domains, name)

    def process(self, user: str | None, account: str | None = None) -> str | None:
        """A process's (or a Slurm job's) tenant: by account when it has one, else by user."""
        return _match(self.accounts, account) or _match(self.users, user)
