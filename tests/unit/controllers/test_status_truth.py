"""Job statuses that tell the truth: restarts per job failure, no event contradicting the action."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.core import Event
from gpuyard.testing import Cluster


def gang(name: str, *, workers: int, suspend: bool = False) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    spec: dict[str, Any] = {
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": workers,
                "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [container]}},
            }
        }
    }
    if suspend:
        spec["runPolicy"] = {"suspend": True}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


async def test_pods_lost_together_with_their_node_count_one_restart() -> None:
    async with Cluster.start(nodes=[("dgx1-v100", 2)]) as c:
        await c.submit(gang("ddp", workers=4))
        await c.run_until("ddp", "Running", timeout=60)
        (node,) = {p.node for p in c.placement("ddp").pods}
        assert await c.inject("node-fail", node) == 4
        await c.run_until("ddp", "Running", timeout=120)
        assert c.job("ddp").status.restarts == 1


async def test_a_resumed_job_is_not_said_to_be_suspended() -> None:
    async with Cluster.start(nodes=[("dgx1-v100", 1)]) as c:
        job = await c.submit(gang("later", workers=2, suspend=True))
        await c.advance(5)
        assert c.phase("later") == "Suspended"
        copy = c.job("later").clone()
        copy.spec.run_policy.suspend = False
        await c.writer.update(copy)
        await c.run_until("later", "Running", timeout=60)
        messages = [
            e.message
            for e in c.store.list_of(Event, namespace="default")
            if e.involved_object.get("uid") == job.metadata.uid
        ]
        assert any("is resumed" in m for m in messages)
        # it was never queued before it was suspended: every "queuing" is about after the resume
        queuing = [m for m in messages if "is queuing" in m]
        assert queuing and not any("suspended" in m for m in queuing), queuing
