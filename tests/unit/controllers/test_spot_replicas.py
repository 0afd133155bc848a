"""KubeDL's spotReplicaSpec: the last N replicas of a role get the spot class and labels, and
their interruption (lost capacity, not a workload failure) is not counted against backoffLimit."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.apis.core import Pod
from gpuyard.apis.jobs import JobValidationError, parse_job
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.priorityclasses import PriorityClass, class_problems, unknown_class_problems
from gpuyard.controllers.judging import Replica, spot_interrupted
from gpuyard.controllers.materializing import build_pod
from gpuyard.controllers.podgroups import pod_group_spec
from gpuyard.controllers.restarting import ending_of
from gpuyard.controllers.workloads.registry import plugin_for
from tests.unit.controllers.fakes import reserve

SPOT_LABELS = {"capacity": "spot", "team.example.com/tier": "cheap"}


def spot_job(*, replicas: int = 4, number: Any = 2, labels: Any = None, cls: str | None = "spot") -> Any:
    spot: dict[str, Any] = {"spotReplicaNumber": number, "labels": SPOT_LABELS if labels is None else labels}
    if cls is not None:
        spot["priorityClassName"] = cls
    template = {
        "metadata": {"labels": {"app": "train"}},
        "spec": {
            "priorityClassName": "normal",
            "containers": [{"name": "pytorch", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
        },
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "sp", "namespace": "ns"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template},
                "Worker": {"replicas": replicas, "template": template, "spotReplicaSpec": spot},
            }
        },
    }


def test_exactly_the_last_n_replicas_get_the_spot_class_and_labels() -> None:
    job = parse_job(spot_job(replicas=4, number=2))
    plugin = plugin_for("PyTorchJob")
    res = reserve(job)
    pods = {
        i: build_pod(job, "Worker", i, plugin=plugin, reservation=res[f"sp-worker-{i}"]) for i in range(4)
    }
    for i in (0, 1):
        assert pods[i].spec.priority_class_name == "normal"
        assert not set(SPOT_LABELS) & set(pods[i].metadata.labels)
    for i in (2, 3):
        assert pods[i].spec.priority_class_name == "spot"
        assert pods[i].metadata.labels.items() >= SPOT_LABELS.items()
        assert pods[i].metadata.labels["app"] == "train"  # the template's labels are kept
        assert pods[i].metadata.labels["replica-index"] == str(i)
    master = build_pod(job, "Master", 0, plugin=plugin, reservation=res["sp-master-0"])
    assert master.spec.priority_class_name == "normal"  # another role's spec is its own
    roles = {r.name: r.spot_replicas for r in pod_group_spec(job, plugin).roles}
    assert roles == {"Master": 0, "Worker": 2}


def test_a_spot_spec_without_a_class_clears_the_templates_as_kubedl_does() -> None:
    job = parse_job(spot_job(replicas=2, number=1, cls=None))
    res = reserve(job)
    last = build_pod(job, "Worker", 1, plugin=plugin_for("PyTorchJob"), reservation=res["sp-worker-1"])
    assert last.spec.priority_class_name is None
    assert last.metadata.labels["capacity"] == "spot"


def test_all_replicas_may_be_spot_and_zero_means_none() -> None:
    job = parse_job(spot_job(replicas=3, number=3))
    assert [job.replica_specs["Worker"].is_spot(i) for i in range(3)] == [True, True, True]
    job = parse_job(spot_job(replicas=3, number=0))
    assert [job.replica_specs["Worker"].is_spot(i) for i in range(3)] == [False, False, False]


@pytest.mark.parametrize(
    ("number", "labels", "field", "reason"),
    [
        (5, None, "spec.pytorchReplicaSpecs.Worker.spotReplicaSpec.spotReplicaNumber", "allowed: 0..4"),
        (-1, None, "spotReplicaSpec.spotReplicaNumber", "greater than or equal to 0"),
        ("two", None, "spotReplicaSpec.spotReplicaNumber", "integer"),
        (1, {"bad key!": "x"}, "spec.pytorchReplicaSpecs.Worker.spotReplicaSpec.labels.bad key!", "key"),
    ],
)
def test_bad_spot_specs_are_refused_naming_the_field(
    number: Any, labels: Any, field: str, reason: str
) -> None:
    with pytest.raises(JobValidationError) as info:
        parse_job(spot_job(replicas=4, number=number, labels=labels))
    details = info.value.details
    assert any(field in d["field"] and reason in d["reason"] for d in details), details


def _cls(name: str, value: int) -> PriorityClass:
    obj, problems = class_problems({"kind": "PriorityClass", "metadata": {"name": name}, "value": value})
    assert obj is not None, problems
    return obj


def test_an_unknown_spot_class_is_refused_naming_the_field() -> None:
    job = parse_job(spot_job())
    problems = unknown_class_problems(job, [_cls("normal", 100)])
    assert problems == [
        {
            "field": "spec.pytorchReplicaSpecs.Worker.spotReplicaSpec.priorityClassName",
            "reason": "PriorityClass 'spot' does not exist; known: normal, system-cluster-critical, "
            "system-node-critical",
        }
    ]
    assert unknown_class_problems(job, [_cls("normal", 100), _cls("spot", 1)]) == []


def _failed(name: str, *, reason: str | None = None) -> Pod:
    p = Pod(metadata=ObjectMeta(name=name, uid=f"uid-{name}"))
    p.status.phase = "Failed"
    p.status.reason = reason
    return p


def test_only_a_spot_replica_or_a_pod_on_a_spot_node_failing_for_lost_capacity_is_free() -> None:
    job = parse_job(spot_job(replicas=4, number=2))

    def free(index: int, pod: Pod, *, on_spot_node: bool = False) -> bool:
        rep = Replica("Worker", index, f"sp-worker-{index}", pod, on_spot_node=on_spot_node)
        return spot_interrupted(job, rep, ending_of(pod))

    assert free(3, _failed("a", reason="NodeLost")) and free(2, _failed("b", reason="Evicted"))
    assert not free(1, _failed("c", reason="NodeLost"))  # an on-demand replica counts
    assert free(1, _failed("d", reason="NodeLost"), on_spot_node=True)  # ... unless it ran on spot
    assert not free(3, _failed("e", reason="OOMKilled"))  # the workload's own failure counts
    preempted = _failed("f")
    preempted.status.conditions = [{"type": "DisruptionTarget", "status": "True"}]
    assert free(3, preempted) and not free(0, preempted)
