"""`deep_copy`: a copy of a model that shares nothing mutable with the original."""

from __future__ import annotations

from decimal import Decimal

from gpuyard.apis.core import Pod
from gpuyard.apis.jobs import parse_job
from gpuyard.apis.meta import deep_copy
from tests.builders import make_node, make_pod


def test_a_copy_equals_the_original_and_shares_nothing_mutable() -> None:
    pod = make_pod("a")
    pod.metadata.labels["x"] = "1"
    copy = deep_copy(pod)
    assert copy == pod and copy.model_dump() == pod.model_dump() and type(copy) is Pod
    copy.metadata.labels["x"] = "2"
    copy.spec.containers[0].env.append(
        copy.spec.containers[0].env[0] if copy.spec.containers[0].env else None
    )  # type: ignore[arg-type]
    copy.spec.containers[0].resources.requests["cpu"] = Decimal(7)
    assert pod.metadata.labels["x"] == "1"
    assert pod.spec.containers[0].resources.requests.get("cpu") != Decimal(7)
    assert len(pod.spec.containers[0].env) != len(copy.spec.containers[0].env)


def test_fields_set_and_unknown_fields_are_kept() -> None:
    node = make_node("n1")
    raw = node.model_dump(by_alias=True)
    raw["spec"]["podCIDR"] = "10.0.0.0/24"  # not modelled: kept as an extra field
    node = type(node).model_validate(raw)
    copy = node.clone()
    assert copy.spec.model_extra == {"podCIDR": "10.0.0.0/24"}
    assert copy.model_fields_set == node.model_fields_set
    assert copy.model_dump(by_alias=True, exclude_unset=True) == node.model_dump(
        by_alias=True, exclude_unset=True
    )
    copy.spec.model_extra["podCIDR"] = "changed"  # type: ignore[index]
    assert node.spec.model_extra == {"podCIDR": "10.0.0.0/24"}


def test_a_job_status_copy_is_independent() -> None:
    job = parse_job(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "j", "namespace": "default"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {
                        "replicas": 1,
                        "template": {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}},
                    }
                }
            },
        }
    )
    status = deep_copy(job.status)
    status.phase = "Running"
    status.conditions.append(status.conditions[0] if status.conditions else None)  # type: ignore[arg-type]
    assert job.status.phase != "Running" and len(job.status.conditions) != len(status.conditions)
