"""The operator's side of the job's scheduling policy: labels, scheduleTimeoutSeconds and
minResources reach the PodGroup, label patches follow, and a ScheduleTimeout fails the job."""

from __future__ import annotations

from gpuyard.apis.quantity import parse_quantity
from gpuyard.apis.scheduling import PodGroup
from gpuyard.controllers.podgroups import changed_pod_group
from tests.unit.controllers.fakes import tf_job
from tests.unit.controllers.test_planning import decide, gang, observed, stored


def test_the_pod_group_carries_the_jobs_labels_and_policy() -> None:
    policy = {"schedulingPolicy": {"scheduleTimeoutSeconds": 90, "minResources": {"cpu": "4"}}}
    job = stored(tf_job(runPolicy=policy))
    job.metadata.labels["app"] = "serving"
    pg, _ = gang(job)
    assert pg.metadata.labels["app"] == "serving" and pg.metadata.labels["job-name"] == job.metadata.name
    assert pg.spec.schedule_timeout_seconds == 90
    assert pg.spec.min_resources is not None and parse_quantity(pg.spec.min_resources["cpu"]) == 4
    plain, _ = gang(stored(tf_job()))
    assert plain.spec.schedule_timeout_seconds is None and plain.spec.min_resources is None


def test_a_label_patch_reaches_the_pod_group() -> None:
    job = stored(tf_job())
    pg, held = gang(job)
    job.metadata.labels["team"] = "vision"  # metadata only: the generation does not change
    out = decide(job, observed(job, pg=pg, held=held))
    new = changed_pod_group(pg, out.pod_group)
    assert new is not None and new.metadata.labels["team"] == "vision"
    assert new.spec == pg.spec and new.metadata.annotations == pg.metadata.annotations
    unchanged = decide(job, observed(job, pg=new, held=held))
    assert changed_pod_group(new, unchanged.pod_group) is None


def test_a_schedule_timeout_fails_the_job_and_deletes_the_pod_group() -> None:
    job = stored(tf_job())
    pg, _ = gang(job, phase="Pending")
    pg = PodGroup.model_validate(pg.model_dump(by_alias=True))
    pg.status.phase = "Failed"
    pg.status.reason = "ScheduleTimeout"
    pg.status.message = "not placed within scheduleTimeoutSeconds=60"
    out = decide(job, observed(job, pg=pg, held={}))
    assert out.status["phase"] == "Failed"
    failed = out.report.status.condition("Failed")
    assert failed is not None and failed.reason == "ScheduleTimeout"
    assert "scheduleTimeoutSeconds=60" in failed.message
    assert out.delete_pod_group is pg
    assert any(e.reason == "ScheduleTimeout" and e.warning for e in out.report.events)
