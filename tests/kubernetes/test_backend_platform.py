"""The whole platform over the test API server (`fake_apiserver`, gpuyard's CRDs installed):
`Platform` with `backend.kind: kubernetes`.

A TFJob custom resource created through the API server becomes pods bound by gpuyard (labels,
ownerReferences, `gpuyard.io/devices`), and its status is patched to Succeeded when the pods (the
test plays their kubelet) succeed. Foreign pods take capacity. A node lost longer than the grace
period fails its pods `NodeLost`. Two replicas elect one leader; the standby answers writes with
503 naming the leader, and takes over when the leader is stopped mid-gang, binding no GPU twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuyard.apis.core import Node
from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.client import KubeClient
from gpuyard.kubecluster.writing import to_json
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import RealClock
from gpuyard.state.config import Settings
from gpuyard.state.store import NotFound
from tests.builders import make_node, make_pod
from tests.kubernetes.conftest_backend import FakeApiServerView, served

__all__ = ["served"]

NODES = resource_for("Node")
PODS = resource_for("Pod")
TFJOBS = resource_for("TFJob", "kubeflow.org/v1")


def tfjob(name: str, *, workers: int, gpus: int) -> dict[str, Any]:
    container = {"name": "tensorflow", "image": "tf:1", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": workers,
                    "restartPolicy": "Never",
                    "template": {"spec": {"containers": [container]}},
                }
            }
        },
    }


def settings(
    kubeconfig: Path, *, identity: str = "replica-a", election: bool = True, **kube: Any
) -> Settings:
    return Settings(
        server={"host": "127.0.0.1", "port": 0},
        backend={
            "kind": "kubernetes",
            "data_dir": None,
            "kubernetes": {
                "kubeconfig": str(kubeconfig),
                "namespace": "gpuyard-system",
                "leader_election": {
                    "enabled": election,
                    "identity": identity,
                    "lease_duration": 2.0,
                    "renew_deadline": 1.5,
                    "retry_period": 0.1,
                },
                **kube,
            },
        },
        scheduler={"cycle_interval": 0.02},
    )


@asynccontextmanager
async def platform(s: Settings, *, serve_http: bool = False) -> AsyncIterator[Platform]:
    p = Platform(s, clock=RealClock(), serve_http=serve_http)
    task = asyncio.create_task(p.run())
    try:
        await asyncio.wait_for(p.backend.synced.wait(), 10)
        yield p
    finally:
        p.stop()
        await asyncio.wait_for(task, 10)


async def eventually(check: Callable[[], Any], *, timeout: float = 10.0, what: str = "condition") -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def job_pods(server: FakeApiServerView, job: str) -> list[dict[str, Any]]:
    return [p for p in server.list("pods") if p["metadata"].get("labels", {}).get("job-name") == job]


async def pods_collected(
    client: KubeClient, server: FakeApiServerView, job: str, *, timeout: float = 30.0
) -> None:
    """Wait until the garbage collector has taken the job's pods, playing their kubelet: a real API
    server deletes a running pod gracefully (it stays, Terminating) until its kubelet's final
    delete, which this makes for each pod marked for deletion."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while pods := job_pods(server, job):
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                with contextlib.suppress(NotFound):
                    await client.delete(PODS, meta["namespace"], meta["name"], grace_period=0)
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {job}'s pods to be collected")
        await asyncio.sleep(0.1)


async def play_kubelet(client: KubeClient, server: FakeApiServerView, job: str, *, phase: str) -> None:
    for pod in job_pods(server, job):
        status: dict[str, Any] = {"phase": phase}
        if phase == "Succeeded":
            status["containerStatuses"] = [
                {
                    "name": "tensorflow",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
            ]
        await client.patch(PODS, "default", pod["metadata"]["name"], {"status": status}, sub="status")


async def connect(server: FakeApiServerView) -> KubeClient:
    return await KubeClient.connect(kubeconfig=str(server.kubeconfig), request_timeout=5.0)


async def test_tfjob_custom_resource_runs_to_succeeded(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        for i in range(2):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False)) as p:
            await client.create(TFJOBS, tfjob("mnist", workers=2, gpus=4))
            pods = await eventually(
                lambda: (
                    len(job_pods(served, "mnist")) == 2
                    and all(x["spec"].get("nodeName") for x in job_pods(served, "mnist"))
                    and job_pods(served, "mnist")
                ),
                what="two bound pods",
            )
            for pod in pods:
                meta, spec = pod["metadata"], pod["spec"]
                assert spec["schedulerName"] == "gpuyard"
                assert meta["labels"]["training.kubeflow.org/job-name"] == "mnist"
                assert meta["labels"]["training.kubeflow.org/replica-type"] == "worker"
                owners = meta["ownerReferences"]
                assert (
                    owners[0]["kind"] == "TFJob"
                    and owners[0]["uid"] == served.get("tfjobs", "default", "mnist")["metadata"]["uid"]
                )
                devices = json.loads(meta["annotations"]["gpuyard.io/devices"])
                assert len(devices["gpus"]) == 4
            bound = [p for m, p in served.requests if m == "POST" and p.endswith("/binding")]
            assert len(bound) == 2
            assert served.list("reservations") and served.list("podgroups")
            await play_kubelet(client, served, "mnist", phase="Running")
            await play_kubelet(client, served, "mnist", phase="Succeeded")
            job = await eventually(
                lambda: (
                    (j := served.get("tfjobs", "default", "mnist"))
                    and j.get("status", {}).get("phase") == "Succeeded"
                    and j
                ),
                what="job Succeeded on the API server",
            )
            assert any(c["type"] == "Succeeded" for c in job["status"].get("conditions", []))
            events = [e for e in served.list("events") if e.get("involvedObject", {}).get("name") == "mnist"]
            assert events, "job transitions are recorded as Events on the job"
            assert p.journal is None
    finally:
        await client.close()


async def test_foreign_pods_take_capacity(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        foreign = to_json(make_pod("daemon", node="gpu-0", gpus=6, cpu="8"))
        foreign["spec"]["schedulerName"] = "default-scheduler"
        await client.create(PODS, foreign)
        async with platform(settings(served.kubeconfig, election=False)) as p:
            node = p.store.must_get_of(Node, "", "gpu-0")
            assert node.status.allocatable["cpu"] == 56
            assert node.metadata.annotations["gpuyard.io/unhealthy-gpus"] == "2,3,4,5,6,7"
            await client.create(TFJOBS, tfjob("big", workers=1, gpus=4))  # 4 > the 2 GPUs left
            await client.create(TFJOBS, tfjob("small", workers=1, gpus=2))
            await eventually(
                lambda: any(x["spec"].get("nodeName") for x in job_pods(served, "small")),
                what="small placed",
            )
            await asyncio.sleep(0.3)
            assert job_pods(served, "big") == []
            # the foreign pod goes (its kubelet's final delete: a real server keeps a pod deleted
            # gracefully until then): room for big
            await client.delete(PODS, "default", "daemon", grace_period=0)
            await eventually(
                lambda: p.store.must_get_of(Node, "", "gpu-0").status.allocatable["cpu"] == 64,
                what="capacity back",
            )
            await play_kubelet(client, served, "small", phase="Succeeded")
            await eventually(
                lambda: any(x["spec"].get("nodeName") for x in job_pods(served, "big")), what="big placed"
            )
    finally:
        await client.close()


async def test_lost_node_fails_pods_after_grace(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False, node_lost_grace=0.5)):
            await client.create(TFJOBS, tfjob("lost", workers=1, gpus=1))
            await eventually(
                lambda: any(x["spec"].get("nodeName") for x in job_pods(served, "lost")), what="placed"
            )
            await play_kubelet(client, served, "lost", phase="Running")
            loop = asyncio.get_running_loop()
            gone_at = loop.time()
            await client.delete(NODES, "", "gpu-0")
            pod = await eventually(
                lambda: (
                    (x := job_pods(served, "lost"))
                    and x[0].get("status", {}).get("reason") == "NodeLost"
                    and x[0]
                ),
                what="NodeLost",
            )
            assert loop.time() - gone_at >= 0.5
            assert pod["status"]["phase"] == "Failed"
    finally:
        await client.close()


def gpus_in_use(server: FakeApiServerView) -> list[tuple[str, int]]:
    """(node, GPU index) of every bound pod: a GPU listed twice is bound twice."""
    out = []
    for pod in server.list("pods"):
        node = pod["spec"].get("nodeName")
        devices = json.loads(pod["metadata"].get("annotations", {}).get("gpuyard.io/devices", "{}"))
        if node and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            out += [(node, g) for g in devices.get("gpus", [])]
    return out


@pytest.mark.dev_apiserver_only
async def test_one_leader_and_the_standby_takes_over(served: FakeApiServerView) -> None:
    client = await connect(served)
    kc = served.kubeconfig
    try:
        for i in range(2):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        async with platform(settings(kc, identity="replica-a"), serve_http=True) as a:
            await eventually(
                lambda: a.backend.leadership is not None and a.backend.leadership.is_leader(), what="a leads"
            )
            async with platform(settings(kc, identity="replica-b"), serve_http=True) as b:
                assert b.backend.leadership is not None
                await eventually(lambda: b.backend.leadership.holder == "replica-a", what="b sees a")
                assert not b.backend.leadership.is_leader()
                lease = served.get("leases", "gpuyard-system", "gpuyard")
                assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
                async with aiohttp.ClientSession() as http:
                    async with http.post(f"{b.url}/api/v1/jobs", json=tfjob("x", workers=1, gpus=1)) as resp:
                        assert resp.status == 503
                        assert "the leader is replica-a" in (await resp.json())["error"]["message"]
                    async with http.get(f"{b.url}/api/v1/nodes") as resp:
                        assert resp.status == 200  # the standby serves reads
                    async with http.get(f"{b.url}/readyz") as resp:
                        assert resp.status == 200
                # a gang of 3 x 4 GPUs; the leader goes away mid-gang: placed (Reservations on
                # the API server), worker-0 bound, the other two bindings failing
                for pod in ("gang-worker-1", "gang-worker-2"):
                    served.fail(
                        10_000, verb="create", path_prefix=f"/api/v1/namespaces/default/pods/{pod}/binding"
                    )
                await client.create(TFJOBS, tfjob("gang", workers=3, gpus=4))
                await eventually(
                    lambda: any(
                        p.endswith("-1/binding") or p.endswith("-2/binding") for m, p in served.requests
                    ),
                    what="bindings tried",
                )
                a.stop()
                await asyncio.sleep(0.2)
                served.clear_faults()
                await eventually(lambda: b.backend.leadership.is_leader(), what="b takes over", timeout=10)
                pods = await eventually(
                    lambda: (
                        len(x := [q for q in job_pods(served, "gang") if q["spec"].get("nodeName")]) == 3
                        and x
                    ),
                    what="the gang bound by b",
                    timeout=15,
                )
                used = gpus_in_use(served)
                assert len(used) == len(set(used)) == 12, used
                assert len({p["metadata"]["name"] for p in pods}) == 3
                for ns, name in set(served.bindings()):  # a pod is bound once (a deleted one may come back)
                    assert served.bindings().count((ns, name)) <= 1 + served.deletions("pods", ns, name), name
                assert (
                    served.get("leases", "gpuyard-system", "gpuyard")["spec"]["holderIdentity"] == "replica-b"
                )
    finally:
        await client.close()


@pytest.mark.dev_apiserver_only
async def test_readyz_follows_the_watches(served: FakeApiServerView) -> None:
    s = settings(served.kubeconfig, election=False, backoff_max=0.1)
    async with platform(s, serve_http=True) as p, aiohttp.ClientSession() as http:
        await asyncio.wait_for(p.serving.wait(), 5)

        async def readyz() -> int:
            async with http.get(f"{p.url}/readyz") as resp:
                return resp.status

        assert await readyz() == 200
        served.fail(10_000)
        served.drop_watches()
        await eventually(lambda: not p.ready(), what="a broken watch")
        assert await readyz() == 503
        served.clear_faults()
        await eventually(p.ready, what="watches back")
        assert await readyz() == 200


async def test_a_leader_that_loses_the_lease_stops(served: FakeApiServerView) -> None:
    client = await connect(served)
    leases = resource_for("Lease")
    try:
        async with platform(settings(served.kubeconfig, identity="replica-a")) as a:
            leadership = a.backend.leadership
            assert leadership is not None
            await eventually(leadership.is_leader, what="a leads")
            lease = await client.get(leases, "gpuyard-system", "gpuyard")
            lease["spec"]["holderIdentity"] = "intruder"
            await client.replace(leases, lease)  # someone else holds it now
            await eventually(lambda: a.lost_leadership, what="a notices")
            assert not leadership.is_leader()
    finally:
        await client.close()


@pytest.mark.dev_apiserver_only
async def test_nothing_is_placed_or_led_before_every_informer_has_listed(served: FakeApiServerView) -> None:
    """A job and its nodes are cached, but the Reservations are not listed yet: placing now could
    hand out GPUs an earlier leader reserved. The replica neither stands for the Lease nor runs
    the scheduler and the operator until every informer has listed."""
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        await client.create(TFJOBS, tfjob("early", workers=1, gpus=8))
        served.fail(10_000, verb="list", path_prefix="/apis/scheduling.gpuyard.io/v1alpha1/reservations")
        p = Platform(settings(served.kubeconfig, backoff_max=0.1), clock=RealClock(), serve_http=False)
        task = asyncio.create_task(p.run())
        try:
            await eventually(
                lambda: p.store.count("Node") == 1 and p.store.count("TFJob") == 1, what="cached"
            )
            await asyncio.sleep(1.0)
            assert not p.backend.synced.is_set()
            assert served.get("leases", "gpuyard-system", "gpuyard") is None  # not standing for the lead
            assert job_pods(served, "early") == [] and p.store.count("PodGroup") == 0
            served.clear_faults()
            await eventually(lambda: job_pods(served, "early"), what="placed once synced")
            assert served.get("leases", "gpuyard-system", "gpuyard") is not None
        finally:
            p.stop()
            await asyncio.wait_for(task, 10)
    finally:
        await client.close()
