"""The job HTTP API: submit (YAML/JSON, multi-document, all or nothing), list, get, delete, pods, events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import yaml

from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.platform.api import app as app_module
from gpuyard.platform.api import jobs as jobs_api
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ControllerRunner
from tests.builders import make_node
from tests.unit.controllers.fakes import JOBS, ScriptedBackend, TinyScheduler

TF = (JOBS / "tf-mnist-hostnetwork.yaml").read_text()
PT = (JOBS / "pytorch-simple.yaml").read_text()


def make(ctx: Context):  # type: ignore[no-untyped-def]
    app = app_module.make_app(ctx)
    if "gpuyard.platform.api.jobs" not in app_module.ROUTE_MODULES:
        jobs_api.setup(app)
    return app


@pytest_asyncio.fixture
async def api(aiohttp_client) -> AsyncIterator[Any]:  # type: ignore[no-untyped-def]
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
    client = await aiohttp_client(make(ctx))
    client.ctx = ctx
    try:
        yield client
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.store.close()


async def post(api: Any, body: str, content_type: str = "application/yaml") -> tuple[int, Any]:
    resp = await api.post("/api/v1/jobs", data=body.encode(), headers={"Content-Type": content_type})
    return resp.status, await resp.json()


async def test_submit_yaml_multi_document_and_read_back(api: Any) -> None:
    status, body = await post(api, TF + "\n---\n" + PT)
    assert status == 201
    assert [(j["kind"], j["metadata"]["namespace"], j["metadata"]["name"]) for j in body["items"]] == [
        ("TFJob", "kubedl", "mnist"),
        ("PyTorchJob", "kubeflow", "pytorch-simple"),
    ]
    await api.ctx.clock.advance(0.01)
    resp = await api.get("/api/v1/namespaces/kubedl/jobs/mnist")
    job = await resp.json()
    assert (
        resp.status == 200
        and job["summary"]["phase"] in ("Queuing", "Running")
        and job["summary"]["hostNetwork"]
    )
    assert job["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] == "ExitCode"
    resp = await api.get("/api/v1/jobs", params={"namespace": "kubedl"})
    assert [j["metadata"]["name"] for j in (await resp.json())["items"]] == ["mnist"]
    resp = await api.get("/api/v1/jobs", params={"queue": "kubeflow"})
    assert [j["metadata"]["name"] for j in (await resp.json())["items"]] == ["pytorch-simple"]
    resp = await api.get("/api/v1/namespaces/kubedl/jobs/mnist/pods")
    pods = (await resp.json())["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["mnist-ps-0", "mnist-ps-1"]
    summary = pods[0]["summary"]
    assert summary["hostPort"] and "TF_CONFIG" in summary["env"]["tensorflow"]
    resp = await api.get("/api/v1/namespaces/kubedl/jobs/mnist/events")
    reasons = [e["reason"] for e in (await resp.json())["items"]]
    assert reasons[0] == "JobCreated" and "SuccessfulCreatePod" in reasons


async def test_submit_json_object_and_array(api: Any) -> None:
    docs = list(yaml.safe_load_all(PT))
    status, _ = await post(api, json.dumps(docs[0]), "application/json")
    assert status == 201
    other = json.loads(json.dumps(docs[0]))
    other["metadata"]["name"] = "pt-2"
    third = json.loads(json.dumps(docs[0]))
    third["metadata"]["name"] = "pt-3"
    status, body = await post(api, json.dumps([other, third]), "application/json")
    assert status == 201 and len(body["items"]) == 2


async def test_phase_filter(api: Any) -> None:
    await post(api, PT)
    await api.ctx.clock.advance(0.01)
    resp = await api.get("/api/v1/jobs", params={"phase": "queuing"})
    assert [j["metadata"]["name"] for j in (await resp.json())["items"]] == ["pytorch-simple"]
    resp = await api.get("/api/v1/jobs", params={"phase": "Succeeded"})
    assert (await resp.json())["items"] == []


@pytest.mark.parametrize(
    ("mutate", "field", "allowed"),
    [
        (lambda d: d.update(kind="SparkJob"), "kind", "JAXJob, MPIJob, MarsJob"),
        (
            lambda d: d.update(apiVersion="kubeflow.org/v2"),
            "apiVersion",
            "allowed: kubeflow.org/v1, training.kubedl.io/v1alpha1",
        ),
        (
            lambda d: d["spec"]["tfReplicaSpecs"].update(Boss=d["spec"]["tfReplicaSpecs"]["PS"]),
            "spec.tfReplicaSpecs.Boss",
            "allowed: Chief, Evaluator",
        ),
        (
            lambda d: d["spec"]["tfReplicaSpecs"]["PS"].update(replicas=-2),
            "spec.tfReplicaSpecs.PS.replicas",
            "non-negative",
        ),
        (
            lambda d: d["spec"]["tfReplicaSpecs"]["PS"].update(replicas=100_001),
            "spec.tfReplicaSpecs.PS.replicas",
            "100001 is out of range; allowed: 0..10000",
        ),
        (
            lambda d: d["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0]["resources"][
                "limits"
            ].update(cpu="-1"),
            "spec.tfReplicaSpecs.PS.template.spec.containers.0.resources.limits",
            "cpu: -1 is negative; allowed: a quantity of 0 or more",
        ),
        (
            lambda d: (
                d["spec"]["tfReplicaSpecs"]["PS"]["template"]
                .setdefault("metadata", {})
                .update(annotations={"fake.gpuyard.io/duration": "3e11"})
            ),
            "spec.tfReplicaSpecs.PS.template.metadata.annotations.fake.gpuyard.io/duration",
            "from 0 to 315360000 seconds",
        ),
        (
            lambda d: (
                d["spec"]["tfReplicaSpecs"]["PS"]["template"]
                .setdefault("metadata", {})
                .update(annotations={"fake.gpuyard.io/duration": "forty seconds"})
            ),
            "spec.tfReplicaSpecs.PS.template.metadata.annotations.fake.gpuyard.io/duration",
            "is not a duration; allowed: seconds (3600) or Go-style units",
        ),
        (
            lambda d: d["metadata"].update(annotations={"gpuyard.io/expected-duration": "soon"}),
            "metadata.annotations.gpuyard.io/expected-duration",
            "is not a duration",
        ),
        (
            lambda d: d["spec"]["tfReplicaSpecs"]["PS"].update(restartPolicy="Maybe"),
            "spec.tfReplicaSpecs.PS.restartPolicy",
            "'ExitCode'",
        ),
        (
            lambda d: d["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0]["resources"][
                "limits"
            ].update(memory="two gigs"),
            "spec.tfReplicaSpecs.PS.template.spec.containers.0.resources.limits.memory",
            "allowed: a number with an optional suffix",
        ),
    ],
    ids=[
        "kind",
        "apiVersion",
        "replica-type",
        "replicas",
        "replicas-bound",
        "negative-cpu",
        "duration-beyond-clock",
        "duration-unreadable",
        "expected-duration",
        "restartPolicy",
        "quantity",
    ],
)
async def test_bad_input_is_422_with_field_and_allowed_values(
    api: Any, mutate, field: str, allowed: str
) -> None:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load(TF)
    mutate(doc)
    status, body = await post(api, yaml.safe_dump(doc))
    assert status == 422, body
    details = {d["field"]: d["reason"] for d in body["error"]["details"]}
    assert field in details and allowed in details[field], details
    assert not api.ctx.store.list("TFJob")


async def test_one_bad_document_stores_none(api: Any) -> None:
    bad = yaml.safe_load(PT)
    bad["metadata"]["name"] = "bad"
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = -1
    status, body = await post(api, TF + "\n---\n" + yaml.safe_dump(bad))
    assert status == 422
    assert body["error"]["details"][0]["field"] == "documents[1].spec.pytorchReplicaSpecs.Worker.replicas"
    assert not api.ctx.store.list("TFJob") and not api.ctx.store.list("PyTorchJob")


async def test_duplicate_name_is_409_and_nothing_changes(api: Any) -> None:
    assert (await post(api, TF))[0] == 201
    before = api.ctx.store.must_get("TFJob", "kubedl", "mnist").metadata.uid
    status, body = await post(api, PT + "\n---\n" + TF)
    assert status == 409
    assert body["error"]["details"][0]["field"] == "documents[1].metadata.name"
    assert "TFJob kubedl/mnist already exists" in body["error"]["details"][0]["reason"]
    assert not api.ctx.store.list("PyTorchJob")
    assert api.ctx.store.must_get("TFJob", "kubedl", "mnist").metadata.uid == before
    # a job of another kind with the same name in the namespace is a duplicate too
    other = yaml.safe_load(PT)
    other["metadata"] = {"name": "mnist", "namespace": "kubedl"}
    assert (await post(api, yaml.safe_dump(other)))[0] == 409
    twice = await post(api, PT + "\n---\n" + PT)
    assert twice[0] == 409 and "given twice" in twice[1]["error"]["details"][0]["reason"]


async def test_malformed_body_is_400(api: Any) -> None:
    status, body = await post(api, "kind: TFJob\n  oops: [\n")
    assert status == 400 and "line" in body["error"]["message"]
    status, body = await post(api, "")
    assert status == 400


async def test_get_and_delete(api: Any) -> None:
    await post(api, TF)
    await api.ctx.clock.advance(0.01)
    assert api.ctx.store.list("Pod", namespace="kubedl")
    resp = await api.delete("/api/v1/namespaces/kubedl/jobs/mnist")
    assert resp.status == 200 and (await resp.json())["deleted"]["kind"] == "TFJob"
    await api.ctx.clock.advance(0.01)
    assert not api.ctx.store.list("Pod", namespace="kubedl")
    assert not api.ctx.store.list("Reservation", namespace="kubedl")
    assert api.ctx.store.get("PodGroup", "kubedl", "mnist") is None
    for path in ("", "/pods", "/events"):
        resp = await api.get(f"/api/v1/namespaces/kubedl/jobs/mnist{path}")
        assert resp.status == 404 and (await resp.json())["error"]["message"] == "job kubedl/mnist not found"
    assert (await api.delete("/api/v1/namespaces/kubedl/jobs/mnist")).status == 404


async def test_resource_requests_are_checked_against_the_cluster(api: Any) -> None:
    doc = yaml.safe_load(TF)
    limits = doc["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"][
        "limits"
    ]
    limits["nvidia.com/gpu"] = 16
    status, body = await post(api, yaml.safe_dump(doc))
    assert status == 422, body
    reasons = " ".join(d["reason"] for d in body["error"]["details"])
    assert "requests 16 nvidia.com/gpu per pod; the largest node has 8" in reasons
    limits.pop("nvidia.com/gpu")
    limits["a100-80g"] = 1
    status, body = await post(api, yaml.safe_dump(doc))
    assert status == 422 and "unknown resource class 'a100-80g'" in body["error"]["details"][0]["reason"]


async def test_job_routes_are_in_the_openapi_document(api: Any) -> None:
    doc = await (await api.get("/api/v1/openapi.json")).json()
    paths = doc["paths"]
    assert set(paths["/api/v1/jobs"]) == {"get", "post"}
    assert set(paths["/api/v1/namespaces/{ns}/jobs/{name}"]) == {"get", "delete", "patch", "put"}
    assert "get" in paths["/api/v1/namespaces/{ns}/jobs/{name}/pods"]
    assert "get" in paths["/api/v1/namespaces/{ns}/jobs/{name}/events"]
    assert set(paths["/api/v1/jobs"]["post"]["requestBody"]["content"]) == {
        "application/yaml",
        "application/json",
    }


async def test_malformed_json_is_400_with_position(api: Any) -> None:
    status, body = await post(api, '{"kind": "TFJob",', "application/json")
    assert (
        status == 400
        and body["error"]["message"].startswith("malformed JSON:")
        and "line 1" in body["error"]["message"]
    )
    status, body = await post(api, "[]", "application/json")
    assert status == 400
