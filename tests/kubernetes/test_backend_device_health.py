"""A GPU that turns unhealthy in its node's NodeTopology, on both API servers: the pods holding it
fail `DeviceUnhealthy` and the job fails over to healthy GPUs, as on the fake cluster."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.resources import resource_for
from gpuyard.devices.presets import get_preset
from gpuyard.kubecluster.writing import to_json
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import (
    NODES,
    TFJOBS,
    connect,
    eventually,
    job_pods,
    platform,
    play_kubelet,
    settings,
    tfjob,
)

__all__ = ["served"]

TOPOLOGIES = resource_for("NodeTopology")


async def test_a_gpu_gone_unhealthy_fails_its_pod_and_the_job_moves(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        for name in ("gpu-0", "gpu-1"):
            await client.create(NODES, to_json(make_node(name, gpus=8, model="a100")))
            await client.create(TOPOLOGIES, to_json(get_preset("dgx-a100", node_name=name)))
        async with platform(settings(served.kubeconfig, election=False)):
            job = tfjob("steady", workers=1, gpus=8)
            job["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
            await client.create(TFJOBS, job)
            first = await eventually(
                lambda: [p for p in job_pods(served, "steady") if p["spec"].get("nodeName")], what="placed"
            )
            node, uid = first[0]["spec"]["nodeName"], first[0]["metadata"]["uid"]
            await play_kubelet(client, served, "steady", phase="Running")

            topo: dict[str, Any] = await client.get(TOPOLOGIES, "", node)
            topo["spec"]["gpus"][3]["health"] = "Unhealthy"  # what the node agent writes on an XID
            await client.replace(TOPOLOGIES, topo)

            def failed_old() -> dict[str, Any] | None:
                events = [e for e in served.list("events") if e.get("reason") == "DeviceUnhealthy"]
                return events[0] if events else None

            await eventually(failed_old, what="a DeviceUnhealthy event for the job", timeout=20)
            moved = await eventually(
                lambda: [
                    p
                    for p in job_pods(served, "steady")
                    if p["metadata"]["uid"] != uid and p["spec"].get("nodeName") not in (None, node)
                ],
                what="the worker placed on the healthy node",
                timeout=30,
            )
            assert moved[0]["spec"]["schedulerName"] == "gpuyard"
    finally:
        await client.close()
