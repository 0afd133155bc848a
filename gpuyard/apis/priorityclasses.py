"""PriorityClass (`scheduling.k8s.io/v1`): a named priority value, as Kubernetes defines it.

Users apply PriorityClass objects (`gpuyard apply`, `POST /api/v1/apply`); the job operator
resolves a job's priority through them into `PodGroup.spec.priority`, which the scheduler's
queues and preemption read. The priority class a job names is, first found:

1. `runPolicy.schedulingPolicy.priorityClass` (Kubeflow) / `schedulingPolicy.priorityClassName`
   (KubeDL, inline run policy);
2. the `priorityClassName` of the job's pod templates (first role in the kind's order that
   names one).

Without a named class, the class with `globalDefault: true` applies (the one with the highest
value when several do, as Kubernetes admits one only); without one, the job's explicit
`schedulingPolicy.priority` (or 0). The built-in `system-cluster-critical` (2000000000) and
`system-node-critical` (2000001000) always exist (:data:`BUILTIN`); user classes are limited to
values <= 1000000000 and may not use the `system-` prefix (Kubernetes' rules).

A job that names a class that does not exist is refused at submit (`unknown_class_problems`;
the spot replicas' `spotReplicaSpec.priorityClassName` is checked the same way);
one whose class disappears, or that was stored before its class existed (a restart, kubectl),
waits Queuing with a condition naming the missing class until the class is created (Kubernetes
refuses such pods outright; waiting is kinder: applying the class is enough to go on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.meta import ObjectMeta, Resource

__all__ = [
    "BUILTIN",
    "HIGHEST_USER_PRIORITY",
    "PRIORITY_CLASS_KINDS",
    "PriorityClass",
    "ResolvedPriority",
    "class_problems",
    "missing_spot_class",
    "named_class",
    "resolve_priority",
    "spot_classes",
    "unknown_class_problems",
]

API_VERSION = "scheduling.k8s.io/v1"
HIGHEST_USER_PRIORITY = 1_000_000_000
"""Kubernetes' `HighestUserDefinablePriority`: user classes may not be above it."""
SYSTEM_CRITICAL = 2_000_000_000
PreemptionPolicy = Literal["PreemptLowerPriority", "Never"]


class PriorityClass(Resource):
    """A cluster-scoped priority value (fields at the top level, as in Kubernetes)."""

    KIND = "PriorityClass"
    API_VERSION = API_VERSION
    NAMESPACED = False

    value: int = Field(ge=-2_147_483_648, le=SYSTEM_CRITICAL + 1000)
    global_default: bool = False
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    description: str = ""


PRIORITY_CLASS_KINDS: list[type[Resource]] = [PriorityClass]


def _builtin(name: str, value: int, description: str) -> PriorityClass:
    return PriorityClass(
        api_version=API_VERSION,
        kind="PriorityClass",
        metadata=ObjectMeta(name=name),
        value=value,
        description=description,
    )


BUILTIN: dict[str, PriorityClass] = {
    "system-cluster-critical": _builtin(
        "system-cluster-critical",
        SYSTEM_CRITICAL,
        "Used for system critical pods that must run in the cluster.",
    ),
    "system-node-critical": _builtin(
        "system-node-critical",
        SYSTEM_CRITICAL + 1000,
        "Used for system critical pods that must not be moved.",
    ),
}


def class_problems(doc: Mapping[str, Any]) -> tuple[PriorityClass | None, list[tuple[str, str]]]:
    """Validate a PriorityClass document: (the object, []) or (None, [(field, reason), ...])."""
    data = {k: v for k, v in doc.items() if k != "status"}
    data.setdefault("apiVersion", API_VERSION)
    try:
        obj = PriorityClass.model_validate(data)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "<root>"
            reason = err["msg"].removeprefix("Value error, ")
            if field == "preemptionPolicy":
                reason = "allowed: PreemptLowerPriority, Never"
            out.append((field, reason))
        return None, out
    name = obj.metadata.name
    problems: list[tuple[str, str]] = []
    if not name:
        problems.append(("metadata.name", "required"))
    elif name.startswith("system-"):
        problems.append(("metadata.name", "the prefix 'system-' is reserved for the built-in classes"))
    if obj.value > HIGHEST_USER_PRIORITY:
        problems.append(
            (
                "value",
                f"{obj.value} is above the highest user priority; allowed: at most {HIGHEST_USER_PRIORITY}",
            )
        )
    return (None if problems else obj), problems


def named_class(job: TrainingJob) -> tuple[str | None, str]:
    """The priority class `job` names and the field that names it ((None, "") for none)."""
    sched = job.run_policy.scheduling_policy
    nested = job.spec.run_policy is not None and job.spec.run_policy.scheduling_policy is not None
    base = "spec.runPolicy.schedulingPolicy" if nested else "spec.schedulingPolicy"
    if sched is not None:
        if sched.priority_class:
            return sched.priority_class, f"{base}.priorityClass"
        if sched.priority_class_name:
            return sched.priority_class_name, f"{base}.priorityClassName"
    field = job.REPLICA_FIELD
    for role in job.roles():
        name = job.replica_specs[role].template.spec.priority_class_name
        if name:
            alias = type(job.spec).model_fields[field].alias or field
            return name, f"spec.{alias}.{role}.template.spec.priorityClassName"
    return None, ""


@dataclass(frozen=True, slots=True)
class ResolvedPriority:
    """A job's priority: its value and class, or the class it names that is missing."""

    value: int = 0
    class_name: str | None = None
    missing: str | None = None  # the class named but not found
    field: str = ""  # where the job names it


def _all_classes(classes: Iterable[PriorityClass]) -> dict[str, PriorityClass]:
    out = dict(BUILTIN)
    out.update({c.metadata.name: c for c in classes})
    return out


def resolve_priority(job: TrainingJob, classes: Iterable[PriorityClass]) -> ResolvedPriority:
    """`job`'s priority through the PriorityClass objects (see the module docstring)."""
    known = _all_classes(classes)
    name, field = named_class(job)
    sched = job.run_policy.scheduling_policy
    explicit = sched.priority if sched is not None else None
    if name is not None:
        found = known.get(name)
        if found is None:
            return ResolvedPriority(value=explicit or 0, class_name=name, missing=name, field=field)
        return ResolvedPriority(value=found.value, class_name=name, field=field)
    if explicit is not None:
        return ResolvedPriority(value=explicit)
    defaults = [c for c in known.values() if c.global_default]
    if defaults:
        best = max(defaults, key=lambda c: (c.value, c.metadata.name))
        return ResolvedPriority(value=best.value, class_name=best.metadata.name)
    return ResolvedPriority()


def spot_classes(job: TrainingJob) -> list[tuple[str, str]]:
    """The priority classes `job`'s spot replicas name (`spotReplicaSpec.priorityClassName`), each
    with its field, in role order."""
    alias = type(job.spec).model_fields[job.REPLICA_FIELD].alias or job.REPLICA_FIELD
    out = []
    for role in job.roles():
        spot = job.replica_specs[role].spot_replica_spec
        if spot is not None and spot.priority_class_name:
            out.append((spot.priority_class_name, f"spec.{alias}.{role}.spotReplicaSpec.priorityClassName"))
    return out


def missing_spot_class(job: TrainingJob, classes: Iterable[PriorityClass]) -> tuple[str, str] | None:
    """The first `spotReplicaSpec.priorityClassName` of `job` that names no PriorityClass, and
    its field; None when every spot class exists (or none is named)."""
    named = spot_classes(job)
    if not named:
        return None
    known = _all_classes(classes)
    return next(((name, field) for name, field in named if name not in known), None)


def unknown_class_problems(job: TrainingJob, classes: Iterable[PriorityClass]) -> list[dict[str, str]]:
    """A 422 detail when `job` names a PriorityClass that does not exist ([] otherwise); the
    classes of its spot replicas (`spotReplicaSpec.priorityClassName`) are checked too."""
    classes = list(classes)
    resolved = resolve_priority(job, classes)
    missing = (resolved.missing, resolved.field) if resolved.missing is not None else None
    missing = missing or missing_spot_class(job, classes)
    if missing is None:
        return []
    known = sorted(_all_classes(classes))
    return [
        {
            "field": missing[1],
            "reason": f"PriorityClass {missing[0]!r} does not exist; known: {', '.join(known)}",
        }
    ]
