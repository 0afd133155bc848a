"""KubeDL-compatible job metrics: exact names, counts by kind, gauges, launch delays once per job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest

from gpuyard.controllers.metrics import job_metrics


def test_kubedl_names_counts_and_gauges() -> None:
    registry = CollectorRegistry()
    m = job_metrics(registry)
    assert job_metrics(registry) is m  # one per registry: a second reconciler shares it
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    m.created("TFJob")
    m.created("TFJob")
    m.created("PyTorchJob")
    m.transition(("a", "tf1"), "TFJob", was="Created", phase="Queuing")
    m.transition(("a", "tf2"), "TFJob", was="Created", phase="Running")
    m.transition(("a", "pt"), "PyTorchJob", was="Running", phase="Restarting")
    m.transition(("a", "pt"), "PyTorchJob", was="Restarting", phase="Failed")
    job = {"name": "tf2", "namespace": "a"}
    m.pods_running("TFJob", "uid-2", **job, created=t0, now=t0 + timedelta(seconds=3), all_pods=False)
    m.pods_running("TFJob", "uid-2", **job, created=t0, now=t0 + timedelta(seconds=9), all_pods=True)
    m.pods_running("TFJob", "uid-2", **job, created=t0, now=t0 + timedelta(seconds=99), all_pods=True)
    m.deleted(("a", "pt"), "uid-pt")
    m.deleted(("a", "never-seen"))
    text = generate_latest(registry).decode()
    assert 'kubedl_jobs_created{kind="tfjob"} 2.0' in text
    assert 'kubedl_jobs_created{kind="pytorchjob"} 1.0' in text
    assert 'kubedl_jobs_restarted{kind="pytorchjob"} 1.0' in text
    assert 'kubedl_jobs_failed{kind="pytorchjob"} 1.0' in text
    assert 'kubedl_jobs_deleted{kind="pytorchjob"} 1.0' in text
    assert "kubedl_jobs_created_total" not in text
    assert 'kubedl_jobs_running{kind="tfjob"} 1.0' in text
    assert 'kubedl_jobs_pending{kind="tfjob"} 1.0' in text
    labels = 'kind="TFJob",name="tf2",namespace="a",uid="uid-2"'  # KubeDL's labels
    assert f"kubedl_jobs_first_pod_launch_delay_seconds_count{{{labels}}} 1.0" in text
    assert f"kubedl_jobs_first_pod_launch_delay_seconds_sum{{{labels}}} 3.0" in text
    assert f"kubedl_jobs_all_pods_launch_delay_seconds_sum{{{labels}}} 9.0" in text
    assert "kubedl_jobs_successful" in text
    m.deleted(("a", "tf2"))  # the job is gone: its launch-delay series go with it
    text = generate_latest(registry).decode()
    assert 'uid="uid-2"' not in text


def test_queue_quota_and_preemption_metrics_come_from_statuses():
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuyard.apis.core import Event
    from gpuyard.apis.quotakinds import ElasticQuota, Queue
    from gpuyard.platform.cluster_metrics import register_cluster_metrics
    from gpuyard.state.context import Context

    ctx = Context.for_tests()
    ctx.store.create(
        Queue.model_validate(
            {"metadata": {"name": "team-a"}, "status": {"pending": 3, "running": 2, "share": 0.25}}
        )
    )
    ctx.store.create(
        ElasticQuota.model_validate(
            {
                "metadata": {"name": "team-a", "namespace": "default"},
                "spec": {"min": {"nvidia.com/gpu": 8}, "max": {"nvidia.com/gpu": 16}},
                "status": {"runtime": {"nvidia.com/gpu": 12}, "used": {"nvidia.com/gpu": 10}},
            }
        )
    )
    ctx.store.create(Event(metadata={"name": "e1", "namespace": "team-b"}, reason="Preempted", count=2))
    registry = CollectorRegistry()
    register_cluster_metrics(registry, ctx.store)
    text = generate_latest(registry).decode()
    assert 'gpuyard_queue_pending_jobs{queue="team-a"} 3.0' in text
    assert 'gpuyard_queue_weighted_share{queue="team-a"} 0.25' in text
    assert 'gpuyard_quota_resource{kind="runtime",quota="team-a",resource="nvidia.com/gpu"} 12.0' in text
    assert 'gpuyard_quota_resource{kind="min",quota="team-a",resource="nvidia.com/gpu"} 8.0' in text
    assert "gpuyard_preemptions 2.0" in text
