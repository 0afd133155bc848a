"""Reclaim: take back borrowed capacity for a quota that is owed it — as a victim *plan*.

When a quota has pending demand within its guarantee (`used + need <= min`, and within its
runtime along its path) but the cluster has no room, the room is held by quotas that borrowed
it: their `used` is above their (recomputed) runtime. The room may also be missing higher up:
an ancestor of the owner whose subtree borrowed past the ancestor's runtime (a sibling over its
share) while the cluster still has free GPUs; then only jobs inside that ancestor's subtree give
the room back. :func:`plan_reclaim` picks whole running jobs (gangs) to stop so that the owner's
job fits in the cluster and in every quota on its path:

* only jobs of quotas above their runtime, in a resource the owner lacks (a quota shared with
  the owner's path, such as the root, does not count: taking from a sibling under the same
  parent is decided by that parent's own children);
* never non-preemptible jobs;
* lowest priority first, newest first (least work lost);
* then jobs the plan turns out not to need are spared again, highest priority first.

It is a pure function over plain data; the cycle executes the plan through the store (the
operator deletes the victims' reservations, the jobs return to the queue) and admits the owner
on a later cycle once the room is free.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuyard.apis.quotakinds import ROOT_QUOTA
from gpuyard.scheduler.admission.quota.resources import Vector, format_amount
from gpuyard.scheduler.admission.quota.tree import QuotaTree

__all__ = ["ReclaimPlan", "RunningJob", "Victim", "entitlement", "plan_reclaim"]


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A running gang as reclaim sees it."""

    key: Hashable
    quota: str
    priority: int
    start_time: float
    usage: Mapping[str, int]
    preemptible: bool = True


@dataclass(frozen=True, slots=True)
class Victim:
    job: RunningJob
    reason: str


@dataclass(slots=True)
class ReclaimPlan:
    """Which jobs to stop so that `owner` gets `need`; `feasible` False: the plan would not suffice."""

    owner: str
    need: Vector
    shortfall: Vector
    victims: list[Victim] = field(default_factory=list)
    freed: Vector = field(default_factory=dict)
    feasible: bool = True
    reason: str = ""

    @property
    def keys(self) -> list[Hashable]:
        return [v.job.key for v in self.victims]


def entitlement(
    tree: QuotaTree, owner: str, wanted: Mapping[str, int], *, within_min_only: bool
) -> str | None:
    """Why `owner` is not owed `wanted` (None: it is): its own used + need must fit its runtime
    (and its min). Its ancestors may be over their runtime: that is what reclaim repairs."""
    if owner not in tree or owner == ROOT_QUOTA or not tree.is_attached(owner):
        return f"quota {owner}: not an attached leaf quota"
    used = tree.used(owner)
    limits = [("min", tree.min(owner))] if within_min_only else []
    limits.append(("runtime", tree.runtime(owner)))
    guaranteed = tree.guaranteed(owner)
    if within_min_only and not guaranteed & set(wanted):
        return f"quota {owner}: guarantees none of {', '.join(sorted(wanted))}; only guaranteed capacity is reclaimed"
    for what, limit in limits:
        for res, amount in sorted(wanted.items()):
            if what == "min" and res not in guaranteed:
                continue  # no guarantee of this resource (CPU of a GPU quota): the runtime decides
            have = used.get(res, 0)
            if have + amount > limit.get(res, 0):
                tail = "; only guaranteed capacity is reclaimed" if what == "min" else ""
                return (
                    f"quota {owner}: {res} used {format_amount(res, have)} + needed {format_amount(res, amount)} "
                    f"> {what} {format_amount(res, limit.get(res, 0))}{tail}"
                )
    return None


def plan_reclaim(
    tree: QuotaTree,
    *,
    owner: str,
    need: Mapping[str, int],
    running: Iterable[RunningJob],
    free: Mapping[str, int] | None = None,
    within_min_only: bool = True,
) -> ReclaimPlan:
    """A plan that frees enough of the cluster for `need` in quota `owner`.

    `free` is the cluster's free capacity (default: total minus the root's used). The owner's
    demand must already be in its quota's request (tracked), and fit its runtime (and, with
    `within_min_only`, its min). No victims when the room is already free (then the job is
    blocked by something else, e.g. fragmentation).
    """
    wanted = {r: a for r, a in need.items() if a > 0}
    reason = entitlement(tree, owner, wanted, within_min_only=within_min_only)
    if reason is not None:
        return ReclaimPlan(owner, wanted, {}, feasible=False, reason=reason)
    if free is None:
        total, root_used = tree.total, tree.used(ROOT_QUOTA)
        free = {r: total.get(r, 0) - root_used.get(r, 0) for r in wanted}
    # What must be freed, per scope: the cluster (None) lacks free room; an ancestor of the
    # owner lacks runtime (its used + need > runtime: a sibling subtree borrowed past its own
    # runtime), and only jobs inside that ancestor's subtree give it back.
    scopes: dict[str | None, Vector] = {}
    cluster = {r: a - free.get(r, 0) for r, a in wanted.items() if a > free.get(r, 0)}
    if cluster:
        scopes[None] = cluster
    shared = tree.path(owner)
    for ancestor in shared[1:]:
        if ancestor == ROOT_QUOTA:
            continue
        used, limit = tree.used(ancestor), tree.runtime(ancestor)
        lack = {r: used.get(r, 0) + a - limit.get(r, 0) for r, a in wanted.items()}
        lack = {r: a for r, a in lack.items() if a > 0}
        if lack:
            scopes[ancestor] = lack
    plan = ReclaimPlan(owner, wanted, _merge(scopes.values()))
    if not scopes:
        return plan

    used_now: dict[str, Vector] = {}
    runtime: dict[str, Vector] = {}

    def over(quota: str, res: str) -> int:
        if quota not in used_now:
            used_now[quota] = tree.used(quota)
            runtime[quota] = tree.runtime(quota)
        return used_now[quota].get(res, 0) - runtime[quota].get(res, 0)

    freed: dict[str | None, Vector] = {scope: {} for scope in scopes}

    def lacking(job_path: list[str]) -> set[str]:
        """The resources still short in some scope this job's release would help."""
        out: set[str] = set()
        for scope, short in scopes.items():
            if scope is None or scope in job_path:
                got = freed[scope]
                out.update(r for r, a in short.items() if got.get(r, 0) < a)
        return out

    def covered(without: RunningJob | None = None) -> bool:
        for scope, short in scopes.items():
            got = freed[scope]
            minus = (
                without.usage
                if without is not None and (scope is None or scope in tree.path(without.quota))
                else {}
            )
            if any(got.get(r, 0) - minus.get(r, 0) < a for r, a in short.items()):
                return False
        return True

    wanted_res = set(plan.shortfall)
    candidates = sorted(
        (
            j
            for j in running
            if j.preemptible and j.quota in tree and any(j.usage.get(r, 0) > 0 for r in wanted_res)
        ),
        key=lambda j: (j.priority, -j.start_time, str(j.key)),
    )
    chosen: list[Victim] = []
    for job in candidates:
        if covered():
            break
        path = tree.path(job.quota)
        short = lacking(path)
        why = None
        for quota in path:
            if quota in shared:
                continue
            for res in sorted(short):
                if job.usage.get(res, 0) > 0 and over(quota, res) > 0:
                    why = (
                        f"quota {quota} uses {format_amount(res, used_now[quota][res])} {res} > runtime "
                        f"{format_amount(res, runtime[quota].get(res, 0))} (borrowed); {owner} needs it back"
                    )
                    break
            if why:
                break
        if why is None:
            continue
        chosen.append(Victim(job, why))
        _release(job, path, freed, used_now)
    if not covered():
        missing = ", ".join(
            f"{format_amount(r, a - freed[scope].get(r, 0))} {r}" + (f" in {scope}" if scope else "")
            for scope, short in scopes.items()
            for r, a in sorted(short.items())
            if freed[scope].get(r, 0) < a
        )
        plan.victims, plan.freed, plan.feasible = chosen, freed.get(None) or _merge(freed.values()), False
        plan.reason = f"borrowed capacity that can be reclaimed falls short by {missing}"
        return plan
    # spare victims the plan does not need, highest priority (then oldest) first
    for victim in sorted(chosen, key=lambda v: (-v.job.priority, v.job.start_time, str(v.job.key))):
        if covered(without=victim.job):
            chosen.remove(victim)
            path = tree.path(victim.job.quota)
            for scope, got in freed.items():
                if scope is None or scope in path:
                    for res, amount in victim.job.usage.items():
                        got[res] = got.get(res, 0) - amount
    total_freed: Vector = {}
    for victim in chosen:
        for res, amount in victim.job.usage.items():
            total_freed[res] = total_freed.get(res, 0) + amount
    plan.victims, plan.freed = chosen, total_freed
    return plan


def _merge(vectors: Iterable[Mapping[str, int]]) -> Vector:
    """Per resource, the largest amount among `vectors`."""
    out: Vector = {}
    for vec in vectors:
        for res, amount in vec.items():
            out[res] = max(out.get(res, 0), amount)
    return out


def _release(
    job: RunningJob, path: list[str], freed: dict[str | None, Vector], used_now: dict[str, Vector]
) -> None:
    """Book `job`'s usage as freed in every scope it lies in, and off its quotas' used."""
    for scope, got in freed.items():
        if scope is None or scope in path:
            for res, amount in job.usage.items():
                got[res] = got.get(res, 0) + amount
    for quota in path:
        if quota in used_now:
            u = used_now[quota]
            for res, amount in job.usage.items():
                u[res] = u.get(res, 0) - amount
