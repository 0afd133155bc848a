"""Reclaim on one node: room for a one-pod job of several GPUs where it can run.

:func:`~gpuyard.scheduler.quota.victims.plan_reclaim` frees enough GPUs *in the cluster*. A job
of 8 GPUs can still find no node with 8 free GPUs afterwards: the freed ones are spread out,
while borrowers hold the rest of each node. :func:`plan_node_reclaim` picks one node and the
borrowers' jobs on it whose preemption leaves the node with room for the pod:

* the same victims as `plan_reclaim` may take: preemptible jobs of a quota above its runtime
  in GPUs, not on the owner's own path; a quota stops giving once it is back at its runtime;
* per node, lowest priority first, newest first, until the node's free GPUs plus the freed ones
  reach the pod's GPUs; then victims the node does not need are spared again;
* the node wins as kube-scheduler picks one for preemption: the lowest highest victim priority,
  then the lowest sum of priorities, the fewest victims, the fewest GPUs preempted, the newest
  victims, the name; a node whose victims would leave an ancestor of the owner above its
  runtime is skipped.

Room that is free in total but split over nodes while nobody borrows is not reclaimed: that is
fragmentation, not borrowed capacity.

Pure: plain data in (the running jobs, the GPUs each holds per node, each candidate node's free
GPUs), a :class:`ReclaimPlan` out.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping

from gpuyard.apis.quotakinds import ROOT_QUOTA
from gpuyard.scheduler.quota.resources import Vector, format_amount
from gpuyard.scheduler.quota.tree import QuotaTree
from gpuyard.scheduler.quota.victims import ReclaimPlan, RunningJob, Victim, entitlement

__all__ = ["plan_node_reclaim"]

GPU = "nvidia.com/gpu"


def plan_node_reclaim(
    tree: QuotaTree,
    *,
    owner: str,
    gpus: int,
    running: Iterable[RunningJob],
    held: Callable[[Hashable], Mapping[str, int]],
    room: Mapping[str, int],
) -> ReclaimPlan:
    """Victims on one node so that a pod of `gpus` GPUs of quota `owner` fits there.

    `held(job key)`: GPUs the job holds per node (asked only for the jobs that may be preempted). `room`: free GPUs of every node the pod
    could use (its constraints and GPU count allow it). The owner must be owed the GPUs
    (within its min and runtime).
    """
    wanted = {GPU: gpus}
    why_not = entitlement(tree, owner, wanted, within_min_only=True)
    if why_not is not None:
        return ReclaimPlan(owner, wanted, {}, feasible=False, reason=why_not)
    shared = set(tree.path(owner))
    over: dict[str, int] = {}
    for quota in tree.names():
        if quota not in shared:
            excess = tree.used(quota).get(GPU, 0) - tree.runtime(quota).get(GPU, 0)
            if excess > 0:
                over[quota] = excess
    if not over:
        return ReclaimPlan(owner, wanted, wanted, feasible=False, reason="no quota borrows GPUs")
    candidates = sorted(
        (
            j
            for j in running
            if j.preemptible
            and j.quota in tree
            and j.usage.get(GPU, 0) > 0
            and any(q in over for q in tree.path(j.quota))
        ),
        key=lambda j: (j.priority, -j.start_time, str(j.key)),
    )
    holdings = {job.key: held(job.key) for job in candidates}
    by_node: dict[str, list[RunningJob]] = {}
    for job in candidates:
        for node, n in holdings[job.key].items():
            if n > 0 and node in room:
                by_node.setdefault(node, []).append(job)
    best: tuple[tuple[int, int, int, int, float, str], str, list[Victim]] | None = None
    for node, free in sorted(room.items()):
        deficit = gpus - free
        if deficit <= 0:
            continue  # the node has room already: not a matter of reclaim
        chosen = _victims_on(tree, node, deficit, by_node.get(node, []), holdings, over, shared, owner)
        if chosen is None or not _ancestors_fit(tree, owner, gpus, chosen):
            continue
        prios = [v.job.priority for v in chosen]
        cost = (
            max(prios, default=0),
            sum(prios),
            len(chosen),
            sum(v.job.usage.get(GPU, 0) for v in chosen),
            -max((v.job.start_time for v in chosen), default=0.0),
            node,
        )
        if best is None or cost < best[0]:
            best = (cost, node, chosen)
    if best is None:
        return ReclaimPlan(
            owner,
            wanted,
            wanted,
            feasible=False,
            reason=f"no node can be given {gpus} free GPUs by preempting borrowed capacity",
        )
    _, node, chosen = best
    freed: Vector = {GPU: sum(v.job.usage.get(GPU, 0) for v in chosen)}
    return ReclaimPlan(owner, wanted, {GPU: gpus - room[node]}, victims=chosen, freed=freed)


def _ancestors_fit(tree: QuotaTree, owner: str, gpus: int, victims: list[Victim]) -> bool:
    """After the victims leave, the owner's GPUs fit every ancestor's runtime (as admission asks)."""
    for ancestor in tree.path(owner)[1:]:
        if ancestor == ROOT_QUOTA:
            continue
        freed = sum(v.job.usage.get(GPU, 0) for v in victims if ancestor in tree.path(v.job.quota))
        if tree.used(ancestor).get(GPU, 0) - freed + gpus > tree.runtime(ancestor).get(GPU, 0):
            return False
    return True


def _victims_on(
    tree: QuotaTree,
    node: str,
    deficit: int,
    jobs: list[RunningJob],
    held: Mapping[Hashable, Mapping[str, int]],
    over: Mapping[str, int],
    shared: set[str],
    owner: str,
) -> list[Victim] | None:
    """The jobs on `node` to preempt for `deficit` more free GPUs there (None: not enough)."""
    left = dict(over)
    chosen: list[Victim] = []
    got = 0
    for job in jobs:
        if got >= deficit:
            break
        path = [q for q in tree.path(job.quota) if q not in shared]
        lender = next((q for q in path if left.get(q, 0) > 0), None)
        if lender is None:
            continue
        for q in path:
            if q in left:
                left[q] -= job.usage.get(GPU, 0)
        got += held[job.key][node]
        used, runtime = tree.used(lender).get(GPU, 0), tree.runtime(lender).get(GPU, 0)
        chosen.append(
            Victim(
                job,
                f"quota {lender} uses {format_amount(GPU, used)} {GPU} > runtime "
                f"{format_amount(GPU, runtime)} (borrowed); {owner} needs {deficit} more free on {node}",
            )
        )
    if got < deficit:
        return None
    for victim in sorted(chosen, key=lambda v: (-v.job.priority, v.job.start_time, str(v.job.key))):
        if got - held[victim.job.key][node] >= deficit:
            chosen.remove(victim)
            got -= held[victim.job.key][node]
    return chosen
