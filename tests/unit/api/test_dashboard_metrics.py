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
    m.pods_running("TFJob", "uid-2", created=t0, now=t0 + timedelta(seconds=3), all_pods=False)
    m.pods_running("TFJob", "uid-2", created=t0, now=t0 + timedelta(seconds=9), all_pods=True)
    m.pods_running("TFJob", "uid-2", created=t0, now=t0 + timedelta(seconds=99), all_pods=True)
    m.deleted(("a", "pt"), "uid-pt")
    m.deleted(("a", "never-seen"))
    text = generate_latest(registry).decode()
    assert 'kubedl_jobs_created{kind="TFJob"} 2.0' in text
    assert 'kubedl_jobs_created{kind="PyTorchJob"} 1.0' in text
    assert 'kubedl_jobs_restarted{kind="PyTorchJob"} 1.0' in text
    assert 'kubedl_jobs_failed{kind="PyTorchJob"} 1.0' in text
    assert 'kubedl_jobs_deleted{kind="PyTorchJob"} 1.0' in text
    assert "kubedl_jobs_created_total" not in text
    assert 'kubedl_jobs_running{kind="TFJob"} 1.0' in text
    assert 'kubedl_jobs_pending{kind="TFJob"} 1.0' in text
    assert 'kubedl_jobs_first_pod_launch_delay_seconds_count{kind="TFJob"} 1.0' in text
    assert 'kubedl_jobs_first_pod_launch_delay_seconds_sum{kind="TFJob"} 3.0' in text
    assert 'kubedl_jobs_all_pods_launch_delay_seconds_sum{kind="TFJob"} 9.0' in text
    assert "kubedl_jobs_successful" in text
