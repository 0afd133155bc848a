"""Per-role `minAvailable` in every job kind: parsed, checked against `replicas`, and carried into
the PodGroup role the scheduler places."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.apis.jobs import JobValidationError, parse_job
from gpuyard.controllers.podgroups import build_pod_group
from gpuyard.controllers.workloads.registry import plugin_for

KINDS = [
    ("kubeflow.org/v1", "TFJob", "tfReplicaSpecs", "Worker"),
    ("kubeflow.org/v1", "PyTorchJob", "pytorchReplicaSpecs", "Worker"),
    ("kubeflow.org/v1", "XGBoostJob", "xgbReplicaSpecs", "Worker"),
    ("kubeflow.org/v1", "MPIJob", "mpiReplicaSpecs", "Worker"),
    ("kubeflow.org/v1", "JAXJob", "jaxReplicaSpecs", "Worker"),
    ("kubeflow.org/v1", "PaddleJob", "paddleReplicaSpecs", "Worker"),
    ("training.kubedl.io/v1alpha1", "TFJob", "tfReplicaSpecs", "Worker"),
    ("training.kubedl.io/v1alpha1", "MarsJob", "marsReplicaSpecs", "Worker"),
]


def job_doc(
    api: str, kind: str, field: str, role: str, *, replicas: int, minimum: int | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "template": {"spec": {"containers": [{"name": "main", "image": "train"}]}},
    }
    if minimum is not None:
        spec["minAvailable"] = minimum
    specs = {role: spec}
    if kind == "MPIJob":
        specs["Launcher"] = {
            "replicas": 1,
            "template": {"spec": {"containers": [{"name": "main", "image": "train"}]}},
        }
    if kind == "MarsJob":
        specs["Scheduler"] = {
            "replicas": 1,
            "template": {"spec": {"containers": [{"name": "main", "image": "m"}]}},
        }
        specs["WebService"] = {
            "replicas": 1,
            "template": {"spec": {"containers": [{"name": "main", "image": "m"}]}},
        }
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": "j", "namespace": "default"},
        "spec": {field: specs},
    }


@pytest.mark.parametrize(("api", "kind", "field", "role"), KINDS)
def test_the_role_minimum_reaches_the_pod_group(api: str, kind: str, field: str, role: str) -> None:
    job = parse_job(job_doc(api, kind, field, role, replicas=4, minimum=2))
    pg = build_pod_group(job, plugin_for(job.kind))
    [worker] = [r for r in pg.spec.roles if r.name == role]
    assert (worker.replicas, worker.min_available, worker.minimum) == (4, 2, 2)


@pytest.mark.parametrize(("api", "kind", "field", "role"), KINDS[:2])
def test_without_it_every_replica_is_required(api: str, kind: str, field: str, role: str) -> None:
    job = parse_job(job_doc(api, kind, field, role, replicas=4, minimum=None))
    pg = build_pod_group(job, plugin_for(job.kind))
    [worker] = [r for r in pg.spec.roles if r.name == role]
    assert worker.minimum == 4


def test_a_minimum_above_replicas_names_the_field_and_the_allowed_range() -> None:
    with pytest.raises(JobValidationError) as info:
        parse_job(job_doc("kubeflow.org/v1", "TFJob", "tfReplicaSpecs", "Worker", replicas=4, minimum=5))
    [detail] = info.value.details
    assert detail["field"] == "spec.tfReplicaSpecs.Worker"
    assert "minAvailable (5) must not exceed replicas (4)" in detail["reason"]
    assert "0..4" in detail["reason"]


def test_a_negative_minimum_is_refused() -> None:
    with pytest.raises(JobValidationError) as info:
        parse_job(job_doc("kubeflow.org/v1", "TFJob", "tfReplicaSpecs", "Worker", replicas=4, minimum=-1))
    assert any("minAvailable" in d["field"] for d in info.value.details)
