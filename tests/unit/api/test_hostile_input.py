"""Hostile input is refused fast with a 4xx naming the field and what is allowed; the CLI exits 2."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from gpuyard.apis.decoding import MAX_DEPTH, DocumentLimitError, json_loads, yaml_load
from gpuyard.cli import main
from gpuyard.platform.api.app import make_app
from gpuyard.state.context import Context


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests()
    return await aiohttp_client(make_app(ctx)), ctx


async def test_an_unknown_phase_is_400_naming_phase_and_the_allowed_ones(client):
    http, _ = client
    resp = await asyncio.wait_for(http.get("/api/v1/jobs?phase=Bogus"), 1)
    assert resp.status == 400
    detail = (await resp.json())["error"]["details"][0]
    assert detail["field"] == "phase"
    assert "Running" in detail["reason"] and "Succeeded" in detail["reason"]
    assert (await http.get("/api/v1/jobs?phase=running")).status == 200


def test_get_jobs_with_an_unknown_phase_exits_2_naming_the_allowed_phases():
    result = CliRunner().invoke(main, ["get", "jobs", "--phase", "Bogus", "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "--phase" in result.output and "running" in result.output.lower()


# --- deep nesting and alias bombs in bodies -------------------------------------------------------

DEEP_JSON = "[" * 100_000 + "]" * 100_000
DEEP_JSON_OBJECT = '{"a":' * 100_000 + "1" + "}" * 100_000
DEEP_YAML_FLOW = "metadata:\n  name: " + "[" * 20_000 + "]" * 20_000
DEEP_YAML_BLOCK = "metadata:\n  labels:\n    " + "- " * 20_000 + "x\n"  # compact nested block sequences
# 8 levels of 9 aliases each: 1.3 KB that expands to 9**8 (43 million) scalars
ALIAS_BOMB = (
    "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata:\n  name: bomb\n  labels:\n"
    "    a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
)
TARGETS = [("post", "/api/v1/jobs"), ("post", "/api/v1/apply"), ("put", "/api/v1/quotas/x")]
LIMITS = {
    "/api/v1/jobs": "max_body_bytes",
    "/api/v1/apply": "max_body_bytes",
    "/api/v1/quotas/x": "max_object_body_bytes",
}


def stored(ctx) -> dict[str, int]:
    return {kind: len(ctx.store.list(kind)) for kind in ctx.store.kinds()}


@pytest.mark.parametrize("method,path", TARGETS)
@pytest.mark.parametrize(
    "body,content_type",
    [
        (DEEP_JSON, "application/json"),
        (DEEP_JSON_OBJECT, "application/json"),
        (DEEP_JSON, "application/yaml"),
        (DEEP_YAML_FLOW, "application/yaml"),
        (DEEP_YAML_BLOCK, "application/yaml"),
    ],
    ids=["json-array", "json-object", "json-as-yaml", "yaml-flow", "yaml-block"],
)
async def test_deep_nesting_is_422_naming_the_depth_limit(client, method, path, body, content_type):
    http, ctx = client
    before = stored(ctx)
    resp = await asyncio.wait_for(
        getattr(http, method)(path, data=body.encode(), headers={"Content-Type": content_type}), 1
    )
    assert resp.status == 422, await resp.text()
    error = (await resp.json())["error"]
    assert f"{MAX_DEPTH} levels" in error["message"]
    assert error["details"][0]["field"] == "<body>"
    assert stored(ctx) == before


@pytest.mark.parametrize("method,path", TARGETS)
async def test_an_alias_bomb_is_413_naming_the_expanded_size_limit(client, method, path):
    http, ctx = client
    assert len(ALIAS_BOMB) < 2048
    before = stored(ctx)
    loop = asyncio.get_running_loop()
    started = loop.time()
    resp = await asyncio.wait_for(
        getattr(http, method)(path, data=ALIAS_BOMB.encode(), headers={"Content-Type": "application/yaml"}), 1
    )
    assert loop.time() - started < 1
    assert resp.status == 413, await resp.text()
    error = (await resp.json())["error"]
    setting = LIMITS[path]
    limit = getattr(ctx.settings.server, setting)
    assert f"more than {limit} bytes" in error["message"]
    assert f"server.{setting}" in error["details"][0]["reason"]
    assert stored(ctx) == before


async def test_a_recursive_alias_is_refused(client):
    http, _ = client
    body = "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata:\n  name: r\n  labels: &a {x: *a}\n"
    resp = await asyncio.wait_for(
        http.post("/api/v1/jobs", data=body.encode(), headers={"Content-Type": "application/yaml"}), 1
    )
    assert resp.status == 422
    assert "itself" in (await resp.json())["error"]["message"]


def test_modest_aliases_and_nesting_still_load():
    doc = yaml_load("base: &b {image: x, env: [1, 2]}\nworker:\n  <<: *b\n  replicas: 2\nps: *b\n")
    assert doc["worker"] == {"image": "x", "env": [1, 2], "replicas": 2}
    assert doc["ps"] == {"image": "x", "env": [1, 2]}
    deep = "[" * MAX_DEPTH + "1" + "]" * MAX_DEPTH
    assert yaml_load(deep) is not None and json_loads(deep) is not None
    with pytest.raises(DocumentLimitError):
        json_loads("[" + deep + "]")
    with pytest.raises(DocumentLimitError):
        yaml_load("[" + deep + "]")


def test_the_cli_refuses_an_alias_bomb_with_exit_2(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    result = CliRunner().invoke(main, ["submit", str(path), "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "expands" in result.output
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
