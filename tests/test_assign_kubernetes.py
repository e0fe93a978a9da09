"""The Kubernetes driver's requests, against a tiny fake API server (aiohttp on 127.0.0.1).

No real API server runs here: these tests pin the requests the official client makes
(paths, verbs, content type, bodies) and how the driver reads the answers; they do not
prove a real cluster's behaviour."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.plan import Layer, Step, StepKind
from tests.peers import require_peer

UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"


@dataclass
class FakeApi:
    """A node with annotations, and pods that go when evicted (or refuse, under a budget)."""

    annotations: dict[str, str] = field(default_factory=dict)
    version: int = 7
    pods: dict[str, str] = field(default_factory=lambda: {"team-nlp/train-0": "uid-1"})
    budget_blocks: bool = False
    conflicts: int = 0
    requests: list[tuple[str, str, str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", self.get_node)
        app.router.add_patch("/api/v1/nodes/{name}", self.patch_node)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}", self.get_pod)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{pod}/eviction", self.evict)
        return app

    async def _log(self, request: web.Request) -> Any:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, request.content_type, body))
        return body

    def _node(self) -> dict[str, Any]:
        meta = {"name": "dgx-003", "resourceVersion": str(self.version)}
        return {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {**meta, "annotations": self.annotations},
        }

    async def get_node(self, request: web.Request) -> web.Response:
        await self._log(request)
        return web.json_response(self._node())

    async def patch_node(self, request: web.Request) -> web.Response:
        body = await self._log(request)
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1
            return web.json_response({"kind": "Status", "code": 409}, status=409)
        if body["metadata"]["resourceVersion"] != str(self.version):
            return web.json_response({"kind": "Status", "code": 409}, status=409)
        for key, value in body["metadata"]["annotations"].items():
            if value is None:
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value
        self.version += 1
        return web.json_response(self._node())

    async def get_pod(self, request: web.Request) -> web.Response:
        await self._log(request)
        key = f"{request.match_info['ns']}/{request.match_info['pod']}"
        if key not in self.pods:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        ns, name = key.split("/")
        meta = {"name": name, "namespace": ns, "uid": self.pods[key]}
        return web.json_response({"kind": "Pod", "apiVersion": "v1", "metadata": meta})

    async def evict(self, request: web.Request) -> web.Response:
        await self._log(request)
        if self.budget_blocks:
            return web.json_response({"kind": "Status", "code": 429}, status=429)
        self.pods.pop(f"{request.match_info['ns']}/{request.match_info['pod']}", None)
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApi, str]]:
    fake = FakeApi()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _driver(host: str) -> Any:
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        require_peer("kubernetes client", False, "pip install 'gpuconsole[kubernetes]'")
    from gpuconsole.actions.drivers.kubernetes import KubernetesDriver, api_client

    return KubernetesDriver("dgx-003", api_client(host=host), evict_timeout_s=5, poll_s=0.05)


def _step(kind: StepKind, *, uuids: tuple[str, ...] = (), pod: str | None = None) -> Step:
    return Step(kind, Layer.KUBERNETES, kind.value, uuids=uuids, pod=pod)


async def test_cordon_merges_the_gpu_into_the_node_annotation_under_its_resource_version(
    api: tuple[FakeApi, str],
) -> None:
    fake, host = api
    fake.annotations["gpuconsole.dev/cordoned-gpus"] = UUID_B
    driver = _driver(host)
    await driver.run(_step(StepKind.CORDON, uuids=(UUID_A,)))
    assert fake.annotations["gpuconsole.dev/cordoned-gpus"] == f"{UUID_A},{UUID_B}"
    method, path, content_type, body = fake.requests[-1]
    assert (method, path, content_type) == (
        "PATCH",
        "/api/v1/nodes/dgx-003",
        "application/merge-patch+json",
    )
    assert body["metadata"]["resourceVersion"] == "7"
    assert await driver.cordoned() == frozenset({UUID_A, UUID_B})
    await driver.run(_step(StepKind.UNCORDON, uuids=(UUID_A, UUID_B)))
    assert "gpuconsole.dev/cordoned-gpus" not in fake.annotations  # null removes it


async def test_a_concurrent_writer_makes_the_cordon_read_again(api: tuple[FakeApi, str]) -> None:
    fake, host = api
    fake.conflicts = 2
    await _driver(host).run(_step(StepKind.CORDON, uuids=(UUID_A,)))
    patches = [r for r in fake.requests if r[0] == "PATCH"]
    assert len(patches) == 3 and fake.annotations["gpuconsole.dev/cordoned-gpus"] == UUID_A


async def test_evicting_posts_an_eviction_and_waits_until_the_pod_is_gone(
    api: tuple[FakeApi, str],
) -> None:
    fake, host = api
    detail = await _driver(host).run(_step(StepKind.EVICT, pod="team-nlp/train-0"))
    assert detail == "evicted pod team-nlp/train-0"
    posts = [r for r in fake.requests if r[0] == "POST"]
    assert [p[1] for p in posts] == ["/api/v1/namespaces/team-nlp/pods/train-0/eviction"]
    assert posts[0][3]["kind"] == "Eviction" and posts[0][3]["apiVersion"] == "policy/v1"
    assert fake.requests[-1][:2] == ("GET", "/api/v1/namespaces/team-nlp/pods/train-0")


async def test_a_disruption_budget_stops_the_eviction_with_what_to_do(
    api: tuple[FakeApi, str],
) -> None:
    fake, host = api
    fake.budget_blocks = True
    with pytest.raises(StepFailed, match="PodDisruptionBudget"):
        await _driver(host).run(_step(StepKind.EVICT, pod="team-nlp/train-0"))
    assert "team-nlp/train-0" in fake.pods
