"""The test API server over plain HTTP: the other built-in kinds as storage, patch flavours, delete
options, deletecollection, watch parameters, discovery forms, Tables, and the errors of bad requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gpuyard.testing.apiserver import FakeApiServer
from gpuyard.testing.apiserver.fixture import RunningApiServer
from tests.kubernetes.conftest import crd_manifest


class Rest:
    """A few-line REST client: `await rest("POST", path, body)` -> (status, JSON body)."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type, "Accept": accept}
        async with self.http.request(method, self.url + path, data=data, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)

    async def lines(self, path: str, n: int, *, timeout: float = 5) -> list[dict[str, Any]]:
        """The first `n` watch events of `path` (fewer if the stream ends)."""
        out: list[dict[str, Any]] = []
        async with self.http.get(self.url + path) as resp:
            while len(out) < n:
                line = await asyncio.wait_for(resp.content.readline(), timeout)
                if not line:
                    break
                out.append(json.loads(line))
        return out


@pytest_asyncio.fixture
async def rest(fake_apiserver: RunningApiServer) -> AsyncIterator[Rest]:
    async with aiohttp.ClientSession() as http:
        yield Rest(http, fake_apiserver.url)


def pod(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {"containers": [{"name": "c"}]},
    }


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
            {"spec": {"holderIdentity": "gpuyard-0", "leaseDurationSeconds": 15}},
        ),
        (
            "/api/v1/namespaces/default/events",
            {"involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Scheduled"},
        ),
        ("/apis/policy/v1/namespaces/default/poddisruptionbudgets", {"spec": {"minAvailable": 1}}),
        ("/apis/scheduling.k8s.io/v1/priorityclasses", {"value": 1000}),
        (
            "/apis/resource.k8s.io/v1/resourceslices",
            {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": "n1"}}},
        ),
        ("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", {"spec": {"devices": {}}}),
        ("/api/v1/nodes", {"status": {"capacity": {"nvidia.com/gpu": "8"}}}),
    ],
)
async def test_builtin_kinds_are_stored_with_the_same_semantics(
    rest: Rest, path: str, body: dict[str, Any]
) -> None:
    code, created = await rest("POST", path, {"metadata": {"name": "x"}, **body})
    assert code == 201 and created["metadata"]["resourceVersion"] and created["metadata"]["uid"]
    code, got = await rest("GET", f"{path}/x")
    assert code == 200 and got == created
    code, listed = await rest("GET", path)
    assert [o["metadata"]["name"] for o in listed["items"]] == ["x"] and listed["kind"].endswith("List")
    code, conflict = await rest(
        "PUT", f"{path}/x", {**created, "metadata": {**created["metadata"], "resourceVersion": "1"}}
    )
    assert code == 409 and conflict["reason"] == "Conflict"
    code, _ = await rest("DELETE", f"{path}/x")
    assert code == 200 and (await rest("GET", f"{path}/x"))[0] == 404


async def test_patch_flavours_and_a_stale_version_in_a_patch(rest: Rest) -> None:
    base = "/api/v1/namespaces/default/pods"
    await rest("POST", base, pod("a", labels={"x": "1", "y": "2"}))
    code, merged = await rest(
        "PATCH",
        f"{base}/a",
        {"metadata": {"labels": {"x": None, "z": "3"}}},
        content_type="application/merge-patch+json",
    )
    assert code == 200 and merged["metadata"]["labels"] == {"y": "2", "z": "3"}
    ops = [
        {"op": "add", "path": "/metadata/labels/w", "value": "4"},
        {"op": "remove", "path": "/metadata/labels/y"},
        {"op": "test", "path": "/metadata/labels/z", "value": "3"},
    ]
    code, patched = await rest("PATCH", f"{base}/a", ops, content_type="application/json-patch+json")
    assert code == 200 and patched["metadata"]["labels"] == {"z": "3", "w": "4"}
    code, failed = await rest(
        "PATCH",
        f"{base}/a",
        [{"op": "test", "path": "/metadata/labels/z", "value": "9"}],
        content_type="application/json-patch+json",
    )
    assert code == 422 and "test" in failed["message"]
    smp = {
        "$setElementOrder/containers": [{"name": "c"}],
        "spec": {"containers": [{"name": "c", "image": "new"}]},
    }
    code, strategic = await rest(
        "PATCH", f"{base}/a", smp, content_type="application/strategic-merge-patch+json"
    )
    assert (
        code == 200
        and strategic["spec"]["containers"] == [{"name": "c", "image": "new"}]
        and "$setElementOrder/containers" not in strategic
    )
    code, _ = await rest(
        "PATCH",
        f"{base}/a",
        {"metadata": {"resourceVersion": "1", "labels": {"k": "v"}}},
        content_type="application/merge-patch+json",
    )
    assert code == 409
    code, unsupported = await rest("PATCH", f"{base}/a", {}, content_type="application/x-unknown-patch")
    assert code == 415 and unsupported["reason"] == "UnsupportedMediaType"
    # server-side apply is answered (tests/kubernetes/test_apiserver_apply.py), but needs a manager
    code, no_manager = await rest("PATCH", f"{base}/a", {}, content_type="application/apply-patch+yaml")
    assert code == 400 and no_manager["message"] == "fieldManager is required for apply requests"


async def test_delete_options_orphan_foreground_and_preconditions(
    rest: Rest, fake_apiserver: RunningApiServer
) -> None:
    base = "/api/v1/namespaces/default/pods"
    _, owner = await rest(
        "POST", "/api/v1/namespaces/default/services", {"metadata": {"name": "o"}, "spec": {}}
    )
    ref = {"apiVersion": "v1", "kind": "Service", "name": "o", "uid": owner["metadata"]["uid"]}
    await rest("POST", base, pod("kept", ownerReferences=[ref]))
    code, _ = await rest("DELETE", "/api/v1/namespaces/default/services/o", {"propagationPolicy": "Orphan"})
    assert code == 200
    await asyncio.sleep(0.05)
    code, kept = await rest("GET", f"{base}/kept")
    assert code == 200 and "ownerReferences" not in kept["metadata"]

    _, owner = await rest(
        "POST", "/api/v1/namespaces/default/services", {"metadata": {"name": "f"}, "spec": {}}
    )
    ref = {"apiVersion": "v1", "kind": "Service", "name": "f", "uid": owner["metadata"]["uid"]}
    await rest("POST", base, pod("dep", ownerReferences=[ref]))
    code, _ = await rest("DELETE", "/api/v1/namespaces/default/services/f?propagationPolicy=Foreground")
    assert code == 200 and (await rest("GET", f"{base}/dep"))[0] == 404  # gone before the answer

    code, wrong = await rest("DELETE", f"{base}/kept", {"preconditions": {"uid": "not-its-uid"}})
    assert code == 409 and "Precondition failed" in wrong["message"]
    code, bad = await rest("DELETE", f"{base}/kept", {"propagationPolicy": "Sometimes"})
    assert code == 400 and "propagationPolicy" in bad["message"]


async def test_deletecollection_with_a_selector(rest: Rest) -> None:
    base = "/api/v1/namespaces/default/pods"
    for name, job in (("a", "x"), ("b", "x"), ("c", "y")):
        await rest("POST", base, pod(name, labels={"job": job}))
    code, gone = await rest("DELETE", f"{base}?labelSelector=job%3Dx")
    assert code == 200 and sorted(o["metadata"]["name"] for o in gone["items"]) == ["a", "b"]
    _, left = await rest("GET", base)
    assert [o["metadata"]["name"] for o in left["items"]] == ["c"]


async def test_watch_initial_events_bookmark_and_timeout(rest: Rest) -> None:
    base = "/api/v1/namespaces/default/pods"
    await rest("POST", base, pod("a"))
    events = await rest.lines(
        f"{base}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2",
        2,
    )
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK" and events[1]["object"]["metadata"]["annotations"] == {
        "k8s.io/initial-events-end": "true"
    }
    loop = asyncio.get_running_loop()
    start = loop.time()
    ended = await rest.lines(f"{base}?watch=1&timeoutSeconds=1", 5)
    assert [e["type"] for e in ended] == ["ADDED"]  # then the server ended the stream
    assert loop.time() - start < 4


async def test_discovery_legacy_and_aggregated(rest: Rest) -> None:
    await rest(
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        crd_manifest(group="training.kubedl.io", kind="PyTorchJob", plural="pytorchjobs", short=()),
    )
    _, versions = await rest("GET", "/api")
    assert versions["kind"] == "APIVersions" and versions["versions"] == ["v1"]
    _, groups = await rest("GET", "/apis")
    names = [g["name"] for g in groups["groups"]]
    assert {
        "coordination.k8s.io",
        "policy",
        "scheduling.k8s.io",
        "resource.k8s.io",
        "training.kubedl.io",
    } <= set(names)
    _, group = await rest("GET", "/apis/training.kubedl.io")
    assert group["preferredVersion"]["groupVersion"] == "training.kubedl.io/v1"
    _, core = await rest("GET", "/api/v1")
    pods = next(r for r in core["resources"] if r["name"] == "pods")
    assert pods["shortNames"] == ["po"] and {"pods/status", "pods/binding"} <= {
        r["name"] for r in core["resources"]
    }
    accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    async with rest.http.get(rest.url + "/apis", headers={"Accept": accept}) as resp:
        assert "as=APIGroupDiscoveryList" in resp.headers["Content-Type"]
        aggregated = await resp.json(content_type=None)
    kubedl = next(i for i in aggregated["items"] if i["metadata"]["name"] == "training.kubedl.io")
    resource = kubedl["versions"][0]["resources"][0]
    assert resource["resource"] == "pytorchjobs" and resource["scope"] == "Namespaced"
    assert resource["subresources"][0]["subresource"] == "status"
    code, _ = await rest("GET", "/apis/nothing.example.com/v1")
    assert code == 404


async def test_tables_for_kubectl(rest: Rest) -> None:
    await rest("POST", "/api/v1/namespaces/default/pods", pod("a"))
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    _, table = await rest("GET", "/api/v1/namespaces/default/pods", accept=accept)
    assert table["kind"] == "Table" and [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
        "IP",
        "Node",
    ]
    cells = table["rows"][0]["cells"]
    assert cells[:4] == ["a", f"0/{len(pod('a')['spec']['containers'])}", "Pending", 0]
    assert cells[5:] == ["<none>", "<none>"]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


@pytest.mark.parametrize(
    ("method", "path", "body", "code", "words"),
    [
        ("GET", "/apis/kubeflow.org/v1/namespaces/default/tfjobs", None, 404, "could not find"),
        ("GET", "/api/v1/namespaces/default/nodes/x", None, 404, "could not find"),
        ("PUT", "/api/v1/namespaces/default/pods/ghost", pod("ghost"), 404, 'pods "ghost" not found'),
        ("POST", "/api/v1/namespaces/default/pods", pod("Bad_Name"), 422, "metadata.name"),
        (
            "POST",
            "/api/v1/namespaces/default/pods",
            {"kind": "Service", "metadata": {"name": "x"}},
            400,
            "kind",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods",
            {"metadata": {"name": "x", "namespace": "other"}},
            400,
            "namespace",
        ),
        ("GET", "/api/v1/pods?labelSelector=a%20in%20(b", None, 400, "labelSelector"),
        ("GET", "/api/v1/pods?watch=true&resourceVersion=abc", None, 400, "resourceVersion"),
        ("GET", "/api/v1/pods?continue=garbage", None, 400, "continue"),
        ("GET", "/api/v1/pods?fieldSelector=spec.containers%3Dx", None, 400, "field label not supported"),
        (
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            {**crd_manifest(), "metadata": {"name": "wrong"}},
            422,
            "metadata.name",
        ),
        (
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            {**crd_manifest(), "spec": {**crd_manifest()["spec"], "scope": "Global"}},
            422,
            "spec.scope",
        ),
        (
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            {
                **crd_manifest(),
                "spec": {**crd_manifest()["spec"], "versions": [{"served": True, "storage": True}]},
            },
            422,
            "spec.versions[0].name",
        ),
    ],
)
async def test_bad_requests_get_kubernetes_status_errors(
    rest: Rest, method: str, path: str, body: Any, code: int, words: str
) -> None:
    status, answer = await rest(method, path, body)
    assert (
        status == code
        and answer["kind"] == "Status"
        and answer["code"] == code
        and words in answer["message"]
    )


async def test_unchanged_writes_make_no_new_version(rest: Rest, fake_apiserver: RunningApiServer) -> None:
    _, created = await rest("POST", "/api/v1/namespaces/default/pods", pod("a"))
    before = fake_apiserver.server.resource_version
    code, same = await rest("PUT", "/api/v1/namespaces/default/pods/a", created)
    assert code == 200 and same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert fake_apiserver.server.resource_version == before


async def test_field_selectors_of_a_crd_are_its_selectable_fields(rest: Rest) -> None:
    crd = crd_manifest(kind="Queue", plural="queues", short=())
    crd["spec"]["versions"][0]["selectableFields"] = [{"jsonPath": ".spec.tenant"}]
    await rest("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    base = "/apis/kubeflow.org/v1/namespaces/default/queues"
    for name, tenant in (("a", "ml"), ("b", "cv")):
        await rest(
            "POST",
            base,
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": {"tenant": tenant},
            },
        )
    _, found = await rest("GET", f"{base}?fieldSelector=spec.tenant%3Dcv")
    assert [o["metadata"]["name"] for o in found["items"]] == ["b"]
    code, refused = await rest("GET", f"{base}?fieldSelector=spec.other%3Dx")
    assert code == 400 and "spec.tenant" in refused["message"]


async def test_custom_resources_refuse_strategic_merge_patches(rest: Rest) -> None:
    await rest("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd_manifest())
    base = "/apis/kubeflow.org/v1/namespaces/default/tfjobs"
    await rest(
        "POST",
        base,
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "j"}, "spec": {}},
    )
    code, answer = await rest(
        "PATCH", f"{base}/j", {"spec": {"x": 1}}, content_type="application/strategic-merge-patch+json"
    )
    assert code == 415 and "custom resources" in answer["message"]
    code, merged = await rest(
        "PATCH", f"{base}/j", {"spec": {"x": 1}}, content_type="application/merge-patch+json"
    )
    assert code == 200 and merged["spec"] == {"x": 1} and merged["metadata"]["generation"] == 2


async def test_exact_lists_and_later_pages_show_the_state_at_their_version(rest: Rest) -> None:
    base = "/api/v1/namespaces/default/pods"
    for name in ("a", "b", "c"):
        await rest("POST", base, pod(name, labels={"v": "1"}))
    _, first = await rest("GET", f"{base}?limit=2")
    then = first["metadata"]["resourceVersion"]
    await rest("DELETE", f"{base}/c")
    await rest(
        "PATCH",
        f"{base}/a",
        {"metadata": {"labels": {"v": "2"}}},
        content_type="application/merge-patch+json",
    )
    await rest("POST", base, pod("d"))
    _, second = await rest("GET", f"{base}?limit=2&continue={first['metadata']['continue']}")
    assert [o["metadata"]["name"] for o in second["items"]] == ["c"]  # as of the first page
    assert second["metadata"]["resourceVersion"] == then
    _, exact = await rest("GET", f"{base}?resourceVersion={then}&resourceVersionMatch=Exact")
    assert [(o["metadata"]["name"], o["metadata"]["labels"]["v"]) for o in exact["items"]] == [
        ("a", "1"),
        ("b", "1"),
        ("c", "1"),
    ]
    _, now = await rest("GET", base)
    assert [o["metadata"]["name"] for o in now["items"]] == ["a", "b", "d"]
    code, _ = await rest("GET", f"{base}?resourceVersion=999999&resourceVersionMatch=Exact")
    assert code == 504


async def test_graceful_pod_deletion_waits_for_the_kubelet() -> None:
    async with FakeApiServer(graceful_pods=True) as server, aiohttp.ClientSession() as http:
        rest = Rest(http, server.url)
        base = "/api/v1/namespaces/default/pods"
        await rest("POST", base, pod("unbound"))
        await rest(
            "POST", base, {**pod("running"), "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}}
        )
        await rest("DELETE", f"{base}/unbound")
        assert (await rest("GET", f"{base}/unbound"))[0] == 404  # never scheduled: goes at once
        code, marked = await rest("DELETE", f"{base}/running")
        assert (
            code == 200
            and marked["metadata"]["deletionTimestamp"]
            and marked["metadata"]["deletionGracePeriodSeconds"] == 30
        )
        code, status = await rest(
            "PATCH",
            f"{base}/running/status",
            {"status": {"phase": "Succeeded"}},
            content_type="application/merge-patch+json",
        )
        assert code == 200 and status["metadata"]["deletionTimestamp"]  # the kubelet reports; still there
        await rest("DELETE", f"{base}/running", {"gracePeriodSeconds": 0})
        assert (await rest("GET", f"{base}/running"))[0] == 404


async def test_custom_resources_refuse_unconditional_updates_and_creates_refuse_versions(rest: Rest) -> None:
    await rest("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd_manifest())
    base = "/apis/kubeflow.org/v1/namespaces/default/tfjobs"
    _, job = await rest(
        "POST",
        base,
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "j"}, "spec": {}},
    )
    unconditional = {**job, "metadata": {"name": "j"}, "spec": {"x": 1}}
    code, refused = await rest("PUT", f"{base}/j", unconditional)
    assert code == 422 and "metadata.resourceVersion" in refused["message"]
    code, _ = await rest("PUT", f"{base}/j", {**job, "spec": {"x": 1}})
    assert code == 200
    code, _ = await rest(
        "PUT", "/api/v1/namespaces/default/pods/p", pod("p")
    )  # pods allow it, but p is missing
    assert code == 404
    await rest("POST", "/api/v1/namespaces/default/pods", pod("p"))
    code, _ = await rest("PUT", "/api/v1/namespaces/default/pods/p", pod("p"))
    assert code == 200
    code, created = await rest("POST", "/api/v1/namespaces/default/pods", pod("q", resourceVersion="7"))
    assert code == 500 and "resourceVersion should not be set" in created["message"]
