"""No head-of-line blocking through the whole platform (issue #13's measured cases).

Two DGX-1 nodes (fake backend, job operator, scheduler, virtual clock) with 3 + 5 GPUs free: a
waiting gang that does not fit on the real nodes (2 x 4 GPUs; 1 x 6 GPUs) says why it waits and
holds the room of its planned placement, while a job of another namespace that fits elsewhere
(1 GPU; 3 GPUs) starts at once — it used to wait behind the head for an hour.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.integration.test_quota_demo import Demo
from tests.integration.virtual_platform import virtual_platform
from tests.unit.controllers.fakes import job_from

CLUSTER = """
name: two-dgx1
kubelet: {startDelay: 1, duration: null, exitCode: 0}
nodeGroups:
  - name: dgx1
    count: 2
    cpu: "80"
    memory: 512Gi
    gpu: {model: v100, count: 8}
    topology: dgx1-v100
    block: block-a
"""


def job(name: str, namespace: str, *, gpus: int, workers: int = 0, node: str | None = None) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    pod: dict[str, Any] = {"containers": [container]}
    if node:
        pod["nodeSelector"] = {"kubernetes.io/hostname": node}
    specs: dict[str, Any] = {
        "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": pod}}
    }
    if workers:
        specs["Worker"] = {"replicas": workers, "restartPolicy": "OnFailure", "template": {"spec": pod}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": specs},
    }


@pytest_asyncio.fixture
async def two_dgx1(tmp_path: Path) -> AsyncIterator[Demo]:
    path = tmp_path / "two-dgx1.yaml"
    path.write_text(CLUSTER)
    async with virtual_platform(path) as platform:
        yield Demo(platform)


@pytest.mark.parametrize(
    ("head", "small_gpus"),
    [(job("head", "team-a", gpus=4, workers=1), 1), (job("head", "team-a", gpus=6), 3)],
    ids=["2x4-head-and-1-gpu-job", "1x6-head-and-3-gpu-job"],
)
async def test_a_head_that_does_not_fit_does_not_block_a_job_that_fits(
    two_dgx1: Demo, head: dict[str, Any], small_gpus: int
) -> None:
    demo = two_dgx1
    demo.store.create(job_from(job("fill5", "team-a", gpus=5, node="dgx1-0")))
    demo.store.create(job_from(job("fill3", "team-a", gpus=3, node="dgx1-1")))
    await demo.until(
        lambda: demo.phase("team-a", "fill5") == "Running" and demo.phase("team-a", "fill3") == "Running"
    )
    demo.store.create(job_from(head))
    await demo.clock.advance(5)
    demo.store.create(job_from(job("small", "team-b", gpus=small_gpus)))
    await demo.until(lambda: demo.phase("team-b", "small") == "Running", timeout=60)
    status = demo.pg("team-a", "head").status
    assert status.phase == "Pending" and status.message  # it says why it waits
    assert "room is held for it" in status.message
