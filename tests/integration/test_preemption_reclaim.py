"""Reclaim counts every dimension the quota tracks (issue #13, measured case).

On the demo cluster (52 GPUs; 48 of them on 8-GPU nodes) with the two teams' quotas, team A runs
seven 8-GPU jobs that also ask for `cpu: 1` and `memory: 1Gi`; six start (borrowing team B's
idle min). Team B's 8-GPU job is within its min of 24 GPUs: a borrowed job of team A is
preempted and team B's job starts, although the quotas guarantee GPUs only.
"""

from __future__ import annotations

from typing import Any

from gpuyard.apis.jobkinds import find_job
from tests.integration.test_quota_demo import Demo, demo  # noqa: F401  (the fixture)
from tests.unit.controllers.fakes import job_from


def cpu_gpu_job(name: str, namespace: str) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": 8, "cpu": "1", "memory": "1Gi"}
    container = {"name": "pytorch", "image": "pytorch", "resources": {"limits": limits}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [container]}},
                }
            }
        },
    }


async def test_reclaim_fires_when_jobs_also_request_cpu_and_memory(demo: Demo) -> None:  # noqa: F811
    for i in range(7):
        demo.store.create(job_from(cpu_gpu_job(f"a{i}", "team-a")))
        await demo.clock.advance(1)
    await demo.until(lambda: sum(demo.placed("team-a", f"a{i}") for i in range(7)) == 6)
    await demo.clock.advance(5)
    assert demo.quota("team-a")["used"]["nvidia.com/gpu"] == 48  # 24 of its min + 24 borrowed

    demo.store.create(job_from(cpu_gpu_job("b0", "team-b")))
    await demo.until(lambda: demo.placed("team-b", "b0"), timeout=600)
    await demo.until(lambda: demo.phase("team-b", "b0") == "Running", timeout=600)
    # exactly one of team A's jobs gave its GPUs back, and it waits again (not failed)
    running = [i for i in range(7) if demo.placed("team-a", f"a{i}")]
    assert len(running) == 5
    preempted = [f"a{i}" for i in range(7) if "Preempted" in demo.events("team-a", f"a{i}")]
    assert len(preempted) == 1
    job = find_job(demo.store, "team-a", preempted[0])
    assert job is not None and job.status.phase not in ("Failed", "Succeeded")
