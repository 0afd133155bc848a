"""Pod placement rules a user writes in a job's pod template, through the whole platform
(operator, scheduler, fake kubelet): required anti-affinity on the hostname keeps two workers on
different nodes, a DoNotSchedule spread constraint spreads a gang over network blocks, and a
required affinity follows a running job's pods."""

from __future__ import annotations

from typing import Any

from gpuyard.testing import ClusterFactory

HOST = "kubernetes.io/hostname"
BLOCK = "topology.gpuyard.io/block"

SCENARIO: dict[str, Any] = {
    "name": "blocks",
    "kubelet": {"startDelay": 1, "duration": None},
    "nodeGroups": [
        {
            "name": "a",
            "count": 2,
            "cpu": "64",
            "memory": "256Gi",
            "gpu": {"model": "v100", "count": 8},
            "block": "block-a",
        },
        {
            "name": "b",
            "count": 2,
            "cpu": "64",
            "memory": "256Gi",
            "gpu": {"model": "v100", "count": 8},
            "block": "block-b",
        },
    ],
}


def tfjob(name: str, *, workers: int, labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": workers,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "containers": [
                                {
                                    "name": "tensorflow",
                                    "image": "train",
                                    "resources": {
                                        "limits": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "8Gi"}
                                    },
                                }
                            ],
                            **spec,
                        },
                    },
                }
            }
        },
    }


def anti(**match: str) -> dict[str, Any]:
    return {
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": match}, "topologyKey": HOST}
                ]
            }
        }
    }


def nodes_of(cluster: Any, job: Any) -> list[str]:
    return sorted(p.node for p in cluster.placement(job).pods)


async def test_hostname_anti_affinity_keeps_two_workers_apart(gpuyard_cluster: ClusterFactory) -> None:
    c = await gpuyard_cluster(scenario=SCENARIO)
    job = await c.submit(tfjob("apart", workers=2, labels={"app": "apart"}, spec=anti(app="apart")))
    await c.run_until(job, "Running", timeout=120)
    placed = nodes_of(c, job)
    assert len(set(placed)) == 2, placed
    # the pods carry the rule as written, on the nodes the scheduler chose
    pods = c.pods(job)
    assert {p.spec.node_name for p in pods} == set(placed)
    assert all("podAntiAffinity" in (p.spec.affinity.model_extra or {}) for p in pods if p.spec.affinity)
    # a job without the rule packs its two workers on one node
    packed = await c.submit(tfjob("packed", workers=2, labels={"app": "packed"}, spec={}))
    await c.run_until(packed, "Running", timeout=120)
    assert len(set(nodes_of(c, packed))) == 1


async def test_spread_over_blocks_and_affinity_to_a_running_job(gpuyard_cluster: ClusterFactory) -> None:
    c = await gpuyard_cluster(scenario=SCENARIO)
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": BLOCK,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}},
            }
        ]
    }
    job = await c.submit(tfjob("spread", workers=4, labels={"app": "spread"}, spec=spread))
    await c.run_until(job, "Running", timeout=120)
    blocks = [c.store.get("Node", "", n).metadata.labels[BLOCK] for n in nodes_of(c, job)]
    assert sorted(blocks) == ["block-a", "block-a", "block-b", "block-b"], blocks

    # a job that must run in the block of the (running) cache job's pods
    cache = await c.submit(tfjob("cache", workers=1, labels={"app": "cache"}, spec={}))
    await c.run_until(cache, "Running", timeout=120)
    [cache_node] = nodes_of(c, cache)
    cache_block = c.store.get("Node", "", cache_node).metadata.labels[BLOCK]
    near = {
        "affinity": {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": HOST}
                ]
            }
        }
    }
    follower = await c.submit(tfjob("follower", workers=2, labels={"app": "f"}, spec=near))
    await c.run_until(follower, "Running", timeout=120)
    assert nodes_of(c, follower) == [cache_node, cache_node]
    assert cache_block in ("block-a", "block-b")
