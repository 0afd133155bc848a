"""KubeDL's XDLJob and ElasticDLJob: defaults, the XDL environment, the success rules, and a run on
the fake cluster."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from gpuyard.apis.core import Pod
from gpuyard.apis.jobkinds import ElasticDLJob, TrainingJob, XDLJob, find_job
from gpuyard.apis.jobs import JobValidationError, load_documents, parse_job
from gpuyard.apis.jobspecs import JobStatus
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import pod_name
from gpuyard.controllers.judging import Replica
from gpuyard.controllers.materializing import build_pod
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.controllers.reporting import replica_statuses
from gpuyard.controllers.workloads.base import JobView, PodOutcome
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.devices.scenarios import load_scenario
from gpuyard.fakecluster import FakeCluster
from gpuyard.state.clock import VirtualClock
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ControllerRunner
from tests.unit.controllers.fakes import JOBS, ROOT, TinyScheduler, reserve


def sample(name: str) -> dict[str, Any]:
    (doc,) = load_documents((JOBS / f"{name}.yaml").read_text())
    return doc


def xdl(workers: int = 10, **spec: Any) -> XDLJob:
    doc = sample("xdl-kubedl")
    doc["spec"]["xdlReplicaSpecs"]["Worker"]["replicas"] = workers
    doc["spec"].update(spec)
    job = parse_job(doc)
    assert isinstance(job, XDLJob)
    return job


def view(job: TrainingJob, succeeded: dict[str, int]) -> JobView:
    replicas = {r: s.count for r, s in job.replica_specs.items()}
    pods = {
        r: {i: PodOutcome(phase="Succeeded", exit_code=0) for i in range(n)} for r, n in succeeded.items()
    }
    return JobView(replicas=replicas, pods=pods)


def test_xdl_defaults_are_kubedls() -> None:
    job = xdl()
    assert job.run_policy.backoff_limit == 20
    assert job.spec.min_finish_work_rate == 90
    assert all(s.restart_policy == "ExitCode" for s in job.replica_specs.values())  # as written
    port = job.replica_specs["PS"].template.spec.containers[0].ports[0]
    assert (port.name, port.container_port) == ("xdljob-port", 2222)
    given = xdl(minFinishWorkNum=3, backoffLimit=2)
    assert given.spec.min_finish_work_rate is None and given.spec.min_finish_work_num == 3
    assert given.run_policy.backoff_limit == 2


def test_xdl_roles_are_kubedls_and_a_rate_is_a_percentage() -> None:
    doc = sample("xdl-kubedl")
    doc["spec"]["xdlReplicaSpecs"]["extendrole"] = doc["spec"]["xdlReplicaSpecs"]["Worker"]
    assert set(parse_job(doc).replica_specs) == {"Scheduler", "PS", "Worker", "ExtendRole"}
    doc["spec"]["xdlReplicaSpecs"]["Master"] = doc["spec"]["xdlReplicaSpecs"]["Worker"]
    doc["spec"]["minFinishWorkRate"] = 101
    with pytest.raises(JobValidationError) as err:
        parse_job(doc)
    fields = {d["field"] for d in err.value.details}
    assert {"spec.xdlReplicaSpecs.Master", "spec.minFinishWorkRate"} <= fields


@pytest.mark.parametrize(
    ("spec", "needed"),
    [({}, 9), ({"minFinishWorkRate": 50}, 5), ({"minFinishWorkNum": 3}, 3), ({"minFinishWorkNum": 0}, 1)],
)
def test_xdl_succeeds_once_enough_workers_have(spec: dict[str, Any], needed: int) -> None:
    job = xdl(10, **spec)
    plugin = plugin_for("XDLJob")
    assert plugin.succeeded(job, view(job, {"Worker": needed}))
    assert needed == 1 or not plugin.succeeded(job, view(job, {"Worker": needed - 1, "PS": 1}))


def test_xdl_pods_get_task_name_index_config_and_the_uid_in_zk_addr() -> None:
    job = xdl(2)
    job.metadata.uid = "0f0e-uid"
    placement = reserve(job)
    name = pod_name(job.metadata.name, "Worker", 1)
    pod = build_pod(job, "Worker", 1, plugin=plugin_for("XDLJob"), reservation=placement[name])
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["ZK_ADDR"] == "zfs://zk-0:2181/xdl/0f0e-uid"
    assert env["TASK_NAME"] == "worker" and env["TASK_INDEX"] == "1"
    config = json.loads(env["XDL_CONFIG"] or "")
    assert config["task"] == {"type": "worker", "index": 1}
    assert config["cluster"]["worker"] == [
        "xdl-mnist-example-worker-0:2222",
        "xdl-mnist-example-worker-1:2222",
    ]
    assert list(config["cluster"]) == ["ps", "scheduler", "worker"]  # Go's sorted map keys
    assert pod.metadata.labels.get("job-role") is None  # XDL has no master role


def test_elasticdl_has_one_master_role_that_decides() -> None:
    job = parse_job(sample("elasticdl-kubedl"))
    assert isinstance(job, ElasticDLJob)
    plugin = plugin_for("ElasticDLJob")
    assert plugin.is_master(job, "Master", 0)
    assert plugin.succeeded(job, view(job, {"Master": 1}))
    assert not plugin.succeeded(job, view(job, {}))
    port = job.replica_specs["Master"].template.spec.containers[0].ports[0]
    assert (port.name, port.container_port) == ("elasticdl-port", 11111)
    doc = sample("elasticdl-kubedl")
    doc["spec"]["elasticdlReplicaSpecs"]["Worker"] = doc["spec"]["elasticdlReplicaSpecs"]["Master"]
    with pytest.raises(JobValidationError):
        parse_job(doc)


@pytest_asyncio.fixture
async def ctx() -> AsyncIterator[Context]:
    ctx = Context.for_tests()
    fake = FakeCluster(ctx, load_scenario(ROOT / "configs" / "clusters" / "demo.yaml"))
    ctx.backend = fake
    ctx.writer = fake.writer
    tasks = [
        asyncio.create_task(fake.run(), name="fake-cluster"),
        asyncio.create_task(
            ControllerRunner(JobReconciler(ctx), store=ctx.store, clock=ctx.clock).run(), name="operator"
        ),
        asyncio.create_task(
            ControllerRunner(TinyScheduler(ctx.store), store=ctx.store, clock=ctx.clock).run(),
            name="scheduler",
        ),
    ]
    await asyncio.wait_for(fake.synced.wait(), 5)
    try:
        yield ctx
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.store.close()


@pytest.mark.parametrize(("sample_name", "pods"), [("xdl-kubedl", 4), ("elasticdl-kubedl", 1)])
async def test_both_kinds_run_to_succeeded_on_the_fake_cluster(
    ctx: Context, sample_name: str, pods: int
) -> None:
    doc = sample(sample_name)
    for replica in next(v for k, v in doc["spec"].items() if k.endswith("ReplicaSpecs")).values():
        replica["template"]["metadata"] = {"annotations": {"fake.gpuyard.io/duration": "60"}}
    job = parse_job(doc)
    ctx.store.create(job)
    clock = ctx.clock
    assert isinstance(clock, VirtualClock)
    ns, name = job.metadata.namespace, job.metadata.name

    def phase() -> str:
        found = find_job(ctx.store, ns, name)
        return found.status.phase if found is not None else ""

    assert await clock.run_until(lambda: phase() == "Running", timeout=600)
    assert len(ctx.store.list("Pod", namespace=ns)) == pods
    assert await clock.run_until(lambda: phase() == "Succeeded", timeout=7200)


def test_replica_status_counts_evicted_and_preempted_pods() -> None:
    def failed(name: str, reason: str | None, conditions: list[dict[str, str]] | None = None) -> Pod:
        p = Pod(metadata=ObjectMeta(name=name))
        p.status.phase = "Failed"
        p.status.reason = reason
        p.status.conditions = conditions or []
        return p

    job = xdl(4)
    pods = [
        failed("w0", "Evicted"),
        failed("w1", "Preempted"),
        failed(
            "w2", None, [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
        ),
        failed("w3", "Error"),
    ]
    reps = [Replica(role="Worker", index=i, name=p.metadata.name, pod=p) for i, p in enumerate(pods)]
    status = JobStatus()
    replica_statuses(job, status, replicas=reps)
    worker = status.replica_statuses["Worker"]
    assert (worker.failed, worker.evicted) == (4, 3)
    assert status.replica_statuses["PS"].evicted == 0
    assert worker.to_dict()["evicted"] == 3
