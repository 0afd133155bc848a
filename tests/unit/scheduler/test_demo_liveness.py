"""Jobs that could run are not left waiting: the cases found on the bundled demo (issue 24).

Each test runs the whole platform on the demo cluster (configs/clusters/demo.yaml) with its
sample jobs (configs/demo), on the harness's virtual clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.priorityclasses import PriorityClass
from gpuyard.apis.quotakinds import ElasticQuota
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.testing import Cluster

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "configs" / "clusters" / "demo.yaml"
TEAMS = ROOT / "configs" / "quotas" / "demo-teams.yaml"


def h100_job(name: str, namespace: str, *, priority_class: str | None = None) -> dict[str, Any]:
    container = {
        "name": "pytorch",
        "image": "pytorch",
        "resources": {"limits": {"nvidia.h100": 8, "cpu": "8", "memory": "64Gi"}},
    }
    spec: dict[str, Any] = {
        "pytorchReplicaSpecs": {
            "Master": {
                "replicas": 1,
                "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [container]}},
            }
        }
    }
    if priority_class:
        spec["runPolicy"] = {"schedulingPolicy": {"priorityClass": priority_class}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def _with_demo_jobs(cluster: Cluster) -> Cluster:
    for path in sorted((ROOT / "configs" / "demo").glob("*.yaml")):
        await cluster.submit(path)
    await cluster.run_until("team-b/llm-pretrain", "Running", timeout=120)
    return cluster


@pytest_asyncio.fixture
async def demo() -> AsyncIterator[Cluster]:
    async with Cluster.start(DEMO) as cluster:
        yield await _with_demo_jobs(cluster)


@pytest_asyncio.fixture
async def teams() -> AsyncIterator[Cluster]:
    async with Cluster.start(DEMO, quotas=TEAMS) as cluster:
        yield await _with_demo_jobs(cluster)


def _podgroup(cluster: Cluster, job: str) -> PodGroup:
    ns, name = job.split("/")
    return cluster.store.must_get_of(PodGroup, ns, name)


async def test_a_high_priority_job_that_preempted_starts_on_the_room_it_freed(demo: Cluster) -> None:
    # hgx-0's 8 H100s run team-b's llm-pretrain; an urgent team-a job asks for all of them
    await demo.writer.create(PriorityClass(metadata=ObjectMeta(name="high"), value=100000))
    await demo.submit(h100_job("urgent", "team-a", priority_class="high"))
    await demo.run_until("team-a/urgent", "Running", timeout=60)
    assert {p.node for p in demo.placement("team-a/urgent").pods} == {"hgx-0"}
    # the victim waits for room again, without holding any against its preemptor
    held = [
        r for r in demo.store.list_of(Reservation, namespace="team-b") if r.spec.pod_group == "llm-pretrain"
    ]
    assert held == []
    # and says so: Queuing, for the preemption's sake (not Restarting with no reason)
    victim = demo.job("team-b/llm-pretrain")
    assert victim.status.phase == "Queuing"
    queuing = victim.status.condition("Queuing")
    assert queuing is not None and queuing.reason == "Preempted", queuing
    assert victim.status.restarts == 0


async def test_a_job_that_can_never_fit_does_not_squeeze_the_default_quota(teams: Cluster) -> None:
    # team-b's a100-sweep (4 x 8 A100s, the demo has 8) can never fit: its demand counts for nothing
    sweep = _podgroup(teams, "team-b/a100-sweep")
    assert sweep.status.reason == "Unschedulable"
    assert "can never fit" in sweep.status.message
    team_b = teams.store.must_get_of(ElasticQuota, "team-b", "team-b")
    assert team_b.status.request.get("nvidia.com/gpu") == 8  # llm-pretrain's 8 H100s alone
    # the MPIJob of namespace kubedl (no quota names it: the default quota) starts on free GPUs
    await teams.submit(ROOT / "configs" / "jobs" / "mpi-kubedl.yaml")
    await teams.run_until("kubedl/horovod-resnet", "Running", timeout=60)


async def test_no_per_model_limit_applies_that_no_quota_sets(teams: Cluster) -> None:
    # team-b runs 8 H100s; team-a (guaranteed 24 GPUs) asks for 8 H100s too: only the room is
    # missing, never an `nvidia.h100` runtime that no ElasticQuota names
    await teams.submit(h100_job("h100-too", "team-a"))
    await teams.advance(10)
    pg = _podgroup(teams, "team-a/h100-too")
    assert pg.status.reason == "Unschedulable", pg.status.message
    assert "nvidia.h100 used" not in pg.status.message
    team_a = teams.store.must_get_of(ElasticQuota, "team-a", "team-a")
    assert "nvidia.h100" not in team_a.status.runtime
    await teams.delete("team-b/llm-pretrain")
    await teams.run_until("team-a/h100-too", "Running", timeout=60)
