"""Tenant bindings: which quotas and queues a namespace's jobs may name (checked at the API edge).

A job names the elastic quota it is charged to with the label
`quota.scheduling.koordinator.sh/name` and its queue with `schedulingPolicy.queue`. A tenant
(a token without the admin role) may name only what an admin has bound to the job's namespace,
as Koordinator binds namespaces to an ElasticQuota and Kueue a LocalQueue to a ClusterQueue:

* **quota** `Q` is usable from namespace `N` when `Q` is `N`'s default quota (the quota the
  scheduler charges `N`'s jobs without a label: the first quota, by name, listing `N` in
  `spec.namespaces` or the annotation `quota.scheduling.koordinator.sh/namespaces`, else the one
  quota living in `N`, else `koordinator-default-quota`), when `Q` lists `N` (or `*`), or when
  the ElasticQuota `Q` lives in namespace `N`;
* **queue** `Q` is usable from `N` when `Q` is `N` itself (a namespace's implicit queue, what a
  job without `schedulingPolicy.queue` uses) or the Queue object `Q` lists `N` (or `*`) in
  `spec.namespaces`.

The same bindings hold for the labels of each role's pod template (:data:`TEMPLATE_QUOTA_LABELS`:
Koordinator's quota label, :data:`TEMPLATE_QUEUE_LABELS`: Kueue's queue label): the pods carry
their template's labels, so a tenant's pods never carry another team's quota or queue.

**Priorities** (:func:`priority_problems`): the built-in classes `system-cluster-critical` and
`system-node-critical` only for admins and jobs in `kube-system` (as Kubernetes allows them only
there); a job's queue may list the classes its jobs may use (`Queue.spec.allowedPriorityClasses`;
none listed: every other class); the spot replicas' `spotReplicaSpec.priorityClassName` is held to
the same two rules. An explicit `schedulingPolicy.priority` without a class may not
exceed 1000000000 (the highest user priority), nor, when the queue lists classes, the highest of
their values.

Anything else is a 403 whose details name the field (and the class and the queue). Admins (and
the anonymous admin of a server without tokens) may name anything. `POST /api/v1/jobs` and
`PATCH` of a job call :func:`binding_problems` for each job after authorising its namespace; any
other route that writes a job spec must do the same.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.priorityclasses import (
    BUILTIN,
    HIGHEST_USER_PRIORITY,
    PriorityClass,
    resolve_priority,
    spot_classes,
)
from gpuyard.apis.quotakinds import DEFAULT_QUOTA, LABEL_QUOTA_NAME, ROOT_QUOTA, ElasticQuota, Queue
from gpuyard.platform.api.auth import Principal
from gpuyard.state.store import Store

__all__ = [
    "ANY_NAMESPACE",
    "SYSTEM_NAMESPACE",
    "TEMPLATE_QUEUE_LABELS",
    "TEMPLATE_QUOTA_LABELS",
    "binding_problems",
    "default_quota",
    "priority_problems",
    "queue_allows",
    "quota_allows",
]

ANY_NAMESPACE = "*"
SYSTEM_NAMESPACE = "kube-system"  # where Kubernetes allows the system priority classes
TEMPLATE_QUOTA_LABELS = (LABEL_QUOTA_NAME,)
TEMPLATE_QUEUE_LABELS = ("kueue.x-k8s.io/queue-name",)


def default_quota(quotas: list[ElasticQuota], namespace: str) -> str:
    """The quota the scheduler charges a job of `namespace` that names none.

    The same rule as the scheduler's quota tree (`QuotaTree.quota_for_namespace`, then the
    default quota); a test keeps the two in step.
    """
    for quota in sorted(quotas, key=lambda q: q.metadata.name):
        if quota.metadata.name != ROOT_QUOTA and namespace in quota.covered_namespaces:
            return quota.metadata.name
    living = [
        q.metadata.name
        for q in quotas
        if q.metadata.namespace == namespace and not q.is_parent and q.metadata.name != ROOT_QUOTA
    ]
    if len(living) == 1:
        return living[0]
    return DEFAULT_QUOTA


def quota_allows(quotas: list[ElasticQuota], name: str, namespace: str) -> bool:
    """May a tenant's job in `namespace` be charged to quota `name`?"""
    if name == default_quota(quotas, namespace):
        return True
    quota = next((q for q in quotas if q.metadata.name == name), None)
    if quota is None:
        return False
    covered = quota.covered_namespaces
    return namespace in covered or ANY_NAMESPACE in covered or quota.metadata.namespace == namespace


def queue_allows(store: Store, name: str, namespace: str) -> bool:
    """May a tenant's job in `namespace` wait in queue `name`?"""
    if name == namespace:
        return True
    queue = store.get_of(Queue, "", name)
    if queue is None:
        return False
    return namespace in queue.spec.namespaces or ANY_NAMESPACE in queue.spec.namespaces


def _queue_field(job: TrainingJob) -> str:
    nested = job.spec.run_policy
    if nested is not None and nested.scheduling_policy is not None and nested.scheduling_policy.queue:
        return "spec.runPolicy.schedulingPolicy.queue"
    return "spec.schedulingPolicy.queue"


def _usable_quotas(quotas: list[ElasticQuota], namespace: str) -> list[str]:
    names = {default_quota(quotas, namespace)}
    names.update(q.metadata.name for q in quotas if quota_allows(quotas, q.metadata.name, namespace))
    return sorted(names)


def _usable_queues(store: Store, namespace: str) -> list[str]:
    names = {namespace}
    for queue in store.list_of(Queue):
        if namespace in queue.spec.namespaces or ANY_NAMESPACE in queue.spec.namespaces:
            names.add(queue.metadata.name)
    return sorted(names)


def _template_labels(job: TrainingJob) -> list[tuple[str, str, str]]:
    """(field, label, value) of the quota and queue labels of each role's pod template."""
    out = []
    for role in job.roles():
        labels = job.replica_specs[role].template.metadata.get("labels")
        if not isinstance(labels, dict):
            continue
        for label in (*TEMPLATE_QUOTA_LABELS, *TEMPLATE_QUEUE_LABELS):
            value = labels.get(label)
            if isinstance(value, str) and value.strip():
                field = f"spec.{job.info.replica_field}.{role}.template.metadata.labels.{label}"
                out.append((field, label, value.strip()))
    return out


def binding_problems(
    store: Store, who: Principal, job: TrainingJob, *, prefix: str = ""
) -> list[dict[str, str]]:
    """403 details for the quotas and queues `job` names (its labels, its queue, its pod templates'
    labels) that its namespace may not use (none for admins)."""
    if who.role == "admin":
        return []
    namespace = job.metadata.namespace
    problems: list[dict[str, str]] = []
    quotas = store.list_of(ElasticQuota)
    named = job.metadata.labels.get(LABEL_QUOTA_NAME, "").strip()
    if named and not quota_allows(quotas, named, namespace):
        problems.append(
            {
                "field": f"{prefix}metadata.labels.{LABEL_QUOTA_NAME}",
                "reason": f"quota {named!r} is not bound to namespace {namespace}; "
                f"allowed: {', '.join(_usable_quotas(quotas, namespace))} "
                "(an admin binds a quota by listing the namespace in its spec.namespaces)",
            }
        )
    queue = job.queue
    if not queue_allows(store, queue, namespace):
        problems.append(
            {
                "field": f"{prefix}{_queue_field(job)}",
                "reason": f"queue {queue!r} is not bound to namespace {namespace}; "
                f"allowed: {', '.join(_usable_queues(store, namespace))} "
                "(an admin binds a queue by listing the namespace in its spec.namespaces)",
            }
        )
    for field, label, value in _template_labels(job):
        if label in TEMPLATE_QUOTA_LABELS and not quota_allows(quotas, value, namespace):
            allowed = ", ".join(_usable_quotas(quotas, namespace))
            what = f"quota {value!r}"
        elif label in TEMPLATE_QUEUE_LABELS and not queue_allows(store, value, namespace):
            allowed = ", ".join(_usable_queues(store, namespace))
            what = f"queue {value!r}"
        else:
            continue
        problems.append(
            {
                "field": f"{prefix}{field}",
                "reason": f"the pod template's label {label} names {what}, which is not bound to "
                f"namespace {namespace}; allowed: {allowed} (pods carry their template's labels)",
            }
        )
    return problems


def _priority_field(job: TrainingJob) -> str:
    nested = job.spec.run_policy is not None and job.spec.run_policy.scheduling_policy is not None
    return f"{'spec.runPolicy' if nested else 'spec'}.schedulingPolicy.priority"


def priority_problems(
    store: Store, who: Principal, job: TrainingJob, classes: Iterable[PriorityClass], *, prefix: str = ""
) -> list[dict[str, str]]:
    """403 details for a priority `job` may not use (module docstring; none for admins)."""
    if who.role == "admin":
        return []
    namespace = job.metadata.namespace
    queue_name = job.queue
    queue = store.get_of(Queue, "", queue_name)
    allowed = list(queue.spec.allowed_priority_classes or []) if queue is not None else []
    where = f"queue {queue_name}" + ("" if queue is not None else " (implicit: no Queue object)")
    known = {**BUILTIN, **{c.metadata.name: c for c in classes}}

    def refusal(name: str, field: str) -> list[dict[str, str]]:
        """Why a tenant's job may not name class `name` in `field` (none: it may)."""
        if name in BUILTIN and namespace != SYSTEM_NAMESPACE and name not in allowed:
            reason = (
                f"PriorityClass {name!r} is a system class: only admins and jobs in "
                f"{SYSTEM_NAMESPACE} may use it ({where}, namespace {namespace})"
            )
        elif allowed and name not in allowed:
            reason = (
                f"PriorityClass {name!r} is not allowed in {where}; allowed: "
                f"{', '.join(allowed)} (Queue spec.allowedPriorityClasses)"
            )
        else:
            return []
        return [{"field": f"{prefix}{field}", "reason": reason}]

    for spot_class, field in spot_classes(job):  # the spot replicas' class is held to the same rules
        if refused := refusal(spot_class, field):
            return refused
    resolved = resolve_priority(job, known.values())
    name = resolved.class_name if resolved.field else None  # the class the job names itself
    if name is not None:
        return refusal(name, resolved.field)
    sched = job.run_policy.scheduling_policy
    explicit = sched.priority if sched is not None else None
    if explicit is None:
        return []
    ceiling = HIGHEST_USER_PRIORITY
    values = [known[c].value for c in allowed if c in known]
    if allowed and values:
        ceiling = min(ceiling, max(values)) if all(c not in BUILTIN for c in allowed) else max(values)
    if explicit > ceiling:
        return [
            {
                "field": f"{prefix}{_priority_field(job)}",
                "reason": f"priority {explicit} is above {ceiling}, the highest a job of {where} may ask "
                "for (higher ones are the system classes'; an admin lists classes in the Queue's "
                "spec.allowedPriorityClasses)",
            }
        ]
    return []
