"""NodeTopology writes over HTTP: PUT/DELETE and `apply`, admin only, 422s naming the field, and the
scheduler's view (a node described by hand is placed on; an Unhealthy GPU is not)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices import get_preset
from gpuyard.platform.api import app as app_module
from gpuyard.state.context import Context
from tests.unit.api.test_dashboard import bearer, make_ctx

ROOT = {**bearer("root"), "Content-Type": "application/yaml"}


def doc(name: str = "a100-0", **changes: Any) -> dict[str, Any]:
    body = get_preset("dgx-a100", node_name=name).to_dict()
    body["metadata"] = {"name": name}
    body["spec"].update(changes)
    return body


@pytest.fixture
def ctx() -> Context:
    return make_ctx()


@pytest.fixture
async def client(aiohttp_client, ctx):
    return await aiohttp_client(app_module.make_app(ctx))


async def test_put_creates_then_replaces_and_delete_removes(client, ctx) -> None:
    assert ctx.store.get("NodeTopology", "", "a100-0") is None
    r = await client.put("/api/v1/nodetopologies/a100-0", data=yaml.safe_dump(doc()), headers=ROOT)
    assert r.status == 201, await r.text()
    assert len(ctx.store.must_get_of(NodeTopology, "", "a100-0").spec.gpus) == 8
    changed = doc()
    changed["spec"]["gpus"][5]["health"] = "Unhealthy"
    r = await client.put("/api/v1/nodetopologies/a100-0", json=changed, headers=ROOT)
    assert r.status == 200
    assert ctx.store.must_get_of(NodeTopology, "", "a100-0").spec.gpus[5].health == "Unhealthy"
    r = await client.get("/api/v1/nodetopologies/a100-0", headers=ROOT)
    assert (await r.json())["spec"]["gpus"][5]["health"] == "Unhealthy"
    r = await client.delete("/api/v1/nodetopologies/a100-0", headers=ROOT)
    assert r.status == 200 and ctx.store.get("NodeTopology", "", "a100-0") is None
    r = await client.delete("/api/v1/nodetopologies/a100-0", headers=ROOT)
    assert r.status == 404


async def test_stale_resource_version_is_a_conflict(client, ctx) -> None:
    r = await client.put("/api/v1/nodetopologies/a100-0", json=doc(), headers=ROOT)
    version = (await r.json())["metadata"]["resourceVersion"]
    body = doc()
    body["metadata"]["resourceVersion"] = version
    assert (await client.put("/api/v1/nodetopologies/a100-0", json=body, headers=ROOT)).status == 200
    r = await client.put("/api/v1/nodetopologies/a100-0", json=body, headers=ROOT)
    assert r.status == 409


@pytest.mark.parametrize("who", ["alice", "vic"])
async def test_only_admins_write(client, ctx, who) -> None:
    r = await client.put("/api/v1/nodetopologies/a100-0", json=doc(), headers=bearer(who))
    assert r.status == 403
    r = await client.delete("/api/v1/nodetopologies/dgx-0", headers=bearer(who))
    assert r.status == 403 and ctx.store.get("NodeTopology", "", "dgx-0") is not None


def _bad_peer() -> dict[str, Any]:
    body = doc()
    body["spec"]["gpus"][2]["nvlinkPeers"]["9"] = 12
    return body


def _dup_numa() -> dict[str, Any]:
    body = doc()
    body["spec"]["numaNodes"].append(dict(body["spec"]["numaNodes"][0]))
    return body


def _nic_numa() -> dict[str, Any]:
    body = doc()
    body["spec"]["nics"][1]["numaNode"] = 7
    return body


def _index_order() -> dict[str, Any]:
    body = doc()
    body["spec"]["gpus"][3]["index"] = 2
    return body


def _dup_uuid() -> dict[str, Any]:
    body = doc()
    body["spec"]["gpus"][6]["uuid"] = body["spec"]["gpus"][1]["uuid"]
    return body


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (_bad_peer, "spec.gpus[2].nvlinkPeers"),
        (_dup_numa, "spec.numaNodes[0].id"),
        (_nic_numa, "spec.nics[1].numaNode"),
        (_index_order, "spec.gpus[3].index"),
        (_dup_uuid, "spec.gpus[6].uuid"),
        (lambda: {**doc(), "metadata": {"name": "other"}}, "metadata.name"),
        (lambda: {**doc(), "kind": "Node"}, "kind"),
        (lambda: doc(bogus=1), "spec.bogus"),
    ],
)
async def test_bad_topology_is_a_422_naming_the_field(client, ctx, make, field) -> None:
    r = await client.put("/api/v1/nodetopologies/a100-0", json=make(), headers=ROOT)
    body = await r.json()
    assert r.status == 422, body
    assert field in [d["field"] for d in body["error"]["details"]], body
    assert ctx.store.get("NodeTopology", "", "a100-0") is None


async def test_apply_takes_node_topologies_all_or_nothing(client, ctx) -> None:
    good = doc()
    queue = {"apiVersion": "gpuyard.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"}}
    bad = _bad_peer()
    bad["metadata"]["name"] = "dgx-1"
    text = yaml.safe_dump_all([good, bad])
    r = await client.post("/api/v1/apply", data=text, headers=ROOT)
    body = await r.json()
    assert r.status == 422
    assert [d["field"] for d in body["error"]["details"]] == ["documents[1].spec.gpus[2].nvlinkPeers"]
    assert ctx.store.get("NodeTopology", "", "a100-0") is None
    r = await client.post("/api/v1/apply", data=json.dumps([good, queue]), headers=ROOT)
    assert r.status == 200, await r.text()
    applied = (await r.json())["applied"]
    assert {"kind": "NodeTopology", "namespace": "", "name": "a100-0", "action": "created"} in applied
    assert (
        await client.post("/api/v1/apply", data=json.dumps([good]), headers=bearer("alice"))
    ).status == 403
