"""Fault injection over HTTP on the fake backend, and the one error shape."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.devices.scenarios import parse_scenario
from gpuyard.platform.api.app import make_app
from gpuyard.platform.backends import BackendPlan, build_backend
from gpuyard.state.context import Context
from tests.builders import make_pod

SCENARIO = {
    "kubelet": {"startDelay": 0},
    "nodeGroups": [{"name": "n", "count": 2, "gpu": {"model": "a100", "count": 8}}],
}


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests()
    fake = build_backend(ctx, BackendPlan(kind="fake", scenario=parse_scenario(SCENARIO, source="t")))
    task = asyncio.create_task(fake.run())
    await fake.synced.wait()
    await ctx.writer.create(make_pod("p", node="n-0"))
    await ctx.clock.advance(1)
    yield await aiohttp_client(make_app(ctx)), ctx
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_node_fail_and_recover(client):
    http, ctx = client
    r = await http.post("/api/v1/fake/nodes/n-0:fail")
    assert r.status == 200 and (await r.json()) == {"node": "n-0", "ready": False, "podsFailed": 1}
    assert ctx.store.get("Pod", "default", "p").status.reason == "NodeLost"
    r = await http.post("/api/v1/fake/nodes/n-0:recover")
    assert (await r.json())["ready"] is True


async def test_crash_pod_with_exit_code(client):
    http, _ = client
    r = await http.post("/api/v1/fake/pods/default/p:crash?exitCode=137")
    assert r.status == 200
    assert (await r.json()) == {"pod": "default/p", "phase": "Failed", "exitCode": 137, "reason": "OOMKilled"}
    r = await http.post("/api/v1/fake/pods/default/p:crash?exitCode=1")
    assert r.status == 409


async def test_gpu_fail(client):
    http, ctx = client
    r = await http.post("/api/v1/fake/nodes/n-1/gpus/3:fail")
    assert (await r.json())["healthy"] is False
    assert ctx.store.get("Node", "", "n-1").metadata.annotations["gpuyard.io/unhealthy-gpus"] == "3"


async def test_gpu_recover(client):
    http, ctx = client
    await http.post("/api/v1/fake/nodes/n-1/gpus/3:fail")
    r = await http.post("/api/v1/fake/nodes/n-1/gpus/3:recover")
    assert r.status == 200 and (await r.json()) == {"node": "n-1", "gpu": 3, "healthy": True}
    assert not ctx.store.get("Node", "", "n-1").metadata.annotations.get("gpuyard.io/unhealthy-gpus")


async def test_fail_next_creates(client):
    http, ctx = client
    r = await http.post("/api/v1/fake/pods:failNextCreates?count=2")
    assert r.status == 200 and (await r.json()) == {"failNextCreates": 2}
    assert ctx.backend.writer.fail_creates == 2
    r = await http.post("/api/v1/fake/pods:failNextCreates")
    assert (await r.json()) == {"failNextCreates": 1}


async def test_an_unknown_action_names_the_allowed_ones(client):
    http, _ = client
    r = await http.post("/api/v1/fake/nodes/n-0:explode")
    error = (await r.json())["error"]
    assert r.status == 422 and error["message"] == "unknown action 'explode'; allowed: fail, recover"
    r = await http.post("/api/v1/fake/pods/default/p:explode")
    assert (await r.json())["error"]["details"] == [{"field": "action", "reason": "allowed: crash"}]


@pytest.mark.parametrize(
    ("path", "status", "field"),
    [
        ("/api/v1/fake/nodes/ghost:fail", 404, None),
        ("/api/v1/fake/nodes/n-0:explode", 422, "action"),
        ("/api/v1/fake/nodes/ghost:explode", 422, "action"),
        ("/api/v1/fake/nodes/n-0/gpus/1:explode", 422, "action"),
        ("/api/v1/fake/pods/default/p:explode", 422, "action"),
        ("/api/v1/fake/pods:explode", 422, "action"),
        ("/api/v1/fake/pods:failNextCreates?count=0", 422, "count"),
        ("/api/v1/fake/pods:failNextCreates?count=x", 422, "count"),
        ("/api/v1/fake/nodes/n-0/gpus/9:fail", 422, "idx"),
        ("/api/v1/fake/nodes/n-0/gpus/x:fail", 422, "idx"),
        ("/api/v1/fake/pods/default/p:crash?exitCode=abc", 422, "exitCode"),
        ("/api/v1/fake/pods/default/p:crash?reason=Bored", 422, "reason"),
        ("/api/v1/fake/pods/default/ghost:crash", 404, None),
    ],
)
async def test_bad_requests_use_the_error_shape(client, path, status, field):
    http, ctx = client
    before = ctx.store.resource_version
    r = await http.post(path)
    assert r.status == status
    body = await r.json()
    assert set(body["error"]) == {"code", "message", "details"} and body["error"]["code"] == status
    if field:
        assert body["error"]["details"][0]["field"] == field
    assert ctx.store.resource_version == before, "a rejected request changes nothing"


class _NoFaults:
    """A backend that cannot inject faults (as a real cluster)."""

    name = "kubernetes"
    faults = None


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/fake/nodes/n-0:fail",
        "/api/v1/fake/nodes/n-0/gpus/1:fail",
        "/api/v1/fake/pods/default/p:crash?exitCode=1",
        "/api/v1/fake/pods:failNextCreates",
        "/api/v1/fake/nodes/n-0:explode",
    ],
)
async def test_a_backend_without_faults_says_so(aiohttp_client, path):
    ctx = Context.for_tests()
    ctx.backend = _NoFaults()  # type: ignore[assignment]
    http = await aiohttp_client(make_app(ctx))
    r = await http.post(path)
    assert r.status == 501
    error = (await r.json())["error"]
    assert "the kubernetes backend cannot inject faults" in error["message"]
    assert error["details"] == [{"field": "backend.kind", "reason": "fault injection needs the fake backend"}]
    assert ctx.store.resource_version == 0, "nothing was written"
