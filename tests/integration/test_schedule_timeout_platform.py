"""The job's scheduling policy through the whole platform (operator, scheduler, fake kubelet,
virtual clock): `scheduleTimeoutSeconds` fails a job whose gang was not placed in time,
`minResources` keeps a gang waiting until the free capacity covers it, and the PodGroup carries
the job's labels so a PodDisruptionBudget written for them protects it from preemption."""

from __future__ import annotations

from typing import Any

import yaml

from gpuyard.apis.core import Event
from gpuyard.apis.disruption import PodDisruptionBudget
from gpuyard.apis.scheduling import PodGroup
from gpuyard.testing import Cluster


def job(
    name: str,
    *,
    gpus: int,
    workers: int = 1,
    labels: dict[str, str] | None = None,
    policy: dict[str, Any] | None = None,
) -> str:
    container = {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    body: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {
            "runPolicy": {"schedulingPolicy": policy or {}},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": workers,
                    "template": {
                        "metadata": {"annotations": {"fake.gpuyard.io/duration": "100000"}},
                        "spec": {"containers": [container]},
                    },
                }
            },
        },
    }
    return yaml.safe_dump(body)


def events(c: Cluster, name: str) -> dict[str, str]:
    return {
        e.reason: e.message
        for e in c.store.list_of(Event, namespace="default")
        if e.involved_object.get("name") == name
    }


async def test_a_job_not_placed_within_its_timeout_fails_and_one_placed_in_time_runs() -> None:
    async with Cluster.start(nodes=[("dgx-a100", 1)]) as c:
        full = await c.submit(job("full", gpus=8))
        await c.run_until(full, "Running", timeout=120)
        late = await c.submit(job("late", gpus=4, policy={"scheduleTimeoutSeconds": 120}))
        await c.advance(60)
        assert c.phase(late) == "Queuing"
        await c.run_until(late, "Failed", timeout=120)
        failed = c.job(late).status.condition("Failed")
        assert failed is not None and failed.reason == "ScheduleTimeout"
        assert "scheduleTimeoutSeconds=120" in failed.message
        assert "ScheduleTimeout" in events(c, "late")
        await c.advance(5)
        assert c.store.get_of(PodGroup, "default", "late") is None  # nothing left held
        assert c.phase(full) == "Running"
        # room frees up: a job with a timeout placed in time is unaffected by it afterwards
        await c.delete(full)
        quick = await c.submit(job("quick", gpus=8, policy={"scheduleTimeoutSeconds": 30}))
        await c.run_until(quick, "Running", timeout=30)
        await c.advance(120)
        assert c.phase(quick) == "Running"


async def test_a_pod_disruption_budget_on_a_user_label_protects_the_job() -> None:
    async with Cluster.start(nodes=[("dgx-a100", 2)]) as c:
        older = await c.submit(job("older", gpus=8))
        await c.run_until(older, "Running", timeout=120)
        await c.advance(100)
        newer = await c.submit(job("newer", gpus=8, labels={"app": "serving"}))
        await c.run_until(newer, "Running", timeout=120)
        pg = c.store.get_of(PodGroup, "default", "newer")
        assert pg is not None and pg.metadata.labels.get("app") == "serving"
        pdb = PodDisruptionBudget.model_validate(
            {
                "metadata": {"name": "serving", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "serving"}}},
            }
        )
        await c.writer.create(pdb)
        await c.advance(100)
        urgent = await c.submit(job("urgent", gpus=8, policy={"priority": 1000}))
        await c.run_until(urgent, "Running", timeout=300)
        # without the budget the newer job (least work lost) would be the victim
        assert c.phase(newer) == "Running"
        assert c.phase(older) in ("Queuing", "Restarting", "Created")


async def test_min_resources_keep_a_job_queuing_until_free_capacity_covers_them() -> None:
    async with Cluster.start(nodes=[("dgx-a100", 1)]) as c:
        busy = await c.submit(job("busy", gpus=6))
        await c.run_until(busy, "Running", timeout=120)
        gated = await c.submit(job("gated", gpus=1, policy={"minResources": {"nvidia.com/gpu": "4"}}))
        await c.advance(60)
        assert c.phase(gated) == "Queuing"
        pg = c.store.get_of(PodGroup, "default", "gated")
        assert pg is not None and pg.status.reason == "MinResources"
        assert "nvidia.com/gpu 4 > 2 free" in c.job(gated).status.condition("Queuing").message
        await c.delete(busy)
        await c.run_until(gated, "Running", timeout=120)
