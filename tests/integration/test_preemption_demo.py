"""Priority preemption through the whole platform (issue #13's "done when").

On the demo cluster (fake backend, job operator, scheduler, virtual clock) the 8-GPU nodes are
full of lower-priority jobs; a priority-1000 8-GPU job preempts the cheapest gang (the newest of
the priority-0 jobs: the least work lost), which is requeued — not failed, restart count
untouched — and the urgent job starts. The counters and events say what happened.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from prometheus_client import generate_latest

from tests.integration.test_quota_demo import Demo
from tests.integration.virtual_platform import virtual_platform
from tests.unit.controllers.fakes import ROOT, job_from


def job(name: str, *, priority: int = 0, gpus: int = 8) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "research"},
        "spec": {
            "runPolicy": {"schedulingPolicy": {"priority": priority}},
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [container]}},
                }
            },
        },
    }


@pytest_asyncio.fixture
async def demo() -> AsyncIterator[Demo]:
    async with virtual_platform(ROOT / "configs" / "clusters" / "demo.yaml") as platform:
        yield Demo(platform)


async def test_a_priority_1000_job_preempts_the_cheapest_lower_priority_gang_and_starts(demo: Demo) -> None:
    names = ["keep"] + [f"low{i}" for i in range(5)]
    for name in names:  # 6 x 8 GPUs: every 8-GPU node of the demo cluster
        demo.store.create(job_from(job(name, priority=100 if name == "keep" else 0)))
        await demo.clock.advance(10)
    await demo.until(lambda: all(demo.phase("research", n) == "Running" for n in names))
    await demo.clock.advance(60)

    demo.store.create(job_from(job("urgent", priority=1000)))
    await demo.until(lambda: demo.phase("research", "urgent") == "Running", timeout=600)
    stopped = [n for n in names if not demo.placed("research", n)]
    assert stopped == ["low4"]  # priority 0, started last: the least work lost
    victim = demo.pg("research", "low4")
    assert victim.status.reason in ("Preempted", "Unschedulable")
    assert "Preempted" in demo.events("research", "low4")
    assert (
        "preempted by higher-priority job urgent (priority 1000)"
        in demo.events("research", "low4")["Preempted"]
    )
    assert "Preempting" in demo.events("research", "urgent")
    assert demo.phase("research", "low4") not in ("Failed", "Succeeded")
    metrics = generate_latest(demo.platform.ctx.registry).decode()
    assert 'gpuyard_preemptions_total{reason="priority"} 1.0' in metrics
    assert "gpuyard_gpu_hours_lost_total" in metrics
