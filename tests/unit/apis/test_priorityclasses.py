"""Resolving a job's priority through PriorityClass objects, and validating classes."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.jobs import parse_job
from gpuyard.apis.priorityclasses import PriorityClass, class_problems, resolve_priority


def job(
    *, policy: dict[str, Any] | None = None, template_class: str | None = None, kubedl: bool = False
) -> Any:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if template_class:
        spec["priorityClassName"] = template_class
    doc: dict[str, Any] = {
        "apiVersion": "training.kubedl.io/v1alpha1" if kubedl else "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "n"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": spec}}}},
    }
    if policy is not None:
        if kubedl:
            doc["spec"]["schedulingPolicy"] = policy
        else:
            doc["spec"]["runPolicy"] = {"schedulingPolicy": policy}
    return parse_job(doc)


def cls(name: str, value: int, *, default: bool = False) -> PriorityClass:
    obj, problems = class_problems(
        {"kind": "PriorityClass", "metadata": {"name": name}, "value": value, "globalDefault": default}
    )
    assert obj is not None, problems
    return obj


def test_named_class_then_template_then_default_then_explicit() -> None:
    classes = [cls("high", 100), cls("low", 1), cls("base", 10, default=True)]
    r = resolve_priority(job(policy={"priorityClass": "high"}, template_class="low"), classes)
    assert (r.value, r.class_name, r.missing) == (100, "high", None)
    r = resolve_priority(job(policy={"priorityClassName": "low"}, kubedl=True), classes)
    assert (r.value, r.field) == (1, "spec.schedulingPolicy.priorityClassName")
    r = resolve_priority(job(template_class="low"), classes)
    assert (r.value, r.field) == (1, "spec.pytorchReplicaSpecs.Worker.template.spec.priorityClassName")
    assert resolve_priority(job(), classes).value == 10
    assert resolve_priority(job(policy={"priority": 5}), classes).value == 5
    assert resolve_priority(job(), []).value == 0
    assert resolve_priority(job(policy={"priorityClass": "system-node-critical"}), []).value == 2_000_001_000


def test_missing_class_is_reported_with_its_field() -> None:
    r = resolve_priority(job(policy={"priorityClass": "gold"}), [])
    assert (r.missing, r.field) == ("gold", "spec.runPolicy.schedulingPolicy.priorityClass")


def test_class_rules() -> None:
    assert class_problems({"metadata": {"name": "x"}, "value": 1_000_000_001})[1][0][0] == "value"
    assert class_problems({"metadata": {"name": "system-x"}, "value": 1})[1][0][0] == "metadata.name"
    assert class_problems({"metadata": {"name": "x"}, "value": 1, "preemptionPolicy": "Maybe"})[1] == [
        ("preemptionPolicy", "allowed: PreemptLowerPriority, Never")
    ]
    assert class_problems({"metadata": {"name": "x"}})[1][0][0] == "value"
    assert class_problems({"metadata": {"name": "x"}, "value": -5, "preemptionPolicy": "Never"})[1] == []


def test_offline_validate_checks_priority_classes() -> None:
    from gpuyard.cli.validate import validate_documents

    good = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "hi"},
        "value": 5,
    }
    bad = {**good, "metadata": {"name": "system-hi"}}
    checked = validate_documents([("classes.yaml", [good, bad])])
    assert checked.problems == [
        "classes.yaml: documents[1]: metadata.name: the prefix 'system-' is reserved for the built-in classes"
    ]
