"""DRA objects on the test API server: a DGX A100 node's ResourceSlice, a role's ResourceClaimTemplate
and the ResourceClaim of a 4-GPU pod placed on GPUs {4,5,6,7} are accepted by a Kubernetes-speaking
server (resource.k8s.io/v1, status subresource), and the stored claim, read back and matched against
the stored slice, allocates exactly those four GPUs."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from gpuyard.devices import get_preset
from gpuyard.devices.dra import claim_template, match_slice_devices, resource_claim, resource_slice
from gpuyard.testing.apiserver.fixture import RunningApiServer, fake_apiserver

pytest.importorskip("kmock")

__all__ = ["fake_apiserver"]  # the fixture, used by name below

DRA = "/apis/resource.k8s.io/v1"


async def call(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body)
    async with http.request(method, url, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json(content_type=None)


async def test_claim_for_gpus_4_to_7_round_trips_through_the_api_server(
    fake_apiserver: RunningApiServer,
) -> None:
    base = fake_apiserver.url
    node = get_preset("dgx-a100", node_name="a100-0")
    claim = resource_claim(node, [4, 5, 6, 7], pod="ddp-worker-0", pod_uid="0b5e-4c", namespace="default")
    status = claim.pop("status")
    async with aiohttp.ClientSession() as http:
        code, body = await call(http, "POST", f"{base}{DRA}/resourceslices", resource_slice(node))
        assert code == 201, body
        template = claim_template(job="ddp", namespace="default", role="Worker", count=4)
        code, body = await call(
            http, "POST", f"{base}{DRA}/namespaces/default/resourceclaimtemplates", template
        )
        assert code == 201, body
        code, created = await call(http, "POST", f"{base}{DRA}/namespaces/default/resourceclaims", claim)
        assert code == 201, created
        name = created["metadata"]["name"]
        created["status"] = status
        url = f"{base}{DRA}/namespaces/default/resourceclaims/{name}/status"
        code, body = await call(http, "PUT", url, created)
        assert code == 200, body
        code, stored = await call(http, "GET", f"{base}{DRA}/namespaces/default/resourceclaims/{name}")
        code_s, slices = await call(http, "GET", f"{base}{DRA}/resourceslices")
    assert code == 200 and code_s == 200
    results = stored["status"]["allocation"]["devices"]["results"]
    assert {(r["driver"], r["pool"]) for r in results} == {("gpu.nvidia.com", "a100-0")}
    assert stored["status"]["reservedFor"][0]["name"] == "ddp-worker-0"
    (published,) = slices["items"]
    match = match_slice_devices(node, published)
    assert match.unmatched == []
    assert sorted(match.by_device[r["device"]] for r in results) == [4, 5, 6, 7]
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in published["spec"]["devices"]}
    assert [uuids[r["device"]] for r in results] == [node.spec.gpus[i].uuid for i in (4, 5, 6, 7)]
