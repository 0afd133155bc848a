"""The pure verdict over a job's pods: deadline, failure, success, backoff, restarts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuyard.apis.core import Pod
from gpuyard.apis.jobspecs import JobStatus, PodRestart
from gpuyard.apis.meta import ObjectMeta
from gpuyard.controllers.judging import Replica, judge
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.fakecluster.kubelet import terminate
from tests.unit.controllers.fakes import job_from, load_job

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def pod(
    name: str, phase: str = "Running", exit_code: int | None = None, reason: str | None = None, uid: str = ""
) -> Pod:
    p = Pod(metadata=ObjectMeta(name=name, uid=uid or f"uid-{name}"))
    p.spec.containers = []
    if phase in ("Succeeded", "Failed"):
        terminate(p, exit_code=exit_code, reason=reason, message=None, now=NOW)
    else:
        p.status.phase = phase  # type: ignore[assignment]
    return p


def replicas(job, pods: dict[str, Pod]) -> list[Replica]:  # type: ignore[no-untyped-def]
    out = []
    for role in job.roles():
        for i in range(job.replica_specs[role].count):
            name = f"{job.metadata.name}-{role.lower()}-{i}"
            out.append(Replica(role, i, name, pods.get(name)))
    return out


def test_running_job_goes_on() -> None:
    job = load_job("tf-dist-mnist")
    reps = replicas(job, {f"dist-mnist-for-e2e-test-worker-{i}": pod(f"w{i}") for i in range(4)})
    verdict = judge(job, plugin_for("TFJob"), JobStatus(), reps, NOW)
    assert verdict.terminal is None and verdict.restarts == []


def test_failure_outranks_success_in_the_same_pass() -> None:
    job = load_job("tf-dist-mnist")  # Kubeflow TF: restartPolicy Never
    pods = {
        "dist-mnist-for-e2e-test-worker-0": pod("w0", "Succeeded", 0),
        "dist-mnist-for-e2e-test-ps-1": pod("p1", "Failed", 1),
    }
    verdict = judge(job, plugin_for("TFJob"), JobStatus(), replicas(job, pods), NOW)
    assert verdict.terminal == (
        "Failed",
        "TFJobFailed",
        "TFJob dist-mnist-for-e2e-test is failed because 1 PS replica(s) failed.",
    )


def test_deadline_first() -> None:
    job = load_job("tf-dist-mnist")
    job.spec.active_deadline_seconds = 10
    status = JobStatus(start_time=NOW - timedelta(seconds=11))
    verdict = judge(job, plugin_for("TFJob"), status, replicas(job, {}), NOW)
    assert verdict.terminal is not None and verdict.terminal[1] == "DeadlineExceeded"


def test_backoff_counts_only_uncounted_restarts() -> None:
    job = load_job("tf-mnist-hostnetwork")  # workers ExitCode, backoffLimit 3
    failed = pod("w1", "Failed", 137, uid="u1")
    reps = replicas(job, {"mnist-worker-1": failed})
    status = JobStatus(restarts=3, pod_restarts={"mnist-worker-1": PodRestart(count=1, last_uid="u1")})
    verdict = judge(job, plugin_for("TFJob"), status, reps, NOW)
    assert verdict.terminal is None and [r.name for r, _ in verdict.restarts] == ["mnist-worker-1"]
    status.pod_restarts["mnist-worker-1"].last_uid = "older"
    verdict = judge(job, plugin_for("TFJob"), status, reps, NOW)
    assert verdict.terminal is not None and verdict.terminal[1] == "BackoffLimitExceeded"


def test_mars_scheduler_failure_is_fatal_whatever_its_policy() -> None:
    doc = {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "MarsJob",
        "metadata": {"name": "m"},
        "spec": {
            "marsReplicaSpecs": {
                "Scheduler": {
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [{"name": "mars", "image": "mars"}]}},
                }
            }
        },
    }
    job = job_from(doc)
    verdict = judge(
        job,
        plugin_for("MarsJob"),
        JobStatus(),
        replicas(job, {"m-scheduler-0": pod("s", "Failed", 137)}),
        NOW,
    )
    assert verdict.terminal is not None and verdict.terminal[0] == "Failed"
