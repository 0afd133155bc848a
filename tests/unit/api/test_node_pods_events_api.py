"""`GET /api/v1/nodes/{name}/pods` and `/events`: what the dashboard's node page shows."""

from __future__ import annotations

from gpuyard.apis.core import Event
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from tests.builders import make_pod
from tests.unit.api.test_dashboard import bearer, build_app, make_ctx


def _ctx():  # type: ignore[no-untyped-def]
    ctx = make_ctx()
    store = ctx.store
    store.create(
        make_pod("big-worker-0", namespace="team-a", node="dgx-0", gpus=4, labels={LABEL_JOB_NAME: "big"})
    )
    store.create(
        make_pod("small-worker-0", namespace="team-b", node="dgx-0", labels={LABEL_JOB_NAME: "small"})
    )
    store.create(make_pod("elsewhere", namespace="team-a", node="dgx-1"))
    store.create(
        Event(
            metadata=ObjectMeta(name="dgx-0.notready", namespace="default"),
            involved_object={"kind": "Node", "name": "dgx-0"},
            reason="NodeNotReady",
            message="node dgx-0 stopped reporting",
            type="Warning",
        )
    )
    store.create(
        Event(
            metadata=ObjectMeta(name="big.placed", namespace="team-a"),
            involved_object={"kind": "PyTorchJob", "name": "dgx-0"},  # same name, not a node
            reason="Placed",
        )
    )
    return ctx


async def test_node_pods_lists_the_pods_bound_to_the_node_with_their_job(aiohttp_client) -> None:
    client = await aiohttp_client(build_app(_ctx()))
    r = await client.get("/api/v1/nodes/dgx-0/pods", headers=bearer("root"))
    assert r.status == 200
    items = (await r.json())["items"]
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in items] == [
        ("team-a", "big-worker-0"),
        ("team-b", "small-worker-0"),
    ]
    assert items[0]["summary"]["job"] == "team-a/big" and items[0]["summary"]["node"] == "dgx-0"
    # a tenant sees its own namespaces' pods; another tenant's pod is only counted, as `other`
    r = await client.get("/api/v1/nodes/dgx-0/pods", headers=bearer("alice"))
    items = (await r.json())["items"]
    assert [p["metadata"]["name"] for p in items] == ["big-worker-0", "other"]
    assert items[1]["summary"]["job"] == "other" and "small" not in str(items[1])
    assert (await (await client.get("/api/v1/nodes/cpu-0/pods", headers=bearer("root"))).json())[
        "items"
    ] == []


async def test_node_events_are_the_events_about_the_node(aiohttp_client) -> None:
    client = await aiohttp_client(build_app(_ctx()))
    r = await client.get("/api/v1/nodes/dgx-0/events", headers=bearer("vic"))
    assert r.status == 200
    (event,) = (await r.json())["items"]
    assert event["reason"] == "NodeNotReady" and event["type"] == "Warning"


async def test_unknown_node_is_404_naming_the_field(aiohttp_client) -> None:
    client = await aiohttp_client(build_app(_ctx()))
    for what in ("pods", "events"):
        r = await client.get(f"/api/v1/nodes/nope/{what}", headers=bearer("root"))
        assert r.status == 404
        body = await r.json()
        assert body["error"]["details"][0]["field"] == "name"
    assert (await client.get("/api/v1/nodes/dgx-0/pods")).status == 401
