"""DRA mode end to end on the test API server: `gpuyard fake-nodes` publishes ResourceSlices, and the
platform (`backend.kind: kubernetes`, `backend.kubernetes.dra`) gives each placed pod a
ResourceClaim allocating exactly its GPUs, referenced by the pod instead of `nvidia.com/gpu`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import pytest_asyncio
from kubernetes_asyncio import client as kclient

from gpuyard.apis.crds import crds
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.resources import ApiResource, resource_for
from gpuyard.devices.dra import resource_slice
from gpuyard.devices.scenarios import load_scenario
from gpuyard.kubecluster.client import KubeClient
from gpuyard.kubecluster.dra import RESOURCE_CLAIMS, RESOURCE_SLICES, DraAllocator
from gpuyard.kubecluster.fakenodes import FakeNodes, connect
from gpuyard.kubecluster.writing import to_json
from gpuyard.state.backend import BackendError
from gpuyard.state.store import Store
from gpuyard.testing.apiserver.fixture import RunningApiServer
from tests.builders import make_pod
from tests.kubernetes.test_backend_platform import platform, settings
from tests.unit.devices.test_dra import driver_device, driver_slice

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = load_scenario(ROOT / "configs" / "clusters" / "demo.yaml")
NODE = "dgxa100-0"
PODS = resource_for("Pod")
EVENTS = resource_for("Event")
PYTORCHJOBS = resource_for("PyTorchJob", "kubeflow.org/v1")
VERSION = max(kubernetes_validate.latest_version(), "1.34.0")


def pytorchjob(name: str, *, gpus: int) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "pt:1", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    template = {"spec": {"nodeSelector": {"kubernetes.io/hostname": NODE}, "containers": [container]}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
        },
    }


@pytest_asyncio.fixture
async def fake_cluster(fake_apiserver: RunningApiServer) -> AsyncIterator[KubeClient]:
    """The demo scenario's nodes from fake-nodes (slices included) and a client of the server."""
    api = await connect(str(fake_apiserver.kubeconfig))
    async with api:
        extensions = kclient.ApiextensionsV1Api(api)
        for crd in crds():
            await extensions.create_custom_resource_definition(body=crd)
        nodes = FakeNodes(api, scenario=SCENARIO, heartbeat=0.5)
        task = asyncio.create_task(nodes.run())
        await asyncio.wait_for(nodes.registered.wait(), 10)
        kube = await KubeClient.connect(kubeconfig=str(fake_apiserver.kubeconfig), request_timeout=5.0)
        try:
            yield kube
        finally:
            await kube.close()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _objects(kube: KubeClient, res: ApiResource) -> list[dict[str, Any]]:
    return (await kube.list(res))[0]


async def _job_pod(kube: KubeClient, job: str) -> dict[str, Any] | None:
    for pod in await _objects(kube, PODS):
        labels = pod["metadata"].get("labels") or {}
        if labels.get("training.kubeflow.org/job-name") == job and pod["spec"].get("nodeName"):
            return pod
    return None


async def _until(check: Callable[[], Awaitable[Any]], *, what: str, timeout: float = 20.0) -> Any:
    """Poll `check()` until it returns something true; AssertionError naming `what` after `timeout`."""
    for _ in range(int(timeout / 0.05)):
        if value := await check():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _placed(kube: KubeClient, job: str) -> dict[str, Any]:
    pod: dict[str, Any] = await _until(lambda: _job_pod(kube, job), what=f"a bound pod of {job}")
    return pod


async def test_fake_nodes_publish_one_slice_per_gpu_node(fake_cluster: KubeClient) -> None:
    slices = await _objects(fake_cluster, RESOURCE_SLICES)
    by_node = {s["spec"]["nodeName"]: s for s in slices}
    assert set(by_node) == {t.metadata.name for t in SCENARIO.topologies()}
    dgx = by_node[NODE]
    assert dgx["spec"]["driver"] == "gpu.nvidia.com" and dgx["spec"]["pool"]["name"] == NODE
    assert [d["name"] for d in dgx["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert dgx["metadata"]["ownerReferences"][0]["kind"] == "Node"
    kubernetes_validate.validate(dgx, VERSION, strict=True)


async def test_placed_pod_gets_a_claim_allocating_exactly_its_gpus(
    fake_cluster: KubeClient, fake_apiserver: RunningApiServer
) -> None:
    kube = fake_cluster
    dgx = next(s for s in await _objects(kube, RESOURCE_SLICES) if s["spec"]["nodeName"] == NODE)
    dgx["spec"]["devices"].append({"name": "gpu-99", "attributes": {"uuid": {"string": "GPU-elsewhere"}}})
    await kube.replace(RESOURCE_SLICES, dgx)
    async with platform(settings(fake_apiserver.kubeconfig, election=False)):
        await kube.create(PYTORCHJOBS, pytorchjob("fill", gpus=4))
        first = await _placed(kube, "fill")
        await kube.create(PYTORCHJOBS, pytorchjob("big", gpus=4))
        pod = await _placed(kube, "big")
        claims = {c["metadata"]["name"]: c for c in await _objects(kube, RESOURCE_CLAIMS)}
        events = await _objects(kube, EVENTS)
    gpus = json.loads(pod["metadata"]["annotations"]["gpuyard.io/devices"])["gpus"]
    taken = json.loads(first["metadata"]["annotations"]["gpuyard.io/devices"])["gpus"]
    assert sorted(gpus) == [4, 5, 6, 7] and sorted(taken) == [0, 1, 2, 3]

    ref = pod["spec"]["resourceClaims"]
    assert len(ref) == 1
    claim = claims[ref[0]["resourceClaimName"]]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["claims"] == [{"name": ref[0]["name"]}]
    for part in ("requests", "limits"):
        assert "nvidia.com/gpu" not in (container["resources"].get(part) or {})

    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == [f"gpu-{i}" for i in gpus]
    assert {(r["driver"], r["pool"]) for r in results} == {("gpu.nvidia.com", NODE)}
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    ]
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("Pod", pod["metadata"]["uid"])
    kubernetes_validate.validate(claim, VERSION, strict=True)
    kubernetes_validate.validate(pod, VERSION, strict=True)

    unmatched = [e for e in events if e.get("reason") == "UnmatchedDevices"]
    assert [e["involvedObject"]["name"] for e in unmatched] == [NODE]
    assert "gpu-99" in unmatched[0]["message"] and "gpu-0" not in unmatched[0]["message"]
    assert len(claims) == 2  # one per pod: gpu-99 was never allocated
    assert all(
        r["device"] != "gpu-99"
        for c in claims.values()
        for r in c["status"]["allocation"]["devices"]["results"]
    )

    await kube.delete(PODS, "default", pod["metadata"]["name"])

    async def claim_gone() -> bool:
        names = {c["metadata"]["name"] for c in await _objects(kube, RESOURCE_CLAIMS)}
        return claim["metadata"]["name"] not in names

    await _until(claim_gone, what="the claim deleted with its pod")


async def test_dra_off_leaves_pods_requesting_gpus(
    fake_cluster: KubeClient, fake_apiserver: RunningApiServer
) -> None:
    """`gpu_resource: nvidia.com/gpu` (count-only, set explicitly): NVIDIA's plugin gets the request."""
    kube = fake_cluster
    async with platform(
        settings(fake_apiserver.kubeconfig, election=False, dra="off", gpu_resource="nvidia.com/gpu")
    ):
        await kube.create(PYTORCHJOBS, pytorchjob("plain", gpus=2))
        pod = await _placed(kube, "plain")
    assert "resourceClaims" not in pod["spec"]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in (2, "2")
    assert await _objects(kube, RESOURCE_CLAIMS) == []


@pytest.mark.parametrize("gpu_resource", ["gpuyard.io/gpu", "auto"])
async def test_device_plugin_mode_hands_the_gpus_to_gpuyards_plugin(
    fake_cluster: KubeClient, fake_apiserver: RunningApiServer, gpu_resource: str
) -> None:
    """`gpu_resource: gpuyard.io/gpu`, or `auto` without DRA: the bound pod asks the kubelet for
    gpuyard.io/gpu, which `gpuyard agent --device-plugin` serves with exactly the annotated devices."""
    kube = fake_cluster
    async with platform(
        settings(fake_apiserver.kubeconfig, election=False, dra="off", gpu_resource=gpu_resource)
    ):
        await kube.create(PYTORCHJOBS, pytorchjob("plugged", gpus=2))
        pod = await _placed(kube, "plugged")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["gpuyard.io/gpu"] in (2, "2") and "nvidia.com/gpu" not in limits
    assert len(json.loads(pod["metadata"]["annotations"]["gpuyard.io/devices"])["gpus"]) == 2


async def test_on_without_a_slice_refuses_and_auto_leaves_the_pod(fake_apiserver: RunningApiServer) -> None:
    kube = await KubeClient.connect(kubeconfig=str(fake_apiserver.kubeconfig), request_timeout=5.0)
    try:
        store = Store()
        store.register(NodeTopology)
        store.observe(SCENARIO.topologies()[0])
        node = SCENARIO.topologies()[0].metadata.name
        pod = make_pod("p", node=node, gpus=2)
        pod.metadata.annotations["gpuyard.io/devices"] = json.dumps({"gpus": [0, 1]})
        body = to_json(pod)
        auto = DraAllocator(client=kube, store=store, mode="auto")
        assert await auto.prepare(pod, body, node) is None
        assert body == to_json(pod)
        on = DraAllocator(client=kube, store=store, mode="on")
        with pytest.raises(BackendError, match=f"node {node} publishes no gpu.nvidia.com ResourceSlice"):
            await on.prepare(pod, body, node)
    finally:
        await kube.close()


async def test_slices_are_listed_again_for_a_new_node_and_when_old(fake_apiserver: RunningApiServer) -> None:
    """A slice published after the last LIST is found at the next pod for its node; a driver that
    republished fewer devices is seen once the LIST is `max_age` old, not before."""
    kube = await KubeClient.connect(kubeconfig=str(fake_apiserver.kubeconfig), request_timeout=5.0)
    try:
        topology = SCENARIO.topologies()[0]
        node = topology.metadata.name
        store = Store()
        store.register(NodeTopology)
        store.observe(topology)
        clock = [0.0]
        dra = DraAllocator(client=kube, store=store, mode="auto", now=lambda: clock[0], max_age=60.0)

        async def prepare(at: float) -> Any:
            clock[0] = at
            p = make_pod("p", node=node, gpus=2)
            p.metadata.annotations["gpuyard.io/devices"] = json.dumps({"gpus": [0, 1]})
            return await dra.prepare(p, to_json(p), node)

        assert await prepare(0.0) is None and dra.lists == 1  # no slice yet: the pod keeps nvidia.com/gpu
        published = resource_slice(topology, driver_version="550.54.15", cuda_driver_version="12.4")
        await kube.create(RESOURCE_SLICES, published)
        assert await prepare(1.0) is not None and dra.lists == 2  # the node had none: listed again
        stored = (await kube.list(RESOURCE_SLICES))[0][0]
        stored["spec"]["devices"] = [d for d in stored["spec"]["devices"] if d["name"] != "gpu-1"]
        await kube.replace(RESOURCE_SLICES, stored)
        assert await prepare(30.0) is not None and dra.lists == 2  # the cached slice, still young
        with pytest.raises(BackendError, match=r"GPUs \[1\] .* not published"):
            await prepare(70.0)  # older than max_age: listed again, GPU 1 is gone
        assert dra.lists == 3
    finally:
        await kube.close()


async def test_a_pool_split_over_slices_is_used_once_complete_and_its_names_claimed(
    fake_apiserver: RunningApiServer,
) -> None:
    """Slices as NVIDIA's DRA driver writes them (shape: `tests/unit/devices/test_dra.py`
    `driver_device`): a newer generation split over two slices replaces the old one; while only one
    of its slices is listed the node counts as publishing none; once both are, the claim names the
    devices by their published names (`gpu-<minor>`, minors in another order than the indices)."""
    kube = await KubeClient.connect(kubeconfig=str(fake_apiserver.kubeconfig), request_timeout=5.0)
    try:
        topology = SCENARIO.topologies()[0]
        node = topology.metadata.name
        store = Store()
        store.register(NodeTopology)
        store.observe(topology)
        clock = [0.0]
        dra = DraAllocator(client=kube, store=store, mode="auto", now=lambda: clock[0])

        async def prepare(at: float) -> Any:
            clock[0] = at
            p = make_pod("p", node=node, gpus=2)
            p.metadata.annotations["gpuyard.io/devices"] = json.dumps({"gpus": [0, 1]})
            return await dra.prepare(p, to_json(p), node)

        await kube.create(RESOURCE_SLICES, resource_slice(topology, generation=1))
        count = len(topology.spec.gpus)
        devices = [driver_device(g, minor=(g.index + 1) % count) for g in topology.spec.gpus]
        half = count // 2
        await kube.create(
            RESOURCE_SLICES, driver_slice(node, node, devices[:half], generation=2, count=2, part=0)
        )
        assert await prepare(0.0) is None and dra.incomplete == [node]  # generation 2 not all there
        await kube.create(
            RESOURCE_SLICES, driver_slice(node, node, devices[half:], generation=2, count=2, part=1)
        )
        claim = await prepare(1.0)  # the node had no pool: listed again
        assert claim is not None and dra.incomplete == [] and dra.lists == 2
        results = claim.body["status"]["allocation"]["devices"]["results"]
        assert [(r["pool"], r["device"]) for r in results] == [(node, "gpu-1"), (node, "gpu-2")]
    finally:
        await kube.close()
