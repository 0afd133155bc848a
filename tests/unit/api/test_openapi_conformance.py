"""The OpenAPI document says what the routes do: 201 on PUT, 400 for a bad `continue`, a bounded
`limit`, one parameter per name, 3.0-dialect schemas, job bodies from the models, `Allow` on 405."""

from __future__ import annotations

import pytest

from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.openapi import build_document, openapi30
from gpuyard.platform.api.paging import MAX_LIMIT
from gpuyard.state.context import Context


@pytest.fixture(scope="module")
def doc():
    return build_document(make_app(Context.for_tests()))


def _operations(doc):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield path, method, op


def test_every_put_documents_201_created(doc):
    puts = [(path, op) for path, method, op in _operations(doc) if method == "put"]
    assert puts
    for path, op in puts:
        assert "201" in op["responses"] and "200" in op["responses"], path


def test_every_list_with_continue_documents_400_and_bounds_limit(doc):
    paged = 0
    for path, _method, op in _operations(doc):
        params = {p["name"]: p for p in op.get("parameters", [])}
        if "continue" in params:
            paged += 1
            assert "400" in op["responses"], path
            limit = params["limit"]["schema"]
            assert limit == {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 500}, path
    assert paged >= 9  # jobs, job pods/events, nodes, node events, queues, quotas, resourcequotas, ...


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs",
        "/api/v1/queues",
        "/api/v1/resourceclasses",
        "/api/v1/nodes/{name}/events",
        "/api/v1/usage/nodes",
    ],
)
def test_these_lists_page(doc, path):
    names = {p["name"] for p in doc["paths"][path]["get"].get("parameters", [])}
    assert {"limit", "continue"} <= names


def test_no_parameter_is_declared_twice(doc):
    for path, method, op in _operations(doc):
        keys = [(p["name"], p["in"]) for p in op.get("parameters", [])]
        assert len(keys) == len(set(keys)), (path, method, keys)


def test_schemas_use_the_openapi_30_dialect(doc):
    def walk(node, where):
        if isinstance(node, dict):
            for bound in ("exclusiveMinimum", "exclusiveMaximum"):
                if bound in node:
                    assert isinstance(node[bound], bool), where
            assert node.get("type") != "null", where
            assert "const" not in node, where
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(doc, "doc")
    queue_spec = doc["components"]["schemas"]["QueueSpec"]["properties"]["weight"]
    assert queue_spec["minimum"] == 0 and queue_spec["exclusiveMinimum"] is True


def test_openapi30_rewrites_nullable_and_exclusive_bounds():
    schema = {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}], "default": None}
    assert openapi30(schema) == {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "nullable": True,
        "default": None,
    }


def test_job_bodies_are_described_by_the_models(doc):
    body = doc["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    refs = [o["$ref"].rsplit("/", 1)[-1] for o in body["oneOf"]]
    assert "PyTorchJobDocument" in refs and "TFJobDocument" in refs
    tf = doc["components"]["schemas"]["TFJobDocument"]
    assert tf["properties"]["kind"]["enum"] == ["TFJob"]
    assert set(tf["properties"]["apiVersion"]["enum"]) == {"kubeflow.org/v1", "training.kubedl.io/v1alpha1"}
    assert "status" not in tf["properties"]
    spec = doc["components"]["schemas"][tf["properties"]["spec"]["$ref"].rsplit("/", 1)[-1]]
    assert "tfReplicaSpecs" in spec["properties"]
    assert doc["paths"]["/api/v1/jobs"]["post"]["responses"].keys() >= {"201", "422"}


async def test_405_names_the_allowed_methods(aiohttp_client):
    client = await aiohttp_client(make_app(Context.for_tests()))
    r = await client.patch("/api/v1/queues")
    assert r.status == 405
    assert "GET" in r.headers["Allow"]
    assert (await r.json())["error"]["code"] == 405
