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

Anything else is a 403 whose details name the field. Admins (and the anonymous admin of a server
without tokens) may name anything. `POST /api/v1/jobs` calls :func:`binding_problems` for each
job after authorising its namespace; any other route that writes a job spec must do the same.
"""

from __future__ import annotations

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.quotakinds import DEFAULT_QUOTA, LABEL_QUOTA_NAME, ROOT_QUOTA, ElasticQuota, Queue
from gpuyard.platform.api.auth import Principal
from gpuyard.state.store import Store

__all__ = ["ANY_NAMESPACE", "binding_problems", "default_quota", "queue_allows", "quota_allows"]

ANY_NAMESPACE = "*"


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


def binding_problems(
    store: Store, who: Principal, job: TrainingJob, *, prefix: str = ""
) -> list[dict[str, str]]:
    """403 details for the quota and queue `job` names that its namespace may not use (none for admins)."""
    if who.role == "admin":
        return []
    namespace = job.metadata.namespace
    problems: list[dict[str, str]] = []
    named = job.metadata.labels.get(LABEL_QUOTA_NAME, "").strip()
    if named:
        quotas = store.list_of(ElasticQuota)
        if not quota_allows(quotas, named, namespace):
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
    return problems
