"""`runPolicy.managedBy`: a job another controller manages is left alone (training-operator v1.9)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from gpuyard.apis.jobkinds import TrainingJob, find_job
from gpuyard.apis.jobs import JobValidationError, load_documents, parse_job
from gpuyard.apis.managers import MULTIKUEUE, TRAINING_OPERATOR, external_manager, raw_external_manager
from gpuyard.apis.resources import resource_for
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.devices.scenarios import load_scenario
from gpuyard.fakecluster import FakeCluster
from gpuyard.kubecluster.invalid import InvalidJobs
from gpuyard.state.clock import VirtualClock
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ControllerRunner
from tests.unit.controllers.fakes import JOBS, ROOT, TinyScheduler


def pytorch_doc(name: str, manager: str | None, *, inline: bool = False) -> dict[str, Any]:
    (doc,) = load_documents((JOBS / "pytorch-simple.yaml").read_text())
    doc["metadata"]["name"] = name
    if manager is not None:
        if inline:
            doc["spec"]["managedBy"] = manager
        else:
            doc["spec"]["runPolicy"] = {"managedBy": manager}
    return doc


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


async def test_a_job_managed_by_multikueue_gets_no_pods_and_no_status(ctx: Context) -> None:
    store = ctx.store
    clock = ctx.clock
    assert isinstance(clock, VirtualClock)
    ours = parse_job(pytorch_doc("ours", TRAINING_OPERATOR))
    theirs = parse_job(pytorch_doc("theirs", MULTIKUEUE))
    store.create(theirs)
    store.create(ours)
    before = find_job(store, "kubeflow", "theirs")
    assert before is not None

    def running() -> bool:
        job = find_job(store, "kubeflow", "ours")
        return job is not None and job.status.phase == "Running"

    assert await clock.run_until(running, timeout=600), "gpuyard's own job never ran"
    await clock.advance(60)
    pods = {p.metadata.name for p in store.list("Pod", namespace="kubeflow")}
    assert "ours-master-0" in pods
    assert not [p for p in pods if p.startswith("theirs-")]
    assert store.get("PodGroup", "kubeflow", "theirs") is None
    assert store.get("PodGroup", "kubeflow", "ours") is not None
    after = find_job(store, "kubeflow", "theirs")
    assert after is not None
    assert after.metadata.resource_version == before.metadata.resource_version  # no status write
    assert after.status.conditions == [] and after.status.phase == ""


def test_absent_or_training_operator_is_gpuyards_and_kubedl_inline_field_is_read() -> None:
    assert external_manager(parse_job(pytorch_doc("a", None))) is None
    assert external_manager(parse_job(pytorch_doc("b", TRAINING_OPERATOR))) is None
    assert external_manager(parse_job(pytorch_doc("c", MULTIKUEUE))) == MULTIKUEUE
    doc = pytorch_doc("d", MULTIKUEUE, inline=True)
    doc["apiVersion"] = "training.kubedl.io/v1alpha1"
    assert external_manager(parse_job(doc)) == MULTIKUEUE
    assert raw_external_manager(doc) == MULTIKUEUE
    assert raw_external_manager(pytorch_doc("e", TRAINING_OPERATOR)) is None


@pytest.mark.parametrize("value", ["example.com/my-controller", "", "kueue.x-k8s.io/MultiKueue"])
def test_an_unsupported_manager_is_refused_naming_the_field(value: str) -> None:
    with pytest.raises(JobValidationError) as err:
        parse_job(pytorch_doc("x", value))
    (detail,) = [d for d in err.value.details if "managedBy" in d["field"]]
    assert detail["field"] == "spec.runPolicy.managedBy"
    assert TRAINING_OPERATOR in detail["reason"] and MULTIKUEUE in detail["reason"]


def test_the_kubernetes_backend_reports_no_invalid_spec_on_a_job_it_does_not_manage() -> None:
    invalid = InvalidJobs(clock=VirtualClock(), may_write=lambda: None)
    resource = resource_for("PyTorchJob", "kubeflow.org/v1")
    theirs = pytorch_doc("theirs", MULTIKUEUE)
    invalid.note(resource, theirs, "spec.x: wrong")
    assert not invalid._pending
    ours = pytorch_doc("ours", None)
    invalid.note(resource, ours, "spec.x: wrong")
    assert len(invalid._pending) == 1


def test_its_manager_is_in_the_api_summary() -> None:
    from gpuyard.platform.api.jobs import summarize

    job: TrainingJob = parse_job(pytorch_doc("x", MULTIKUEUE))
    assert summarize(job)["summary"]["managedBy"] == MULTIKUEUE
    assert summarize(parse_job(pytorch_doc("y", None)))["summary"]["managedBy"] == TRAINING_OPERATOR
