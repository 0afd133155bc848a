"""A node whose kubelet dies, on the real control plane: the node lifecycle controller marks it
NotReady and taints it `unreachable:NoExecute`, the taint manager evicts its pods (a graceful
delete: with no kubelet to finish it, each pod stays Terminating), and gpuyard must still run the
job again on another node — the pod left Terminating must not block its replacement, which has the
same name.

The control plane here is its own, with short timings: a node is NotReady 6 s after its last
heartbeat and its pods tolerate that for 2 s (Kubernetes' defaults are 50 s and 300 s).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.client import KubeClient
from gpuyard.kubecluster.writing import to_json
from gpuyard.state.store import AlreadyExists, NotFound
from gpuyard.testing.controlplane.fixture import require_binaries
from tests.builders import make_node
from tests.kubernetes.realplane import (
    GPUYARD_NAMESPACE,
    admin_http,
    ensure_namespace,
    gpuyard_crds,
    install_crds,
)
from tests.kubernetes.test_backend_platform import (
    NODES,
    TFJOBS,
    eventually,
    job_pods,
    platform,
    play_kubelet,
    settings,
    tfjob,
)

LEASES = resource_for("Lease")


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_binaries()
    from gpuyard.testing.controlplane.running import ControlPlane, Timings

    timings = Timings(node_monitor_grace_period=6, not_ready_toleration=2, unreachable_toleration=2)
    with ControlPlane(data_dir=tmp_path_factory.mktemp("lost-nodes"), timings=timings, audit=True) as cp:
        with admin_http(cp) as http:
            install_crds(http, gpuyard_crds())
            ensure_namespace(http, GPUYARD_NAMESPACE)
        yield cp


class View:
    """What the shared helpers of test_backend_platform ask of a server: objects by plural."""

    def __init__(self, plane: Any) -> None:
        from tests.kubernetes.realplane import ControlPlaneView

        self.http = admin_http(plane)
        self.inner = ControlPlaneView(plane, self.http)
        self.inner.wipe()  # the module's control plane is shared by the parameters
        self.kubeconfig = plane.admin_kubeconfig

    def list(self, plural: str) -> list[dict[str, Any]]:
        return self.inner.list(plural)


async def kubelets(client: KubeClient, alive: dict[str, bool]) -> None:
    """Each live node's kubelet renews its Lease in kube-node-lease every second."""
    while True:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for node, up in alive.items():
            if not up:
                continue
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": node, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now},
            }
            try:
                await client.patch(LEASES, "kube-node-lease", node, {"spec": body["spec"]})
            except NotFound:
                with contextlib.suppress(AlreadyExists):
                    await client.create(LEASES, body)
        await asyncio.sleep(1.0)


@contextlib.asynccontextmanager
async def running(coro: Any) -> AsyncIterator[None]:
    task = asyncio.create_task(coro)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    "lost_grace",
    [
        pytest.param(1.0, id="gpuyard-fails-the-pod-first"),
        # gpuyard waits far longer than the taint manager (6 s + 2 s here, later on a loaded machine):
        # its eviction (a graceful delete) comes first and leaves the pod Terminating, with the
        # replacement's name
        pytest.param(20.0, id="the-taint-manager-evicts-first"),
    ],
)
async def test_a_job_on_a_node_whose_kubelet_died_runs_again_elsewhere(plane: Any, lost_grace: float) -> None:
    view = View(plane)
    client = await KubeClient.connect(kubeconfig=str(plane.admin_kubeconfig), request_timeout=10.0)
    # names of this test's own: the lifecycle controller keeps what it knew of a deleted node by name
    alive = {f"gpu-{lost_grace:g}-0": True, f"gpu-{lost_grace:g}-1": True}
    try:
        for name in alive:
            await client.create(NODES, to_json(make_node(name, gpus=8)))
        s = settings(
            plane.admin_kubeconfig, election=False, node_monitor_grace=6.0, node_lost_grace=lost_grace
        )
        async with running(kubelets(client, alive)), platform(s):
            # a node just created may carry the lifecycle controller's not-ready taints for a
            # moment (longer on a loaded machine); the job is submitted to nodes that are up
            await eventually(
                lambda: all(not n["spec"].get("taints") for n in view.list("nodes")),
                what="both nodes without taints",
                timeout=60,
            )
            job = tfjob("survivor", workers=1, gpus=8)
            job["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"  # NodeLost: run again
            await client.create(TFJOBS, job)
            first = await eventually(
                lambda: [p for p in job_pods(view, "survivor") if p["spec"].get("nodeName")],
                what="placed",
                timeout=30,
            )
            dead = first[0]["spec"]["nodeName"]
            uid = first[0]["metadata"]["uid"]
            await play_kubelet(client, view, "survivor", phase="Running")
            alive[dead] = False  # the kubelet dies: no more heartbeats, nobody finishes its pods

            terminating = False

            def replacement() -> list[dict[str, Any]]:
                nonlocal terminating
                pods = job_pods(view, "survivor")
                terminating |= any(
                    p["metadata"]["uid"] == uid and p["metadata"].get("deletionTimestamp") for p in pods
                )
                return [
                    p
                    for p in pods
                    if p["metadata"]["uid"] != uid and p["spec"].get("nodeName") not in (None, dead)
                ]

            moved = await eventually(replacement, what="the worker bound to the other node", timeout=90)
            assert moved[0]["spec"]["schedulerName"] == "gpuyard"
            node = await client.get(NODES, "", dead)
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            assert "node.kubernetes.io/unreachable" in taints  # the real node lifecycle controller did it
            if lost_grace > 6.0:
                assert terminating, "the taint manager evicted the pod before gpuyard failed it"
    finally:
        await client.close()
        view.http.close()
