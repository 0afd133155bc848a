"""The cron controller's pure half (`controllers/cronplanning.py`), on plain objects: which run is
due, the concurrency policies, history kept and trimmed, suspend and deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpuyard.apis.crons import LABEL_CRON_NAME, Cron, CronHistory, CronHistoryObject, parse_cron
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import JobCondition
from gpuyard.apis.meta import OwnerReference
from gpuyard.controllers.cronplanning import plan_cron

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_cron(*, name: str = "c", workload_meta: dict[str, Any] | None = None, **spec: Any) -> Cron:
    container = {"name": "tensorflow", "image": "tf"}
    doc = {
        "apiVersion": "apps.kubedl.io/v1alpha1",
        "kind": "Cron",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedule": "* * * * *",
            **spec,
            "template": {
                "apiVersion": "training.kubedl.io/v1alpha1",
                "kind": "TFJob",
                "workload": {
                    "metadata": workload_meta or {},
                    "spec": {
                        "tfReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [container]}}}}
                    },
                },
            },
        },
    }
    cron, problems = parse_cron(doc)
    assert cron is not None, problems
    cron.metadata.uid = "cron-uid"
    cron.metadata.creation_timestamp = T0
    return cron


def run_of(cron: Cron, at: datetime, *, state: str = "Running") -> TrainingJob:
    plan = plan_cron(cron.model_copy(update={"status": cron.status.model_copy()}), [], now=at)
    assert plan.create is not None
    job = plan.create
    job.metadata.uid = f"uid-{job.metadata.name}"
    job.metadata.creation_timestamp = at
    job.status.conditions = [JobCondition.model_validate({"type": state})]
    return job


def test_the_due_run_is_created_named_labelled_and_owned() -> None:
    cron = make_cron()
    assert plan_cron(cron, [], now=T0 + timedelta(seconds=59)).create is None
    plan = plan_cron(cron, [], now=T0 + timedelta(seconds=60))
    assert plan.create is not None
    meta = plan.create.metadata
    assert meta.name == f"c-{int((T0 + timedelta(minutes=1)).timestamp())}"
    assert meta.labels[LABEL_CRON_NAME] == "c"
    assert meta.owner_references == [
        OwnerReference(
            api_version="apps.kubedl.io/v1alpha1",
            kind="Cron",
            name="c",
            uid="cron-uid",
            controller=True,
            block_owner_deletion=True,
        )
    ]
    assert plan.last_schedule_time == T0 + timedelta(minutes=1)
    assert plan.requeue_after == 60.0


def test_a_processed_schedule_time_is_not_run_again() -> None:
    cron = make_cron()
    cron.status.last_schedule_time = T0 + timedelta(minutes=1)
    assert plan_cron(cron, [], now=T0 + timedelta(seconds=90)).create is None


def test_forbid_skips_while_active_allow_overlaps_replace_deletes() -> None:
    at = T0 + timedelta(minutes=2)
    for policy, creates, deletes in (
        ("Forbid", False, False),
        ("Allow", True, False),
        ("Replace", True, True),
    ):
        cron = make_cron(concurrencyPolicy=policy)
        running = run_of(cron, T0 + timedelta(minutes=1))
        cron.status.last_schedule_time = T0 + timedelta(minutes=1)
        plan = plan_cron(cron, [running], now=at)
        assert (plan.create is not None) == creates, policy
        assert ([j.metadata.name for j in plan.delete] == [running.metadata.name]) == deletes, policy
        if policy == "Forbid":
            assert [e.reason for e in plan.events] == ["AlreadyActive"]


def test_a_template_that_names_its_job_runs_as_forbid() -> None:
    cron = make_cron(workload_meta={"name": "fixed"})
    running = run_of(cron, T0 + timedelta(minutes=1))
    assert running.metadata.name == "fixed"
    cron.status.last_schedule_time = T0 + timedelta(minutes=1)
    assert plan_cron(cron, [running], now=T0 + timedelta(minutes=2)).create is None


def test_history_keeps_deleted_runs_and_is_trimmed_to_the_limit_deleting_finished_runs() -> None:
    cron = make_cron(historyLimit=2)
    gone = CronHistory(object=CronHistoryObject(kind="TFJob", name="c-1"), status="Succeeded", created=T0)
    cron.status.history = [gone]
    a = run_of(cron, T0 + timedelta(minutes=1), state="Succeeded")
    b = run_of(cron, T0 + timedelta(minutes=2), state="Failed")
    c = run_of(cron, T0 + timedelta(minutes=3))
    cron.status.last_schedule_time = T0 + timedelta(minutes=3)
    plan = plan_cron(cron, [a, b, c], now=T0 + timedelta(minutes=3, seconds=10))
    assert [h.object.name for h in plan.history] == [b.metadata.name, c.metadata.name]
    assert [h.status for h in plan.history] == ["Failed", "Running"]
    assert [j.metadata.name for j in plan.delete] == [a.metadata.name]
    assert [r.name for r in plan.status()["active"]] == [c.metadata.name]
    cron.spec.history_limit = None
    unlimited = plan_cron(cron, [a, b, c], now=T0 + timedelta(minutes=3))
    assert [h.object.name for h in unlimited.history] == [
        "c-1",
        a.metadata.name,
        b.metadata.name,
        c.metadata.name,
    ]


def test_a_job_the_cron_does_not_own_is_ignored() -> None:
    cron = make_cron()
    stranger = run_of(cron, T0 + timedelta(minutes=1))
    stranger.metadata.owner_references[0].uid = "another-cron"
    assert plan_cron(cron, [stranger], now=T0 + timedelta(seconds=70)).active == []


def test_suspend_and_deadline_start_nothing() -> None:
    late = T0 + timedelta(minutes=5)
    suspended = plan_cron(make_cron(suspend=True), [], now=late)
    assert (suspended.create, suspended.requeue_after) == (None, None)
    ended = plan_cron(make_cron(deadline=(T0 + timedelta(minutes=2)).isoformat()), [], now=late)
    assert ended.create is None and [e.reason for e in ended.events] == ["Deadline"]
