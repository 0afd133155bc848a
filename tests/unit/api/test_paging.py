"""Pagination over list endpoints: limit, continue, bad tokens."""

from __future__ import annotations

import pytest

from gpuyard.platform.api.app import make_app
from gpuyard.state.context import Context
from tests.builders import make_node


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests()
    for i in range(7):
        ctx.store.create(make_node(f"n{i}", labels={"even": str(i % 2 == 0).lower()}))
    return await aiohttp_client(make_app(ctx)), ctx


async def test_pages_cover_everything_once(client):
    http, ctx = client
    names, token, pages = [], None, 0
    while True:
        url = "/api/v1/nodes?limit=3" + (f"&continue={token}" if token else "")
        body = await (await http.get(url)).json()
        names += [n["metadata"]["name"] for n in body["items"]]
        pages += 1
        token = body["metadata"]["continue"]
        if token is None:
            break
        ctx.store.create(make_node(f"a-late{pages}"))  # sorts before the cursor: not returned twice
    assert names == [f"n{i}" for i in range(7)] and pages == 3


async def test_label_selector_filters(client):
    http, _ = client
    body = await (await http.get("/api/v1/nodes?labelSelector=even%3Dtrue")).json()
    assert [n["metadata"]["name"] for n in body["items"]] == ["n0", "n2", "n4", "n6"]


@pytest.mark.parametrize(
    ("query", "status", "field"),
    [
        ("limit=0", 422, "limit"),
        ("limit=x", 422, "limit"),
        ("continue=%%%", 400, "continue"),
        ("continue=bm90anNvbg", 400, "continue"),
    ],
)
async def test_bad_paging_parameters(client, query, status, field):
    http, _ = client
    r = await http.get(f"/api/v1/nodes?{query}")
    assert r.status == status
    assert (await r.json())["error"]["details"][0]["field"] == field


async def test_oversize_body_is_413_in_the_error_shape(aiohttp_client):
    from gpuyard.state.config import Settings

    ctx = Context.for_tests(settings=Settings(server={"max_body_bytes": 2048}, backend={"data_dir": None}))
    http = await aiohttp_client(make_app(ctx))
    before = ctx.store.resource_version
    r = await http.post("/api/v1/jobs", data=b"x" * 10_000, headers={"Content-Type": "application/yaml"})
    assert r.status == 413
    body = await r.json()
    assert body["error"]["code"] == 413 and "2048" in body["error"]["message"]
    assert ctx.store.resource_version == before


JOB = """apiVersion: kubeflow.org/v1
kind: {kind}
metadata: {{name: {name}, namespace: {ns}}}
spec:
  {specs}:
    {role}:
      replicas: 1
      template:
        spec:
          containers: [{{name: main, image: x, resources: {{limits: {{cpu: 1}}}}}}]
"""
KINDS = [("PyTorchJob", "pytorchReplicaSpecs", "Master"), ("TFJob", "tfReplicaSpecs", "Worker")]


async def test_job_pages_come_in_namespace_and_name_order_across_kinds_each_job_once(aiohttp_client):
    ctx = Context.for_tests()
    http = await aiohttp_client(make_app(ctx))
    # written in an order that is neither name nor kind order
    wanted = [(f"team-{i % 3}", f"j{(i * 7) % 20:02d}") for i in range(20)]
    docs = [
        JOB.format(kind=KINDS[i % 2][0], specs=KINDS[i % 2][1], role=KINDS[i % 2][2], ns=ns, name=name)
        for i, (ns, name) in enumerate(wanted)
    ]
    r = await http.post("/api/v1/jobs", data="---\n".join(docs), headers={"Content-Type": "application/yaml"})
    assert r.status == 201, await r.text()
    seen, token, pages, expected = [], None, 0, list(wanted)
    while True:
        url = "/api/v1/jobs?limit=6" + (f"&continue={token}" if token else "")
        body = await (await http.get(url)).json()
        seen += [(j["metadata"]["namespace"], j["metadata"]["name"]) for j in body["items"]]
        token = body["metadata"]["continue"]
        if token is None:
            break
        pages += 1
        if pages == 1:  # between pages: one job before the cursor and one after come, one after goes
            late = [("team-0", "a-late"), ("team-2", "z-late")]
            for ns, name in late:
                doc = JOB.format(kind="TFJob", specs="tfReplicaSpecs", role="Worker", ns=ns, name=name)
                r = await http.post("/api/v1/jobs", data=doc, headers={"Content-Type": "application/yaml"})
                assert r.status == 201, await r.text()
            gone = max(expected)
            r = await http.delete(f"/api/v1/namespaces/{gone[0]}/jobs/{gone[1]}")
            assert r.status == 200, await r.text()
            expected = [k for k in expected if k != gone] + [("team-2", "z-late")]
    assert seen == sorted(expected)
    body = await (await http.get("/api/v1/jobs?limit=3&namespace=team-1&kind=TFJob")).json()
    tf_team1 = sorted(k for i, k in enumerate(wanted) if i % 2 == 1 and k[0] == "team-1" and k != gone)
    assert [(j["metadata"]["namespace"], j["metadata"]["name"]) for j in body["items"]] == tf_team1[:3]
    assert (body["metadata"]["continue"] is not None) == (len(tf_team1) > 3)
