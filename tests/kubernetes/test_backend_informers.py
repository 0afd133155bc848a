"""The Kubernetes backend's client, informers and writer against an in-process API server.

Informers: LIST then WATCH, a 410 re-lists and the store ends up exact (no missed add or delete),
a silent stream is restarted, 500s are retried, readiness is false while a watch is broken, a
resource the server does not serve is named (CRD + `gpuyard install`) without a crash loop.
Writer: a stale PUT is a Conflict, a pod is created unbound with `schedulerName: gpuyard` and
bound through `pods/binding`, status goes through the `status` subresource, writes are mirrored
into the store at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from gpuyard.apis.core import Node, Pod
from gpuyard.apis.quotakinds import Queue
from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.client import KubeClient
from gpuyard.kubecluster.cluster import KubeCluster
from gpuyard.kubecluster.informing import Informer
from gpuyard.kubecluster.writing import to_json
from gpuyard.state.backend import BackendError
from gpuyard.state.clock import RealClock
from gpuyard.state.config import Settings
from gpuyard.state.context import Context
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Conflict, NotFound, Store
from tests.builders import make_node, make_pod
from tests.kubernetes.conftest_backend import MiniApiServer, apiserver

__all__ = ["apiserver"]

NODES = resource_for("Node")
PODS = resource_for("Pod")


async def eventually(check: Callable[[], bool], *, timeout: float = 5.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def client(apiserver: MiniApiServer, tmp_path: Path) -> AsyncIterator[KubeClient]:
    c = await KubeClient.connect(kubeconfig=str(tmp_path / "kubeconfig.yaml"), request_timeout=5.0)
    try:
        yield c
    finally:
        await c.close()


def new_store() -> Store:
    store = Store()
    register_kinds(store)
    return store


async def running(coro: Awaitable[None]) -> asyncio.Task[None]:
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(0)
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def informer(client: KubeClient, store: Store, kind: str = "Node", **kwargs: float) -> Informer:
    res = resource_for(kind)
    return Informer(
        client=client, resource=res, cls=store.kind_class(kind), store=store, clock=RealClock(), **kwargs
    )


async def test_list_then_watch_mirrors_with_server_versions(
    apiserver: MiniApiServer, client: KubeClient
) -> None:
    await client.create(NODES, to_json(make_node("n1")))
    store = new_store()
    inf = informer(client, store)
    task = await running(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        n1 = store.must_get_of(Node, "", "n1")
        assert n1.metadata.resource_version == apiserver.get("nodes", "", "n1")["metadata"]["resourceVersion"]
        await client.create(NODES, to_json(make_node("n2")))
        await eventually(lambda: store.get("Node", "", "n2") is not None, what="n2 watched")
        await client.delete(NODES, "", "n1")
        await eventually(lambda: store.get("Node", "", "n1") is None, what="n1 deleted")
        assert inf.lists == 1
    finally:
        await stop(task)


async def test_gone_relists_and_misses_no_event(apiserver: MiniApiServer, client: KubeClient) -> None:
    for name in ("a", "b"):
        await client.create(PODS, to_json(make_pod(name)))
    store = new_store()
    inf = informer(client, store, "Pod")
    task = await running(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        apiserver.silence()  # the watch sees nothing of what follows ...
        await client.create(PODS, to_json(make_pod("c")))
        await client.delete(PODS, "default", "b")
        changed = await client.get(PODS, "default", "a")
        changed["metadata"]["labels"] = {"x": "1"}
        await client.replace(PODS, changed)
        await asyncio.sleep(0.1)
        assert store.get("Pod", "default", "c") is None and store.get("Pod", "default", "b") is not None
        apiserver.silence(False)
        apiserver.compact()  # ... and its version is gone: 410, re-list
        await eventually(lambda: inf.lists == 2, what="a re-list")
        assert sorted(n for _, n in store.keys_of("Pod")) == ["a", "c"]
        assert store.must_get_of(Pod, "default", "a").metadata.labels == {"x": "1"}
        await client.create(PODS, to_json(make_pod("d")))  # and watching goes on from the new list
        await eventually(lambda: store.get("Pod", "default", "d") is not None, what="d watched after re-list")
    finally:
        await stop(task)


async def test_silent_stream_is_restarted(apiserver: MiniApiServer, client: KubeClient) -> None:
    apiserver.bookmark_interval = 0.1
    store = new_store()
    inf = informer(client, store, inactivity_timeout=0.4)
    task = await running(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        await asyncio.sleep(0.6)  # bookmarks keep a quiet stream alive
        assert inf.watches == 1 and inf.healthy
        apiserver.silence()
        await eventually(lambda: inf.watches >= 2, what="the silent watch restarted")
        apiserver.silence(False)
        await client.create(NODES, to_json(make_node("late")))
        await eventually(lambda: store.get("Node", "", "late") is not None, what="event after restart")
        assert inf.healthy and inf.lists == 1
    finally:
        await stop(task)


async def test_server_errors_are_retried_with_backoff(apiserver: MiniApiServer, client: KubeClient) -> None:
    await client.create(NODES, to_json(make_node("n1")))
    apiserver.fail(3, status=500, method="GET")
    store = new_store()
    inf = informer(client, store)
    task = await running(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 10)
        lists = [p for m, p in apiserver.requests if m == "GET" and p.endswith("/nodes")]
        assert len(lists) == 4  # three 500s, then the LIST that worked
        assert store.get("Node", "", "n1") is not None
        assert inf.backoff.failures == 0  # reset after success
    finally:
        await stop(task)


async def test_missing_crd_is_named_and_retried(apiserver: MiniApiServer, client: KubeClient) -> None:
    res = resource_for("TFJob", "training.kubedl.io/v1alpha1")
    del apiserver.resources[(res.group, res.version, res.plural)]
    store = new_store()
    inf = Informer(
        client=client,
        resource=res,
        cls=store.kind_class("TFJob"),
        store=store,
        clock=RealClock(),
        backoff_max=0.05,
    )
    with capture_logs() as logs:
        task = await running(inf.run())
        try:
            await eventually(
                lambda: sum(1 for m, p in apiserver.requests if p.endswith("/tfjobs")) >= 3, what="retries"
            )
            assert not inf.synced.is_set() and not inf.healthy
        finally:
            await stop(task)
    missing = [e for e in logs if e["event"] == "informer.resource_missing"]
    assert len(missing) == 1  # logged once, retried quietly
    assert "tfjobs.training.kubedl.io" in missing[0]["error"] and "gpuyard install" in missing[0]["error"]


def kube_context(apiserver_kubeconfig: Path, **kube: object) -> Context:
    settings = Settings(
        backend={
            "kind": "kubernetes",
            "data_dir": None,
            "kubernetes": {
                "kubeconfig": str(apiserver_kubeconfig),
                "leader_election": {"enabled": False},
                **kube,
            },
        }
    )
    return Context.for_tests(settings=settings, clock=RealClock())


async def test_readiness_false_while_a_watch_is_broken(apiserver: MiniApiServer, tmp_path: Path) -> None:
    ctx = kube_context(tmp_path / "kubeconfig.yaml", backoff_max=0.1)
    cluster = KubeCluster(ctx)
    task = await running(cluster.run())
    try:
        await asyncio.wait_for(cluster.synced.wait(), 10)
        assert cluster.healthy()
        apiserver.fail(10_000, status=500)
        apiserver.drop_watches()
        await eventually(lambda: not cluster.healthy(), what="unhealthy while broken")
        apiserver.faults.clear()
        await eventually(cluster.healthy, what="healthy again", timeout=10)
    finally:
        await stop(task)


async def test_writer_conflict_bind_status_and_mirror(apiserver: MiniApiServer, tmp_path: Path) -> None:
    ctx = kube_context(tmp_path / "kubeconfig.yaml")
    cluster = KubeCluster(ctx)
    task = await running(cluster.run())
    try:
        await asyncio.wait_for(cluster.synced.wait(), 10)
        writer = cluster.writer
        await writer.create(make_node("gpu-0", gpus=8))
        queue = await writer.create(Queue(metadata={"name": "team-a"}))
        assert ctx.store.get_of(Queue, "", "team-a") is queue  # read-your-writes
        fresh = queue.clone()
        fresh.metadata.labels["owner"] = "a"
        updated = await writer.update(fresh)
        stale = queue.clone()
        stale.metadata.labels["owner"] = "b"
        with pytest.raises(Conflict):
            await writer.update(stale)
        assert int(updated.metadata.resource_version) > int(queue.metadata.resource_version)

        pod = await writer.create(make_pod("w-0", node="gpu-0", gpus=2))
        assert pod.spec.node_name == "gpu-0"
        served = apiserver.get("pods", "default", "w-0")
        assert served["spec"]["nodeName"] == "gpu-0" and served["spec"]["schedulerName"] == "gpuyard"
        posts = [p for m, p in apiserver.requests if m == "POST"]
        assert posts[-2:] == [
            "/api/v1/namespaces/default/pods",
            "/api/v1/namespaces/default/pods/w-0/binding",
        ]
        await eventually(
            lambda: (
                ctx.store.must_get_of(Pod, "default", "w-0").metadata.resource_version
                == served["metadata"]["resourceVersion"]
            ),
            what="bind event",
        )

        with pytest.raises(BackendError):  # no node chosen: refused before anything is written
            await writer.create(make_pod("unplaced"))
        assert apiserver.get("pods", "default", "unplaced") is None

        running_pod = await writer.patch_status("Pod", "default", "w-0", {"phase": "Running"})
        assert isinstance(running_pod, Pod) and running_pod.status.phase == "Running"
        assert [m for m, p in apiserver.requests if p.endswith("/w-0/status")] == ["PATCH"]
        with pytest.raises(Conflict):
            await writer.patch_status("Pod", "default", "w-0", {"phase": "Failed"}, resource_version="1")

        await writer.delete("Pod", "default", "w-0")
        assert ctx.store.get("Pod", "default", "w-0") is None
        with pytest.raises(NotFound):
            await writer.delete("Pod", "default", "w-0")
    finally:
        await stop(task)


async def test_failed_binding_deletes_the_pod(apiserver: MiniApiServer, tmp_path: Path) -> None:
    ctx = kube_context(tmp_path / "kubeconfig.yaml")
    cluster = KubeCluster(ctx)
    task = await running(cluster.run())
    try:
        await asyncio.wait_for(cluster.synced.wait(), 10)
        await cluster.writer.create(make_node("gpu-0", gpus=8))
        apiserver.fail(1, status=500, method="POST", path="/binding")
        with pytest.raises(BackendError, match="binding to node gpu-0 failed"):
            await cluster.writer.create(make_pod("w-0", node="gpu-0"))
        assert apiserver.get("pods", "default", "w-0") is None
    finally:
        await stop(task)
