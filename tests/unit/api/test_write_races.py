"""The API's writes when another writer got there first (on Kubernetes the cache lags the API server):

* a replace without `metadata.resourceVersion` (`PUT` of a queue, `apply`, a job's `PATCH`) that
  races the scheduler's or the operator's write of the same object is decided again on the fresher
  object, and answers 200; with a resourceVersion the 409 is the answer;
* a create whose name was taken after the handler looked answers 409 (not 500).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpuyard.apis.meta import Resource
from gpuyard.state.context import Context
from gpuyard.state.store import AlreadyExists
from gpuyard.state.writing import Writer
from tests.unit.controllers.fakes import JOBS

PT = (JOBS / "pytorch-simple.yaml").read_text()
NS, NAME = "kubeflow", "pytorch-simple"
MERGE = {"Content-Type": "application/merge-patch+json"}


class Racing:
    """The writer, with another writer's status write landing on the object just before each of the
    next `times` updates (the handler's resourceVersion is then stale)."""

    def __init__(self, writer: Writer, *, status: dict[str, Any], times: int) -> None:
        self.writer, self.status, self.times = writer, status, times
        self.updates = 0

    async def update(self, obj: Resource) -> Resource:
        self.updates += 1
        if self.times:
            self.times -= 1
            await self.writer.patch_status(obj.kind, obj.metadata.namespace, obj.metadata.name, self.status)
        return await self.writer.update(obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


def queue(weight: float, **meta: Any) -> str:
    return yaml.safe_dump({"kind": "Queue", "metadata": {"name": "team", **meta}, "spec": {"weight": weight}})


@pytest.mark.parametrize("times, expect", [(1, 200), (4, 200), (5, 409)])
async def test_a_queue_put_that_races_the_scheduler_is_decided_again(
    client: Any, ctx: Context, times: int, expect: int
) -> None:
    assert (
        await client.put("/api/v1/queues/team", data=queue(1), headers={"Content-Type": "application/yaml"})
    ).status == 201
    racing = Racing(ctx.writer, status={"pending": 3}, times=times)
    ctx.writer = racing
    r = await client.put("/api/v1/queues/team", data=queue(2), headers={"Content-Type": "application/yaml"})
    assert r.status == expect, await r.text()
    stored = ctx.store.must_get("Queue", "", "team")
    assert stored.spec.weight == (2 if expect == 200 else 1)
    assert stored.status.pending == 3  # the other writer's status is kept


async def test_a_put_with_a_resource_version_is_not_retried(client: Any, ctx: Context) -> None:
    r = await client.put("/api/v1/queues/team", data=queue(1), headers={"Content-Type": "application/yaml"})
    version = (await r.json())["metadata"]["resourceVersion"]
    racing = Racing(ctx.writer, status={"pending": 3}, times=1)
    ctx.writer = racing
    r = await client.put(
        "/api/v1/queues/team",
        data=queue(2, resourceVersion=version),
        headers={"Content-Type": "application/yaml"},
    )
    assert r.status == 409 and racing.updates == 1


async def test_apply_that_races_the_scheduler_is_decided_again(client: Any, ctx: Context) -> None:
    assert (
        await client.post("/api/v1/apply", data=queue(1), headers={"Content-Type": "application/yaml"})
    ).status == 200
    ctx.writer = Racing(ctx.writer, status={"running": 1}, times=2)
    r = await client.post("/api/v1/apply", data=queue(3), headers={"Content-Type": "application/yaml"})
    assert r.status == 200, await r.text()
    assert (await r.json())["applied"][0]["action"] == "configured"
    assert ctx.store.must_get("Queue", "", "team").spec.weight == 3


async def test_a_job_patch_without_a_resource_version_is_decided_again(client: Any, ctx: Context) -> None:
    from tests.builders import make_node

    ctx.store.create(make_node("node-a"))
    r = await client.post("/api/v1/jobs", data=PT.encode(), headers={"Content-Type": "application/yaml"})
    assert r.status == 201, await r.text()
    ctx.writer = Racing(ctx.writer, status={"restarts": 1}, times=2)
    path = f"/api/v1/namespaces/{NS}/jobs/{NAME}"
    r = await client.patch(path, data=json.dumps({"metadata": {"labels": {"team": "x"}}}), headers=MERGE)
    assert r.status == 200, await r.text()
    assert (await r.json())["metadata"]["labels"]["team"] == "x"
    version = (await r.json())["metadata"]["resourceVersion"]
    ctx.writer = Racing(ctx.writer, status={"restarts": 2}, times=1)
    body = {"metadata": {"labels": {"team": "y"}, "resourceVersion": version}}
    r = await client.patch(path, data=json.dumps(body), headers=MERGE)
    assert r.status == 409, await r.text()


async def test_a_name_taken_meanwhile_is_a_conflict(client: Any, ctx: Context) -> None:
    writer = ctx.writer
    assert writer is not None

    async def taken(obj: Resource) -> Resource:
        raise AlreadyExists(f"{obj.kind} {obj.metadata.name} already exists")

    writer.create = taken
    r = await client.put("/api/v1/queues/team", data=queue(1), headers={"Content-Type": "application/yaml"})
    assert r.status == 409
    assert "created meanwhile" in (await r.json())["error"]["message"]
