"""The quota issue's "done when" on the demo cluster with two teams' quotas.

Team A's idle guaranteed GPUs run team B's jobs; when team A submits, B's borrowed jobs are
preempted (whole gangs, newest first) and requeued — not failed — so that A gets its min; every
step is visible in the quotas' status and the jobs' events. A whole Platform (fake demo cluster,
job operator, scheduler) runs on a virtual clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest_asyncio

from gpuyard.apis.jobkinds import find_job
from gpuyard.apis.jobs import load_documents
from gpuyard.apis.quota import parse_quota_document
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import VirtualClock
from gpuyard.state.ownership import SCHEDULER
from tests.integration.virtual_platform import virtual_platform
from tests.unit.controllers.fakes import ROOT, job_from

QUOTAS = ROOT / "configs" / "quotas" / "demo-teams.yaml"


def gpu_job(name: str, namespace: str, *, gpus: int = 8) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
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


class Demo:
    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.store = platform.store
        self.clock = platform.clock
        assert isinstance(self.clock, VirtualClock)

    def submit(self, name: str, namespace: str) -> None:
        self.store.create(job_from(gpu_job(name, namespace)))

    def phase(self, ns: str, name: str) -> str:
        job = find_job(self.store, ns, name)
        return job.status.phase if job is not None else ""

    def pg(self, ns: str, name: str) -> Any:
        return self.store.get("PodGroup", ns, name)

    def placed(self, ns: str, name: str) -> bool:
        pg = self.pg(ns, name)
        return pg is not None and pg.status.phase == "Placed"

    def quota(self, name: str) -> dict[str, dict[str, Decimal]]:
        st = self.store.must_get("ElasticQuota", name, name).status
        return {"used": dict(st.used), "runtime": dict(st.runtime), "request": dict(st.request)}

    def events(self, ns: str, name: str) -> dict[str, str]:
        """The scheduler's Events about the job: reason -> message (the operator reports a
        preemption too, as the job's queuing again)."""
        return {
            e.reason: e.message
            for e in self.store.list("Event", namespace=ns)
            if e.involved_object.get("name") == name and e.source.get("component") == SCHEDULER
        }

    async def until(self, cond, timeout: float = 300.0) -> None:  # type: ignore[no-untyped-def]
        assert await self.clock.run_until(cond, timeout=timeout)  # type: ignore[attr-defined]


@pytest_asyncio.fixture
async def demo() -> AsyncIterator[Demo]:
    def store_quotas(platform: Platform) -> None:
        for doc in load_documents(QUOTAS.read_text()):
            platform.store.create(
                parse_quota_document(doc, current_quotas=platform.store.list("ElasticQuota"))
            )

    async with virtual_platform(
        ROOT / "configs" / "clusters" / "demo.yaml", prepare=store_quotas
    ) as platform:
        yield Demo(platform)


GPU = "nvidia.com/gpu"


async def test_team_b_borrows_team_a_idle_gpus_and_gives_them_back(demo: Demo) -> None:
    # team B submits 5 jobs x 8 GPUs = 40 GPUs: 24 of its own min plus 16 borrowed from idle team A
    for i in range(5):
        demo.submit(f"b{i}", "team-b")
        await demo.clock.advance(1)  # distinct submission and start times
    await demo.until(lambda: all(demo.phase("team-b", f"b{i}") == "Running" for i in range(5)))
    await demo.clock.advance(1)
    b = demo.quota("team-b")
    assert b["used"][GPU] == 40 and b["runtime"][GPU] >= 40  # borrowing beyond its min of 24

    # team A submits 2 x 8 GPUs = 16, within its min of 24: 12 GPUs are free, so B must give back
    demo.submit("a0", "team-a")
    demo.submit("a1", "team-a")
    await demo.until(lambda: demo.placed("team-a", "a0") and demo.placed("team-a", "a1"))
    await demo.until(
        lambda: demo.phase("team-a", "a0") == "Running" and demo.phase("team-a", "a1") == "Running"
    )
    await demo.clock.advance(1)

    # B's newest job was preempted (whole gang), and is requeued (not failed): waiting on quota
    victims = [f"b{i}" for i in range(5) if not demo.placed("team-b", f"b{i}")]
    assert victims == ["b4"]
    assert demo.phase("team-b", "b4") not in ("Failed", "Succeeded")
    pg = demo.pg("team-b", "b4")
    assert pg.status.phase == "Pending" and pg.status.reason == "QuotaExceeded"
    assert "quota team-b" in pg.status.message and "in queue team-b" in pg.status.message
    events = demo.events("team-b", "b4")
    assert events["Preempted"].startswith("reclaimed by quota team-a (min 24)")
    assert "Reclaiming" in demo.events("team-a", "a1") or "Reclaiming" in demo.events("team-a", "a0")

    # the quotas' status shows it: A holds its 16 within min, B is back within its runtime
    a, b = demo.quota("team-a"), demo.quota("team-b")
    assert a["used"][GPU] == 16 and a["runtime"][GPU] == 16
    assert b["used"][GPU] == 32 and b["used"][GPU] <= b["runtime"][GPU]
    assert b["request"][GPU] == 40
    queue_b = demo.store.must_get("Queue", "", "team-b").status
    assert (queue_b.pending, queue_b.running) == (1, 4)

    # when team A's jobs end, B's preempted job runs again
    demo.store.delete("PyTorchJob", "team-a", "a0")
    demo.store.delete("PyTorchJob", "team-a", "a1")
    await demo.until(lambda: demo.phase("team-b", "b4") == "Running")
