"""The node agent against a running platform (fake cluster, real HTTP): `gpuyard agent --once` writes a
node's NodeTopology; a long-running agent on fake NVML reports an XID, the GPU becomes unhealthy in
the store and on the node, and the scheduler no longer places on it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
from click.testing import CliRunner

from gpuyard.apis.core import Node
from gpuyard.apis.devicematching import ANNOTATION_UNHEALTHY_GPUS
from gpuyard.apis.devices import NodeTopology
from gpuyard.cli import main
from gpuyard.devices.agent.fakenvml import FakeNVML
from gpuyard.devices.agent.inventory import LABEL_DISCOVERED_BY, Inventory
from gpuyard.devices.agent.running import Agent, AgentTimings, HttpSink
from tests.integration.live_platform import live_platform, until

NODE = "dgxa100-0"
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
          nodeSelector: {gpuyard.io/gpu-model: a100}
          containers:
            - {name: pytorch, image: train, resources: {limits: {nvidia.com/gpu: GPUS}}}
"""


async def test_agent_writes_topology_and_an_xid_reaches_the_scheduler(tmp_path: Path) -> None:
    async with live_platform() as platform:
        base = platform.url
        store = platform.store
        # `gpuyard agent --once` from a preset (the CLI runs its own event loop: in a thread)
        result = await asyncio.to_thread(
            CliRunner().invoke,
            main,
            ["agent", "--once", "--preset", "dgx-a100", "--node", NODE, "--server", base],
            env={"GPUYARD_TOKEN": "", "GPUYARD_SERVER": ""},
        )
        assert result.exit_code == 0, result.output
        assert store.must_get_of(NodeTopology, "", NODE).metadata.labels[LABEL_DISCOVERED_BY] == "preset"

        fake = FakeNVML.shaped("dgx-a100", node_name=NODE)
        sink = HttpSink(base)
        agent = Agent(
            Inventory(node=NODE, nvml=fake, sysfs_root=tmp_path / "sys"),
            sink,
            timings=AgentTimings(health_interval_s=0.1, backoff_min_s=0.05),
        )
        running = asyncio.create_task(agent.run())
        try:

            async def written() -> bool:
                topo = store.get_of(NodeTopology, "", NODE)
                return topo is not None and topo.metadata.labels.get(LABEL_DISCOVERED_BY) == "nvml"

            assert await until(written)
            fake.inject_xid(4, 79)

            async def gpu4_unhealthy() -> bool:
                topo = store.must_get_of(NodeTopology, "", NODE)
                node = store.must_get_of(Node, "", NODE)
                return topo.spec.gpus[4].health == "Unhealthy" and "4" in node.metadata.annotations.get(
                    ANNOTATION_UNHEALTHY_GPUS, ""
                ).split(",")

            assert await until(gpu4_unhealthy)
            async with aiohttp.ClientSession() as http:
                for name, gpus in (("eight", 8), ("four", 4)):
                    body = JOB.replace("NAME", name).replace("GPUS", str(gpus))
                    async with http.post(
                        f"{base}/api/v1/jobs", data=body, headers={"Content-Type": "application/yaml"}
                    ) as r:
                        assert r.status == 201, await r.text()

                async def four_placed() -> list[int]:
                    async with http.get(f"{base}/api/v1/namespaces/default/jobs/four/pods") as r:
                        items = (await r.json()).get("items", [])
                    return items[0]["summary"]["gpus"] if items else []

                gpus = await until(four_placed)
                assert len(gpus) == 4 and 4 not in gpus
                async with http.get(f"{base}/api/v1/namespaces/default/jobs/eight/pods") as r:
                    assert (await r.json())["items"] == []  # 7 healthy A100s: an 8-GPU pod cannot start
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            await sink.aclose()
