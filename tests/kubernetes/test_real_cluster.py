"""Opt-in: the Kubernetes backend's end-to-end scenario against a real cluster (`pytest -m k8s`).

Runs only when `KUBECONFIG` names a cluster and `GPUYARD_K8S_TESTS=1`; otherwise every test here
is skipped, saying so (CI sets neither: this suite never runs in CI). What it does, against the
cluster of `$KUBECONFIG` (see docs/kubernetes-testing.md, "Against a real cluster"):

1. installs gpuyard's CRDs by server-side apply through the backend's client;
2. uses the cluster's nodes when some advertise `nvidia.com/gpu`, else registers the nodes of
   `configs/clusters/small.yaml` with `gpuyard fake-nodes`'s code and plays their kubelets;
3. runs gpuyard (the `Platform`, `backend.kind: kubernetes`) in-process, submits a TFJob custom
   resource, sees its pods bound by gpuyard and the job's status Succeeded;
4. deletes what it created (the job, its namespace, the fake nodes); the CRDs stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.apis.crds import crds
from gpuyard.apis.resources import ApiResource, resource_for
from gpuyard.devices.scenarios import load_scenario
from gpuyard.kubecluster.client import ApiError, Json, KubeClient
from gpuyard.kubecluster.fakenodes import FakeNodes, connect
from gpuyard.state.store import AlreadyExists, NotFound
from tests.kubernetes.test_backend_platform import platform, settings

ENABLED = bool(os.environ.get("KUBECONFIG")) and os.environ.get("GPUYARD_K8S_TESTS") == "1"
pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(
        not ENABLED,
        reason="real-cluster suite: set KUBECONFIG and GPUYARD_K8S_TESTS=1 to run it (never run in CI)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
CRDS = ApiResource(
    "CustomResourceDefinition", "apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False
)
NAMESPACES = ApiResource("Namespace", "", "v1", "namespaces", namespaced=False, status_subresource=False)
NODES = resource_for("Node")
PODS = resource_for("Pod")
TFJOBS = resource_for("TFJob", "kubeflow.org/v1")
IMAGE = os.environ.get("GPUYARD_K8S_TEST_IMAGE", "busybox:1.36")
TIMEOUT = float(os.environ.get("GPUYARD_K8S_TEST_TIMEOUT", "300"))


async def install_crds(client: KubeClient) -> None:
    """Server-side apply of every CRD gpuyard ships (field manager `gpuyard`), then wait until the
    API server serves them."""
    for crd in crds():
        path = CRDS.path(name=crd["metadata"]["name"])
        try:
            await client.request(
                "PATCH",
                path,
                query={"fieldManager": "gpuyard", "force": "true"},
                body=crd,
                content_type="application/apply-patch+yaml",
            )
        except (NotFound, ApiError) as exc:  # a server without server-side apply (the test API server)
            if isinstance(exc, ApiError) and exc.status != 415:
                raise
            try:
                await client.create(CRDS, crd)
            except AlreadyExists:
                await client.patch(CRDS, "", crd["metadata"]["name"], crd)

    async def established() -> bool:
        for crd in crds():
            got = await client.get(CRDS, "", crd["metadata"]["name"])
            conds = got.get("status", {}).get("conditions", [])
            if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                return False
        return True

    for _ in range(60):
        if await established():
            return
        await asyncio.sleep(1)
    raise AssertionError("gpuyard's CRDs were not Established within 60 s")


def gpu_nodes(nodes: list[Json]) -> list[str]:
    return [
        n["metadata"]["name"]
        for n in nodes
        if int(str((n.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", "0")) or 0) > 0
    ]


@contextlib.asynccontextmanager
async def gpu_capacity(client: KubeClient, kubeconfig: str) -> AsyncIterator[bool]:
    """The cluster's GPU nodes if it has some (yields False), else fake nodes for the test (True)."""
    nodes, _ = await client.list(NODES)
    if gpu_nodes(nodes):
        yield False
        return
    scenario = load_scenario(ROOT / "configs" / "clusters" / "small.yaml")
    api = await connect(kubeconfig)
    fake = FakeNodes(api, scenario=scenario, heartbeat=5.0)
    task = asyncio.create_task(fake.run())
    try:
        await asyncio.wait_for(fake.registered.wait(), 60)
        yield True
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for node in scenario.nodes():
            with contextlib.suppress(NotFound):
                await client.delete(NODES, "", node.metadata.name)
        await api.close()


def tfjob(name: str, namespace: str, *, fake: bool) -> Json:
    container: Json = {"name": "tensorflow", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": 1}}}
    if not fake:
        container["command"] = ["sh", "-c", "exit 0"]
    template: Json = {"spec": {"containers": [container]}}
    if fake:
        template["metadata"] = {"annotations": {"fake.gpuyard.io/duration": "3s"}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "tfReplicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "Never", "template": template}}
        },
    }


async def job_pods(client: KubeClient, namespace: str, job: str) -> list[Json]:
    pods, _ = await client.list(PODS, namespace=namespace, selector=f"training.kubeflow.org/job-name={job}")
    return pods


async def test_tfjob_runs_to_succeeded_on_a_real_cluster(tmp_path: Path) -> None:
    kubeconfig = os.environ["KUBECONFIG"].split(os.pathsep)[0]
    client = await KubeClient.connect(kubeconfig=kubeconfig, request_timeout=30.0)
    namespace = f"gpuyard-e2e-{uuid.uuid4().hex[:6]}"
    try:
        await install_crds(client)
        for ns in (namespace, "gpuyard-system"):
            with contextlib.suppress(AlreadyExists):
                await client.create(
                    NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                )
        async with gpu_capacity(client, kubeconfig) as fake:
            async with platform(settings(Path(kubeconfig), election=False)):
                await client.create(TFJOBS, tfjob("mnist", namespace, fake=fake))

                async def bound() -> list[Json]:
                    pods = await job_pods(client, namespace, "mnist")
                    ok = len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods)
                    return pods if ok else []

                pods = await poll(bound, what="two pods bound by gpuyard")
                assert all(p["spec"]["schedulerName"] == "gpuyard" for p in pods)

                async def succeeded() -> Json | None:
                    job = await client.get(TFJOBS, namespace, "mnist")
                    return job if job.get("status", {}).get("phase") == "Succeeded" else None

                job = await poll(succeeded, what="the TFJob Succeeded")
                assert any(c["type"] == "Succeeded" for c in job["status"]["conditions"])
    finally:
        with contextlib.suppress(NotFound):
            await client.delete(TFJOBS, namespace, "mnist")
        with contextlib.suppress(NotFound):
            await client.delete(NAMESPACES, "", namespace)
        await client.close()


async def poll(check: Any, *, what: str) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + TIMEOUT
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"timed out after {TIMEOUT:g}s waiting for {what}")
        await asyncio.sleep(1.0)
