"""kubectl's habits on the `gpuyard` root against a live loopback server: `-A`, `get pods` across
jobs, singular names, `-o name|jsonpath`, `-w` printing the current state first, `logs` of a
job's pod, and errors that say what to do (a missing token)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner

from gpuyard.apis.core import Pod
from gpuyard.apis.meta import OwnerReference
from gpuyard.apis.scheduling import LABEL_JOB_NAME, LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from gpuyard.cli import main
from gpuyard.cli.logs import pick_pod
from gpuyard.devices.scenarios import KubeletDefaults
from gpuyard.fakecluster.kubelet import FakeKubelet, terminate
from gpuyard.fakecluster.podlogs import StorePodLogs
from gpuyard.state.clock import VirtualClock
from gpuyard.state.context import Context
from tests.builders import make_pod
from tests.integration.serving import clean_cli_env, serving
from tests.unit.api.test_dashboard import build_app, make_ctx

MNIST = "dist-mnist-for-e2e-test"  # configs/jobs/tf-dist-mnist.yaml, in team-b


class _Backend:
    name = "fake"

    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet
        self.pod_log = StorePodLogs(kubelet.store).pod_log


class Live:
    def __init__(self, ctx: Context, url: str) -> None:
        self.ctx = ctx
        self.url = url

    async def cli(self, *args: str, token: str | None = "root") -> Any:
        argv = [*args, "--server", self.url] + (["--token", token] if token is not None else [])
        return await asyncio.to_thread(CliRunner().invoke, main, argv, catch_exceptions=False)


def _pod(ctx: Context, name: str, *, namespace: str, role: str, index: int) -> Pod:
    """A pod of the one job in `namespace`, owned by it."""
    job = next(j for k in ("PyTorchJob", "TFJob") for j in ctx.store.list(k, namespace=namespace))
    labels = {LABEL_JOB_NAME: job.metadata.name, LABEL_REPLICA_TYPE: role, LABEL_REPLICA_INDEX: str(index)}
    pod = make_pod(f"{job.metadata.name}-{name}", namespace=namespace, node="dgx-1", labels=labels)
    owner = OwnerReference(
        api_version=job.api_version, kind=job.kind, name=job.metadata.name, uid=job.metadata.uid
    )
    pod.metadata.owner_references = [owner]
    return pod


@pytest_asyncio.fixture
async def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Live]:
    clean_cli_env(monkeypatch, tmp_path)
    ctx = make_ctx()
    ctx.backend = _Backend(
        FakeKubelet(store=ctx.store, writer=ctx.writer, clock=ctx.clock, defaults=KubeletDefaults())  # type: ignore[arg-type]
    )  # type: ignore[assignment]
    for pod in (
        _pod(ctx, "master-0", namespace="team-b", role="Master", index=0),
        _pod(ctx, "worker-0", namespace="team-b", role="Worker", index=0),
        _pod(ctx, "worker-1", namespace="team-b", role="Worker", index=1),
        _pod(ctx, "worker-0", namespace="team-a", role="Worker", index=0),
    ):
        ctx.store.create(pod)
    try:
        async with serving(build_app(ctx)) as url:
            yield Live(ctx, url)
    finally:
        ctx.store.close()


async def test_get_job_singular_all_namespaces_and_names(live: Live) -> None:
    r = await live.cli("get", "job", "-A", "-o", "name")
    assert r.exit_code == 0, r.output
    names = r.output.split()
    assert len(names) == 2 and all(n.endswith("job/" + n.split("/", 1)[1]) for n in names)
    r = await live.cli("get", "jobs", "-o", "jsonpath={.items[*].metadata.namespace}")
    assert r.output.split() == ["team-a", "team-b"]


async def test_get_pods_across_jobs_and_of_one(live: Live) -> None:
    r = await live.cli("get", "po", "-A")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split()[:3] == ["NAMESPACE", "NAME", "JOB"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["team-a", "pytorch-simple-worker-0", "pytorch-simple"],
        ["team-b", f"{MNIST}-master-0", MNIST],
        ["team-b", f"{MNIST}-worker-0", MNIST],
        ["team-b", f"{MNIST}-worker-1", MNIST],
    ]
    r = await live.cli("get", "pods", "-n", "team-a", "-o", "name")
    assert r.output.split() == ["pod/pytorch-simple-worker-0"]


async def test_logs_of_a_jobs_pod_by_role_and_index(live: Live) -> None:
    assert isinstance(live.ctx.clock, VirtualClock)
    kubelet = live.ctx.backend.kubelet  # type: ignore[union-attr]
    await kubelet.reconcile(("team-b", f"{MNIST}-worker-1"))
    await live.ctx.clock.advance(2)
    await kubelet.reconcile(("team-b", f"{MNIST}-worker-1"))
    r = await live.cli("logs", f"job/team-b/{MNIST}", "--role", "worker", "--index", "1")
    assert r.exit_code == 0, r.output
    assert "started container main" in r.output and "on node dgx-1" in r.output
    r = await live.cli("logs", f"job/{MNIST}", "-n", "team-b")  # the master's pod: not started yet
    assert r.exit_code == 0 and f"team-b/{MNIST}-master-0 is Pending" in r.output
    r = await live.cli("logs", f"job/team-b/{MNIST}", "--role", "PS")
    assert r.exit_code == 2 and "its roles: Master, Worker" in r.output
    r = await live.cli("logs", f"job/team-b/{MNIST}", "--role", "worker", "--index", "1", "--tail", "1")
    assert r.exit_code == 0 and r.output.count("\n") == 1 and " env: " in r.output


async def test_logs_follow_streams_until_the_pod_has_finished(live: Live) -> None:
    """`logs -f` of a pod not started yet waits for it, prints its lines as the kubelet writes
    them, and returns once the container has exited."""
    assert isinstance(live.ctx.clock, VirtualClock)
    kubelet = live.ctx.backend.kubelet  # type: ignore[union-attr]
    key = ("team-b", f"{MNIST}-worker-0")
    following = asyncio.create_task(live.cli("logs", f"job/team-b/{MNIST}", "--role", "Worker", "-f"))
    await asyncio.sleep(0.5)
    assert not following.done()
    await kubelet.reconcile(key)
    await live.ctx.clock.advance(2)
    await kubelet.reconcile(key)  # Running: the first two lines
    pod = live.ctx.store.get_of(Pod, *key)
    assert pod is not None and pod.status.phase == "Running"
    await asyncio.sleep(0.5)
    assert not following.done()
    done = pod.clone()
    terminate(done, exit_code=0, reason="Completed", message=None, now=live.ctx.clock.utcnow())
    live.ctx.store.update(done)
    r = await asyncio.wait_for(following, 10)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert len(lines) == 3 and "started container main" in lines[0] and "exited with code 0" in lines[2]


def test_pick_pod_prefers_the_leader_then_index_zero() -> None:
    pods = [
        {"metadata": {"name": n}, "summary": {"replicaType": t, "replicaIndex": str(i)}}
        for n, t, i in [("w1", "Worker", 1), ("w0", "Worker", 0), ("c0", "Chief", 0)]
    ]
    assert pick_pod(pods, role=None, index=None, job="j")["metadata"]["name"] == "c0"
    assert pick_pod(pods[:2], role=None, index=None, job="j")["metadata"]["name"] == "w0"
    assert pick_pod(pods, role="worker", index=1, job="j")["metadata"]["name"] == "w1"


async def test_watch_prints_the_current_jobs_first(live: Live) -> None:
    task = asyncio.create_task(live.cli("get", "jobs", "-w", "--max-events", "1"))
    await asyncio.sleep(1.0)  # the jobs are listed and the watch connects
    job = next(iter(live.ctx.store.list("PyTorchJob", namespace="team-a"))).clone()
    job.status.phase = "Running"  # type: ignore[attr-defined]
    live.ctx.store.update(job)
    r = await asyncio.wait_for(task, 20)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split()[:4] == ["NAMESPACE", "NAME", "KIND", "PHASE"]
    assert [line.split()[0] for line in lines[1:3]] == ["team-a", "team-b"]  # the state first
    assert lines[3].split()[:4] == ["team-a", job.metadata.name, "PyTorchJob", "Running"]
    assert lines[3].index("PyTorchJob") == lines[0].index("KIND")  # lined up with the header


async def test_a_missing_token_names_the_flag_and_the_variable(live: Live) -> None:
    r = await live.cli("get", "jobs", token=None)
    assert r.exit_code == 2
    assert "--token" in r.output and "GPUYARD_TOKEN" in r.output
