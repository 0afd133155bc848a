"""`runPolicy.managedBy` on the Kubernetes backend (the development server and the real control plane).

A job another controller manages (`kueue.x-k8s.io/multikueue`) gets no pods, no PodGroup and no
status write from gpuyard, not even the `InvalidSpec` report of a job that does not validate; on
the real API server the CRD's transition rule keeps the field immutable.
"""

from __future__ import annotations

import asyncio
import copy

import pytest

from gpuyard.apis.managers import MULTIKUEUE, TRAINING_OPERATOR
from gpuyard.kubecluster.client import ApiError
from gpuyard.kubecluster.writing import to_json
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


async def test_a_job_another_controller_manages_is_left_alone(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False)) as p:
            theirs = tfjob("theirs", workers=1, gpus=1)
            theirs["spec"]["runPolicy"] = {"managedBy": MULTIKUEUE}
            broken = copy.deepcopy(theirs)
            broken["metadata"]["name"] = "theirs-broken"
            broken["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = -1  # would fail InvalidSpec if ours
            ours = tfjob("ours", workers=1, gpus=1)
            ours["spec"]["runPolicy"] = {"managedBy": TRAINING_OPERATOR}
            for job in (theirs, broken, ours):
                await client.create(TFJOBS, job)
            await eventually(
                lambda: (
                    job_pods(served, "ours")
                    and all(x["spec"].get("nodeName") for x in job_pods(served, "ours"))
                ),
                what="gpuyard's own job's pod bound",
            )
            await eventually(lambda: p.ctx.store.get("TFJob", "default", "theirs") is not None, what="cached")
            await asyncio.sleep(0.5)
            for name in ("theirs", "theirs-broken"):
                stored = served.get("tfjobs", "default", name)
                assert stored is not None
                assert not (stored.get("status") or {}), f"{name}: gpuyard wrote its status"
                assert not job_pods(served, name)
                assert served.get("podgroups", "default", name) is None
            assert not [r for r in served.requests if r[0] == "PATCH" and "/theirs" in r[1]]
            if served.real:  # the CRD's transition rule (CEL) is the real API server's
                changed = copy.deepcopy(served.get("tfjobs", "default", "theirs"))
                assert changed is not None
                changed["spec"]["runPolicy"]["managedBy"] = TRAINING_OPERATOR
                with pytest.raises(ApiError) as refused:
                    await client.replace(TFJOBS, changed)
                assert refused.value.status == 422 and "managedBy is immutable" in str(refused.value)
    finally:
        await client.close()
