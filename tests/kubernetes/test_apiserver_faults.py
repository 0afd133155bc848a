"""Fault injection of the test API server, from Python and over HTTP (`/_gpuyard/faults`), as the
Kubernetes backend's resilience tests will use it; plus request auditing and token checking."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from gpuyard.testing.apiserver import FakeApiServer
from gpuyard.testing.apiserver.fixture import RunningApiServer


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


async def test_drop_watches_ends_open_streams(kube: Any, fake_apiserver: RunningApiServer) -> None:
    core = client.CoreV1Api(kube)
    w = watch.Watch()
    seen: list[str] = []

    async def follow() -> None:
        async for event in w.stream(core.list_namespaced_pod, "default", timeout_seconds=30):
            seen.append(event["raw_object"]["metadata"]["name"])

    task = asyncio.create_task(follow())
    await core.create_namespaced_pod("default", pod("a"))
    for _ in range(500):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert fake_apiserver.server.faults.drop_watches() == 1
    await asyncio.wait_for(task, 2)  # the stream ended long before its 30 s timeout
    await w.close()
    assert seen == ["a"] and fake_apiserver.server.faults.state()["openWatches"] == 0


async def test_fail_next_answers_500_to_matching_requests_only(
    kube: Any, fake_apiserver: RunningApiServer
) -> None:
    core = client.CoreV1Api(kube)
    fake_apiserver.server.faults.fail_next(2, verb="list", path_prefix="/api/v1/namespaces/default/pods")
    await core.list_namespaced_service("default")  # other path
    await core.create_namespaced_pod("default", pod("a"))  # other verb
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            await core.list_namespaced_pod("default")
        assert err.value.status == 500 and "injected fault" in err.value.body
    assert [p.metadata.name for p in (await core.list_namespaced_pod("default")).items] == ["a"]


async def test_slow_delays_answers(kube: Any, fake_apiserver: RunningApiServer) -> None:
    core = client.CoreV1Api(kube)
    fake_apiserver.server.faults.slow(1.0)
    with pytest.raises(asyncio.TimeoutError):
        await core.list_namespaced_pod("default", _request_timeout=0.2)
    fake_apiserver.server.faults.slow(0)
    assert (await core.list_namespaced_pod("default", _request_timeout=2)).items == []


async def test_a_silent_stream_stays_open_and_sends_nothing(
    kube: Any, fake_apiserver: RunningApiServer
) -> None:
    core = client.CoreV1Api(kube)
    faults = fake_apiserver.server.faults
    pods = f"{fake_apiserver.url}/api/v1/namespaces/default/pods?watch=true"

    async def opened(count: int) -> None:
        for _ in range(500):
            if faults.state()["openWatches"] == count:
                return
            await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as http:
        async with (
            http.get(pods) as before,
            http.get(pods) as also_before,
        ):  # no bookmarks: nothing is sent yet
            await opened(2)
            faults.go_silent()
            async with http.get(pods + "&allowWatchBookmarks=true") as during:  # opened while silent
                await opened(3)
                await core.create_namespaced_pod("default", pod("a"))
                for stream in (before, also_before, during):
                    with pytest.raises(asyncio.TimeoutError):  # no event, no bookmark (every 0.2 s)
                        await asyncio.wait_for(stream.content.readline(), 0.6)
                    assert not stream.content.at_eof()
                assert faults.state()["openWatches"] == 3
        faults.go_silent(False)
        async with http.get(pods + "&timeoutSeconds=2") as after:
            first = await asyncio.wait_for(after.content.readline(), 2)
            assert b'"ADDED"' in first and b'"a"' in first


async def test_conflict_next_answers_409_to_writes_only(kube: Any, fake_apiserver: RunningApiServer) -> None:
    core = client.CoreV1Api(kube)
    fake_apiserver.server.faults.conflict_next(1)
    await core.list_namespaced_pod("default")  # reads are not affected
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod("default", pod("a"))
    assert err.value.status == 409
    await core.create_namespaced_pod("default", pod("a"))


async def test_faults_over_http(kube: Any, fake_apiserver: RunningApiServer) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod("default", pod("a"))
    old = (await core.list_namespaced_pod("default")).metadata.resource_version
    await core.create_namespaced_pod("default", pod("b"))
    faults_url = f"{fake_apiserver.url}/_gpuyard/faults"
    async with aiohttp.ClientSession() as http:
        async with http.post(faults_url, json={"action": "compact"}) as resp:
            assert resp.status == 200
        async with http.post(
            faults_url, json={"action": "fail", "count": 1, "code": 503, "verb": "get"}
        ) as resp:
            assert (await resp.json())["state"]["failures"][0]["code"] == 503
        with pytest.raises(ApiException) as err:
            await core.read_namespaced_pod("a", "default")
        assert err.value.status == 503
        async with http.post(faults_url, json={"action": "conflict", "count": 1}) as resp:
            assert resp.status == 200
        with pytest.raises(ApiException) as conflict:
            await core.delete_namespaced_pod("a", "default")
        assert conflict.value.status == 409
        async with http.post(faults_url, json={"action": "slow", "seconds": -1}) as resp:
            body = await resp.json()
            assert resp.status == 400 and body["error"]["details"][0]["field"] == "slow.seconds"
        async with http.post(faults_url, json={"action": "explode"}) as resp:
            assert resp.status == 400 and "drop-watches" in (await resp.json())["error"]["message"]
        async with http.post(faults_url, json={"action": "clear"}) as resp:
            assert (await resp.json())["state"]["conflicts"] == 0
    w = watch.Watch()
    with pytest.raises(ApiException) as gone:
        async for _ in w.stream(core.list_namespaced_pod, "default", resource_version=old, timeout_seconds=2):
            pass
    assert gone.value.status == 410
    with pytest.raises(ApiException) as paged:
        first = await core.list_namespaced_pod("default", limit=1)
        await core.create_namespaced_pod("default", pod("c"))
        fake_apiserver.server.compact()  # forgets the version of the first page
        await core.list_namespaced_pod("default", limit=1, _continue=first.metadata._continue)
    assert paged.value.status == 410


async def test_audit_records_every_resource_request(kube: Any, fake_apiserver: RunningApiServer) -> None:
    core = client.CoreV1Api(kube)
    audit = fake_apiserver.server.audit
    assert audit is not None
    audit.clear()
    await core.create_namespaced_pod("default", pod("a"))
    await core.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"}})
    await core.list_node()
    with pytest.raises(ApiException):
        await core.read_namespaced_pod("missing", "default")
    calls = [(r.verb, r.group, r.resource, r.subresource, r.namespace, r.code) for r in audit]
    assert calls == [
        ("create", "", "pods", "", "default", 201),
        ("patch", "", "pods", "status", "default", 200),
        ("list", "", "nodes", "", "", 200),
        ("get", "", "pods", "", "default", 404),
    ]
    async with aiohttp.ClientSession() as http, http.get(f"{fake_apiserver.url}/_gpuyard/audit") as resp:
        assert len((await resp.json())["records"]) == 4


async def test_a_required_token_rejects_others() -> None:
    async with FakeApiServer(token="s3cret") as server, aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/api/v1/pods", headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 401 and (await resp.json())["reason"] == "Unauthorized"
        async with http.get(f"{server.url}/api/v1/pods", headers={"Authorization": "Bearer s3cret"}) as resp:
            assert resp.status == 200


async def test_a_client_resuming_after_a_dropped_stream_misses_nothing(
    kube: Any, fake_apiserver: RunningApiServer
) -> None:
    core = client.CoreV1Api(kube)
    rv = (await core.list_namespaced_pod("default")).metadata.resource_version
    w = watch.Watch()
    seen: list[tuple[str, str]] = []
    got_one = asyncio.Event()

    async def follow() -> None:  # watches forever: kubernetes-asyncio reconnects from its last version
        async for event in w.stream(core.list_namespaced_pod, "default", resource_version=rv):
            seen.append((event["type"], event["raw_object"]["metadata"]["name"]))
            got_one.set()
            if len(seen) == 3:
                return

    task = asyncio.create_task(follow())
    await core.create_namespaced_pod("default", pod("a"))
    await asyncio.wait_for(got_one.wait(), 5)
    fake_apiserver.server.faults.drop_watches()
    await core.create_namespaced_pod("default", pod("b"))  # written while no stream is open
    await core.delete_namespaced_pod("a", "default")
    await asyncio.wait_for(task, 5)
    await w.close()
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    assert fake_apiserver.server.faults.dropped == 1
