"""JSON merge patch (RFC 7386) and which job fields a patch may change."""

from __future__ import annotations

from gpuyard.apis.jobpatches import merge_patch, patch_problems

JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "a", "namespace": "n", "labels": {"x": "1"}, "resourceVersion": "7", "uid": "u"},
    "spec": {
        "runPolicy": {"cleanPodPolicy": "None"},
        "pytorchReplicaSpecs": {
            "Worker": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c"}]}}}
        },
    },
}


def fields(patch: dict[str, object]) -> list[str]:
    return [p["field"] for p in patch_problems(JOB, merge_patch(JOB, patch))]


def test_rfc7386_examples() -> None:
    assert merge_patch({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge_patch({"a": "b"}, {"a": None}) == {}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert merge_patch([1, 2], {"a": "b", "c": None}) == {"a": "b"}
    assert merge_patch({"a": "foo"}, "bar") == "bar"


def test_mutable_fields_pass() -> None:
    assert fields({"metadata": {"labels": {"y": "2", "x": None}, "annotations": {"k": "v"}}}) == []
    assert (
        fields(
            {
                "spec": {
                    "runPolicy": {"suspend": True, "schedulingPolicy": {"queue": "q", "priorityClass": "p"}}
                }
            }
        )
        == []
    )
    assert (
        fields({"spec": {"suspend": True, "schedulingPolicy": {"priority": 3, "priorityClassName": "p"}}})
        == []
    )
    assert (
        fields(
            {
                "metadata": {"resourceVersion": "7"},
                "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}},
            }
        )
        == []
    )


def test_immutable_fields_are_named() -> None:
    assert fields({"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}}) == [
        "spec.pytorchReplicaSpecs.Worker.replicas"
    ]
    assert fields({"spec": {"runPolicy": {"cleanPodPolicy": "All"}}}) == ["spec.runPolicy.cleanPodPolicy"]
    assert fields({"spec": {"runPolicy": {"schedulingPolicy": {"minAvailable": 1, "queue": "q"}}}}) == [
        "spec.runPolicy.schedulingPolicy.minAvailable"
    ]
    assert fields({"metadata": {"name": "b"}, "kind": "TFJob"}) == ["kind", "metadata.name"]
    assert fields({"status": {"phase": "Running"}}) == ["status"]
    assert fields({"spec": {"runPolicy": None}}) == ["spec.runPolicy.cleanPodPolicy"]
