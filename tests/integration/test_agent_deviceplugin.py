"""Device-plugin mode end to end: an 8x1-GPU PyTorchJob gang and a 2x4-GPU job placed by gpuyard on two
DGX A100 nodes; each node's device plugin, asking the running platform which pods are pending there
(`GET /api/v1/nodes/{name}/pods`), answers a kubelet that admits the pods one by one and books other
GPUs than the plugin preferred, and every container gets exactly the GPUs gpuyard chose."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from gpuyard.apis.core import Pod
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.scheduling import pod_devices
from gpuyard.devices.agent.allocating import RESOURCE_GPU
from gpuyard.devices.agent.deviceplugin import DevicePlugin
from gpuyard.devices.agent.fakekubelet import FakeKubelet
from gpuyard.devices.agent.running import HttpPodLookup
from tests.integration.live_platform import live_platform, until

SCENARIO = """
name: two-a100
kubelet: {startDelay: 600, duration: null, exitCode: 0}
nodeGroups:
  - name: a100
    count: 2
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
      replicas: REPLICAS
      template:
        spec:
          containers:
            - {name: pytorch, image: train, resources: {limits: {nvidia.com/gpu: GPUS}}}
"""


@contextlib.asynccontextmanager
async def kubelet_with_plugin(
    node: str, lookup: HttpPodLookup, topology: NodeTopology
) -> AsyncIterator[FakeKubelet]:
    folder = Path(tempfile.mkdtemp(prefix="dp"))  # unix socket paths are limited to 107 bytes
    kubelet = FakeKubelet(folder)
    plugin = DevicePlugin(node=node, resource=RESOURCE_GPU, lookup=lookup, plugin_dir=folder, poll_s=0.05)
    plugin.update(topology)
    await kubelet.start()
    watch = asyncio.create_task(plugin.watch())
    try:
        deadline = time.monotonic() + 5
        while not kubelet.devices.get(RESOURCE_GPU):
            assert time.monotonic() < deadline, "the plugin did not register"
            await asyncio.sleep(0.02)
        yield kubelet
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await kubelet.stop()
        shutil.rmtree(folder, ignore_errors=True)


async def test_a_gang_and_a_2x4_job_get_exactly_their_gpus(tmp_path: Path) -> None:
    scenario = tmp_path / "two-a100.yaml"
    scenario.write_text(SCENARIO)
    async with live_platform(str(scenario)) as platform:
        base = platform.url
        async with aiohttp.ClientSession() as http:

            async def submit(name: str, replicas: int, gpus: int) -> None:
                doc = JOB.replace("NAME", name).replace("REPLICAS", str(replicas)).replace("GPUS", str(gpus))
                async with http.post(
                    f"{base}/api/v1/jobs", data=doc, headers={"Content-Type": "application/yaml"}
                ) as r:
                    assert r.status == 201, await r.text()

            def placed(job: str, count: int) -> list[Pod]:
                pods = [
                    p
                    for p in platform.store.list_of(Pod)
                    if p.metadata.name.startswith(f"{job}-")
                    and p.spec.node_name
                    and pod_devices(p).get("gpus")
                ]
                return pods if len(pods) == count else []

            await submit("gang", 8, 1)
            gang = await until(lambda: asyncio.sleep(0, placed("gang", 8)))
            await submit("pair", 2, 4)
            pair = await until(lambda: asyncio.sleep(0, placed("pair", 2)))
        assert gang and pair
        assert len({p.spec.node_name for p in gang}) == 1 and len({p.spec.node_name for p in pair}) == 1

        lookup = HttpPodLookup(base)
        try:
            for pods in (gang, pair):
                node = str(pods[0].spec.node_name)
                topology = platform.store.must_get_of(NodeTopology, "", node)
                uuids = {g.index: g.uuid for g in topology.spec.gpus}
                minors = {g.index: g.minor for g in topology.spec.gpus}
                # the kubelet admits in creation order, one pod at a time, picking other GPUs than preferred
                order = sorted(pods, key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))
                async with kubelet_with_plugin(node, lookup, topology) as kubelet:
                    for pod in order:
                        chosen = sorted(pod_devices(pod)["gpus"])
                        (got,) = await kubelet.admit(
                            pod.metadata.name, [{RESOURCE_GPU: len(chosen)}], pick="others"
                        )
                        answer = got[RESOURCE_GPU]
                        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids[g] for g in chosen)
                        env: dict[str, Any] = pod.spec.containers[0].env_dict()
                        assert env["NVIDIA_VISIBLE_DEVICES"] == answer.envs["NVIDIA_VISIBLE_DEVICES"]
                        nodes = sorted(
                            c for c, _, _ in answer.devices if c.removeprefix("/dev/nvidia").isdigit()
                        )
                        assert nodes == sorted(f"/dev/nvidia{minors[g]}" for g in chosen)
        finally:
            await lookup.aclose()
