"""Quota admission: may this job start now? `None` (yes) or a reason a person can read.

Two independent checks, both on plain data, called by the scheduling cycle once a job is the
queue's candidate (before or after its placement is computed, before it is assumed):

* **Elastic quota** (:func:`admit`): admitted only if `used + request <= runtime` for every
  resource on the path from the job's quota to the root; a non-preemptible job (label
  `quota.scheduling.koordinator.sh/preemptible: "false"`) only within its quota's `min`
  (non-preemptible used + request <= min), since it can never be reclaimed. Jobs are charged to
  a leaf: a parent quota takes no jobs.
* **ResourceQuota** (:class:`ResourceQuotaBook`): Kubernetes' per-namespace hard limits, counted
  per job: `requests.cpu`/`cpu`, `limits.*`, `nvidia.com/gpu` (every GPU), per GPU class
  (`nvidia.tesla.k80`), `count/jobs`, `pods`.

:class:`QuotaBook` keeps per job what it charges (pending demand, then usage once admitted) so
that the cycle says only `track`, `admit`, `release`, `forget`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpuyard.apis.quotakinds import (
    DEFAULT_QUOTA,
    LABEL_PREEMPTIBLE,
    LABEL_QUOTA_NAME,
    ROOT_QUOTA,
    ResourceQuota,
)
from gpuyard.scheduler.admission.quota.resources import Vector, format_amount, to_units
from gpuyard.scheduler.admission.quota.tree import QuotaTree

K = TypeVar("K", bound=Hashable)
"""A job's key (the scheduler uses (namespace, name))."""

__all__ = [
    "Cause",
    "JobCharge",
    "QuotaBook",
    "ResourceQuotaBook",
    "admit",
    "admits",
    "is_preemptible",
    "quota_of",
    "resource_quota_usage",
]


def is_preemptible(labels: Mapping[str, str]) -> bool:
    return labels.get(LABEL_PREEMPTIBLE, "").strip().lower() != "false"


def quota_of(
    labels: Mapping[str, str], namespace: str, *, tree: QuotaTree, default: str = DEFAULT_QUOTA
) -> str:
    """A job's quota: its `quota.scheduling.koordinator.sh/name` label, else the quota covering
    its namespace, else the default quota."""
    named = labels.get(LABEL_QUOTA_NAME, "").strip()
    if named:
        return named
    return tree.quota_for_namespace(namespace) or default


def _explain(tree: QuotaTree, name: str, res: str) -> str:
    """`min 8, borrowing 8`: how a runtime came about (cached on the tree per version)."""
    cached = tree.notes
    if cached is None or cached[0] != tree.version:
        cached = tree.notes = (tree.version, {})
    note = cached[1].get((name, res))
    if note is None:
        note = cached[1][(name, res)] = _note(tree, name, res)
    return note


def _note(tree: QuotaTree, name: str, res: str) -> str:
    st = tree.status(name)
    rt = st.runtime.get(res, 0)
    lo = st.scaled_min.get(res, 0)

    def f(v: int) -> str:
        return format_amount(res, v)

    if name == ROOT_QUOTA:
        return "the cluster's total"
    if st.min.get(res, 0) != lo:
        base = f"min {f(st.min.get(res, 0))} scaled to {f(lo)}: the cluster is smaller than the mins"
    else:
        base = f"min {f(lo)}"
    if rt > lo:
        return f"{base}, borrowing {f(rt - lo)}"
    cap = st.max.get(res)
    if cap is not None and rt >= cap:
        return f"{base}, max {f(cap)}"
    return f"{base}, nothing to borrow"


Cause = tuple[str, str, str, int, int]
"""Why `admit` says no, as data: (what, quota, resource, amount, limit); see `_blocked`."""


def _blocked(tree: QuotaTree, quota: str, request: Mapping[str, int], preemptible: bool) -> Cause | None:
    """The first reason `request` may not start in `quota` now (None: it may), without words.

    ("missing" | "detached" | "parent", quota, "", 0, 0); ("max", quota, resource, requested,
    max); ("min", quota, resource, non-preemptible used, min); ("excess", the first quota on the
    path without room, resource, used, runtime).
    """
    if quota not in tree:
        return ("missing", quota, "", 0, 0)
    if quota != ROOT_QUOTA and not tree.is_attached(quota):
        return ("detached", quota, "", 0, 0)
    spec = tree.spec(quota)
    if spec.is_parent or tree.has_children(quota):
        return ("parent", quota, "", 0, 0)
    wanted = {r: request[r] for r in sorted(request) if request[r] > 0}
    for res, amount in wanted.items():
        cap = spec.max.get(res)
        if cap is not None and amount > cap:
            return ("max", quota, res, amount, cap)
    tree.refresh()
    if not preemptible:
        lo = tree.min(quota)
        used = tree.non_preemptible_used(quota)
        for res, amount in wanted.items():
            have = used.get(res, 0)
            if have + amount > lo.get(res, 0):
                return ("min", quota, res, have, lo.get(res, 0))
    found = tree.excess(quota, wanted)
    if found is None:
        return None
    name, res, have, rt = found
    return ("excess", name, res, have, rt)


def admits(tree: QuotaTree, quota: str, request: Mapping[str, int], *, preemptible: bool = True) -> bool:
    """Whether `admit` says yes, without building its message (the parking check's question)."""
    return _blocked(tree, quota, request, preemptible) is None


def admit(tree: QuotaTree, quota: str, request: Mapping[str, int], *, preemptible: bool = True) -> str | None:
    """None if `request` may start in `quota` now, else why not.

    `request` is already charged to the quota's request (pending demand); runtimes are
    recomputed first if anything changed.
    """
    cause = _blocked(tree, quota, request, preemptible)
    if cause is None:
        return None
    what, name, res, have, limit = cause
    if what == "missing":
        return f"quota {quota}: no such ElasticQuota"
    if what == "detached":
        return f"quota {quota}: detached from the tree (parent {tree.spec(quota).parent!r} is unknown or forms a cycle)"
    if what == "parent":
        return f"quota {quota}: is a parent quota; jobs are charged to its leaf quotas"
    if what == "max":
        return (
            f"quota {quota}: {res} requested {format_amount(res, have)} > max {format_amount(res, limit)} "
            "(the job can never run in this quota)"
        )
    if what == "min":
        amount = request[res]
        return (
            f"quota {quota}: non-preemptible jobs run only within min; {res} non-preemptible used "
            f"{format_amount(res, have)} + requested {format_amount(res, amount)} > min {format_amount(res, limit)}"
        )
    what = "cluster" if name == ROOT_QUOTA else f"quota {name}"
    return (
        f"{what}: {res} used {format_amount(res, have)} + requested {format_amount(res, request[res])} "
        f"> runtime {format_amount(res, limit)} ({_explain(tree, name, res)})"
    )


# --- per-job bookkeeping -----------------------------------------------------------------------


@dataclass(slots=True)
class JobCharge:
    """What one job charges: its quota, demand vector, whether it runs (is admitted) now."""

    quota: str
    usage: Vector
    preemptible: bool = True
    admitted: bool = False
    counted: bool = True
    """Whether its demand counts in its quota's request: a waiting job that can never be placed
    does not (it must not take a share of spare capacity from jobs that could run)."""


class QuotaBook(Generic[K]):
    """The elastic quota tree plus, per job, what it charges to it.

    `track` a job when it is queued (its demand joins its quota's request), `admit` it when it
    may start (its usage joins `used`), `release` it when it stops but stays queued (preempted,
    suspended), `forget` it when it is gone (finished, deleted).
    """

    def __init__(self, tree: QuotaTree) -> None:
        self.tree = tree
        self._jobs: dict[K, JobCharge] = {}
        self._admitted: dict[K, JobCharge] = {}  # the admitted ones (kept where `admitted` flips)

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def charge(self, key: K) -> JobCharge | None:
        return self._jobs.get(key)

    def jobs(self) -> Iterable[tuple[K, JobCharge]]:
        return self._jobs.items()

    def admitted(self) -> Iterable[tuple[K, JobCharge]]:
        """The admitted jobs' charges (what `jobs` holds with `admitted` set), without walking
        the waiting ones."""
        return self._admitted.items()

    def track(
        self,
        key: K,
        *,
        quota: str,
        usage: Mapping[str, int],
        preemptible: bool = True,
        admitted: bool = False,
    ) -> None:
        """Queue a job (or update it: a changed quota/demand moves its charge)."""
        old = self._jobs.get(key)
        counted = old.counted if old is not None else True
        self.forget(key)
        charge = JobCharge(quota, dict(usage), preemptible, admitted, counted=counted or admitted)
        self._jobs[key] = charge
        if charge.counted:
            self.tree.add_request(quota, charge.usage)
        if admitted:
            self._admitted[key] = charge
            self.tree.add_used(quota, charge.usage, preemptible=preemptible)

    def check(self, key: K) -> str | None:
        """Whether the tracked job may start now (without admitting it)."""
        charge = self._jobs[key]
        if charge.admitted:
            return None
        return admit(self.tree, charge.quota, charge.usage, preemptible=charge.preemptible)

    def cause(self, key: K) -> Cause | None:
        """Why the tracked, waiting job may not start now, as data (`_blocked`); None: it may."""
        charge = self._jobs[key]
        return (
            None if charge.admitted else _blocked(self.tree, charge.quota, charge.usage, charge.preemptible)
        )

    def allows(self, key: K) -> bool:
        """Whether `check` says yes, without building its message."""
        charge = self._jobs[key]
        return charge.admitted or admits(
            self.tree, charge.quota, charge.usage, preemptible=charge.preemptible
        )

    def admit(self, key: K) -> str | None:
        """Admit the job if its quota allows; None on success, else the reason."""
        reason = self.check(key)
        if reason is None:
            charge = self._jobs[key]
            if not charge.admitted:
                self.count_demand(key, True)
                charge.admitted = True
                self._admitted[key] = charge
                self.tree.add_used(charge.quota, charge.usage, preemptible=charge.preemptible)
        return reason

    def count_demand(self, key: K, counted: bool) -> bool:
        """Count the waiting job's demand in its quota's request, or not (it can never be
        placed); whether that changed. An admitted job's demand always counts."""
        charge = self._jobs.get(key)
        if charge is None or charge.admitted or charge.counted == counted:
            return False
        charge.counted = counted
        self.tree.add_request(charge.quota, charge.usage, sign=1 if counted else -1)
        return True

    def release(self, key: K) -> None:
        """The job stopped running but stays queued (its demand stays in the request)."""
        charge = self._jobs.get(key)
        if charge is not None and charge.admitted:
            charge.admitted = False
            del self._admitted[key]
            self.tree.add_used(charge.quota, charge.usage, preemptible=charge.preemptible, sign=-1)

    def forget(self, key: K) -> None:
        charge = self._jobs.pop(key, None)
        if charge is None:
            return
        if charge.admitted:
            del self._admitted[key]
            self.tree.add_used(charge.quota, charge.usage, preemptible=charge.preemptible, sign=-1)
        if charge.counted:
            self.tree.add_request(charge.quota, charge.usage, sign=-1)


# --- ResourceQuota -----------------------------------------------------------------------------


def _canonical(key: str) -> str:
    """`cpu` -> `requests.cpu`, `nvidia.tesla.k80` -> `requests.nvidia.tesla.k80`, counts kept."""
    if key.startswith(("requests.", "limits.", "count/")) or key == "pods":
        if key.startswith("count/"):
            return "count/" + key.removeprefix("count/").split(".", 1)[0]
        return key
    return f"requests.{key}"


_OVERCOMMITTABLE = frozenset({"cpu", "memory", "ephemeral-storage"})


def resource_quota_usage(
    requests: Mapping[str, int], *, limits: Mapping[str, int] | None = None, pods: int = 0, kind: str = ""
) -> Vector:
    """A job's charge against ResourceQuotas, in canonical keys (`requests.cpu`, `count/jobs`, ...).

    `requests`/`limits` are quota-unit vectors of the whole job (`usage_of_requests`: GPU classes
    already counted as `nvidia.com/gpu` too).
    """
    out: Vector = {f"requests.{r}": a for r, a in requests.items() if a > 0}
    for r, a in (limits or {}).items():
        if a > 0:
            out[f"limits.{r}"] = a
    for r, a in requests.items():  # extended resources (GPUs, classes): limits equal requests
        if a > 0 and r not in _OVERCOMMITTABLE:
            out.setdefault(f"limits.{r}", a)
    out["count/jobs"] = 1
    if kind:
        out[f"count/{kind.lower()}s"] = 1
    if pods:
        out["pods"] = pods
    return out


@dataclass(slots=True)
class _RQ:
    namespace: str
    name: str
    hard: dict[str, tuple[str, int]]  # canonical key -> (key as written, limit)
    used: Vector = field(default_factory=dict)


class ResourceQuotaBook:
    """Namespace ResourceQuotas and what admitted jobs use of them, kept per job."""

    def __init__(self, quotas: Iterable[ResourceQuota] = ()) -> None:
        self._quotas: dict[tuple[str, str], _RQ] = {}
        self._by_ns: dict[str, list[_RQ]] = {}
        self._jobs: dict[Hashable, tuple[str, Vector]] = {}
        self.set_quotas(quotas)

    def set_quotas(self, quotas: Iterable[ResourceQuota]) -> None:
        self._quotas = {}
        for q in quotas:
            if q.spec.scopes or q.spec.scope_selector:
                continue  # scoped quotas are not enforced (validation rejects them on submit)
            hard = {
                _canonical(k): (k, to_units(k.removeprefix("requests.").removeprefix("limits."), v))
                for k, v in q.spec.hard.items()
            }
            self._quotas[(q.metadata.namespace, q.metadata.name)] = _RQ(
                q.metadata.namespace, q.metadata.name, hard
            )
        self._by_ns = {}
        for rq in self._quotas.values():
            self._by_ns.setdefault(rq.namespace, []).append(rq)
        for namespace, usage in self._jobs.values():
            for rq in self._by_ns.get(namespace, []):
                _add_into(rq.used, usage, 1)

    def check(self, namespace: str, usage: Mapping[str, int]) -> str | None:
        """None if the job's `usage` (see :func:`resource_quota_usage`) fits every quota of the namespace."""
        for rq in sorted(self._by_ns.get(namespace, []), key=lambda q: q.name):
            for canon, (written, limit) in sorted(rq.hard.items()):
                amount = usage.get(canon, 0)
                if amount <= 0:
                    continue
                have = rq.used.get(canon, 0)
                if have + amount > limit:
                    res = written.removeprefix("requests.").removeprefix("limits.")
                    return (
                        f"ResourceQuota {rq.namespace}/{rq.name}: {written} {format_amount(res, have)} of "
                        f"{format_amount(res, limit)} used, the job needs {format_amount(res, amount)}"
                    )
        return None

    def charge(self, key: Hashable, namespace: str, usage: Mapping[str, int]) -> None:
        """Count an admitted job (replaces an earlier charge of the same job)."""
        self.uncharge(key)
        self._jobs[key] = (namespace, dict(usage))
        for rq in self._by_ns.get(namespace, []):
            _add_into(rq.used, usage, 1)

    def uncharge(self, key: Hashable) -> None:
        entry = self._jobs.pop(key, None)
        if entry is None:
            return
        namespace, usage = entry
        for rq in self._by_ns.get(namespace, []):
            _add_into(rq.used, usage, -1)

    def used(self, namespace: str, name: str) -> dict[str, int]:
        """Usage per key as written in the quota's `spec.hard` (for `status.used`)."""
        rq = self._quotas.get((namespace, name))
        if rq is None:
            return {}
        return {written: rq.used.get(canon, 0) for canon, (written, _) in rq.hard.items()}


def _add_into(into: Vector, delta: Mapping[str, int], sign: int) -> None:
    for k, v in delta.items():
        if v:
            into[k] = into.get(k, 0) + sign * v
