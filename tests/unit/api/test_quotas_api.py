"""The quota HTTP API: ElasticQuota / Queue / ResourceQuota CRUD, `apply`, 422s naming the object
and field with nothing stored, children-protected deletes, status kept on replace, and roles."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
import yaml
from aiohttp import web

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import PodGroup
from gpuyard.platform.api import app as app_module
from gpuyard.platform.api import quotas
from gpuyard.state.context import Context
from tests.unit.api.test_dashboard import bearer, make_ctx

ROOT = {**bearer("root"), "Content-Type": "application/yaml"}  # the content type of every write body here
GPU = "nvidia.com/gpu"


def build_app(ctx: Context) -> web.Application:
    app = app_module.make_app(ctx)
    if "gpuyard.platform.api.quotas" not in app_module.ROUTE_MODULES:
        quotas.setup(app)
    return app


def quota(
    name: str,
    *,
    gmin: int,
    gmax: int,
    parent: str | None = None,
    is_parent: bool = False,
    namespace: str | None = None,
) -> dict[str, Any]:
    labels = {}
    if parent:
        labels["quota.scheduling.koordinator.sh/parent"] = parent
    if is_parent:
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": meta,
        "spec": {"min": {GPU: str(gmin)}, "max": {GPU: str(gmax)}},
    }


@pytest.fixture
def ctx() -> Context:
    return make_ctx()


@pytest.fixture
async def client(aiohttp_client, ctx):
    return await aiohttp_client(build_app(ctx))


def names(ctx: Context, kind: str) -> list[str]:
    return [o.metadata.name for o in ctx.store.list(kind)]


async def put_yaml(client, path: str, doc: Any, headers=ROOT):
    return await client.put(
        path, data=yaml.safe_dump(doc), headers={**headers, "Content-Type": "application/yaml"}
    )


async def test_quota_crud_keeps_status_and_namespace(client, ctx) -> None:
    r = await put_yaml(client, "/api/v1/quotas/org", quota("org", gmin=40, gmax=64, is_parent=True))
    assert r.status == 201, await r.text()
    r = await client.put(
        "/api/v1/quotas/team-a",
        data=json.dumps(quota("team-a", gmin=24, gmax=64, parent="org", namespace="team-a")),
        headers=ROOT,
    )
    assert r.status == 201, await r.text()
    assert (await r.json())["metadata"]["namespace"] == "team-a"
    # the scheduler writes a status; a replace keeps it (and the namespace it lives in)
    stored = ctx.store.get("ElasticQuota", "team-a", "team-a").clone()
    stored.status.used = {GPU: Decimal(8)}
    ctx.store.update(stored)
    r = await put_yaml(client, "/api/v1/quotas/team-a", quota("team-a", gmin=30, gmax=64, parent="org"))
    assert r.status == 200, await r.text()
    body = await r.json()
    assert body["spec"]["min"][GPU] == "30"
    assert body["status"]["used"][GPU] == "8"
    assert body["metadata"]["namespace"] == "team-a"
    r = await client.get("/api/v1/quotas/team-a", headers=ROOT)
    assert (await r.json())["spec"]["min"][GPU] == "30"
    r = await client.get("/api/v1/quotas", headers=ROOT)
    names = [i["metadata"]["name"] for i in (await r.json())["items"]]
    assert names == ["org", "team-a", "koordinator-default-quota"]  # the default: implicit
    assert (await client.get("/api/v1/quotas/nope", headers=ROOT)).status == 404


async def test_bad_quota_is_422_naming_object_and_field_and_tree_is_unchanged(client, ctx) -> None:
    await put_yaml(client, "/api/v1/quotas/org", quota("org", gmin=40, gmax=64, is_parent=True))
    await put_yaml(client, "/api/v1/quotas/team-a", quota("team-a", gmin=24, gmax=64, parent="org"))
    before = [q.to_dict() for q in ctx.store.list("ElasticQuota")]
    cases = [
        (quota("team-b", gmin=24, gmax=64, parent="org"), "spec.min.nvidia.com/gpu", "children's min"),
        (quota("team-b", gmin=8, gmax=4), "spec.max.nvidia.com/gpu", "less than min"),
        (quota("team-b", gmin=1, gmax=4, parent="ghost"), "metadata.labels.", "unknown parent"),
        (
            quota("team-a", gmin=1, gmax=4, parent="org", namespace="elsewhere"),
            "metadata.name",
            "cluster-wide",
        ),
    ]
    for doc, field, reason in cases:
        name = doc["metadata"]["name"]
        r = await put_yaml(client, f"/api/v1/quotas/{name}", doc)
        assert r.status == 422, (doc, await r.text())
        details = (await r.json())["error"]["details"]
        assert any(
            d["field"].startswith(field) and reason in d["reason"] and d["object"] == f"ElasticQuota/{name}"
            for d in details
        ), details
    r = await put_yaml(client, "/api/v1/quotas/x", {**quota("y", gmin=1, gmax=2)})
    assert r.status == 422
    assert (await r.json())["error"]["details"][0]["field"] == "metadata.name"
    r = await put_yaml(client, "/api/v1/quotas/x", {"kind": "Queue", "metadata": {"name": "x"}})
    assert (await r.json())["error"]["details"][0]["field"] == "kind"
    r = await client.put("/api/v1/quotas/x", data=b"{not json", headers=ROOT)
    assert r.status == 400
    assert [q.to_dict() for q in ctx.store.list("ElasticQuota")] == before


async def test_delete_refuses_a_quota_with_children(client, ctx) -> None:
    await put_yaml(client, "/api/v1/quotas/org", quota("org", gmin=40, gmax=64, is_parent=True))
    await put_yaml(client, "/api/v1/quotas/team-a", quota("team-a", gmin=24, gmax=64, parent="org"))
    r = await client.delete("/api/v1/quotas/org", headers=ROOT)
    assert r.status == 409
    assert "team-a" in (await r.json())["error"]["details"][0]["reason"]
    assert names(ctx, "ElasticQuota") == ["org", "team-a"]
    assert (await client.delete("/api/v1/quotas/team-a", headers=ROOT)).status == 200
    assert (await client.delete("/api/v1/quotas/org", headers=ROOT)).status == 200
    assert names(ctx, "ElasticQuota") == []
    assert (await client.delete("/api/v1/quotas/org", headers=ROOT)).status == 404


async def test_queue_crud_and_validation(client, ctx) -> None:
    doc = {"kind": "Queue", "metadata": {"name": "team-a"}, "spec": {"weight": 2}}
    r = await put_yaml(client, "/api/v1/queues/team-a", doc)
    assert r.status == 201, await r.text()
    r = await put_yaml(
        client, "/api/v1/queues/team-a", {**doc, "spec": {"weight": 3, "queueingStrategy": "StrictFIFO"}}
    )
    assert r.status == 200
    assert (await (await client.get("/api/v1/queues/team-a", headers=ROOT)).json())["spec"]["weight"] == 3
    for spec, field in (
        ({"weight": 0}, "spec.weight"),
        ({"queueingStrategy": "LIFO"}, "spec.queueingStrategy"),
        ({"wieght": 1}, "spec.wieght"),
    ):
        r = await put_yaml(client, "/api/v1/queues/team-a", {**doc, "spec": spec})
        assert r.status == 422, spec
        assert [d["field"] for d in (await r.json())["error"]["details"]] == [field]
    assert ctx.store.get("Queue", "", "team-a").spec.weight == 3
    r = await client.get("/api/v1/queues", headers=ROOT)
    items = (await r.json())["items"]
    assert [i["metadata"]["name"] for i in items] == ["team-a", "team-b"]  # team-b: implicit
    assert "gpuyard.io/implicit" not in items[0]["metadata"].get("annotations", {})
    assert (await client.delete("/api/v1/queues/team-a", headers=ROOT)).status == 200
    r = await client.get("/api/v1/queues/team-a", headers=ROOT)  # its job still names it
    assert (await r.json())["metadata"]["annotations"] == {"gpuyard.io/implicit": "true"}
    assert (await client.delete("/api/v1/queues/team-a", headers=ROOT)).status == 404
    r = await client.get("/api/v1/queues/nobody", headers=ROOT)
    assert r.status == 404 and "no job names it" in (await r.json())["error"]["message"]


async def test_queues_jobs_use_are_listed_implicitly_with_their_counts(client, ctx) -> None:
    """make_ctx has one job in team-a and one in team-b, neither started; no Queue object."""
    team_b = next(iter(ctx.store.list("TFJob", namespace="team-b")))
    group = PodGroup(metadata=ObjectMeta(name=team_b.metadata.name, namespace="team-b"))
    group.status.phase = "Placed"
    ctx.store.create(group)
    r = await client.get("/api/v1/queues", headers=ROOT)
    assert r.status == 200
    items = (await r.json())["items"]
    assert [(i["metadata"]["name"], i["metadata"]["annotations"], i["status"]) for i in items] == [
        ("team-a", {"gpuyard.io/implicit": "true"}, {"pending": 1, "running": 0}),
        ("team-b", {"gpuyard.io/implicit": "true"}, {"pending": 0, "running": 1}),
    ]
    assert items[0]["spec"]["weight"] == 1 and items[0]["spec"]["queueingStrategy"] == "BestEffortFIFO"
    r = await client.get("/api/v1/queues/team-b", headers=ROOT)
    assert r.status == 200 and (await r.json())["status"] == {"pending": 0, "running": 1}
    # a caller sees the implicit queues of its own namespaces only
    r = await client.get("/api/v1/queues", headers=bearer("vic"))
    assert [i["metadata"]["name"] for i in (await r.json())["items"]] == ["team-a"]
    assert (await client.get("/api/v1/queues/team-b", headers=bearer("vic"))).status == 404
    # paging covers them too
    r = await client.get("/api/v1/queues?limit=1", headers=ROOT)
    body = await r.json()
    assert [i["metadata"]["name"] for i in body["items"]] == ["team-a"]
    r = await client.get(f"/api/v1/queues?limit=1&continue={body['metadata']['continue']}", headers=ROOT)
    assert [i["metadata"]["name"] for i in (await r.json())["items"]] == ["team-b"]


async def test_resource_quota_crud_and_namespace_filter(client, ctx) -> None:
    rq = {
        "kind": "ResourceQuota",
        "apiVersion": "v1",
        "metadata": {"name": "gpus"},
        "spec": {"hard": {GPU: "16"}},
    }
    for ns in ("team-a", "team-b"):
        r = await put_yaml(client, f"/api/v1/namespaces/{ns}/resourcequotas/gpus", rq)
        assert r.status == 201, await r.text()
    r = await put_yaml(
        client, "/api/v1/namespaces/team-a/resourcequotas/gpus", {**rq, "spec": {"hard": {GPU: "1.5"}}}
    )
    assert r.status == 422
    assert (await r.json())["error"]["details"][0]["field"] == f"spec.hard.{GPU}"
    r = await put_yaml(
        client,
        "/api/v1/namespaces/team-a/resourcequotas/gpus",
        {**rq, "metadata": {"name": "gpus", "namespace": "team-b"}},
    )
    assert r.status == 422
    assert (await r.json())["error"]["details"][0]["field"] == "metadata.namespace"
    r = await client.get("/api/v1/resourcequotas", headers=ROOT)
    assert [i["metadata"]["namespace"] for i in (await r.json())["items"]] == ["team-a", "team-b"]
    r = await client.get("/api/v1/resourcequotas", headers=bearer("alice"))
    assert [i["metadata"]["namespace"] for i in (await r.json())["items"]] == ["team-a"]
    assert (
        await client.get("/api/v1/namespaces/team-b/resourcequotas/gpus", headers=bearer("alice"))
    ).status == 403
    r = await client.get("/api/v1/namespaces/team-a/resourcequotas/gpus", headers=bearer("alice"))
    assert (await r.json())["spec"]["hard"][GPU] == "16"
    assert (await client.delete("/api/v1/namespaces/team-b/resourcequotas/gpus", headers=ROOT)).status == 200
    assert [(o.metadata.namespace) for o in ctx.store.list("ResourceQuota")] == ["team-a"]


async def test_roles(client, ctx) -> None:
    doc = quota("org", gmin=1, gmax=2)
    assert (await put_yaml(client, "/api/v1/quotas/org", doc, headers={})).status == 401
    assert (await put_yaml(client, "/api/v1/quotas/org", doc, headers=bearer("nobody"))).status == 401
    for who in ("alice", "vic"):
        assert (await put_yaml(client, "/api/v1/quotas/org", doc, headers=bearer(who))).status == 403
        r = await client.post("/api/v1/apply", data=yaml.safe_dump(doc), headers=bearer(who))
        assert r.status == 403
    assert names(ctx, "ElasticQuota") == []
    assert (await put_yaml(client, "/api/v1/quotas/org", doc)).status == 201
    assert (await client.get("/api/v1/quotas", headers={})).status == 401
    assert (await client.get("/api/v1/quotas", headers=bearer("vic"))).status == 200
    assert (await client.get("/api/v1/queues", headers=bearer("vic"))).status == 200
    assert (await client.delete("/api/v1/quotas/org", headers=bearer("alice"))).status == 403
    assert names(ctx, "ElasticQuota") == ["org"]


def file_text(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(docs)


async def test_apply_is_all_or_nothing(client, ctx) -> None:
    # the child comes before its parent: the file is checked as one tree
    good = [
        quota("team-a", gmin=24, gmax=52, parent="org"),
        quota("org", gmin=48, gmax=52, is_parent=True),
        {"kind": "Queue", "apiVersion": "gpuyard.io/v1alpha1", "metadata": {"name": "team-a"}},
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": "team-a"},
            "spec": {"hard": {GPU: "8"}},
        },
        {
            "kind": "ResourceClass",
            "metadata": {"name": "fast"},
            "spec": {"selector": {"matchLabels": {"gpuyard.io/gpu-model": "a100"}}},
        },
    ]
    bad = [*good, quota("team-b", gmin=30, gmax=52, parent="org")]  # 24 + 30 > 48
    r = await client.post("/api/v1/apply", data=file_text(*bad), headers=ROOT)
    assert r.status == 422, await r.text()
    details = (await r.json())["error"]["details"]
    assert any(
        d["field"] == f"documents[5].spec.min.{GPU}" and d["object"] == "ElasticQuota/team-b" for d in details
    ), details
    for kind in ("ElasticQuota", "Queue", "ResourceQuota"):
        assert names(ctx, kind) == []
    assert ctx.store.get("ResourceClass", "", "fast") is None
    r = await client.post("/api/v1/apply", data=file_text(*good), headers=ROOT)
    assert r.status == 200, await r.text()
    applied = (await r.json())["applied"]
    assert {(a["kind"], a["name"], a["action"]) for a in applied} == {
        ("ElasticQuota", "team-a", "created"),
        ("ElasticQuota", "org", "created"),
        ("Queue", "team-a", "created"),
        ("ResourceQuota", "gpus", "created"),
        ("ResourceClass", "fast", "created"),
    }
    assert names(ctx, "ElasticQuota") == ["org", "team-a"]
    r = await client.post("/api/v1/apply", data=file_text(*good), headers=ROOT)
    assert {a["action"] for a in (await r.json())["applied"]} == {"unchanged"}


async def test_apply_reports_every_bad_document(client, ctx) -> None:
    docs = [
        {"kind": "Pod", "metadata": {"name": "p"}},
        {"kind": "Queue", "metadata": {"name": "q"}, "spec": {"weight": -1}},
        {
            "kind": "ResourceClass",
            "metadata": {"name": "rc"},
            "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
        },
        {"kind": "Queue", "metadata": {"name": "ok"}},
        {"kind": "Queue", "metadata": {"name": "ok"}},
    ]
    r = await client.post("/api/v1/apply", data=file_text(*docs), headers=ROOT)
    assert r.status == 422
    fields = [d["field"] for d in (await r.json())["error"]["details"]]
    assert fields[0] == "documents[0].kind"
    assert "documents[1].spec.weight" in fields
    assert any(f.startswith("documents[2].spec") for f in fields), fields
    assert fields[-1] == "documents[4].metadata.name"
    assert names(ctx, "Queue") == []
    r = await client.post("/api/v1/apply", data=b"", headers=ROOT)
    assert r.status == 422
    r = await client.post("/api/v1/apply", data=b"a: [", headers=ROOT)
    assert r.status == 400


async def test_demo_file_applies(client, ctx) -> None:
    from pathlib import Path

    text = (Path(__file__).parents[3] / "configs" / "quotas" / "demo-teams.yaml").read_text()
    r = await client.post("/api/v1/apply", data=text, headers=ROOT)
    assert r.status == 200, await r.text()
    assert names(ctx, "ElasticQuota") == ["team-a", "team-b"]
    assert names(ctx, "Queue") == ["team-a", "team-b"]


async def test_every_quota_route_is_documented(client) -> None:
    from gpuyard.platform.api.openapi import _path_of

    routes = [
        r
        for r in client.app.router.routes()
        if _path_of(r.resource).startswith(("/api/v1/quotas", "/api/v1/queues", "/api/v1/apply"))
        or "resourcequotas" in _path_of(r.resource)
    ]
    assert len([r for r in routes if r.method != "HEAD"]) == 13
    assert all(hasattr(r.handler, "__openapi__") for r in routes if r.method != "HEAD")
    doc = await (await client.get("/api/v1/openapi.json", headers=ROOT)).json()
    assert set(doc["paths"]["/api/v1/quotas/{name}"]) == {"get", "put", "delete"}
    assert "ElasticQuota" in doc["components"]["schemas"]


async def test_the_implicit_default_quota_is_got_and_listed_until_stored(client, ctx) -> None:
    """No quota stored: no default quota shown. Once one is, `koordinator-default-quota` is
    listed and got by name (implicit); once stored, only the stored one is shown."""
    r = await client.get("/api/v1/quotas/koordinator-default-quota", headers=ROOT)
    assert r.status == 404
    assert (
        await client.put(
            "/api/v1/quotas/team-a", data=json.dumps(quota("team-a", gmin=4, gmax=8)), headers=ROOT
        )
    ).status == 201
    r = await client.get("/api/v1/quotas/koordinator-default-quota", headers=ROOT)
    assert r.status == 200
    body = await r.json()
    assert body["metadata"]["annotations"] == {"gpuyard.io/implicit": "true"}
    names = [
        i["metadata"]["name"]
        for i in (await (await client.get("/api/v1/quotas", headers=ROOT)).json())["items"]
    ]
    assert names == ["team-a", "koordinator-default-quota"]
    stored = quota("koordinator-default-quota", gmin=0, gmax=16)
    assert (
        await client.put("/api/v1/quotas/koordinator-default-quota", data=json.dumps(stored), headers=ROOT)
    ).status == 201
    items = (await (await client.get("/api/v1/quotas", headers=ROOT)).json())["items"]
    default = [i for i in items if i["metadata"]["name"] == "koordinator-default-quota"]
    assert len(default) == 1 and "gpuyard.io/implicit" not in (
        default[0]["metadata"].get("annotations") or {}
    )
