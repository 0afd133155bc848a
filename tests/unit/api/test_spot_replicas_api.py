"""Submitting spot replicas over HTTP: a bad spotReplicaSpec or an unknown spot class is a 422
naming the field, a spot class a tenant may not use is a 403 naming it, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.priorityclasses import PriorityClass
from gpuyard.apis.quotakinds import ElasticQuota, Queue
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.auth import hash_token
from gpuyard.state.config import Settings
from gpuyard.state.context import Context

TOKENS = [{"sha256": hash_token("alice"), "user": "alice", "role": "user", "namespaces": ["team-a"]}]
HEADERS = {"Authorization": "Bearer alice", "Content-Type": "application/yaml"}
FIELD = "spec.pytorchReplicaSpecs.Worker.spotReplicaSpec"


def job(spot: str, *, queue: str = "") -> str:
    policy = f"\n  runPolicy:\n    schedulingPolicy: {{queue: {queue}}}" if queue else ""
    return f"""apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: sp, namespace: team-a}}
spec:{policy}
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      spotReplicaSpec: {spot}
      template:
        spec:
          containers: [{{name: pytorch, image: x, resources: {{limits: {{cpu: 1}}}}}}]
"""


@pytest.fixture
def ctx() -> Context:
    ctx = Context.for_tests(settings=Settings(server={"tokens": TOKENS}, backend={"data_dir": None}))
    ctx.store.create(
        ElasticQuota.model_validate({"metadata": {"name": "team-a"}, "spec": {"namespaces": ["team-a"]}})
    )
    ctx.store.create(PriorityClass(metadata=ObjectMeta(name="spot-low"), value=-10))
    ctx.store.create(PriorityClass(metadata=ObjectMeta(name="other"), value=5))
    ctx.store.create(
        Queue.model_validate(
            {
                "metadata": {"name": "strict"},
                "spec": {"namespaces": ["team-a"], "allowedPriorityClasses": ["spot-low"]},
            }
        )
    )
    return ctx


@pytest.fixture
async def http(aiohttp_client: Any, ctx: Context) -> Any:
    return await aiohttp_client(make_app(ctx))


async def refused(http: Any, body: str, status: int) -> dict[str, str]:
    r = await http.post("/api/v1/jobs", data=body.encode(), headers=HEADERS)
    assert r.status == status, await r.text()
    details: list[dict[str, str]] = (await r.json())["error"]["details"]
    assert len(details) == 1, details
    return details[0]


@pytest.mark.parametrize(
    ("spot", "field", "reason"),
    [
        ("{spotReplicaNumber: 3}", f"{FIELD}.spotReplicaNumber", "allowed: 0..2"),
        ("{spotReplicaNumber: -1}", f"{FIELD}.spotReplicaNumber", "greater than or equal to 0"),
        ("{spotReplicaNumber: 1, labels: {'bad key!': x}}", f"{FIELD}.labels.bad key!", "key"),
        ("{spotReplicaNumber: 1, priorityClassName: nope}", f"{FIELD}.priorityClassName", "'nope' does not"),
    ],
)
async def test_bad_spot_specs_are_422_naming_the_field(
    http: Any, ctx: Context, spot: str, field: str, reason: str
) -> None:
    detail = await refused(http, job(spot), 422)
    assert detail["field"] == field and reason in detail["reason"], detail
    assert ctx.store.list("PyTorchJob") == []


async def test_a_spot_class_the_tenant_may_not_use_is_403(http: Any, ctx: Context) -> None:
    spot = "{spotReplicaNumber: 1, priorityClassName: system-node-critical}"
    detail = await refused(http, job(spot), 403)
    assert detail["field"] == f"{FIELD}.priorityClassName" and "system class" in detail["reason"]
    detail = await refused(http, job("{spotReplicaNumber: 1, priorityClassName: other}", queue="strict"), 403)
    assert detail["field"] == f"{FIELD}.priorityClassName" and "allowed: spot-low" in detail["reason"]
    assert ctx.store.list("PyTorchJob") == []
    spot = "{spotReplicaNumber: 1, priorityClassName: spot-low, labels: {capacity: spot}}"
    r = await http.post("/api/v1/jobs", data=job(spot, queue="strict").encode(), headers=HEADERS)
    assert r.status == 201, await r.text()
    (stored,) = ctx.store.list("PyTorchJob")
    worker = stored.spec.pytorch_replica_specs["Worker"]  # type: ignore[attr-defined]
    assert worker.spot_replica_spec.labels == {"capacity": "spot"}
