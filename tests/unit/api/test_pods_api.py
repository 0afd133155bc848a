"""`GET /api/v1/pods` and a pod's log (`.../pods/{name}/log`): the fake kubelet's short log per
container (start, environment, exit), `tailLines`, `follow=true` streaming until the pod has
finished (waiting for a pod not started yet), 404/400/501/502/503 that say what to do, tenants see
their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuyard.apis.core import EnvVar, Pod
from gpuyard.apis.scheduling import LABEL_JOB_NAME, LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from gpuyard.devices.fakepods import container_logs
from gpuyard.devices.scenarios import KubeletDefaults
from gpuyard.fakecluster.kubelet import FakeKubelet
from gpuyard.fakecluster.podlogs import StorePodLogs
from gpuyard.state.backend import BackendError
from gpuyard.state.clock import VirtualClock
from gpuyard.state.context import Context
from tests.builders import make_node, make_pod


class _Backend:
    """The parts of the fake cluster the route reads: its kubelet (the tests drive it) and its
    `pod_log` (`PodLogs`)."""

    name = "fake"

    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet
        self.pod_log = StorePodLogs(kubelet.store).pod_log


class _Refusing:
    """A backend whose cluster refuses the log with `status` (the Kubernetes backend's errors)."""

    name = "kubernetes"

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message

    async def pod_log(self, pod: Pod, **_: Any) -> AsyncIterator[str]:
        err = BackendError(self.message)
        err.status = self.status
        raise err


class _Plain:
    """A backend that reads no logs (no `pod_log`)."""

    name = "plain"


def _job_pod(
    name: str, *, namespace: str = "team-a", job: str = "mnist", role: str = "Worker", index: int = 0
) -> Any:
    pod = make_pod(
        name,
        namespace=namespace,
        node="n1",
        labels={LABEL_JOB_NAME: job, LABEL_REPLICA_TYPE: role, LABEL_REPLICA_INDEX: str(index)},
        annotations={"fake.gpuyard.io/duration": "30", "fake.gpuyard.io/exit-code": "3"},
    )
    pod.spec.containers[0].env = [
        EnvVar(name="RANK", value=str(index)),
        EnvVar(name="WORLD_SIZE", value="2"),
        EnvVar(name="MASTER_ADDR", value="mnist-master-0"),
        EnvVar(
            name="TF_CONFIG",
            value='{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}',
        ),
        EnvVar(name="OTHER", value="x"),
    ]
    return pod


async def _run(ctx: Context, kubelet: FakeKubelet, key: tuple[str, str], seconds: float) -> None:
    assert isinstance(ctx.clock, VirtualClock)
    await kubelet.reconcile(key)
    await ctx.clock.advance(seconds)
    await kubelet.reconcile(key)


async def test_a_pod_log_says_start_environment_and_exit(aiohttp_client: Any, ctx: Context) -> None:
    from gpuyard.platform.api.app import make_app

    kubelet = FakeKubelet(store=ctx.store, writer=ctx.writer, clock=ctx.clock, defaults=KubeletDefaults())  # type: ignore[arg-type]
    ctx.backend = _Backend(kubelet)  # type: ignore[assignment]
    ctx.store.create(make_node("n1"))
    ctx.store.create(_job_pod("mnist-worker-0"))
    client = await aiohttp_client(make_app(ctx))

    pending = await (await client.get("/api/v1/namespaces/team-a/pods/mnist-worker-0/log")).json()
    assert pending["phase"] == "Pending" and pending["lines"] == []

    await _run(ctx, kubelet, ("team-a", "mnist-worker-0"), 1.5)
    running = await (await client.get("/api/v1/namespaces/team-a/pods/mnist-worker-0/log")).json()
    assert running["phase"] == "Running" and running["container"] == "main"
    started, env = running["lines"]
    assert "started container main image busybox on node n1" in started
    assert "RANK=0 WORLD_SIZE=2 MASTER_ADDR=mnist-master-0" in env
    assert "TF_CONFIG task=worker:1 cluster=worker:2" in env and "(+1 more)" in env

    await _run(ctx, kubelet, ("team-a", "mnist-worker-0"), 31)
    done = await (await client.get("/api/v1/namespaces/team-a/pods/mnist-worker-0/log")).json()
    assert done["phase"] == "Failed" and done["lines"][:2] == running["lines"]
    assert "exited with code 3" in done["lines"][2]
    pod = ctx.store.get("Pod", "team-a", "mnist-worker-0")
    assert container_logs(pod)["main"] == done["lines"]  # type: ignore[arg-type]


async def test_log_errors_say_what_to_do(aiohttp_client: Any, ctx: Context) -> None:
    from gpuyard.platform.api.app import make_app

    kubelet = FakeKubelet(store=ctx.store, writer=ctx.writer, clock=ctx.clock, defaults=KubeletDefaults())  # type: ignore[arg-type]
    ctx.backend = _Backend(kubelet)  # type: ignore[assignment]
    ctx.store.create(_job_pod("p"))
    client = await aiohttp_client(make_app(ctx))
    missing = await client.get("/api/v1/namespaces/team-a/pods/nope/log")
    assert missing.status == 404 and "gpuyard get pods" in (await missing.json())["error"]["message"]
    wrong = await client.get("/api/v1/namespaces/team-a/pods/p/log?container=sidecar")
    body = (await wrong.json())["error"]
    assert wrong.status == 400 and body["details"] == [{"field": "container", "reason": "allowed: main"}]

    bad = await client.get("/api/v1/namespaces/team-a/pods/p/log?tailLines=-1")
    assert bad.status == 400 and (await bad.json())["error"]["details"][0]["field"] == "tailLines"

    ctx.backend = _Plain()  # type: ignore[assignment]
    plain = await client.get("/api/v1/namespaces/team-a/pods/p/log")
    message = (await plain.json())["error"]["message"]
    assert plain.status == 501 and "plain backend reads no pod logs" in message and "kubectl logs" in message


@pytest.mark.parametrize(
    ("status", "answer", "says"),
    [
        (400, 400, "waiting to start"),
        (404, 404, "not found"),
        (403, 502, "needs get on pods/log"),
        (500, 502, "kubelet of the pod's node"),
        (0, 503, "cannot be read now"),
    ],
)
async def test_a_cluster_refusing_the_log_is_told_apart(
    aiohttp_client: Any, ctx: Context, status: int, answer: int, says: str
) -> None:
    from gpuyard.platform.api.app import make_app

    pod = _job_pod("p")
    pod.status.phase = "Running"
    ctx.store.create(pod)
    messages = {400: 'container "main" in pod "p" is waiting to start', 404: 'pods "p" not found'}
    ctx.backend = _Refusing(status, messages.get(status, "refused"))  # type: ignore[assignment]
    client = await aiohttp_client(make_app(ctx))
    resp = await client.get("/api/v1/namespaces/team-a/pods/p/log")
    assert resp.status == answer and says in (await resp.json())["error"]["message"]


async def test_tail_lines_keeps_the_last_lines(aiohttp_client: Any, ctx: Context) -> None:
    from gpuyard.platform.api.app import make_app

    kubelet = FakeKubelet(store=ctx.store, writer=ctx.writer, clock=ctx.clock, defaults=KubeletDefaults())  # type: ignore[arg-type]
    ctx.backend = _Backend(kubelet)  # type: ignore[assignment]
    ctx.store.create(make_node("n1"))
    ctx.store.create(_job_pod("p"))
    await _run(ctx, kubelet, ("team-a", "p"), 1.5)
    await _run(ctx, kubelet, ("team-a", "p"), 31)
    client = await aiohttp_client(make_app(ctx))
    whole = await (await client.get("/api/v1/namespaces/team-a/pods/p/log")).json()
    last = await (await client.get("/api/v1/namespaces/team-a/pods/p/log?tailLines=1")).json()
    assert len(whole["lines"]) == 3 and whole["truncated"] is False
    assert last["lines"] == whole["lines"][-1:] and "exited with code 3" in last["lines"][0]


async def test_follow_streams_lines_until_the_pod_has_finished(aiohttp_client: Any, ctx: Context) -> None:
    """`follow=true` on a pod not started yet: the answer waits for it, then streams its lines as
    the kubelet writes them, and ends once it has finished."""
    from gpuyard.platform.api.app import make_app

    kubelet = FakeKubelet(store=ctx.store, writer=ctx.writer, clock=ctx.clock, defaults=KubeletDefaults())  # type: ignore[arg-type]
    ctx.backend = _Backend(kubelet)  # type: ignore[assignment]
    ctx.store.create(make_node("n1"))
    ctx.store.create(_job_pod("p"))
    client = await aiohttp_client(make_app(ctx))
    key = ("team-a", "p")
    opened = asyncio.create_task(client.get("/api/v1/namespaces/team-a/pods/p/log?follow=true"))
    await asyncio.sleep(0.1)
    assert not opened.done()  # Pending: waiting for the container to start
    await kubelet.reconcile(key)
    assert isinstance(ctx.clock, VirtualClock)
    await ctx.clock.advance(1.5)
    await kubelet.reconcile(key)  # Running
    resp = await asyncio.wait_for(opened, 5)
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    started = (await asyncio.wait_for(resp.content.readline(), 5)).decode()
    env = (await asyncio.wait_for(resp.content.readline(), 5)).decode()
    assert "started container main" in started and env.startswith(started.split()[0]) and "RANK=0" in env
    await ctx.clock.advance(31)
    await kubelet.reconcile(key)  # Failed, exit code 3
    rest = (await asyncio.wait_for(resp.content.read(), 5)).decode()
    assert rest.endswith("\n") and "exited with code 3" in rest and rest.count("\n") == 1


async def test_follow_of_a_finished_pod_sends_its_log_and_ends(aiohttp_client: Any, ctx: Context) -> None:
    from gpuyard.platform.api.app import make_app

    kubelet = FakeKubelet(store=ctx.store, writer=ctx.writer, clock=ctx.clock, defaults=KubeletDefaults())  # type: ignore[arg-type]
    ctx.backend = _Backend(kubelet)  # type: ignore[assignment]
    ctx.store.create(make_node("n1"))
    ctx.store.create(_job_pod("p"))
    await _run(ctx, kubelet, ("team-a", "p"), 1.5)
    await _run(ctx, kubelet, ("team-a", "p"), 31)
    client = await aiohttp_client(make_app(ctx))
    resp = await client.get("/api/v1/namespaces/team-a/pods/p/log?follow=true&tailLines=2")
    text = await asyncio.wait_for(resp.text(), 5)
    assert resp.status == 200 and len(text.splitlines()) == 2 and "exited with code 3" in text


async def test_pods_of_every_job_with_their_job_and_filters(client: Any, ctx: Context) -> None:
    ctx.store.create(_job_pod("mnist-worker-0", index=0))
    ctx.store.create(_job_pod("mnist-worker-1", index=1))
    ctx.store.create(_job_pod("bert-worker-0", namespace="team-b", job="bert"))
    ctx.store.create(make_pod("not-a-job-pod", namespace="team-a"))
    every = await (await client.get("/api/v1/pods")).json()
    assert [
        (p["metadata"]["namespace"], p["metadata"]["name"], p["summary"]["job"]) for p in every["items"]
    ] == [
        ("team-a", "mnist-worker-0", "mnist"),
        ("team-a", "mnist-worker-1", "mnist"),
        ("team-b", "bert-worker-0", "bert"),
    ]
    one_ns = await (await client.get("/api/v1/pods?namespace=team-b")).json()
    assert [p["metadata"]["name"] for p in one_ns["items"]] == ["bert-worker-0"]
    one_job = await (await client.get("/api/v1/pods?job=mnist")).json()
    assert len(one_job["items"]) == 2 and every["metadata"]["resourceVersion"]
