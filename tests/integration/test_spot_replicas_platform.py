"""Spot replicas through the whole platform on the fake cluster (operator, scheduler, fake
kubelet, virtual clock): KubeDL's spotReplicaSpec gives the last replicas the spot class and
labels, the scheduler puts them on the `spot: true` node group and the others off it, and losing
a spot node does not count against the job's backoffLimit (a crash of an on-demand pod does)."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.core import Node, Pod
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.priorityclasses import PriorityClass
from gpuyard.testing import Cluster

LIFECYCLE = "node.kubernetes.io/lifecycle"
SCENARIO: dict[str, Any] = {
    "name": "spot",
    "kubelet": {"startDelay": 1},
    "nodeGroups": [
        {"name": "spot", "count": 2, "gpu": {"model": "a100", "count": 8}, "spot": True},
        {"name": "od", "count": 2, "gpu": {"model": "a100", "count": 8}},
    ],
}


def spot_job(name: str = "sp") -> dict[str, Any]:
    container = {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": 4}}}
    template = {
        "metadata": {"annotations": {"fake.gpuyard.io/duration": "100000"}},
        "spec": {"containers": [container]},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "runPolicy": {"backoffLimit": 0},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 4,
                    "restartPolicy": "ExitCode",
                    "template": template,
                    "spotReplicaSpec": {
                        "spotReplicaNumber": 2,
                        "priorityClassName": "spot-low",
                        "labels": {"capacity": "spot"},
                    },
                }
            },
        },
    }


def pod(c: Cluster, name: str) -> Pod | None:
    return c.store.get_of(Pod, "default", name)


def running(c: Cluster, name: str) -> bool:
    p = pod(c, name)
    return p is not None and p.status.phase == "Running"


def on_spot(c: Cluster, p: Pod) -> bool:
    node = c.store.must_get_of(Node, "", p.spec.node_name or "")
    return node.metadata.labels.get(LIFECYCLE) == "spot"


async def test_spot_replicas_get_class_labels_and_spot_nodes_and_a_lost_spot_node_is_free() -> None:
    async with Cluster.start(SCENARIO) as c:
        spot_nodes = sorted(
            n.metadata.name for n in c.store.list_of(Node) if n.metadata.labels.get(LIFECYCLE) == "spot"
        )
        assert len(spot_nodes) == 2  # `spot: true` labels the group's nodes
        await c.writer.create(PriorityClass(metadata=ObjectMeta(name="spot-low"), value=-10))
        job = await c.submit(spot_job())
        await c.run_until(job, "Running", timeout=120)
        names = [f"sp-worker-{i}" for i in range(4)]
        assert await c.until(lambda: all(running(c, n) for n in names), timeout=60)
        pods = {n: pod(c, n) for n in names}
        for n in names[:2]:
            p = pods[n]
            assert p is not None and p.spec.priority_class_name is None
            assert "capacity" not in p.metadata.labels and not on_spot(c, p)
        for n in names[2:]:
            p = pods[n]
            assert p is not None and p.spec.priority_class_name == "spot-low"
            assert p.metadata.labels["capacity"] == "spot" and on_spot(c, p)

        # the spot capacity goes away: the spot replica comes back, nothing counted
        first = pods["sp-worker-3"]
        assert first is not None
        lost = first.spec.node_name or ""
        assert await c.inject("node-fail", lost) >= 1

        def back() -> bool:
            p = pod(c, "sp-worker-3")
            return p is not None and p.metadata.uid != first.metadata.uid and p.status.phase == "Running"

        assert await c.until(back, timeout=300)
        replaced = pod(c, "sp-worker-3")
        assert replaced is not None and replaced.spec.node_name != lost and on_spot(c, replaced)
        assert c.phase(job) == "Running" and c.job(job).status.restarts == 0

        # an on-demand worker's crash still counts: backoffLimit 0 ends the job
        await c.inject("pod-crash", "default/sp-worker-0", exit_code=137)
        await c.run_until(job, "Failed", timeout=120)
        failed = c.job(job).status.condition("Failed")
        assert failed is not None and failed.reason == "BackoffLimitExceeded"
