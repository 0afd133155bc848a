"""Job updates over HTTP: PATCH (JSON merge patch) of the fields that may change, PUT refused,
PriorityClasses applied, listed and resolved into the PodGroup's priority."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from gpuyard.apis.scheduling import PodGroup
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.platform.api import app as app_module
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ControllerRunner
from tests.builders import make_node
from tests.unit.controllers.fakes import JOBS, ScriptedBackend, TinyScheduler

PT = (JOBS / "pytorch-simple.yaml").read_text()
NS, NAME = "kubeflow", "pytorch-simple"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest_asyncio.fixture
async def api(aiohttp_client: Any) -> AsyncIterator[Any]:
    ctx = Context.for_tests()
    for n in ("node-a", "node-b"):
        ctx.store.create(make_node(n))
    ctx.backend = ScriptedBackend(ctx.store)
    ctx.writer = ctx.backend.writer
    tasks = [
        asyncio.create_task(ControllerRunner(JobReconciler(ctx), store=ctx.store, clock=ctx.clock).run()),
        asyncio.create_task(
            ControllerRunner(TinyScheduler(ctx.store), store=ctx.store, clock=ctx.clock).run()
        ),
    ]
    client = await aiohttp_client(app_module.make_app(ctx))
    client.ctx = ctx
    try:
        yield client
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.store.close()


async def submit(api: Any, text: str = PT) -> tuple[int, Any]:
    resp = await api.post("/api/v1/jobs", data=text.encode(), headers={"Content-Type": "application/yaml"})
    return resp.status, await resp.json()


async def patch(api: Any, body: Any, headers: dict[str, str] = MERGE) -> tuple[int, Any]:
    resp = await api.patch(f"/api/v1/namespaces/{NS}/jobs/{NAME}", data=json.dumps(body), headers=headers)
    return resp.status, await resp.json()


async def apply(api: Any, text: str) -> tuple[int, Any]:
    resp = await api.post("/api/v1/apply", data=text.encode(), headers={"Content-Type": "application/yaml"})
    return resp.status, await resp.json()


def stored(api: Any) -> Any:
    return api.ctx.store.get("PyTorchJob", NS, NAME)


async def test_suspend_and_resume_through_patch(api: Any) -> None:
    assert (await submit(api))[0] == 201
    await api.ctx.clock.advance(0.05)
    assert api.ctx.store.list_of(PodGroup)[0].spec.suspend is False
    status, body = await patch(api, {"spec": {"runPolicy": {"suspend": True}}})
    assert status == 200, body
    assert stored(api).suspended
    await api.ctx.clock.advance(0.05)
    assert api.ctx.store.get_of(PodGroup, NS, NAME).spec.suspend is True
    assert api.ctx.store.list("Reservation") == []  # the GPUs are given back
    assert stored(api).status.phase == "Suspended"
    status, _ = await patch(
        api, {"spec": {"runPolicy": {"suspend": False}}}, {"Content-Type": "application/json"}
    )
    assert status == 200
    await api.ctx.clock.advance(0.05)
    assert api.ctx.store.get_of(PodGroup, NS, NAME).spec.suspend is False
    assert api.ctx.store.list("Reservation")  # placed again


async def test_labels_queue_and_priority_may_change(api: Any) -> None:
    await submit(api)
    for _ in range(
        5
    ):  # the operator may write the job's status between our read and the patch: 409, read again
        rv = stored(api).metadata.resource_version
        status, body = await patch(
            api,
            {
                "metadata": {
                    "labels": {"team": "vision"},
                    "annotations": {"note": "x"},
                    "resourceVersion": rv,
                },
                "spec": {"runPolicy": {"schedulingPolicy": {"queue": "urgent", "priority": 7}}},
            },
        )
        if status != 409:
            break
    assert status == 200, body
    job = stored(api)
    assert job.metadata.labels["team"] == "vision" and job.queue == "urgent"
    assert job.metadata.generation == 2
    await api.ctx.clock.advance(0.05)
    pg = api.ctx.store.get_of(PodGroup, NS, NAME)
    assert (pg.spec.queue, pg.spec.priority) == ("urgent", 7)


async def test_immutable_field_is_refused_and_nothing_changes(api: Any) -> None:
    await submit(api)
    before = stored(api)
    status, body = await patch(
        api,
        {"metadata": {"labels": {"a": "b"}}, "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 5}}}},
    )
    assert status == 422
    assert body["error"]["details"][0]["field"] == "spec.pytorchReplicaSpecs.Worker.replicas"
    assert "spec.pytorchReplicaSpecs.Worker.replicas is immutable" in body["error"]["message"]
    after = stored(
        api
    )  # the operator may have written its status meanwhile: compare what the patch would change
    assert after.spec == before.spec
    assert after.metadata.labels == before.metadata.labels and "a" not in after.metadata.labels


async def test_stale_resource_version_is_a_conflict(api: Any) -> None:
    await submit(api)
    status, body = await patch(api, {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}})
    assert status == 409 and "stale" in body["error"]["message"]
    assert "a" not in stored(api).metadata.labels


async def test_bad_content_type_bad_json_and_put(api: Any) -> None:
    await submit(api)
    status, _ = await patch(api, {"metadata": {}}, {"Content-Type": "text/plain"})
    assert status == 415
    resp = await api.patch(f"/api/v1/namespaces/{NS}/jobs/{NAME}", data=b"[1]", headers=MERGE)
    assert resp.status == 400
    resp = await api.put(f"/api/v1/namespaces/{NS}/jobs/{NAME}", data=b"{}", headers=MERGE)
    assert resp.status == 405 and "PATCH" in resp.headers["Allow"]
    resp = await api.patch(f"/api/v1/namespaces/{NS}/jobs/nope", data=b"{}", headers=MERGE)
    assert resp.status == 404


HIGH = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
description: urgent work
"""


async def test_priority_class_resolves_into_the_pod_group(api: Any) -> None:
    status, body = await apply(api, HIGH)
    assert status == 200, body
    resp = await api.get("/api/v1/priorityclasses")
    names = [c["metadata"]["name"] for c in (await resp.json())["items"]]
    assert names == ["system-node-critical", "system-cluster-critical", "high"]
    doc = json.loads(json.dumps(__import__("yaml").safe_load(PT)))
    doc.setdefault("spec", {}).setdefault("runPolicy", {})["schedulingPolicy"] = {"priorityClass": "high"}
    status, body = await submit(api, json.dumps(doc))
    assert status == 201, body
    await api.ctx.clock.advance(0.05)
    pg = api.ctx.store.get_of(PodGroup, NS, NAME)
    assert (pg.spec.priority, pg.spec.priority_class_name) == (1000, "high")
    status, body = await patch(api, {"spec": {"runPolicy": {"schedulingPolicy": {"priorityClass": "nope"}}}})
    assert status == 422 and "'nope' does not exist" in body["error"]["message"]
    status, body = await patch(
        api, {"spec": {"runPolicy": {"schedulingPolicy": {"priorityClass": "system-cluster-critical"}}}}
    )
    assert status == 200
    await api.ctx.clock.advance(0.05)
    assert api.ctx.store.get_of(PodGroup, NS, NAME).spec.priority == 2_000_000_000


async def test_unknown_priority_class_is_refused_at_submit(api: Any) -> None:
    doc = __import__("yaml").safe_load(PT)
    doc.setdefault("spec", {}).setdefault("runPolicy", {})["schedulingPolicy"] = {"priorityClass": "gold"}
    status, body = await submit(api, json.dumps(doc))
    assert status == 422
    assert body["error"]["details"][0]["field"] == "spec.runPolicy.schedulingPolicy.priorityClass"
    assert api.ctx.store.get("PyTorchJob", NS, NAME) is None


async def test_global_default_and_bad_classes(api: Any) -> None:
    default = HIGH.replace("name: high", "name: normal").replace(
        "value: 1000", "value: 10\nglobalDefault: true"
    )
    assert (await apply(api, default))[0] == 200
    await submit(api)
    await api.ctx.clock.advance(0.05)
    assert api.ctx.store.get_of(PodGroup, NS, NAME).spec.priority == 10
    status, body = await apply(api, HIGH.replace("value: 1000", "value: 1000000001"))
    assert status == 422 and body["error"]["details"][0]["field"] == "documents[0].value"
    status, body = await apply(api, HIGH.replace("name: high", "name: system-x"))
    assert status == 422 and body["error"]["details"][0]["field"] == "documents[0].metadata.name"
    status, body = await apply(api, default.replace("name: normal", "name: other"))
    assert status == 422 and body["error"]["details"][0]["field"] == "documents[0].globalDefault"
    status, body = await apply(api, default.replace("value: 10", "value: 11"))
    assert status == 422 and "immutable" in body["error"]["details"][0]["reason"]
    status, body = await apply(api, HIGH.replace("description", "preemptionPolicy: Sometimes\ndescription"))
    assert status == 422 and body["error"]["details"][0]["field"] == "documents[0].preemptionPolicy"


async def test_job_stored_before_its_class_waits_until_the_class_exists(api: Any) -> None:
    from gpuyard.apis.jobs import parse_job

    doc = __import__("yaml").safe_load(PT)
    doc.setdefault("spec", {}).setdefault("runPolicy", {})["schedulingPolicy"] = {"priorityClass": "late"}
    await api.ctx.writer.create(parse_job(doc))  # as kubectl would, past the API's check
    await api.ctx.clock.advance(0.05)
    job = stored(api)
    assert api.ctx.store.get_of(PodGroup, NS, NAME) is None
    queuing = job.status.condition("Queuing")
    assert queuing is not None and queuing.reason == "PriorityClassNotFound"
    assert "PriorityClass 'late'" in queuing.message
    assert (await apply(api, HIGH.replace("name: high", "name: late").replace("value: 1000", "value: 500")))[
        0
    ] == 200
    await api.ctx.clock.advance(0.05)
    pg = api.ctx.store.get_of(PodGroup, NS, NAME)
    assert pg is not None and pg.spec.priority == 500
