"""The job operator on the fake cluster (simulated kubelet, fault injection) on a virtual clock.

The real scheduler lives in `gpuyard.scheduler`; these tests place gangs with the tiny contract-
following scheduler from the operator's unit tests, so they exercise the operator, the fake
cluster and the PodGroup/Reservation contract end to end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest_asyncio

from gpuyard.apis.jobkinds import TrainingJob, find_job
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.devices.scenarios import load_scenario
from gpuyard.fakecluster import FakeCluster
from gpuyard.state.clock import VirtualClock
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ControllerRunner
from tests.unit.controllers.fakes import ROOT, TinyScheduler, load_job


@dataclass
class Cluster:
    ctx: Context
    fake: FakeCluster
    scheduler: TinyScheduler

    @property
    def clock(self) -> VirtualClock:
        assert isinstance(self.ctx.clock, VirtualClock)
        return self.ctx.clock

    def job(self, ns: str, name: str) -> TrainingJob:
        job = find_job(self.ctx.store, ns, name)
        assert job is not None
        return job

    async def until(self, cond, timeout: float = 600.0) -> None:  # type: ignore[no-untyped-def]
        assert await self.clock.run_until(cond, timeout=timeout), "condition not reached in virtual time"

    def pods(self, ns: str) -> dict[str, object]:
        return {p.metadata.name: p for p in self.ctx.store.list("Pod", namespace=ns)}


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[Cluster]:
    ctx = Context.for_tests()
    fake = FakeCluster(ctx, load_scenario(ROOT / "configs" / "clusters" / "demo.yaml"))
    ctx.backend = fake
    ctx.writer = fake.writer
    scheduler = TinyScheduler(ctx.store)
    tasks = [
        asyncio.create_task(fake.run(), name="fake-cluster"),
        asyncio.create_task(
            ControllerRunner(JobReconciler(ctx), store=ctx.store, clock=ctx.clock).run(), name="operator"
        ),
        asyncio.create_task(
            ControllerRunner(scheduler, store=ctx.store, clock=ctx.clock).run(), name="scheduler"
        ),
    ]
    await asyncio.wait_for(fake.synced.wait(), 5)
    try:
        yield Cluster(ctx, fake, scheduler)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.store.close()


def phase(c: Cluster, ns: str, name: str) -> str:
    return c.job(ns, name).status.phase


async def test_hostnetwork_tfjob_runs_to_succeeded(cluster: Cluster) -> None:
    cluster.ctx.store.create(load_job("tf-mnist-hostnetwork"))
    await cluster.until(lambda: phase(cluster, "kubedl", "mnist") == "Running")
    pods = cluster.pods("kubedl")
    assert sorted(pods) == ["mnist-ps-0", "mnist-ps-1", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2"]
    ports = {}
    for name, pod in pods.items():
        assert pod.spec.host_network and pod.spec.dns_policy == "ClusterFirstWithHostNet"  # type: ignore[attr-defined]
        port = pod.spec.containers[0].ports[0].host_port  # type: ignore[attr-defined]
        assert 20000 <= port <= 30000
        ports[name] = port
        config = json.loads(pod.spec.containers[0].env_dict()["TF_CONFIG"])  # type: ignore[attr-defined]
        rt, _, idx = name.removeprefix("mnist-").rpartition("-")
        assert config["task"] == {"type": rt, "index": int(idx)}
        assert config["cluster"][rt][int(idx)] == f"{name}.kubedl.svc:{port}"
    by_node: dict[str, set[int]] = {}
    for name, pod in pods.items():
        node_ports = by_node.setdefault(pod.spec.node_name, set())  # type: ignore[attr-defined]
        assert ports[name] not in node_ports  # no two host-network pods share a port on a node
        node_ports.add(ports[name])
    await cluster.until(lambda: phase(cluster, "kubedl", "mnist") == "Succeeded")
    assert not [p for p in cluster.pods("kubedl").values() if p.status.phase in ("Pending", "Running")]  # type: ignore[attr-defined]
    assert not cluster.ctx.store.list("Reservation", namespace="kubedl")


async def test_crash_137_comes_back_on_a_new_port_and_exit_1_fails(cluster: Cluster) -> None:
    store = cluster.ctx.store
    store.create(load_job("tf-mnist-hostnetwork"))
    await cluster.until(lambda: phase(cluster, "kubedl", "mnist") == "Running")
    await cluster.clock.advance(10)
    old = store.must_get("Pod", "kubedl", "mnist-worker-1")
    old_port = old.spec.containers[0].ports[0].host_port  # type: ignore[attr-defined]
    await cluster.fake.faults.crash_pod("kubedl", "mnist-worker-1", exit_code=137)

    def replaced() -> bool:
        pod = store.get("Pod", "kubedl", "mnist-worker-1")
        return pod is not None and pod.metadata.uid != old.metadata.uid and pod.status.phase == "Running"  # type: ignore[attr-defined]

    await cluster.until(replaced)
    new = store.must_get("Pod", "kubedl", "mnist-worker-1")
    new_port = new.spec.containers[0].ports[0].host_port  # type: ignore[attr-defined]
    assert new_port != old_port
    svc = store.must_get("Service", "kubedl", "mnist-worker-1")
    assert (svc.spec.ports[0].port, svc.spec.ports[0].target_port) == (2222, new_port)  # type: ignore[attr-defined]
    assert json.loads(new.spec.containers[0].env_dict()["TF_CONFIG"])["cluster"]["worker"][1].endswith(
        f":{new_port}"
    )  # type: ignore[attr-defined]
    assert cluster.job("kubedl", "mnist").status.restarts == 1
    await cluster.fake.faults.crash_pod("kubedl", "mnist-worker-2", exit_code=1)
    await cluster.until(lambda: phase(cluster, "kubedl", "mnist") == "Failed")
    job = cluster.job("kubedl", "mnist")
    assert (
        job.status.condition("Failed").message == "TFJob mnist is failed because 1 Worker replica(s) failed."
    )  # type: ignore[union-attr]
    await cluster.clock.advance(1)
    assert not [p for p in cluster.pods("kubedl").values() if p.status.phase in ("Pending", "Running")]  # type: ignore[attr-defined]


async def test_lost_node_fails_its_pods_and_they_come_back_elsewhere(cluster: Cluster) -> None:
    store = cluster.ctx.store
    store.create(load_job("pytorch-simple"))
    await cluster.until(lambda: phase(cluster, "kubeflow", "pytorch-simple") == "Running")
    await cluster.until(
        lambda: (
            len(cluster.pods("kubeflow")) == 2
            and all(p.status.phase == "Running" for p in cluster.pods("kubeflow").values())
        )
    )  # type: ignore[attr-defined]
    worker = store.must_get("Pod", "kubeflow", "pytorch-simple-worker-0")
    lost = worker.spec.node_name  # type: ignore[attr-defined]
    assert await cluster.fake.faults.fail_node(lost) >= 1

    def moved() -> bool:
        pod = store.get("Pod", "kubeflow", "pytorch-simple-worker-0")
        return pod is not None and pod.spec.node_name != lost and pod.status.phase == "Running"  # type: ignore[attr-defined]

    await cluster.until(moved)
    assert cluster.job("kubeflow", "pytorch-simple").status.restarts >= 1


async def test_every_example_job_starts_on_the_demo_cluster(cluster: Cluster) -> None:
    names = [
        "tf-dist-mnist",
        "tf-graphlearn",
        "pytorch-kubedl",
        "pytorch-elastic",
        "xgboost-kubedl",
        "mpi-kubedl",
        "mars-kubedl",
        "jax-simple",
        "paddle-simple",
        "xdl-kubedl",
        "elasticdl-kubedl",
    ]
    jobs = [load_job(n, namespace=f"ns-{i}") for i, n in enumerate(names)]
    for job in jobs:
        cluster.ctx.store.create(job)

    def all_running() -> bool:
        return all(phase(cluster, j.metadata.namespace, j.metadata.name) == "Running" for j in jobs)

    await cluster.until(all_running, timeout=120)
    for job in jobs:
        pods = cluster.pods(job.metadata.namespace)
        expected = sum(s.count for s in job.replica_specs.values())
        assert len(pods) == expected, job.metadata.name
