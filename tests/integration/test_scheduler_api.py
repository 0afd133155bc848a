"""HTTP: ResourceClass CRUD with clear 422s, and the explain endpoint of a job."""

from __future__ import annotations

import pytest

from gpuyard.platform.api import app as app_module
from gpuyard.platform.api import scheduling
from gpuyard.platform.api.app import make_app
from gpuyard.state.context import Context
from tests.unit.scheduler.helpers import make_node, podgroup, role

K80 = """
apiVersion: gpuyard.io/v1alpha1
kind: ResourceClass
metadata: {name: nvidia.tesla.k80}
spec:
  selector:
    matchExpressions:
      - {key: product, operator: In, values: [Tesla-K80]}
"""


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests()
    app = make_app(ctx)
    if "gpuyard.platform.api.scheduling" not in app_module.ROUTE_MODULES:
        scheduling.setup(app)
    return await aiohttp_client(app), ctx


async def test_resource_class_crud(client):
    http, ctx = client
    r = await http.put(
        "/api/v1/resourceclasses/nvidia.tesla.k80", data=K80, headers={"Content-Type": "application/yaml"}
    )
    assert r.status == 201, await r.text()
    body = await r.json()
    assert body["spec"]["selector"]["matchExpressions"][0]["operator"] == "In"
    r = await http.get("/api/v1/resourceclasses")
    assert [c["metadata"]["name"] for c in (await r.json())["items"]] == ["nvidia.tesla.k80"]
    replaced = {"spec": {"selector": {"matchLabels": {"model": "k80"}}}}
    r = await http.put("/api/v1/resourceclasses/nvidia.tesla.k80", json=replaced)
    assert r.status == 200 and (await r.json())["spec"]["selector"]["matchLabels"] == {"model": "k80"}
    stale = {"metadata": {"resourceVersion": "1"}, **replaced}
    r = await http.put("/api/v1/resourceclasses/nvidia.tesla.k80", json=stale)
    assert r.status == 409
    r = await http.get("/api/v1/resourceclasses/nvidia.tesla.k80")
    assert r.status == 200
    r = await http.delete("/api/v1/resourceclasses/nvidia.tesla.k80")
    assert r.status == 200 and ctx.store.get("ResourceClass", "", "nvidia.tesla.k80") is None
    r = await http.get("/api/v1/resourceclasses/nvidia.tesla.k80")
    assert r.status == 404 and (await r.json())["error"]["code"] == 404


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (
            {
                "spec": {
                    "selector": {
                        "matchExpressions": [{"key": "model", "operator": "Like", "values": ["v100"]}]
                    }
                }
            },
            "spec.selector.matchExpressions[0].operator",
            "unknown operator 'Like'; allowed: In, NotIn, Exists, DoesNotExist, Gt, Lt",
        ),
        (
            {
                "spec": {
                    "selector": {"matchExpressions": [{"key": "memory", "operator": "Gt", "values": ["ten"]}]}
                }
            },
            "spec.selector.matchExpressions[0]",
            "operator Gt compares numbers; 'ten' is not a number (with an optional unit, e.g. 10Gi)",
        ),
        (
            {"metadata": {"name": "other"}, "spec": {}},
            "metadata.name",
            "'other' differs from the URL's 'big'",
        ),
        ({"kind": "Pod"}, "kind", "must be ResourceClass, got 'Pod'"),
    ],
)
async def test_bad_resource_classes_are_422_and_nothing_is_stored(client, body, field, reason):
    http, ctx = client
    r = await http.put("/api/v1/resourceclasses/big", json=body)
    assert r.status == 422
    err = (await r.json())["error"]
    assert err["details"] == [{"field": field, "reason": reason}]
    assert ctx.store.get("ResourceClass", "", "big") is None


async def test_malformed_body_is_400(client):
    http, _ = client
    r = await http.put(
        "/api/v1/resourceclasses/x", data="spec: [unclosed", headers={"Content-Type": "application/yaml"}
    )
    assert r.status == 400 and "malformed YAML" in (await r.json())["error"]["message"]


async def test_explain_shows_the_reason_and_the_reservations(client):
    http, ctx = client
    r = await http.get("/api/v1/namespaces/default/jobs/nope/explain")
    assert r.status == 404
    ctx.store.create(make_node("a", gpus=8))
    pg = podgroup("j", role(replicas=2, gpus=4))
    pg.status.reason = "Unschedulable"
    pg.status.message = "0/1 nodes have 4 free GPUs in one node; 1 node has 3"
    ctx.store.create(pg)
    r = await http.get("/api/v1/namespaces/default/jobs/j/explain")
    body = await r.json()
    assert (body["phase"], body["reason"], body["placed"], body["replicas"], body["minimum"]) == (
        "Pending",
        "Unschedulable",
        0,
        2,
        2,
    )
    assert body["message"].startswith("0/1 nodes have 4 free GPUs")
    assert body["reservations"] == []
