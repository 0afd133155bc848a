"""Delegate mode on the Kubernetes backend: gpuyard queues and admits, Volcano places.

The test API server serves Volcano's `scheduling.volcano.sh/v1beta1` PodGroups (a minimal CRD, as
Volcano's chart would install) beside gpuyard's own; the test plays Volcano (it binds the pods) and
the kubelet. gpuyard writes the Volcano PodGroup before the pods that name it, never binds a pod
itself, counts each delegated pod once (by its Reservation, not again as a foreign pod), and
deletes the Volcano PodGroup when the job is done; the invariant checker does not call a delegated
pod on another node than its Reservation a broken placement.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpuyard.apis.core import Node, Pod
from gpuyard.apis.gangs import GANG_API_VERSIONS, GANG_KIND
from gpuyard.apis.resources import resource_for
from gpuyard.apis.scheduling import Reservation
from gpuyard.kubecluster.nodes import ANNOTATION_FOREIGN_USAGE
from gpuyard.kubecluster.writing import to_json
from gpuyard.platform.invariants import check_store
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import RealClock
from gpuyard.state.config import Settings
from gpuyard.state.store import NotFound
from gpuyard.testing.apiserver.crds import minimal_crd
from tests.builders import make_node, make_pod
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import (
    NODES,
    PODS,
    TFJOBS,
    connect,
    eventually,
    job_pods,
    platform,
    play_kubelet,
    settings,
    tfjob,
)

__all__ = ["served"]

VOLCANO = resource_for(GANG_KIND, GANG_API_VERSIONS["volcano"])


def delegated(kubeconfig: Any) -> Settings:
    s = settings(kubeconfig, election=False)
    return s.model_copy(
        update={"scheduler": s.scheduler.model_copy(update={"mode": "delegate", "gang_scheduler": "volcano"})}
    )


async def test_volcano_places_gpuyard_admits_and_writes_the_pod_group(served: FakeApiServerView) -> None:
    served.install_crds([minimal_crd(VOLCANO)])
    client = await connect(served)
    try:
        for i in range(2):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        async with platform(delegated(served.kubeconfig)) as p:
            await client.create(TFJOBS, tfjob("mnist", workers=2, gpus=4))
            pods = await eventually(
                lambda: len(job_pods(served, "mnist")) == 2 and job_pods(served, "mnist"), what="two pods"
            )
            group = await client.get(VOLCANO, "default", "mnist")
            assert (group["apiVersion"], group["kind"]) == ("scheduling.volcano.sh/v1beta1", "PodGroup")
            job_uid = served.get("tfjobs", "default", "mnist")["metadata"]["uid"]
            assert group["metadata"]["ownerReferences"][0]["uid"] == job_uid
            assert group["spec"]["minMember"] == 2 and group["spec"]["minTaskMember"] == {"worker": 2}
            assert group["spec"]["minResources"]["nvidia.com/gpu"] == "8"
            assert "queue" not in group["spec"]  # the job names none: Volcano's default queue, not gpuyard's
            for pod in pods:
                assert pod["spec"]["schedulerName"] == "volcano" and not pod["spec"].get("nodeName")
                assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "mnist"
                assert "gpuyard.io/devices" not in pod["metadata"]["annotations"]
            assert served.bindings() == []  # gpuyard leaves placement to Volcano

            # Volcano binds each pod to the node gpuyard's books did not pick for it; a pod of another
            # Volcano user lands on gpu-1 too
            other = to_json(make_pod("someone-else", node="gpu-1", gpus=2))
            other["spec"]["schedulerName"] = "volcano"
            await client.create(PODS, other)
            where = {other["metadata"]["name"]: "gpu-1"}
            for pod in pods:
                name = pod["metadata"]["name"]
                booked = p.store.must_get_of(Reservation, "default", name).spec.node
                where[name] = "gpu-1" if booked == "gpu-0" else "gpu-0"
                await client.bind("default", name, where[name], uid=pod["metadata"]["uid"])
            await eventually(
                lambda: all(
                    (q := p.store.get_of(Pod, "default", name)) is not None and q.spec.node_name == node
                    for name, node in where.items()
                ),
                what="the bound pods in gpuyard's cache",
            )
            # gpuyard's books hold the job where its Reservations are: not a broken invariant
            assert [
                v for v in check_store(p.store, delegated_to="volcano") if v.invariant == "placement"
            ] == []
            assert [v for v in check_store(p.store) if v.invariant == "placement"]  # what it would say else
            usage = p.store.must_get_of(Node, "", "gpu-1").metadata.annotations[ANNOTATION_FOREIGN_USAGE]
            # counted once: the job's 8 GPUs by its Reservations, only the other user's pod as foreign
            assert "nvidia.com/gpu=2" in usage.split(","), usage

            await play_kubelet(client, served, "mnist", phase="Running")
            await play_kubelet(client, served, "mnist", phase="Succeeded")
            await eventually(
                lambda: (
                    served.get("tfjobs", "default", "mnist").get("status", {}).get("phase") == "Succeeded"
                ),
                what="job Succeeded",
            )

            async def gone() -> bool:
                try:
                    await client.get(VOLCANO, "default", "mnist")
                except NotFound:
                    return True
                return False

            for _ in range(250):
                if await gone():
                    break
                await asyncio.sleep(0.02)
            assert await gone(), "the Volcano PodGroup is deleted when the job is done"
            assert served.bindings() == [
                (pod["metadata"]["namespace"], pod["metadata"]["name"]) for pod in pods
            ]
    finally:
        await client.close()


async def test_a_missing_gang_scheduler_crd_keeps_gpuyard_not_ready(served: FakeApiServerView) -> None:
    """Delegate mode to a gang scheduler that is not installed: not ready, and the log says why."""
    p = Platform(delegated(served.kubeconfig), clock=RealClock(), serve_http=False)
    task = asyncio.create_task(p.run())
    try:
        await asyncio.sleep(1.0)
        assert not p.backend.synced.is_set()
        broken = [i for i in p.backend.informers if not i.healthy]  # type: ignore[attr-defined]
        assert [i.name for i in broken] == ["podgroups.scheduling.volcano.sh"]
        assert "install volcano" in broken[0].missing_hint()
    finally:
        p.stop()
        await asyncio.wait_for(task, 10)
