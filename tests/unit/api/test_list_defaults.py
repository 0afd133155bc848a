"""Every list pages by default: 500 items and a continue token, even without `limit`."""

from __future__ import annotations

import pytest

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quotakinds import Queue
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.paging import DEFAULT_LIMIT
from gpuyard.state.context import Context
from tests.builders import make_node

JOB = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: j{i:04d}, namespace: team-a}}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers: [{{name: pytorch, image: x, resources: {{limits: {{cpu: 1}}}}}}]
"""


@pytest.fixture
async def http(aiohttp_client):
    ctx = Context.for_tests()
    client = await aiohttp_client(make_app(ctx))
    body = "---\n".join(JOB.format(i=i) for i in range(DEFAULT_LIMIT + 20))
    r = await client.post("/api/v1/jobs", data=body, headers={"Content-Type": "application/yaml"})
    assert r.status == 201, await r.text()
    for i in range(DEFAULT_LIMIT + 3):
        ctx.store.create(make_node(f"n{i:04d}"))
        ctx.store.create(Queue(metadata=ObjectMeta(name=f"q{i:04d}")))
    return client


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/nodes", "/api/v1/queues", "/api/v1/usage/nodes"])
async def test_a_list_without_limit_answers_one_default_page(http, path):
    body = await (await http.get(path)).json()
    assert len(body["items"]) == DEFAULT_LIMIT
    token = body["metadata"]["continue"]
    assert token
    rest = await (await http.get(path, params={"continue": token})).json()
    assert rest["items"] and rest["metadata"]["continue"] is None
    names = [i["metadata"]["name"] if "metadata" in i else i["name"] for i in body["items"] + rest["items"]]
    assert len(names) == len(set(names))


async def test_jobs_list_rejects_a_bad_continue_with_400(http):
    r = await http.get("/api/v1/jobs", params={"continue": "%%%"})
    assert r.status == 400
    assert (await r.json())["error"]["details"][0]["field"] == "continue"


async def test_jobs_list_bounds_limit(http):
    assert (await http.get("/api/v1/jobs", params={"limit": "5001"})).status == 422
    body = await (await http.get("/api/v1/jobs", params={"limit": "7"})).json()
    assert len(body["items"]) == 7
