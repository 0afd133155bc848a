"""Delegate mode: what the operator hands to Volcano, scheduler-plugins or Koordinator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gpuyard.apis.core import Event, Pod
from gpuyard.apis.gangs import GangPodGroup
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobs import load_documents
from gpuyard.apis.resources import resource_for
from gpuyard.apis.scheduling import ANNOTATION_DEVICES, PodGroup
from gpuyard.controllers.delegating import PodScheduling, gang_pod_group
from gpuyard.controllers.materializing import build_pod
from gpuyard.controllers.podgroups import pod_group_spec
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.kubecluster.writing import to_json
from gpuyard.state.config import ConfigError, Settings, load_settings
from gpuyard.state.context import Context
from gpuyard.state.store import NotFound
from gpuyard.state.workqueues import ControllerRunner
from tests.builders import make_node
from tests.unit.controllers.fakes import JOBS, ScriptedBackend, TinyScheduler, job_from, load_job, reserve

OWNER_UID = "6b0e8f0a-0000-4000-8000-00000000000a"


def tfjob() -> TrainingJob:
    """Kubeflow's dist-mnist TFJob (2 PS, 4 workers) with a queue, a priority class and a minimum."""
    (doc,) = load_documents((JOBS / "tf-dist-mnist.yaml").read_text())
    doc["metadata"] |= {"namespace": "ml", "uid": OWNER_UID}
    doc["spec"]["runPolicy"] = {
        "schedulingPolicy": {"queue": "research", "priorityClassName": "high", "minAvailable": 5}
    }
    for spec in doc["spec"]["tfReplicaSpecs"].values():
        spec["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": 2, "nvidia.com/gpu": 1}}
    return job_from(doc)


def delegated(gang: str) -> PodScheduling:
    return PodScheduling.from_settings(
        load_settings(None, scheduler={"mode": "delegate", "gang_scheduler": gang}).scheduler
    )


def group_of(gang: str) -> dict:  # type: ignore[type-arg]
    """The gang scheduler's PodGroup as the API server gets it."""
    job = tfjob()
    group = gang_pod_group(job, pod_group_spec(job, plugin_for("TFJob")), scheduling=delegated(gang))
    body = to_json(group)
    body["kind"] = resource_for(group.kind, group.api_version).wire_kind
    return body


def pod_of(gang: str, role: str = "Worker", index: int = 1):  # type: ignore[no-untyped-def]
    job = tfjob()
    res = reserve(job)[f"{job.metadata.name}-{role.lower()}-{index}"]
    return build_pod(
        job, role, index, plugin=plugin_for("TFJob"), reservation=res, scheduling=delegated(gang)
    )


def test_volcano_pod_group_and_pods() -> None:
    pg = group_of("volcano")
    assert (pg["apiVersion"], pg["kind"]) == ("scheduling.volcano.sh/v1beta1", "PodGroup")
    assert pg["metadata"]["name"] == "dist-mnist-for-e2e-test" and pg["metadata"]["namespace"] == "ml"
    assert pg["metadata"]["ownerReferences"][0]["uid"] == OWNER_UID
    assert pg["spec"] == {
        "minMember": 5,
        "minTaskMember": {"ps": 2, "worker": 4},
        "queue": "research",
        "priorityClassName": "high",
        "minResources": {"cpu": "12", "nvidia.com/gpu": "6"},  # 2 PS + 4 workers, 2 CPUs and 1 GPU each
    }
    pod = pod_of("volcano")
    assert pod.spec.scheduler_name == "volcano"
    assert pod.metadata.annotations["scheduling.k8s.io/group-name"] == "dist-mnist-for-e2e-test"
    assert pod.metadata.annotations["volcano.sh/task-spec"] == "worker"


def test_coscheduling_pod_group_and_pods() -> None:
    pg = group_of("coscheduling")
    assert pg["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert pg["spec"] == {
        "minMember": 5,
        "minResources": {"cpu": "12", "nvidia.com/gpu": "6"},
        "scheduleTimeoutSeconds": 300,
    }
    pod = pod_of("coscheduling")
    assert pod.spec.scheduler_name == "scheduler-plugins-scheduler"
    assert pod.metadata.labels["scheduling.x-k8s.io/pod-group"] == "dist-mnist-for-e2e-test"


def test_koordinator_pod_group_and_gang_annotations() -> None:
    pg = group_of("koordinator")
    assert pg["apiVersion"] == "scheduling.sigs.k8s.io/v1alpha1"
    assert pg["spec"] == {"minMember": 5, "scheduleTimeoutSeconds": 300}
    pod = pod_of("koordinator", "PS", 0)
    assert pod.spec.scheduler_name == "koord-scheduler"
    assert pod.metadata.labels["pod-group.scheduling.sigs.k8s.io"] == "dist-mnist-for-e2e-test"
    gang = {
        k.removeprefix("gang.scheduling.koordinator.sh/"): v
        for k, v in pod.metadata.annotations.items()
        if k.startswith("gang.scheduling.koordinator.sh/")
    }
    assert gang == {
        "name": "dist-mnist-for-e2e-test",
        "min-available": "5",
        "total-number": "6",
        "mode": "Strict",
        "waiting-time": "300s",
    }


@pytest.mark.parametrize("gang", ["volcano", "coscheduling", "koordinator"])
def test_delegated_pods_are_unbound_without_gpuyards_devices(gang: str) -> None:
    pod = pod_of(gang)
    assert pod.spec.node_name is None
    assert ANNOTATION_DEVICES not in pod.metadata.annotations
    assert "NVIDIA_VISIBLE_DEVICES" not in pod.spec.containers[0].env_dict()
    assert pod.metadata.owner_references[0].uid == OWNER_UID  # the operator still owns them


def test_scheduler_names_are_configurable_and_delegate_needs_a_gang_scheduler() -> None:
    own = PodScheduling.from_settings(load_settings(None, scheduler={"name": "gpuyard-b"}).scheduler)
    assert own == PodScheduling(scheduler_name="gpuyard-b") and not own.delegated
    custom = load_settings(
        None, scheduler={"mode": "delegate", "gang_scheduler": "volcano", "delegate_scheduler_name": "vc"}
    )
    assert PodScheduling.from_settings(custom.scheduler).scheduler_name == "vc"
    with pytest.raises(ConfigError, match="gang_scheduler is required"):
        load_settings(None, scheduler={"mode": "delegate"})
    with pytest.raises(ValueError, match="not delegate"):
        gang_pod_group(tfjob(), pod_group_spec(tfjob(), plugin_for("TFJob")), scheduling=own)


@asynccontextmanager
async def delegating_operator(gang: str = "volcano") -> AsyncIterator[tuple[Context, ScriptedBackend]]:
    """The operator in delegate mode and a tiny scheduler on a two-node store, running."""
    settings = Settings(
        backend={"data_dir": None, "clock": "virtual"},
        scheduler={"mode": "delegate", "gang_scheduler": gang},
    )
    ctx = Context.for_tests(settings=settings)
    for name in ("node-a", "node-b"):
        ctx.store.create(make_node(name, gpus=8))
    backend = ScriptedBackend(ctx.store)
    ctx.backend, ctx.writer = backend, backend.writer
    runners = [
        ControllerRunner(JobReconciler(ctx), store=ctx.store, clock=ctx.clock),
        ControllerRunner(TinyScheduler(ctx.store), store=ctx.store, clock=ctx.clock),
    ]
    tasks = [asyncio.create_task(r.run()) for r in runners]
    try:
        yield ctx, backend
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.store.close()


async def settle(ctx: Context, done: Callable[[], bool]) -> None:
    for _ in range(50):
        await ctx.clock.advance(0.01)  # type: ignore[attr-defined]
        if done():
            return


async def test_operator_in_delegate_mode_creates_unbound_pods_once_admitted() -> None:
    async with delegating_operator() as (ctx, _):
        job = load_job("tf-dist-mnist", namespace="ml")
        ctx.store.create(job)
        await settle(ctx, lambda: len(ctx.store.list("Pod", namespace="ml")) == 6)
        pods = ctx.store.list_of(Pod, namespace="ml")
        assert len(pods) == 6  # created after gpuyard's queue admitted the gang (PodGroup Placed)
        assert ctx.store.must_get_of(PodGroup, "ml", job.metadata.name).status.phase == "Placed"
        assert {p.spec.scheduler_name for p in pods} == {"volcano"}
        assert {p.spec.node_name for p in pods} == {None}
        gang = ctx.store.get_of(GangPodGroup, "ml", job.metadata.name)
        assert gang is not None, "the gang scheduler's PodGroup is written with the pods"
        assert gang.api_version == "scheduling.volcano.sh/v1beta1" and gang.spec.min_member == 6
        stored = ctx.store.must_get_of(type(job), "ml", job.metadata.name)
        assert gang.metadata.owner_references[0].uid == stored.metadata.uid
        # the job is suspended: its pods stop and the gang scheduler's PodGroup goes with them
        suspended = stored.clone()
        suspended.spec.suspend = True
        ctx.store.update(suspended)
        await settle(ctx, lambda: ctx.store.get_of(GangPodGroup, "ml", job.metadata.name) is None)
        assert ctx.store.get_of(GangPodGroup, "ml", job.metadata.name) is None
        assert ctx.store.list("Pod", namespace="ml") == []


async def test_a_refused_gang_pod_group_creates_no_pod_and_says_why() -> None:
    async with delegating_operator("coscheduling") as (ctx, backend):
        writer = backend.writer
        real_create = writer.create
        refusals = 0

        async def create(obj: Any) -> Any:
            nonlocal refusals
            if isinstance(obj, GangPodGroup) and refusals < 2:
                refusals += 1
                raise NotFound(
                    "the server could not find the requested resource (podgroups.scheduling.x-k8s.io)"
                )
            return await real_create(obj)

        writer.create = create  # type: ignore[method-assign]
        job = load_job("tf-dist-mnist", namespace="ml")
        ctx.store.create(job)
        await settle(ctx, lambda: refusals == 1)
        assert ctx.store.list("Pod", namespace="ml") == []  # no pod names a PodGroup that is not there
        events = [e for e in ctx.store.list_of(Event, namespace="ml") if e.reason == "FailedCreatePodGroup"]
        assert events and "scheduling.x-k8s.io/v1alpha1" in events[0].message
        assert events[0].type == "Warning"
        for _ in range(400):  # retried after a backoff: once it is created, the pods follow
            await ctx.clock.advance(0.05)  # type: ignore[attr-defined]
            if len(ctx.store.list("Pod", namespace="ml")) == 6:
                break
        assert refusals == 2 and ctx.store.get_of(GangPodGroup, "ml", job.metadata.name) is not None
        assert len(ctx.store.list("Pod", namespace="ml")) == 6


async def test_the_gang_pod_group_spec_is_kept_without_fighting_the_gang_schedulers_defaults() -> None:
    async with delegating_operator("koordinator") as (ctx, backend):
        job = load_job("tf-dist-mnist", namespace="ml")
        ctx.store.create(job)
        name = job.metadata.name
        await settle(ctx, lambda: ctx.store.get_of(GangPodGroup, "ml", name) is not None)
        # the gang scheduler's webhook defaults a field gpuyard does not set: gpuyard leaves it alone
        defaulted = ctx.store.must_get_of(GangPodGroup, "ml", name).clone()
        defaulted.spec.min_resources = {"cpu": "1"}
        ctx.store.update(defaulted)
        writes = len(backend.writer.writes)
        await settle(ctx, lambda: False)
        assert ("update", "GangPodGroup", name) not in backend.writer.writes[writes:]
        # someone changes the gang's minimum: the operator puts the job's back, keeping the default
        changed = ctx.store.must_get_of(GangPodGroup, "ml", name).clone()
        changed.spec.min_member = 1
        ctx.store.update(changed)
        await settle(ctx, lambda: ctx.store.must_get_of(GangPodGroup, "ml", name).spec.min_member == 6)
        kept = ctx.store.must_get_of(GangPodGroup, "ml", name)
        assert kept.spec.min_member == 6 and kept.spec.min_resources == {"cpu": "1"}
        # deleted while the job runs: made again
        ctx.store.delete(GangPodGroup.KIND, "ml", name)
        await settle(ctx, lambda: ctx.store.get_of(GangPodGroup, "ml", name) is not None)
        assert ctx.store.get_of(GangPodGroup, "ml", name) is not None
