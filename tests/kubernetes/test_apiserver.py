"""The test API server through kubernetes-asyncio, as gpuyard's Kubernetes backend will use it:
LIST then WATCH from the list's version, bookmarks, 410 after compaction then re-list, 409 on stale
writes, selectors and paging, the status and binding subresources, CRD registration, garbage collection."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from gpuyard.testing.apiserver.fixture import RunningApiServer
from tests.kubernetes.conftest import crd_manifest


def pod(
    name: str, *, labels: dict[str, str] | None = None, node: str | None = None, phase: str | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


async def collect(stream: Any, n: int, *, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The first `n` raw events of a kubernetes-asyncio watch stream."""
    out: list[dict[str, Any]] = []

    async def run() -> None:
        async for event in stream:
            out.append({"type": event["type"], "object": event["raw_object"]})
            if len(out) >= n:
                return

    await asyncio.wait_for(run(), timeout)
    return out


async def test_list_then_watch_from_the_lists_version_sees_only_later_writes(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod("default", pod("a"))
    listed = await core.list_namespaced_pod("default")
    rv = listed.metadata.resource_version
    assert [p.metadata.name for p in listed.items] == ["a"]
    await core.create_namespaced_pod("default", pod("b"))
    await core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "1"}}})
    await core.delete_namespaced_pod("b", "default")
    w = watch.Watch()
    events = await collect(
        w.stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=5), 3
    )
    await w.close()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and len(set(versions)) == 3 and versions[0] > int(rv)


async def test_every_write_bumps_one_global_counter_and_sets_uid_generation(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    a = await core.create_namespaced_pod("default", pod("a"))
    svc = await core.create_namespaced_service(
        "default", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}
    )
    assert int(svc.metadata.resource_version) == int(a.metadata.resource_version) + 1
    assert a.metadata.uid and a.metadata.creation_timestamp and a.metadata.generation == 1
    relabelled = await core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"k": "v"}}})
    assert relabelled.metadata.generation == 1  # metadata only
    respec = await core.patch_namespaced_pod("a", "default", {"spec": {"activeDeadlineSeconds": 5}})
    assert respec.metadata.generation == 2
    generated = await core.create_namespaced_pod(
        "default", {"metadata": {"generateName": "job-worker-"}, "spec": {"containers": []}}
    )
    assert (
        generated.metadata.name.startswith("job-worker-")
        and len(generated.metadata.name) == len("job-worker-") + 5
    )


async def test_bookmarks_carry_the_current_version(kube: Any, fake_apiserver: RunningApiServer) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod("default", pod("a"))
    rv = (await core.list_namespaced_pod("default")).metadata.resource_version
    await core.create_namespaced_service(
        "default", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}
    )
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        "default",
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    )
    events = await collect(stream, 1)
    await w.close()
    assert events[0]["type"] == "BOOKMARK"
    assert events[0]["object"]["metadata"]["resourceVersion"] == str(fake_apiserver.server.resource_version)
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > int(rv)


async def test_a_compacted_version_answers_410_and_a_relist_recovers(
    kube: Any, fake_apiserver: RunningApiServer
) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod("default", pod("a"))
    old = (await core.list_namespaced_pod("default")).metadata.resource_version
    await core.create_namespaced_pod("default", pod("b"))
    fake_apiserver.server.compact()
    w = watch.Watch()
    with pytest.raises(ApiException) as err:
        await collect(
            w.stream(core.list_namespaced_pod, "default", resource_version=old, timeout_seconds=5), 1
        )
    assert err.value.status == 410
    with pytest.raises(ApiException) as exact:
        await core.list_namespaced_pod("default", resource_version=old, resource_version_match="Exact")
    assert exact.value.status == 410
    relisted = await core.list_namespaced_pod("default")
    assert [p.metadata.name for p in relisted.items] == ["a", "b"]
    await core.create_namespaced_pod("default", pod("c"))
    w = watch.Watch()
    events = await collect(
        w.stream(
            core.list_namespaced_pod,
            "default",
            resource_version=relisted.metadata.resource_version,
            timeout_seconds=5,
        ),
        1,
    )
    await w.close()
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "c"


async def test_stale_update_is_a_409_conflict_and_a_fresh_one_succeeds(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    created = await core.create_namespaced_pod("default", pod("a"))
    await core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"by": "someone-else"}}})
    created.metadata.labels = {"by": "me"}
    with pytest.raises(ApiException) as err:
        await core.replace_namespaced_pod("a", "default", created)
    assert err.value.status == 409 and "Conflict" in err.value.body
    fresh = await core.read_namespaced_pod("a", "default")
    fresh.metadata.labels = {"by": "me"}
    replaced = await core.replace_namespaced_pod("a", "default", fresh)
    assert replaced.metadata.labels == {"by": "me"}
    with pytest.raises(ApiException) as dup:
        await core.create_namespaced_pod("default", pod("a"))
    assert dup.value.status == 409 and "AlreadyExists" in dup.value.body


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["w1", "w2"]),
        ("app==web,tier!=front", ["w2"]),
        ("app in (web,db)", ["d1", "w1", "w2"]),
        ("app notin (web)", ["d1", "n1"]),
        ("tier", ["w1"]),
        ("!tier", ["d1", "n1", "w2"]),
    ],
)
async def test_label_selectors(kube: Any, selector: str, expected: list[str]) -> None:
    core = client.CoreV1Api(kube)
    for name, labels in [
        ("w1", {"app": "web", "tier": "front"}),
        ("w2", {"app": "web"}),
        ("d1", {"app": "db"}),
        ("n1", {}),
    ]:
        await core.create_namespaced_pod("default", pod(name, labels=labels))
    listed = await core.list_namespaced_pod("default", label_selector=selector)
    assert sorted(p.metadata.name for p in listed.items) == expected


async def test_field_selectors_and_paging(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespace({"metadata": {"name": "team"}})
    for i in range(5):
        await core.create_namespaced_pod("team", pod(f"p{i}", node="n1" if i % 2 else None))
    on_n1 = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    assert [p.metadata.name for p in on_n1.items] == ["p1", "p3"]
    unbound = await core.list_namespaced_pod("team", field_selector="spec.nodeName=,metadata.name!=p0")
    assert [p.metadata.name for p in unbound.items] == ["p2", "p4"]
    pending = await core.list_namespaced_pod(
        "team", field_selector="status.phase=Pending,metadata.namespace=team"
    )
    assert len(pending.items) == 5
    first = await core.list_namespaced_pod("team", limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"] and first.metadata.remaining_item_count == 3
    second = await core.list_namespaced_pod("team", limit=2, _continue=first.metadata._continue)
    third = await core.list_namespaced_pod("team", limit=2, _continue=second.metadata._continue)
    assert [p.metadata.name for p in second.items + third.items] == ["p2", "p3", "p4"]
    assert not third.metadata._continue
    with pytest.raises(ApiException) as bad:
        await core.list_namespaced_pod("team", label_selector="a in (b")
    assert bad.value.status == 400 and "labelSelector" in bad.value.body


async def test_event_field_selectors_on_involved_object(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    for i, name in enumerate(["job-a", "job-b", "job-a"]):
        await core.create_namespaced_event(
            "default",
            {
                "metadata": {"name": f"e{i}"},
                "involvedObject": {"kind": "TFJob", "name": name, "namespace": "default"},
                "reason": "Created",
                "message": "m",
            },
        )
    found = await core.list_namespaced_event(
        "default", field_selector="involvedObject.name=job-a,involvedObject.kind=TFJob"
    )
    assert [e.metadata.name for e in found.items] == ["e0", "e2"]


async def test_watch_with_a_selector_sees_objects_enter_and_leave_it(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod("default", pod("a"))
    rv = (await core.list_namespaced_pod("default")).metadata.resource_version
    await core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"gang": "g1"}}})
    await core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"gang": "g2"}}})
    w = watch.Watch()
    events = await collect(
        w.stream(
            core.list_namespaced_pod,
            "default",
            label_selector="gang=g1",
            resource_version=rv,
            timeout_seconds=5,
        ),
        2,
    )
    await w.close()
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]


async def test_status_subresource_changes_only_status_and_main_writes_keep_it(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod("default", {**pod("a"), "status": {"phase": "Running"}})
    assert (await core.read_namespaced_pod("a", "default")).status.phase == "Pending"
    after = await core.patch_namespaced_pod_status(
        "a", "default", {"status": {"phase": "Running"}, "metadata": {"labels": {"ignored": "yes"}}}
    )
    assert after.status.phase == "Running" and not after.metadata.labels and after.metadata.generation == 1
    kept = await core.patch_namespaced_pod(
        "a", "default", {"status": {"phase": "Failed"}, "metadata": {"labels": {"k": "v"}}}
    )
    assert kept.status.phase == "Running" and kept.metadata.labels == {"k": "v"}
    current = await core.read_namespaced_pod("a", "default")
    current.status.phase = "Succeeded"
    replaced = await core.replace_namespaced_pod_status("a", "default", current)
    assert replaced.status.phase == "Succeeded"


async def test_binding_sets_the_node_once(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod("default", pod("a"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "a"},
        "target": {"kind": "Node", "name": "gpu-1"},
    }
    # the server answers a Status (as a real one does), which the generated client cannot read as a Binding
    first = await core.create_namespaced_pod_binding("a", "default", binding, _preload_content=False)
    assert first.status == 201
    first.release()
    bound = await core.read_namespaced_pod("a", "default")
    assert bound.spec.node_name == "gpu-1"
    assert any(c.type == "PodScheduled" and c.status == "True" for c in bound.status.conditions)
    again = await core.create_namespaced_pod_binding(
        "a", "default", {**binding, "target": {"kind": "Node", "name": "gpu-2"}}, _preload_content=False
    )
    assert again.status == 409 and "already assigned" in (await again.json())["message"]
    assert (await core.read_namespaced_pod("a", "default")).spec.node_name == "gpu-1"


async def test_the_bindings_collection_binds_too(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod("default", pod("b"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "b"},
        "target": {"kind": "Node", "name": "gpu-3"},
    }
    answer = await core.create_namespaced_binding("default", binding, _preload_content=False)
    assert answer.status == 201
    answer.release()
    assert (await core.read_namespaced_pod("b", "default")).spec.node_name == "gpu-3"
    again = await core.create_namespaced_binding("default", binding, _preload_content=False)
    assert again.status == 409
    again.release()


async def test_crd_registration_serves_the_custom_resource(kube: Any) -> None:
    custom = client.CustomObjectsApi(kube)
    with pytest.raises(ApiException) as before:
        await custom.list_namespaced_custom_object("kubeflow.org", "v1", "default", "tfjobs")
    assert before.value.status == 404
    ext = client.ApiextensionsV1Api(kube)
    crd = await ext.create_custom_resource_definition(crd_manifest())
    assert {c.type: c.status for c in crd.status.conditions}["Established"] == "True"
    groups = await client.ApisApi(kube).get_api_versions()
    assert "kubeflow.org" in [g.name for g in groups.groups]
    resources = await client.CustomObjectsApi(kube).get_api_resources("kubeflow.org", "v1")
    tfjobs = next(r for r in resources.resources if r.name == "tfjobs")
    assert tfjobs.short_names == ["tfj"] and tfjobs.namespaced and "all" in tfjobs.categories
    assert any(r.name == "tfjobs/status" for r in resources.resources)
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "mnist"},
        "spec": {"x": 1},
        "status": {"ignored": True},
    }
    created = await custom.create_namespaced_custom_object("kubeflow.org", "v1", "default", "tfjobs", job)
    assert "status" not in created and created["metadata"]["generation"] == 1
    rv = created["metadata"]["resourceVersion"]
    await custom.patch_namespaced_custom_object_status(
        "kubeflow.org",
        "v1",
        "default",
        "tfjobs",
        "mnist",
        {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}},
        _content_type="application/merge-patch+json",
    )
    got = await custom.get_namespaced_custom_object("kubeflow.org", "v1", "default", "tfjobs", "mnist")
    assert got["status"]["conditions"][0]["type"] == "Succeeded" and got["metadata"]["generation"] == 1
    w = watch.Watch()
    events = await collect(
        w.stream(
            custom.list_namespaced_custom_object,
            "kubeflow.org",
            "v1",
            "default",
            "tfjobs",
            resource_version=rv,
            timeout_seconds=5,
        ),
        1,
    )
    await w.close()
    assert (
        events[0]["type"] == "MODIFIED"
        and events[0]["object"]["status"]["conditions"][0]["type"] == "Succeeded"
    )
    await ext.delete_custom_resource_definition("tfjobs.kubeflow.org")
    with pytest.raises(ApiException) as after:
        await custom.get_namespaced_custom_object("kubeflow.org", "v1", "default", "tfjobs", "mnist")
    assert after.value.status == 404


async def test_deleting_an_owner_collects_its_dependents(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    await client.ApiextensionsV1Api(kube).create_custom_resource_definition(crd_manifest())
    custom = client.CustomObjectsApi(kube)
    job = await custom.create_namespaced_custom_object(
        "kubeflow.org",
        "v1",
        "default",
        "tfjobs",
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "j"}, "spec": {}},
    )
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "name": "j",
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    for name in ("j-worker-0", "j-worker-1"):
        await core.create_namespaced_pod(
            "default", {**pod(name), "metadata": {"name": name, "ownerReferences": [owner]}}
        )
    await core.create_namespaced_pod("default", pod("unrelated"))
    await custom.delete_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "tfjobs", "j", propagation_policy="Background"
    )
    for _ in range(250):
        names = [p.metadata.name for p in (await core.list_namespaced_pod("default")).items]
        if names == ["unrelated"]:
            break
        await asyncio.sleep(0.02)
    assert names == ["unrelated"]


async def test_finalizers_hold_a_deleted_object_until_removed(kube: Any) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod(
        "default", {**pod("a"), "metadata": {"name": "a", "finalizers": ["gpuyard.io/x"]}}
    )
    await core.delete_namespaced_pod("a", "default")
    held = await core.read_namespaced_pod("a", "default")
    assert held.metadata.deletion_timestamp is not None
    await core.patch_namespaced_pod("a", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        await core.read_namespaced_pod("a", "default")
    assert err.value.status == 404
