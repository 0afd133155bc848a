"""Writes the cluster refuses: a clear answer, and `apply` stays all or nothing.

On the Kubernetes backend the writer raises `BackendError` with the status the API server
answered. The API answers 422 when the cluster refused the object itself (400/422: a CRD schema, an
admission webhook), 502 when it refused gpuyard's write otherwise (e.g. 403: a narrowed
ClusterRole), 503 when the write was not taken at all (no answer, a standby). A policy file whose
write fails part-way has the writes that went through put back: created objects deleted,
configured ones given their earlier spec again.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpuyard.apis.meta import Resource
from gpuyard.state.backend import BackendError
from gpuyard.state.context import Context
from gpuyard.state.writing import Writer


class Refused(BackendError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Refusing:
    """The writer, refusing creates and updates of `kind` with `status`."""

    def __init__(self, writer: Writer, *, kind: str, status: int) -> None:
        self.writer, self.kind, self.status = writer, kind, status

    def _check(self, obj: Resource) -> None:
        if obj.kind == self.kind:
            raise Refused(f'{self.kind} "{obj.metadata.name}" is forbidden: refused', self.status)

    async def create(self, obj: Resource) -> Resource:
        self._check(obj)
        return await self.writer.create(obj)

    async def update(self, obj: Resource) -> Resource:
        self._check(obj)
        return await self.writer.update(obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


def policy(weight: float, gpus: int) -> str:
    return yaml.safe_dump_all(
        [
            {"kind": "Queue", "metadata": {"name": "team"}, "spec": {"weight": weight}},
            {
                "kind": "ElasticQuota",
                "metadata": {"name": "team", "namespace": "default"},
                "spec": {"max": {"nvidia.com/gpu": gpus}, "namespaces": ["default"]},
            },
            {
                "kind": "ResourceClass",
                "metadata": {"name": "fast"},
                "spec": {"selector": {"matchLabels": {"gpuyard.io/gpu-model": "a100"}}},
            },
        ]
    )


@pytest.mark.parametrize(("status", "expect"), [(422, 422), (400, 422), (403, 502), (500, 502), (0, 503)])
async def test_a_refused_write_gets_a_clear_answer(
    client: Any, ctx: Context, status: int, expect: int
) -> None:
    assert ctx.writer is not None
    ctx.writer = Refusing(ctx.writer, kind="Queue", status=status)
    r = await client.put(
        "/api/v1/queues/team",
        data=yaml.safe_dump({"kind": "Queue", "spec": {"weight": 1}}),
        headers={"Content-Type": "application/yaml"},
    )
    body = await r.json()
    assert r.status == expect, body
    assert "is forbidden: refused" in body["error"]["message"]
    assert body["error"]["details"][0]["field"] == "cluster"
    assert ctx.store.get("Queue", "", "team") is None


async def test_apply_refused_part_way_creates_nothing(client: Any, ctx: Context) -> None:
    assert ctx.writer is not None
    ctx.writer = Refusing(ctx.writer, kind="ElasticQuota", status=422)
    r = await client.post("/api/v1/apply", data=policy(1, 8), headers={"Content-Type": "application/yaml"})
    body = await r.json()
    assert r.status == 422, body
    assert "nothing was applied" in body["error"]["message"]
    assert ctx.store.get("Queue", "", "team") is None
    assert ctx.store.get("ResourceClass", "", "fast") is None


async def test_apply_refused_part_way_puts_the_earlier_specs_back(client: Any, ctx: Context) -> None:
    assert (
        await client.post("/api/v1/apply", data=policy(1, 8), headers={"Content-Type": "application/yaml"})
    ).status == 200
    assert ctx.writer is not None
    writer = ctx.writer
    ctx.writer = Refusing(writer, kind="ResourceClass", status=403)
    r = await client.post(
        "/api/v1/apply",
        data=policy(5, 16).replace("a100", "h100"),
        headers={"Content-Type": "application/yaml"},
    )
    assert r.status == 502, await r.text()
    assert ctx.store.must_get("Queue", "", "team").spec.weight == 1  # type: ignore[attr-defined]
    quota = ctx.store.must_get("ElasticQuota", "default", "team")
    assert quota.spec.max["nvidia.com/gpu"] == 8  # type: ignore[attr-defined]
    ctx.writer = writer
    r = await client.post("/api/v1/apply", data=policy(5, 16), headers={"Content-Type": "application/yaml"})
    assert r.status == 200 and ctx.store.must_get("Queue", "", "team").spec.weight == 5  # type: ignore[attr-defined]
