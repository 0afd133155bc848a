"""The rescheduler through the whole platform (operator, scheduler, fake kubelet, virtual clock):
the issue's 8 x 8-GPU example — one 1-GPU job on each of eight nodes, an 8-GPU job waiting —
dry-run, the moves, `gpuyard.io/migratable: "false"`, the limits, the periodic run; and suspend /
resume through PATCH."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gpuyard.apis.core import Event
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.scheduler.running import service_for
from gpuyard.testing import Cluster

SMALL = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: {name}
  namespace: default
  annotations: {annotations}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 1
      template:
        metadata: {{annotations: {{fake.gpuyard.io/duration: "100000"}}}}
        spec:
          containers:
            - {{name: pytorch, image: train, resources: {{limits: {{nvidia.com/gpu: {gpus}}}}}}}
"""


def job(name: str, gpus: int = 1, **annotations: str) -> str:
    ann = "{" + ", ".join(f'"{k}": "{v}"' for k, v in annotations.items()) + "}"
    return SMALL.format(name=name, gpus=gpus, annotations=ann)


@asynccontextmanager
async def scattered(
    *, cheap: dict[str, str] | None = None, serve_http: bool = False, **rescheduler: Any
) -> AsyncIterator[tuple[Cluster, dict[str, str]]]:
    """Eight 8-GPU nodes with one 1-GPU job each (`keep-<node index>`) and the 8-GPU job `big`
    waiting. `keep-3` has the annotations `cheap` (default: a 10-minute checkpoint interval,
    so moving it costs least)."""
    settings = {"scheduler": {"rescheduler": {"min_wait": 0, "interval": 30, **rescheduler}}}
    async with Cluster.start(nodes=[("dgx-a100", 8)], settings=settings, serve_http=serve_http) as c:
        fill = [await c.submit(job(f"fill-{i:02d}")) for i in range(64)]
        for j in fill:
            await c.run_until(j, "Running", timeout=300)
        by_node: dict[str, list[str]] = {}
        for j in fill:
            by_node.setdefault(c.placement(j).nodes[0], []).append(j.metadata.name)
        assert len(by_node) == 8 and all(len(v) == 8 for v in by_node.values())
        # a full cluster with one GPU freed at a time: each keep job gets the only free room, so
        # one lands on each node (on an empty cluster the scheduler would pack them together)
        for i, names in enumerate(by_node.values()):
            await c.delete(("default", names[0]))
            await c.advance(30)
            extra = (
                (cheap if cheap is not None else {"gpuyard.io/checkpoint-interval": "10m"}) if i == 3 else {}
            )
            k = await c.submit(job(f"keep-{i}", **extra))
            await c.run_until(k, "Running", timeout=300)
        for names in by_node.values():
            for name in names[1:]:
                await c.delete(("default", name))
        await c.advance(30)
        placed = {f"keep-{i}": c.placement(("default", f"keep-{i}")).nodes[0] for i in range(8)}
        assert len(set(placed.values())) == 8, placed  # one on each node
        await c.advance(900)  # 15 minutes in: keep-3 checkpointed 5 minutes ago
        big = await c.submit(job("big", 8))
        if not rescheduler.get("enabled"):
            await c.advance(60)
            assert c.phase(big) == "Queuing"
        yield c, placed


async def ask(c: Cluster, *, dry_run: bool) -> dict[str, Any]:
    service = service_for(c.store)
    assert service is not None
    answer = asyncio.ensure_future(service.request(dry_run=dry_run))
    while not answer.done():
        await c.advance(1)
    return answer.result()


def reservations(c: Cluster) -> dict[str, str]:
    return {r.metadata.name: r.spec.node for r in c.store.list_of(Reservation)}


def events(c: Cluster, name: str) -> dict[str, str]:
    return {
        e.reason: e.message
        for e in c.store.list_of(Event, namespace="default")
        if e.involved_object.get("name") == name
    }


async def test_plan_moves_the_cheapest_job_and_the_big_job_starts() -> None:
    async with scattered() as (c, placed):
        before = reservations(c)
        plan = await ask(c, dry_run=True)
        assert [m["job"] for m in plan["moves"]] == ["default/keep-3"]
        move = plan["moves"][0]
        assert move["from"]["node"] == placed["keep-3"] and move["to"]["node"] != placed["keep-3"]
        assert move["costGpuHours"] <= 600 / 3600 and plan["beneficiaries"] == ["default/big"]
        await c.advance(5)
        assert reservations(c) == before  # the dry run changed nothing
        assert not any(pg.status.evictions for pg in c.store.list_of(PodGroup))

        done = await ask(c, dry_run=False)
        assert [m["job"] for m in done["moves"]] == ["default/keep-3"]
        await c.run_until(("default", "big"), "Running", timeout=600)
        assert c.placement(("default", "big")).nodes == [placed["keep-3"]]
        await c.run_until(("default", "keep-3"), "Running", timeout=600)
        assert c.placement(("default", "keep-3")).nodes == [move["to"]["node"]]
        for i in range(8):
            assert c.phase(("default", f"keep-{i}")) == "Running"
        assert not [n for n in reservations(c) if n.endswith(".next")]
        held: dict[str, list[int]] = {}
        for r in c.store.list_of(Reservation):  # nothing is held twice
            assert not set(held.get(r.spec.node, [])) & set(r.spec.gpus), (r.metadata.name, held)
            held.setdefault(r.spec.node, []).extend(r.spec.gpus)
        assert "Migrated" in events(c, "keep-3") and "for default/big" in events(c, "keep-3")["Migrated"]
        assert "Migrating" in events(c, "big")
        value = c.platform.ctx.registry.get_sample_value("gpuyard_migrations_total")
        assert value == 1.0


async def test_migratable_false_is_never_moved() -> None:
    async with scattered(
        cheap={"gpuyard.io/migratable": "false", "gpuyard.io/checkpoint-interval": "10m"}
    ) as (c, _):
        plan = await ask(c, dry_run=True)
        assert len(plan["moves"]) == 1 and plan["moves"][0]["job"] != "default/keep-3"


async def test_limits_stop_the_plan() -> None:
    async with scattered(max_migrations_per_cycle=0) as (c, _):
        assert (await ask(c, dry_run=True))["moves"] == []
    async with scattered(max_migrations_per_job_per_hour=0) as (c, _):
        assert (await ask(c, dry_run=True))["moves"] == []
    async with scattered(max_gpu_hours_lost_per_hour=0.0) as (c, _):
        assert (await ask(c, dry_run=False))["moves"] == []
        await c.advance(120)
        assert c.phase(("default", "big")) == "Queuing"


async def test_periodic_rescheduler_lets_the_big_job_start() -> None:
    async with scattered(enabled=True) as (c, placed):
        await c.run_until(("default", "big"), "Running", timeout=600)
        assert c.placement(("default", "big")).nodes == [placed["keep-3"]]
        await c.run_until(("default", "keep-3"), "Running", timeout=600)


async def test_a_waiting_job_moved_to_another_queue_waits_there() -> None:
    import aiohttp

    async with Cluster.start(nodes=[("dgx-a100", 1)], serve_http=True) as c:
        first = await c.submit(job("first", 8))
        await c.run_until(first, "Running", timeout=300)
        second = await c.submit(job("second", 8))
        await c.advance(30)
        loop = next(comp.run.__self__ for comp in c.platform.components if comp.name == "scheduler")
        assert loop.queue.get(("default", "second")).queue == "default"
        url = f"{c.url}/api/v1/namespaces/default/jobs/second"
        patch = {"spec": {"runPolicy": {"schedulingPolicy": {"queue": "urgent", "priority": 5}}}}
        async with aiohttp.ClientSession() as http:
            async with http.patch(url, json=patch, headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200
        await c.advance(30)
        queued = loop.queue.get(("default", "second"))
        assert (queued.queue, queued.priority) == ("urgent", 5)
        await c.delete(first)
        await c.run_until(second, "Running", timeout=300)


async def test_suspend_releases_the_gpus_and_resume_runs_again() -> None:
    """PATCH over HTTP: the running job's pods go and its GPUs are free; resumed, it runs again."""
    import aiohttp

    async with Cluster.start(nodes=[("dgx-a100", 1)], serve_http=True) as c:
        j = await c.submit(job("sus", 8))
        await c.run_until(j, "Running", timeout=300)
        url = f"{c.url}/api/v1/namespaces/default/jobs/sus"
        merge = {"Content-Type": "application/merge-patch+json"}
        async with aiohttp.ClientSession() as http:
            async with http.patch(
                url, json={"spec": {"runPolicy": {"suspend": True}}}, headers=merge
            ) as resp:
                assert resp.status == 200, await resp.text()
            await c.run_until(j, "Suspended", timeout=120)
            await c.advance(10)
            assert c.pods(j) == [] and c.store.list_of(Reservation) == []
            other = await c.submit(job("other", 8))
            await c.run_until(other, "Running", timeout=300)  # the GPUs were free
            await c.delete(other)
            async with http.patch(
                url, json={"spec": {"runPolicy": {"suspend": False}}}, headers=merge
            ) as resp:
                assert resp.status == 200
            await c.run_until(j, "Running", timeout=300)
            assert len(c.pods(j)) == 1
