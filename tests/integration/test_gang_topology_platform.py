"""Gang-level topology through the whole platform (operator, scheduler, fake kubelet), as a user
submits it: a PyTorchJob of one-GPU pods lands on one node's fully NVLinked quad, and eight one-GPU
workers fill one node, on two empty DGX-1 nodes and on the demo cluster."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.devices.presets import DGX1_NVLINKS
from gpuyard.testing import ClusterFactory

QUADS = {(0, 1, 2, 3), (4, 5, 6, 7)}


def pytorchjob(name: str, *, masters: int, workers: int) -> dict[str, Any]:
    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "pytorch",
                            "image": "train",
                            "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}},
                        }
                    ]
                }
            },
        }

    specs = {"Worker": replica(workers)}
    if masters:
        specs["Master"] = replica(masters)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"pytorchReplicaSpecs": specs},
    }


def gpus_by_node(cluster: Any, job: Any) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for pod in cluster.placement(job).pods:
        out.setdefault(pod.node, set()).update(pod.gpus)
    return out


@pytest.mark.parametrize("nodes", [[("dgx1-v100", 2)], "configs/clusters/demo.yaml"])
async def test_master_and_three_workers_land_on_one_nvlinked_quad(
    gpuyard_cluster: ClusterFactory, nodes: Any
) -> None:
    kwargs = {"nodes": nodes} if isinstance(nodes, list) else {"scenario": nodes}
    c = await gpuyard_cluster(**kwargs)
    job = await c.submit(pytorchjob("ddp", masters=1, workers=3))
    await c.run_until(job, "Running", timeout=120)
    placed = gpus_by_node(c, job)
    assert len(placed) == 1, placed
    [gpus] = placed.values()
    assert tuple(sorted(gpus)) in QUADS
    assert all((a, b) in DGX1_NVLINKS or (b, a) in DGX1_NVLINKS for a in gpus for b in gpus if a < b)
    c.assert_nvlink_connected(job)


async def test_eight_one_gpu_workers_fill_one_node(gpuyard_cluster: ClusterFactory) -> None:
    c = await gpuyard_cluster(nodes=[("dgx1-v100", 2)])
    job = await c.submit(pytorchjob("w8", masters=0, workers=8))
    await c.run_until(job, "Running", timeout=120)
    placed = gpus_by_node(c, job)
    assert [sorted(g) for g in placed.values()] == [list(range(8))]


def tfjob(name: str, *, workers: int, gpus: int, minimum: int | None) -> dict[str, Any]:
    worker: dict[str, Any] = {
        "replicas": workers,
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "tensorflow",
                        "image": "train",
                        "resources": {"limits": {"nvidia.com/gpu": gpus, "cpu": "4", "memory": "16Gi"}},
                    }
                ]
            }
        },
    }
    if minimum is not None:
        worker["minAvailable"] = minimum
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"tfReplicaSpecs": {"Worker": worker}},
    }


async def test_a_role_minimum_lets_the_gang_start_with_part_of_its_workers(
    gpuyard_cluster: ClusterFactory,
) -> None:
    c = await gpuyard_cluster(nodes=[("dgx1-v100", 1)])
    whole = await c.submit(tfjob("whole", workers=4, gpus=4, minimum=None))
    await c.advance(30)
    assert c.placement(whole).pods == []  # 16 GPUs asked, 8 exist: all or nothing
    await c.delete(whole)
    part = await c.submit(tfjob("part", workers=4, gpus=4, minimum=2))
    await c.run_until(part, "Running", timeout=120)
    assert len(c.placement(part).pods) == 2


MIXED = {
    "name": "mixed",
    "nodeGroups": [
        {
            "name": "mix",
            "count": 1,
            "cpu": "64",
            "memory": "256Gi",
            "gpus": [{"model": "a100", "count": 4}, {"model": "t4", "count": 2}],
        }
    ],
}


def one_pod(name: str, resource: str, count: int) -> dict[str, Any]:
    job = tfjob(name, workers=1, gpus=1, minimum=None)
    limits = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"][
        "limits"
    ]
    del limits["nvidia.com/gpu"]
    limits[resource] = count
    return job


async def test_a_node_with_two_gpu_models_serves_each_class_from_its_own_gpus(
    gpuyard_cluster: ClusterFactory,
) -> None:
    c = await gpuyard_cluster(MIXED)
    t4 = await c.submit(one_pod("t4", "nvidia.t4", 2))
    a100 = await c.submit(one_pod("a100", "nvidia.a100", 3))
    await c.run_until(t4, "Running", timeout=120)
    await c.run_until(a100, "Running", timeout=120)
    assert gpus_by_node(c, t4) == {"mix-0": {4, 5}}
    [a100_gpus] = gpus_by_node(c, a100).values()
    assert a100_gpus <= {0, 1, 2, 3} and len(a100_gpus) == 3
    c.assert_on_model(a100, "A100")
    more = await c.submit(one_pod("more-t4", "nvidia.t4", 1))
    await c.advance(30)
    assert c.placement(more).pods == []  # both T4s are taken; free A100s do not count
