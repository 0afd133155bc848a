"""Tenant bindings (L1/L2): a tenant's job may name only quotas and queues bound to its namespace."""

from __future__ import annotations

import pytest

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quotakinds import DEFAULT_QUOTA, LABEL_QUOTA_NAME, ElasticQuota, Queue
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.auth import hash_token
from gpuyard.platform.api.tenancy import default_quota
from gpuyard.scheduler.admission.quota import QuotaTree, specs_from_quotas
from gpuyard.state.config import Settings
from gpuyard.state.context import Context

TOKENS = [
    {"sha256": hash_token("root"), "user": "root", "role": "admin"},
    {"sha256": hash_token("alice"), "user": "alice", "role": "user", "namespaces": ["team-a", "team-z"]},
]


def quota(
    name: str, *, namespace: str = "default", namespaces: list[str] | None = None, annotation: str = ""
):
    meta = ObjectMeta(name=name, namespace=namespace)
    if annotation:
        meta.annotations["quota.scheduling.koordinator.sh/namespaces"] = annotation
    return ElasticQuota.model_validate(
        {"metadata": meta.model_dump(by_alias=True), "spec": {"namespaces": namespaces or []}}
    )


def job(name: str, *, ns: str = "team-a", quota_label: str | None = None, queue: str | None = None) -> str:
    labels = f"\n  labels: {{{LABEL_QUOTA_NAME}: {quota_label}}}" if quota_label else ""
    policy = f"\n  runPolicy:\n    schedulingPolicy: {{queue: {queue}}}" if queue else ""
    return f"""apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: {name}
  namespace: {ns}{labels}
spec:{policy}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers: [{{name: pytorch, image: x, resources: {{limits: {{cpu: 1}}}}}}]
"""


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests(settings=Settings(server={"tokens": TOKENS}, backend={"data_dir": None}))
    ctx.store.create(quota("team-a", namespaces=["team-a"]))
    ctx.store.create(quota("team-b", namespaces=["team-b"]))
    ctx.store.create(quota("shared", annotation='["*"]'))
    ctx.store.create(quota("lab-a", namespace="team-a"))  # lives in team-a
    ctx.store.create(Queue(metadata=ObjectMeta(name="research"), spec={"namespaces": ["team-a"]}))
    ctx.store.create(Queue(metadata=ObjectMeta(name="team-b")))
    return await aiohttp_client(make_app(ctx)), ctx


async def submit(http, body: str, token: str = "alice"):
    return await http.post(
        "/api/v1/jobs",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"},
    )


@pytest.mark.parametrize("named", ["team-a", "shared", "lab-a"])
async def test_a_tenant_may_name_a_quota_bound_to_its_namespace(client, named):
    http, _ = client
    r = await submit(http, job("j", quota_label=named))
    assert r.status == 201, await r.text()


@pytest.mark.parametrize("named", ["team-b", DEFAULT_QUOTA, "no-such-quota"])
async def test_a_tenant_may_not_name_another_teams_quota(client, named):
    http, ctx = client
    r = await submit(http, job("j", quota_label=named))
    assert r.status == 403, await r.text()
    body = await r.json()
    detail = body["error"]["details"][0]
    assert detail["field"] == f"metadata.labels.{LABEL_QUOTA_NAME}"
    assert f"quota {named!r} is not bound to namespace team-a" in detail["reason"]
    assert "team-a" in detail["reason"].split("allowed:")[1]
    assert ctx.store.get("PyTorchJob", "team-a", "j") is None  # nothing stored


@pytest.mark.parametrize("queue", ["team-a", "research"])
async def test_a_tenant_may_name_its_own_or_a_bound_queue(client, queue):
    http, _ = client
    r = await submit(http, job("j", queue=queue))
    assert r.status == 201, await r.text()


@pytest.mark.parametrize("queue", ["team-b", "nobody"])
async def test_a_tenant_may_not_name_another_teams_queue(client, queue):
    http, _ = client
    r = await submit(http, job("j", queue=queue))
    assert r.status == 403
    detail = (await r.json())["error"]["details"][0]
    assert detail["field"] == "spec.runPolicy.schedulingPolicy.queue"
    assert f"queue {queue!r} is not bound to namespace team-a" in detail["reason"]


async def test_an_unbound_namespace_keeps_its_defaults(client):
    http, _ = client  # team-z: no quota lists it, no Queue names it
    assert (await submit(http, job("j1", ns="team-z"))).status == 201
    assert (await submit(http, job("j2", ns="team-z", quota_label=DEFAULT_QUOTA))).status == 201
    assert (await submit(http, job("j3", ns="team-z", queue="team-z"))).status == 201
    assert (await submit(http, job("j4", ns="team-z", quota_label="team-a"))).status == 403


async def test_an_admin_may_name_anything(client):
    http, _ = client
    r = await submit(http, job("j", quota_label="team-b", queue="team-b"), token="root")
    assert r.status == 201


async def test_one_forbidden_document_stops_the_whole_submission(client):
    http, ctx = client
    r = await submit(http, job("ok") + "---\n" + job("bad", quota_label="team-b"))
    assert r.status == 403
    detail = (await r.json())["error"]["details"][0]
    assert detail["field"] == f"documents[1].metadata.labels.{LABEL_QUOTA_NAME}"
    assert ctx.store.get("PyTorchJob", "team-a", "ok") is None


@pytest.mark.parametrize(
    ("quotas", "namespace"),
    [
        ([quota("a", namespaces=["x"]), quota("b", namespaces=["x"])], "x"),
        ([quota("solo", namespace="y")], "y"),
        ([quota("one", namespace="z"), quota("two", namespace="z")], "z"),
        ([quota("a", namespaces=["x"])], "elsewhere"),
        ([quota("ann", annotation='["w"]')], "w"),
    ],
)
def test_the_default_quota_is_the_one_the_scheduler_charges(quotas, namespace):
    tree = QuotaTree(specs_from_quotas(quotas))
    assert default_quota(quotas, namespace) == (tree.quota_for_namespace(namespace) or DEFAULT_QUOTA)


async def patch(http, name: str, body: dict, token: str = "alice"):
    return await http.patch(
        f"/api/v1/namespaces/team-a/jobs/{name}",
        json=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"},
    )


async def test_a_patch_may_not_move_a_job_into_another_teams_queue_or_quota(client):
    http, ctx = client
    assert (await submit(http, job("p"))).status == 201
    before = ctx.store.get("PyTorchJob", "team-a", "p")
    r = await patch(http, "p", {"spec": {"runPolicy": {"schedulingPolicy": {"queue": "team-b"}}}})
    assert r.status == 403, await r.text()
    assert "team-b" in (await r.text())
    r = await patch(http, "p", {"metadata": {"labels": {LABEL_QUOTA_NAME: "team-b"}}})
    assert r.status == 403, await r.text()
    assert (
        ctx.store.get("PyTorchJob", "team-a", "p").metadata.resource_version
        == before.metadata.resource_version
    )
    r = await patch(http, "p", {"spec": {"runPolicy": {"schedulingPolicy": {"queue": "research"}}}})
    assert r.status == 200, await r.text()  # a queue bound to team-a
