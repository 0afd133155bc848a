"""Elastic victims through the whole platform: a priority-1000 job needing 4 GPUs on a full
8-GPU node stops only the two replicas of an elastic PyTorchJob above its `minReplicas`; the
elastic job keeps running on its minimum, no whole gang is stopped."""

from __future__ import annotations

from typing import Any

import yaml

from gpuyard.apis.core import Pod
from gpuyard.apis.scheduling import PodGroup
from gpuyard.testing import Cluster


def job(name: str, *, gpus: int, workers: int, priority: int = 0, elastic: int | None = None) -> str:
    container = {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    spec: dict[str, Any] = {
        "runPolicy": {"schedulingPolicy": {"priority": priority}},
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": workers,
                "template": {
                    "metadata": {"annotations": {"fake.gpuyard.io/duration": "100000"}},
                    "spec": {"containers": [container]},
                },
            }
        },
    }
    if elastic is not None:
        spec["elasticPolicy"] = {"minReplicas": elastic, "maxReplicas": workers, "rdzvBackend": "c10d"}
    body = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }
    return yaml.safe_dump(body)


def running_pods(c: Cluster, name: str) -> list[str]:
    return sorted(
        p.metadata.name
        for p in c.store.list_of(Pod, namespace="default")
        if p.metadata.labels.get("job-name") == name and p.status.phase == "Running"
    )


async def test_only_replicas_above_the_elastic_minimum_are_preempted() -> None:
    async with Cluster.start(nodes=[("dgx-a100", 1)]) as c:
        elastic = await c.submit(job("elastic", gpus=2, workers=4, elastic=2))
        await c.run_until(elastic, "Running", timeout=120)
        await c.until(lambda: len(running_pods(c, "elastic")) == 4, timeout=120)
        await c.advance(600)
        urgent = await c.submit(job("urgent", gpus=4, workers=1, priority=1000))
        await c.run_until(urgent, "Running", timeout=300)
        assert running_pods(c, "elastic") == ["elastic-worker-0", "elastic-worker-1"]
        await c.advance(60)
        assert c.phase(elastic) == "Running"
        pg = c.store.get_of(PodGroup, "default", "elastic")
        assert pg is not None and pg.status.placed == 2 and not pg.status.evictions


async def test_a_job_that_is_not_elastic_is_preempted_whole() -> None:
    async with Cluster.start(nodes=[("dgx-a100", 1)]) as c:
        rigid = await c.submit(job("rigid", gpus=2, workers=4))
        await c.run_until(rigid, "Running", timeout=120)
        await c.advance(600)
        urgent = await c.submit(job("urgent", gpus=4, workers=1, priority=1000))
        await c.run_until(urgent, "Running", timeout=300)
        assert running_pods(c, "rigid") == []
