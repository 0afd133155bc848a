"""A job custom resource that fails validation, on the test API server (`fake_apiserver`).

It gets a `Failed` condition naming the field (through the `status` subresource) and one Warning
Event, once per resourceVersion (no hot loop on the echo of that status patch); the store (what the
operator sees) never holds it; once fixed, the job is picked up and runs like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Callable
from typing import Any, cast

import pytest

from gpuyard.kubecluster.client import ApiError, KubeClient
from gpuyard.kubecluster.invalid import REASON, InvalidJobs
from gpuyard.kubecluster.writing import to_json
from gpuyard.state.clock import RealClock
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import (
    NODES,
    TFJOBS,
    connect,
    eventually,
    job_pods,
    platform,
    settings,
    tfjob,
)

__all__ = ["served"]


def invalid_condition(server: FakeApiServerView, name: str) -> dict[str, Any] | None:
    job = server.get("tfjobs", "default", name) or {}
    for c in job.get("status", {}).get("conditions", []):
        if c.get("type") == "Failed" and c.get("reason") == REASON:
            return dict(c)
    return None


def warnings(server: FakeApiServerView, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in server.list("events")
        if e.get("involvedObject", {}).get("name") == name and e.get("reason") == REASON
    ]


def negative_replicas(job: dict[str, Any]) -> None:
    job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = -1


def bad_duration(job: dict[str, Any]) -> None:
    template = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]
    template["metadata"] = {"annotations": {"fake.gpuyard.io/duration": "ten minutes"}}


@pytest.mark.parametrize(
    ("spoil", "field"),
    [
        (negative_replicas, "spec.tfReplicaSpecs.Worker.replicas"),
        (bad_duration, "fake.gpuyard.io/duration"),
    ],
)
async def test_an_invalid_job_fails_naming_the_field(
    served: FakeApiServerView, spoil: Callable[[dict[str, Any]], None], field: str
) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False)) as p:
            bad = tfjob("bad", workers=1, gpus=1)
            spoil(bad)
            await client.create(TFJOBS, bad)
            cond = await eventually(lambda: invalid_condition(served, "bad"), what="Failed condition")
            assert cond["status"] == "True"
            assert field in cond["message"]
            job = served.get("tfjobs", "default", "bad")
            assert job is not None and job["status"]["phase"] == "Failed"
            events = await eventually(lambda: warnings(served, "bad"), what="a Warning Event")
            assert events[0]["type"] == "Warning"
            assert events[0]["message"] == cond["message"]
            assert events[0]["involvedObject"]["kind"] == "TFJob"
            assert p.ctx.store.get("TFJob", "default", "bad") is None, "the operator never sees it"
            # no hot loop: the echo of the status patch writes nothing more
            patches = len([r for r in served.requests if r[0] == "PATCH" and r[1].endswith("bad/status")])
            await asyncio.sleep(1.0)
            assert len(warnings(served, "bad")) == 1
            assert (
                len([r for r in served.requests if r[0] == "PATCH" and r[1].endswith("bad/status")])
                == patches
            )
            assert not job_pods(served, "bad")
    finally:
        await client.close()


async def test_unknown_replica_type_then_fixed_runs(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False)) as p:
            good = tfjob("typo", workers=1, gpus=1)
            bad = copy.deepcopy(good)
            specs = bad["spec"]["tfReplicaSpecs"]
            specs["Wrker"] = specs.pop("Worker")
            await client.create(TFJOBS, bad)
            cond = await eventually(lambda: invalid_condition(served, "typo"), what="Failed condition")
            assert "Wrker" in cond["message"]
            assert p.ctx.store.get("TFJob", "default", "typo") is None
            # a fix (a new spec) is picked up: the stale condition goes and pods are bound
            current = served.get("tfjobs", "default", "typo")
            assert current is not None
            fixed = copy.deepcopy(current)
            fixed["spec"] = good["spec"]
            fixed.pop("status", None)
            await client.replace(TFJOBS, fixed)
            await eventually(
                lambda: (
                    job_pods(served, "typo")
                    and all(x["spec"].get("nodeName") for x in job_pods(served, "typo"))
                ),
                what="the fixed job's pod bound",
            )
            await eventually(lambda: invalid_condition(served, "typo") is None, what="condition cleared")
            assert len(warnings(served, "typo")) == 1
    finally:
        await client.close()


async def test_a_standby_reports_nothing(served: FakeApiServerView) -> None:
    client: KubeClient = await connect(served)
    try:
        other = settings(served.kubeconfig, identity="replica-a")
        async with platform(other) as leader:
            await eventually(lambda: leader.backend.leadership.is_leader(), what="a leader")
            async with platform(settings(served.kubeconfig, identity="replica-b")) as standby:
                bad = tfjob("bad", workers=1, gpus=1)
                bad["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = -1
                await client.create(TFJOBS, bad)
                await eventually(lambda: warnings(served, "bad"), what="the leader's Warning Event")
                await asyncio.sleep(0.5)
                assert len(warnings(served, "bad")) == 1, "only the leader reports"
                assert standby.backend.invalid_jobs.events_written == 0
    finally:
        await client.close()


class RefusingClient:
    """Answers every status patch with `status` (0: no answer at all)."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.patches = 0

    async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.patches += 1
        raise ApiError("PATCH refused", status=self.status)


@pytest.mark.parametrize(("status", "retried"), [(422, False), (403, False), (503, True), (0, True)])
async def test_a_refused_report_is_given_up_a_failed_one_retried(status: int, retried: bool) -> None:
    client = RefusingClient(status)
    reporter = InvalidJobs(
        clock=RealClock(), may_write=lambda: None, client=cast(KubeClient, client), retry=0.01
    )
    raw = {"metadata": {"namespace": "default", "name": "bad", "resourceVersion": "7"}}
    reporter.note(TFJOBS, raw, "spec.x: bad")
    task = asyncio.create_task(reporter.run())
    await asyncio.sleep(0.2)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert (client.patches > 1) is retried
    assert reporter.events_written == 0
