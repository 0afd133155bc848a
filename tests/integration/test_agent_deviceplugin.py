"""Device-plugin mode end to end: a 4-GPU PyTorchJob placed by gpuyard on GPUs {4,5,6,7} of a DGX A100
node; the agent's device plugin, asking the running platform which pods are pending on the node
(`GET /api/v1/nodes/{name}/pods`), answers the kubelet's Allocate with exactly those GPUs' UUIDs and
refuses devices no pod was given."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc
import pytest

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.agent.allocating import RESOURCE_GPU
from gpuyard.devices.agent.deviceplugin import DevicePlugin
from gpuyard.devices.agent.fakekubelet import FakeKubelet
from gpuyard.devices.agent.running import HttpPodLookup
from tests.integration.live_platform import live_platform, until

NODE = "a100-0"
SCENARIO = """
name: one-a100
kubelet: {startDelay: 600, duration: null, exitCode: 0}
nodeGroups:
  - name: a100
    count: 1
    cpu: "256"
    memory: 1Ti
    gpu: {model: a100, count: 8}
    topology: dgx-a100
    rdmaNics: 8
"""
JOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: NAME, namespace: default}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          containers:
            - {name: pytorch, image: train, resources: {limits: {nvidia.com/gpu: 4}}}
"""


@pytest.fixture
def plugin_dir():  # type: ignore[no-untyped-def]
    path = Path(tempfile.mkdtemp(prefix="dp"))  # unix socket paths are limited to 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_allocate_answers_the_scheduled_gpus_of_the_pending_pod(
    tmp_path: Path, plugin_dir: Path
) -> None:
    scenario = tmp_path / "one-a100.yaml"
    scenario.write_text(SCENARIO)
    async with live_platform(str(scenario)) as platform:
        lookup: HttpPodLookup | None = None
        kubelet = FakeKubelet(plugin_dir)
        watch: asyncio.Task[None] | None = None
        try:
            base = platform.url
            node = NODE  # node group `a100`, first node
            topology = platform.store.must_get_of(NodeTopology, "", node)
            uuids = [g.uuid for g in topology.spec.gpus]
            async with aiohttp.ClientSession() as http:
                for name in ("first", "second"):
                    async with http.post(
                        f"{base}/api/v1/jobs",
                        data=JOB.replace("NAME", name),
                        headers={"Content-Type": "application/yaml"},
                    ) as r:
                        assert r.status == 201, await r.text()

                async def placed() -> dict[str, list[int]]:
                    out = {}
                    for name in ("first", "second"):
                        async with http.get(f"{base}/api/v1/namespaces/default/jobs/{name}/pods") as r:
                            items = (await r.json()).get("items", [])
                        if items:
                            out[items[0]["metadata"]["name"]] = items[0]["summary"]["gpus"]
                    return out if len(out) == 2 else {}

                pods = await until(placed)
            assert sorted(sorted(g) for g in pods.values()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
            upper = next(p for p, g in pods.items() if sorted(g) == [4, 5, 6, 7])

            lookup = HttpPodLookup(base)
            plugin = DevicePlugin(
                node=node, resource=RESOURCE_GPU, lookup=lookup, plugin_dir=plugin_dir, poll_s=0.05
            )
            plugin.update(topology)
            await kubelet.start()
            watch = asyncio.create_task(plugin.watch())
            deadline = time.monotonic() + 5
            while not kubelet.devices.get(RESOURCE_GPU):
                assert time.monotonic() < deadline, "the plugin did not register"
                await asyncio.sleep(0.02)

            env = await kubelet.allocate(RESOURCE_GPU, uuids[4:8])
            assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids[4:8])
            assert env["GPUYARD_GPU_INDICES"] == "4,5,6,7"
            pod = platform.store.get("Pod", "default", upper)
            assert pod is not None
            assert (
                pod.spec.containers[0].env_dict()["NVIDIA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"]
            )
            # two pending 4-GPU pods: the plugin does not guess a preference
            assert await kubelet.preferred(RESOURCE_GPU, available=uuids, size=4) == []
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await kubelet.allocate(RESOURCE_GPU, [uuids[0], uuids[1], uuids[4], uuids[5]])
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"no pending gpuyard pod on node {node}" in refused.value.details()
        finally:
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            await kubelet.stop()
            if lookup is not None:
                await lookup.aclose()
