"""Hostile input against a server with tokens (issue 26): refusals before the body is read, bodies
beyond a decoding limit, validation as the API server does it, tenant priorities, pod-template
quota labels and signed continue tokens. Each refusal names the field or limit, and nothing is
stored."""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any

import pytest

from gpuyard.apis.decoding import MAX_MERGE_KEYS, MAX_NODES
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.priorityclasses import PriorityClass
from gpuyard.apis.quotakinds import LABEL_QUOTA_NAME, ElasticQuota, Queue
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.auth import hash_token
from gpuyard.platform.api.bodies import READ_METHODS, ROUTES
from gpuyard.state.config import Settings
from gpuyard.state.context import Context
from tests.builders import make_node

TOKENS = [
    {"sha256": hash_token("root"), "user": "root", "role": "admin"},
    {"sha256": hash_token("alice"), "user": "alice", "role": "user", "namespaces": ["team-a"]},
    {"sha256": hash_token("sys"), "user": "sys", "role": "user", "namespaces": ["kube-system"]},
    {"sha256": hash_token("vic"), "user": "vic", "role": "viewer", "namespaces": ["team-a"]},
]
YAML = "application/yaml"


def headers(token: str, content_type: str | None = YAML) -> dict[str, str]:
    out = {"Authorization": f"Bearer {token}"}
    if content_type:
        out["Content-Type"] = content_type
    return out


def job(
    name: str = "j",
    *,
    ns: str = "team-a",
    policy: str = "",
    labels: str = "",
    template_labels: str = "",
) -> str:
    meta_labels = f"\n  labels: {{{labels}}}" if labels else ""
    run_policy = f"\n  runPolicy:\n    schedulingPolicy: {{{policy}}}" if policy else ""
    tmeta = f"\n        metadata: {{labels: {{{template_labels}}}}}" if template_labels else ""
    return f"""apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: {name}
  namespace: {ns}{meta_labels}
spec:{run_policy}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:{tmeta}
        spec:
          containers: [{{name: pytorch, image: x, resources: {{limits: {{cpu: 1}}}}}}]
"""


@pytest.fixture
def ctx() -> Context:
    ctx = Context.for_tests(settings=Settings(server={"tokens": TOKENS}, backend={"data_dir": None}))
    ctx.store.create(
        ElasticQuota.model_validate({"metadata": {"name": "team-a"}, "spec": {"namespaces": ["team-a"]}})
    )
    ctx.store.create(
        ElasticQuota.model_validate({"metadata": {"name": "team-b"}, "spec": {"namespaces": ["team-b"]}})
    )
    ctx.store.create(PriorityClass(metadata=ObjectMeta(name="high"), value=1000))
    ctx.store.create(PriorityClass(metadata=ObjectMeta(name="low"), value=10))
    ctx.store.create(
        Queue.model_validate(
            {
                "metadata": {"name": "strict"},
                "spec": {"namespaces": ["team-a"], "allowedPriorityClasses": ["low"]},
            }
        )
    )
    return ctx


@pytest.fixture
async def http(aiohttp_client: Any, ctx: Context) -> Any:
    return await aiohttp_client(make_app(ctx))


def jobs_stored(ctx: Context) -> int:
    return len(ctx.store.list("PyTorchJob"))


async def error_of(resp: Any) -> dict[str, Any]:
    return dict((await resp.json())["error"])


# --- 1. cheap refusals first ------------------------------------------------------------------


def flat_yaml(keys: int) -> io.BytesIO:
    return io.BytesIO("".join(f"k{i}: v\n" for i in range(keys)).encode())


async def test_a_viewers_large_post_is_403_without_the_body_being_decoded(http: Any, ctx: Context) -> None:
    body = flat_yaml(350_000)  # 3.6 MiB: under the 4 MiB limit, over the node limit
    assert len(body.getvalue()) < ctx.settings.server.max_body_bytes
    r = await http.post("/api/v1/jobs", data=body, headers=headers("vic"))
    assert r.status == 403
    assert "viewer" in (await error_of(r))["message"]
    r = await http.post("/api/v1/apply", data=body, headers=headers("alice"))
    assert r.status == 403 and "admin" in (await error_of(r))["message"]
    assert jobs_stored(ctx) == 0


async def test_a_write_to_another_namespace_is_403_before_the_body(http: Any) -> None:
    r = await http.patch(
        "/api/v1/namespaces/team-b/jobs/x",
        data=b"{}",
        headers=headers("alice", "application/merge-patch+json"),
    )
    assert r.status == 403 and "team-b" in (await error_of(r))["message"]


@pytest.mark.parametrize(
    ("method", "path", "setting"),
    [
        ("post", "/api/v1/jobs", "max_body_bytes"),
        ("post", "/api/v1/apply", "max_body_bytes"),
        ("put", "/api/v1/queues/q", "max_object_body_bytes"),
        ("put", "/api/v1/quotas/q", "max_object_body_bytes"),
    ],
)
async def test_a_body_over_the_routes_limit_is_413_naming_the_setting(
    http: Any, ctx: Context, method: str, path: str, setting: str
) -> None:
    limit = getattr(ctx.settings.server, setting)
    r = await getattr(http, method)(path, data=io.BytesIO(b"#" * (limit + 1)), headers=headers("root"))
    assert r.status == 413
    error = await error_of(r)
    assert f"server.{setting}" in error["message"] and str(limit) in error["message"]


@pytest.mark.parametrize("content_type", ["application/xml", "text/plain", None])
async def test_an_unknown_or_missing_content_type_is_415(
    http: Any, ctx: Context, content_type: str | None
) -> None:
    hdrs = headers("alice", content_type)
    r = await http.post("/api/v1/jobs", data=job().encode(), headers=hdrs, skip_auto_headers=["Content-Type"])
    assert r.status == 415
    assert (await error_of(r))["details"][0]["field"] == "Content-Type"
    assert jobs_stored(ctx) == 0


@pytest.mark.parametrize("content_type", ["application/yaml", "application/x-yaml", "text/yaml"])
async def test_the_yaml_content_types_are_taken(http: Any, content_type: str) -> None:
    r = await http.post("/api/v1/jobs", data=job().encode(), headers=headers("alice", content_type))
    assert r.status == 201, await r.text()


def test_every_write_route_has_a_policy(ctx: Context) -> None:
    app = make_app(ctx)
    writes = {
        (r.method, r.resource.canonical)
        for r in app.router.routes()
        if r.method not in READ_METHODS and r.resource is not None
    }
    assert writes == set(ROUTES)


# --- 2. decoding limits --------------------------------------------------------------------------


async def test_a_flat_mapping_of_350000_keys_is_422_naming_the_node_limit(http: Any, ctx: Context) -> None:
    r = await http.post("/api/v1/jobs", data=flat_yaml(350_000), headers=headers("alice"))
    assert r.status == 422
    assert f"at most {MAX_NODES}" in (await error_of(r))["details"][0]["reason"]
    assert jobs_stored(ctx) == 0


async def test_20000_merge_keys_are_422_naming_the_merge_key_limit(http: Any) -> None:
    body = "a: &a {x: 1}\nb:\n" + "  <<: *a\n" * 20_000
    r = await http.post("/api/v1/jobs", data=body.encode(), headers=headers("alice"))
    assert r.status == 422
    assert f"at most {MAX_MERGE_KEYS}" in (await error_of(r))["details"][0]["reason"]


def test_a_json_body_of_many_values_is_refused_before_it_is_built() -> None:
    from gpuyard.apis.decoding import DocumentLimitError, json_loads

    text = "{" + ",".join(f'"k{i}": 1' for i in range(MAX_NODES + 10)) + "}"
    with pytest.raises(DocumentLimitError, match="nodes"):
        json_loads(text)
    assert json_loads('{"a, b": [1, 2], "c": "[{,"}') == {"a, b": [1, 2], "c": "[{,"}


# --- 3. validation as the API server does it ----------------------------------------------------

HUGE = "9" * 5000


async def test_a_5000_digit_integer_is_422_naming_the_field_on_every_write(http: Any, ctx: Context) -> None:
    r = await http.post(
        "/api/v1/jobs", data=job(policy=f"priority: {HUGE}").encode(), headers=headers("alice")
    )
    assert r.status == 422
    assert (await error_of(r))["details"][0]["field"] == "spec.runPolicy.schedulingPolicy.priority"
    r = await http.post(
        "/api/v1/jobs",
        data=json.dumps({"kind": "PyTorchJob", "x": [1, int(HUGE[:100])]}).encode(),
        headers=headers("alice", "application/json"),
    )
    assert r.status == 422 and (await error_of(r))["details"][0]["field"] == "x.1"
    r = await http.put("/api/v1/queues/q", data=f"spec: {{weight: {HUGE}}}".encode(), headers=headers("root"))
    assert r.status == 422 and (await error_of(r))["details"][0]["field"] == "spec.weight"
    r = await http.post(
        "/api/v1/apply",
        data=f"kind: Queue\nmetadata: {{name: q}}\nspec: {{weight: {HUGE}}}\n".encode(),
        headers=headers("root"),
    )
    assert r.status == 422 and (await error_of(r))["details"][0]["field"] == "spec.weight"
    assert (await http.post("/api/v1/jobs", data=job().encode(), headers=headers("alice"))).status == 201
    r = await http.patch(
        "/api/v1/namespaces/team-a/jobs/j",
        data=f'{{"spec": {{"x": {HUGE}}}}}'.encode(),
        headers=headers("alice", "application/merge-patch+json"),
    )
    assert r.status == 422 and (await error_of(r))["details"][0]["field"] == "spec.x"


@pytest.mark.parametrize("priority", [2**31, 2**63 - 1, -(2**31) - 1])
async def test_a_priority_beyond_int32_is_422(http: Any, ctx: Context, priority: int) -> None:
    r = await http.post(
        "/api/v1/jobs", data=job(policy=f"priority: {priority}").encode(), headers=headers("root")
    )
    assert r.status == 422, await r.text()
    assert (await error_of(r))["details"][0]["field"].endswith("schedulingPolicy.priority")
    assert jobs_stored(ctx) == 0


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (job(labels="'bad key!': x"), "metadata.labels.bad key!"),
        (job(labels=f"ok: {'v' * 100}"), "metadata.labels.ok"),
        (job(ns="n" * 64), "metadata.namespace"),
        (job(template_labels="'a/b/c': x"), "spec.pytorchReplicaSpecs.Master.template.metadata.labels.a/b/c"),
    ],
    ids=["label-key", "label-value-100", "namespace-64", "template-label-key"],
)
async def test_labels_and_namespaces_are_checked_as_kubernetes_does(
    http: Any, ctx: Context, text: str, field: str
) -> None:
    r = await http.post("/api/v1/jobs", data=text.encode(), headers=headers("root"))
    assert r.status == 422, await r.text()
    assert field in [d["field"] for d in (await error_of(r))["details"]]
    assert jobs_stored(ctx) == 0


async def test_annotations_over_256_kib_are_422(http: Any) -> None:
    big = "a" * (200 * 1024)
    text = job().replace("  namespace: team-a", f"  namespace: team-a\n  annotations: {{x: {big}, y: {big}}}")
    r = await http.post("/api/v1/jobs", data=text.encode(), headers=headers("root"))
    assert r.status == 422
    detail = (await error_of(r))["details"][0]
    assert detail["field"] == "metadata.annotations" and "256 KiB" in detail["reason"]


async def test_a_policy_object_with_a_bad_name_is_422(http: Any) -> None:
    r = await http.put("/api/v1/queues/Bad_Name", data=b"spec: {}", headers=headers("root"))
    assert r.status == 422 and (await error_of(r))["details"][0]["field"] == "metadata.name"
    r = await http.post(
        "/api/v1/apply", data=b"kind: Queue\nmetadata: {name: Bad_Name}\n", headers=headers("root")
    )
    assert r.status == 422 and (await error_of(r))["details"][0]["field"] == "documents[0].metadata.name"


# --- 4. priorities a tenant may use ----------------------------------------------------------------


@pytest.mark.parametrize("cls", ["system-node-critical", "system-cluster-critical"])
async def test_a_tenant_may_not_use_a_system_class(http: Any, ctx: Context, cls: str) -> None:
    r = await http.post(
        "/api/v1/jobs", data=job(policy=f"priorityClass: {cls}").encode(), headers=headers("alice")
    )
    assert r.status == 403
    detail = (await error_of(r))["details"][0]
    assert detail["field"] == "spec.runPolicy.schedulingPolicy.priorityClass"
    assert cls in detail["reason"] and "queue team-a" in detail["reason"]
    assert jobs_stored(ctx) == 0
    r = await http.post(
        "/api/v1/jobs", data=job(policy=f"priorityClass: {cls}").encode(), headers=headers("root")
    )
    assert r.status == 201
    text = job(ns="kube-system", policy=f"priorityClass: {cls}")
    assert (await http.post("/api/v1/jobs", data=text.encode(), headers=headers("sys"))).status == 201


async def test_a_tenant_may_not_ask_for_a_system_priority_value(http: Any) -> None:
    r = await http.post(
        "/api/v1/jobs", data=job(policy="priority: 2000001000").encode(), headers=headers("alice")
    )
    assert r.status == 403
    assert "1000000000" in (await error_of(r))["details"][0]["reason"]


async def test_a_queue_limits_the_classes_its_jobs_may_use(http: Any) -> None:
    r = await http.post(
        "/api/v1/jobs",
        data=job(policy="queue: strict, priorityClass: high").encode(),
        headers=headers("alice"),
    )
    assert r.status == 403
    reason = (await error_of(r))["details"][0]["reason"]
    assert "'high'" in reason and "queue strict" in reason and "allowed: low" in reason
    r = await http.post(
        "/api/v1/jobs",
        data=job(policy="queue: strict, priorityClass: low").encode(),
        headers=headers("alice"),
    )
    assert r.status == 201
    r = await http.post(
        "/api/v1/jobs", data=job("k", policy="queue: strict, priority: 11").encode(), headers=headers("alice")
    )
    assert r.status == 403  # above the highest allowed class (low: 10)
    r = await http.post(
        "/api/v1/jobs", data=job("m", policy="priorityClass: high").encode(), headers=headers("alice")
    )
    assert r.status == 201  # the implicit queue team-a lists no classes: any non-system one


async def test_a_patch_to_a_system_class_is_403_and_changes_nothing(http: Any, ctx: Context) -> None:
    assert (await http.post("/api/v1/jobs", data=job().encode(), headers=headers("alice"))).status == 201
    patch = {"spec": {"runPolicy": {"schedulingPolicy": {"priorityClass": "system-node-critical"}}}}
    r = await http.patch(
        "/api/v1/namespaces/team-a/jobs/j",
        data=json.dumps(patch).encode(),
        headers=headers("alice", "application/merge-patch+json"),
    )
    assert r.status == 403 and "system-node-critical" in (await error_of(r))["message"]
    stored = ctx.store.get("PyTorchJob", "team-a", "j")
    policy = stored.run_policy.scheduling_policy  # type: ignore[union-attr]
    assert policy is None or policy.priority_class is None


async def test_apply_refuses_a_queue_allowing_an_unknown_class(http: Any) -> None:
    text = "kind: Queue\nmetadata: {name: q}\nspec: {allowedPriorityClasses: [low, nope]}\n"
    r = await http.post("/api/v1/apply", data=text.encode(), headers=headers("root"))
    assert r.status == 422
    assert (await error_of(r))["details"][0]["field"] == "documents[0].spec.allowedPriorityClasses.1"


# --- 5. quota labels in pod templates ----------------------------------------------------------------


async def test_a_template_naming_another_teams_quota_is_403_naming_the_label(http: Any, ctx: Context) -> None:
    text = job(template_labels=f"{LABEL_QUOTA_NAME}: team-b")
    r = await http.post("/api/v1/jobs", data=text.encode(), headers=headers("alice"))
    assert r.status == 403
    detail = (await error_of(r))["details"][0]
    assert detail["field"] == f"spec.pytorchReplicaSpecs.Master.template.metadata.labels.{LABEL_QUOTA_NAME}"
    assert "team-b" in detail["reason"]
    assert jobs_stored(ctx) == 0
    text = job(template_labels="kueue.x-k8s.io/queue-name: nobody")
    assert (await http.post("/api/v1/jobs", data=text.encode(), headers=headers("alice"))).status == 403
    text = job(template_labels=f"{LABEL_QUOTA_NAME}: team-a")
    assert (await http.post("/api/v1/jobs", data=text.encode(), headers=headers("alice"))).status == 201


# --- 7. signed continue tokens ------------------------------------------------------------------------


async def test_forged_foreign_and_expired_continue_tokens_are_400(
    http: Any, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        ctx.store.create(make_node(f"n{i}"))
    r = await http.get("/api/v1/nodes?limit=1", headers=headers("root"))
    token = (await r.json())["metadata"]["continue"]
    assert (await http.get(f"/api/v1/nodes?limit=1&continue={token}", headers=headers("root"))).status == 200
    body, _, signature = token.partition(".")
    forged = base64.urlsafe_b64encode(b'["","n0",9999999999]').decode().rstrip("=") + "." + signature
    unsigned = body
    for bad in (forged, unsigned, "x" * 40):
        r = await http.get(f"/api/v1/nodes?limit=1&continue={bad}", headers=headers("root"))
        assert r.status == 400 and (await error_of(r))["details"][0]["field"] == "continue"
    r = await http.get(f"/api/v1/resourceclasses?limit=1&continue={token}", headers=headers("root"))
    assert r.status == 400  # a token of another list
    later = time.time() + ctx.settings.server.continue_ttl_seconds + 1
    monkeypatch.setattr(time, "time", lambda: later)  # the module paging reads the clock from
    r = await http.get(f"/api/v1/nodes?limit=1&continue={token}", headers=headers("root"))
    assert r.status == 400 and "expired" in (await error_of(r))["message"]
