"""/metrics (L3): with tokens it needs an admin or metrics token, unless `server.metrics_public`;
per-tenant series (quota usage, queue depth) never reach a caller without one of those roles."""

from __future__ import annotations

import pytest

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quotakinds import ElasticQuota, Queue
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.auth import hash_token
from gpuyard.platform.cluster_metrics import register_cluster_metrics
from gpuyard.state.config import Settings
from gpuyard.state.context import Context

TOKENS = [
    {"sha256": hash_token("root"), "user": "root", "role": "admin"},
    {"sha256": hash_token("prom"), "user": "prometheus", "role": "metrics"},
    {"sha256": hash_token("alice"), "user": "alice", "role": "user", "namespaces": ["team-a"]},
]


def make(aiohttp_client, *, public: bool = False, tokens=TOKENS):
    settings = Settings(server={"tokens": tokens, "metrics_public": public}, backend={"data_dir": None})
    ctx = Context.for_tests(settings=settings)
    register_cluster_metrics(ctx.registry, ctx.store)
    ctx.store.create(
        ElasticQuota.model_validate(
            {"metadata": {"name": "team-b", "namespace": "team-b"}, "spec": {"max": {"nvidia.com/gpu": 16}}}
        )
    )
    ctx.store.create(Queue(metadata=ObjectMeta(name="team-b")))
    return aiohttp_client(make_app(ctx))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(("headers", "status"), [({}, 401), (bearer("alice"), 403), (bearer("bogus"), 401)])
async def test_metrics_need_an_admin_or_metrics_token(aiohttp_client, headers, status):
    client = await make(aiohttp_client)
    r = await client.get("/metrics", headers=headers)
    assert r.status == status
    assert "gpuyard_quota_resource" not in await r.text()


@pytest.mark.parametrize("token", ["root", "prom"])
async def test_admin_and_metrics_roles_see_tenant_series(aiohttp_client, token):
    client = await make(aiohttp_client)
    r = await client.get("/metrics", headers=bearer(token))
    assert r.status == 200
    text = await r.text()
    assert 'gpuyard_quota_resource{kind="max",quota="team-b"' in text
    assert 'gpuyard_queue_pending_jobs{queue="team-b"}' in text


@pytest.mark.parametrize("headers", [{}, bearer("alice")])
async def test_public_metrics_leave_out_tenant_series(aiohttp_client, headers):
    client = await make(aiohttp_client, public=True)
    r = await client.get("/metrics", headers=headers)
    assert r.status == 200
    text = await r.text()
    assert "team-b" not in text
    assert "gpuyard_gpus_total" in text or "gpuyard_store" in text or "gpuyard_preemptions" in text


async def test_the_metrics_role_may_only_scrape(aiohttp_client):
    client = await make(aiohttp_client)
    r = await client.get("/api/v1/jobs", headers=bearer("prom"))
    assert r.status == 403
    assert "metrics role" in (await r.json())["error"]["message"]


async def test_without_tokens_metrics_stay_open(aiohttp_client):
    client = await make(aiohttp_client, tokens=[])
    r = await client.get("/metrics")
    assert r.status == 200 and "team-b" in await r.text()


def test_the_prometheus_config_for_tokens_sends_a_bearer_token():
    from pathlib import Path

    import yaml

    config = yaml.safe_load(
        (Path(__file__).parents[3] / "configs/prometheus/prometheus-tokens.yml").read_text()
    )
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]
