"""Preemption policy objects over HTTP: PodDisruptionBudgets through `POST /api/v1/apply` and
their listing, and the Queue's preemption fields — bad input is a 422 naming the field, with
nothing stored."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.state.context import Context
from tests.unit.api.test_dashboard import make_ctx
from tests.unit.api.test_quotas_api import ROOT, build_app, file_text, names


@pytest.fixture
def ctx() -> Context:
    return make_ctx()


@pytest.fixture
async def client(aiohttp_client, ctx):
    return await aiohttp_client(build_app(ctx))


def pdb(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"selector": {"matchLabels": {"app": "serving"}}, **spec},
    }


async def test_a_budget_is_applied_and_listed(client, ctx) -> None:
    r = await client.post("/api/v1/apply", data=file_text(pdb("serving", minAvailable="50%")), headers=ROOT)
    assert r.status == 200, await r.text()
    assert (await r.json())["applied"] == [
        {"kind": "PodDisruptionBudget", "namespace": "team-a", "name": "serving", "action": "created"}
    ]
    r = await client.get("/api/v1/poddisruptionbudgets?namespace=team-a", headers=ROOT)
    assert r.status == 200
    items = (await r.json())["items"]
    assert [i["metadata"]["name"] for i in items] == ["serving"]
    assert items[0]["spec"]["minAvailable"] == "50%"
    r = await client.get("/api/v1/namespaces/team-a/poddisruptionbudgets/serving", headers=ROOT)
    assert r.status == 200
    r = await client.get("/api/v1/namespaces/team-a/poddisruptionbudgets/nope", headers=ROOT)
    assert r.status == 404


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"minAvailable": 1, "maxUnavailable": 1}, "documents[0].spec", "minAvailable and maxUnavailable"),
        ({"maxUnavailable": "150%"}, "documents[0].spec.maxUnavailable", "percentage"),
        ({"minAvailable": -1}, "documents[0].spec.minAvailable", "negative"),
    ],
)
async def test_a_bad_budget_is_refused_naming_the_field(client, ctx, spec, field, words) -> None:
    r = await client.post("/api/v1/apply", data=file_text(pdb("bad", **spec)), headers=ROOT)
    assert r.status == 422
    details = (await r.json())["error"]["details"]
    assert any(d["field"] == field and words in d["reason"] for d in details), details
    assert names(ctx, "PodDisruptionBudget") == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"preemptMinRuntime": "-5m"}, "documents[0].spec.preemptMinRuntime"),
        ({"preemptMinRuntime": "soon"}, "documents[0].spec.preemptMinRuntime"),
        ({"preemptionPolicy": "Sometimes"}, "documents[0].spec.preemptionPolicy"),
    ],
)
async def test_bad_queue_preemption_fields_are_refused_naming_the_field(client, ctx, spec, field) -> None:
    queue = {"apiVersion": "gpuyard.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"}, "spec": spec}
    r = await client.post("/api/v1/apply", data=file_text(queue), headers=ROOT)
    assert r.status == 422
    details = (await r.json())["error"]["details"]
    assert any(d["field"] == field for d in details), details
    assert names(ctx, "Queue") == []


async def test_queue_preemption_fields_are_stored(client, ctx) -> None:
    spec = {"preemptMinRuntime": "30m", "preemptionPolicy": "LowerOrNewerEqualPriority"}
    queue = {"apiVersion": "gpuyard.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"}, "spec": spec}
    r = await client.post("/api/v1/apply", data=file_text(queue), headers=ROOT)
    assert r.status == 200, await r.text()
    stored = ctx.store.must_get("Queue", "", "q")
    assert stored.spec.min_runtime_seconds() == 1800
    assert stored.spec.preemption_policy == "LowerOrNewerEqualPriority"
