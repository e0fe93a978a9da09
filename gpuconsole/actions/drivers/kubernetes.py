"""The Kubernetes layer through the API server, with the official client (gpuconsole[kubernetes]).

Cordoning one GPU: Kubernetes has no per-device cordon, so gpuconsole keeps the node's
annotation `gpuconsole.dev/cordoned-gpus`, a sorted comma-separated list of GPU UUIDs, and
writes it with a JSON merge patch that carries the node's resourceVersion (a concurrent
writer makes the API server answer 409 and the update is retried). The site's device
plugin honours the list: e.g. a health-check hook of the NVIDIA device plugin that reports
the listed UUIDs Unhealthy, so the kubelet allocates them to no new pod. Evicting uses the
Eviction API (PodDisruptionBudgets apply) and waits until the pod is gone.
The client is blocking: every call runs in a thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.plan import Step, StepKind
from gpuconsole.config import DEFAULTS

__all__ = ["CORDON_ANNOTATION", "KubernetesDriver", "api_client"]

CORDON_ANNOTATION = "gpuconsole.dev/cordoned-gpus"
MERGE_PATCH = "application/merge-patch+json"


def api_client(kubeconfig: str = "", host: str = "") -> Any:
    """An ApiClient from a kubeconfig file, the in-cluster service account, or a bare host."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise StepFailed(
            "the kubernetes client is not installed (pip install 'gpuconsole[kubernetes]')"
        ) from None
    if host:
        configuration = client.Configuration()
        configuration.host = host
        return client.ApiClient(configuration)
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return int(status) if isinstance(status, int) else None


class KubernetesDriver:
    """Cordons GPUs of one Kubernetes node and evicts the pods holding them."""

    def __init__(
        self,
        node: str,
        client: Any,
        *,
        evict_timeout_s: float = DEFAULTS.actions.evict_timeout_s,
        poll_s: float = 1.0,
    ) -> None:
        self.node = node
        self._client = client
        self.evict_timeout_s = evict_timeout_s
        self.poll_s = poll_s

    def _api(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._client)

    async def cordoned(self) -> frozenset[str]:
        return await asyncio.to_thread(self._cordoned)

    def _read(self) -> tuple[set[str], str | None]:
        try:
            node = self._api().read_node(self.node)
        except Exception as exc:
            raise StepFailed(f"reading Kubernetes node {self.node} failed: {exc}") from None
        annotations = node.metadata.annotations or {}
        text = annotations.get(CORDON_ANNOTATION, "")
        return {u for u in text.split(",") if u}, node.metadata.resource_version

    def _cordoned(self) -> frozenset[str]:
        return frozenset(self._read()[0])

    def _update(self, add: tuple[str, ...] = (), remove: tuple[str, ...] = ()) -> str:
        for _attempt in range(5):
            current, version = self._read()
            wanted = (current | set(add)) - set(remove)
            if wanted == current:
                return f"{CORDON_ANNOTATION} already as planned"
            body = {
                "metadata": {
                    "resourceVersion": version,
                    "annotations": {CORDON_ANNOTATION: ",".join(sorted(wanted)) or None},
                }
            }
            try:
                self._api().patch_node(self.node, body, _content_type=MERGE_PATCH)
            except Exception as exc:
                if _status(exc) == 409:
                    continue  # someone else wrote the node: read again
                raise StepFailed(f"patching Kubernetes node {self.node} failed: {exc}") from None
            verb = "cordoned" if add else "uncordoned"
            return f"{verb} {', '.join(add or remove)} on node {self.node}"
        raise StepFailed(f"node {self.node} kept changing under the update: retry")

    def _evict(self, pod: str) -> str:
        namespace, _, name = pod.partition("/")
        api = self._api()
        try:
            before = api.read_namespaced_pod(name, namespace)
        except Exception as exc:
            if _status(exc) == 404:
                return f"pod {pod} already gone"
            raise StepFailed(f"reading pod {pod} failed: {exc}") from None
        uid = before.metadata.uid
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            api.create_namespaced_pod_eviction(name, namespace, body)
        except Exception as exc:
            status = _status(exc)
            if status == 404:
                return f"pod {pod} already gone"
            if status == 429:
                raise StepFailed(
                    f"a PodDisruptionBudget forbids evicting {pod} now: wait, or relax the "
                    "budget, then ask again"
                ) from None
            raise StepFailed(f"evicting pod {pod} failed: {exc}") from None
        deadline = time.monotonic() + self.evict_timeout_s
        while time.monotonic() < deadline:
            try:
                now = api.read_namespaced_pod(name, namespace)
            except Exception as exc:
                if _status(exc) == 404:
                    return f"evicted pod {pod}"
                raise StepFailed(f"reading pod {pod} failed: {exc}") from None
            if now.metadata.uid != uid:
                return f"evicted pod {pod} (a new pod of that name was created)"
            time.sleep(self.poll_s)
        raise StepFailed(
            f"pod {pod} was evicted but still runs after {self.evict_timeout_s:.0f} s: "
            "check its termination grace period, then ask again"
        )

    async def run(self, step: Step) -> str:
        if step.kind is StepKind.CORDON:
            return await asyncio.to_thread(self._update, step.uuids, ())
        if step.kind is StepKind.UNCORDON:
            return await asyncio.to_thread(self._update, (), step.uuids)
        if step.kind is StepKind.EVICT and step.pod:
            return await asyncio.to_thread(self._evict, step.pod)
        raise StepFailed(f"the Kubernetes driver does not do {step.kind.value}")

    async def undo(self, step: Step) -> str:
        if step.kind is StepKind.CORDON:
            return await asyncio.to_thread(self._update, (), step.uuids)
        if step.kind is StepKind.UNCORDON:
            return await asyncio.to_thread(self._update, step.uuids, ())
        if step.kind is StepKind.EVICT:
            return f"pod {step.pod} stays evicted: its controller schedules it again"
        return "nothing to undo"
