"""Elastic victims: shrink running elastic jobs to their minimum before stopping whole gangs.

An elastic job (a PyTorchJob with `elasticPolicy`: its PodGroup carries the annotation
`gpuyard.io/elastic: "true"` and its Worker role's minimum is `elasticPolicy.minReplicas`) keeps
training when replicas above its minimum go away (torchrun re-forms the group). So before the
whole-gang engine (`victims.select_victims`) runs, priority preemption tries a cheaper plan:
evict only such *surplus* replicas (per role the held pods above the role's minimum, highest
index first, never below the job-wide minimum), job after job in the engine's own order (lowest
priority, then least work lost, then latest start), until the preemptor fits on the real nodes
(`fits_without_pods`); jobs the plan turns out not to need are reprieved. Only jobs whose whole
eviction would violate no PodDisruptionBudget take part (so a shrink plan never violates one),
and not for quota reclaim (quota is charged per job). The shrunk job keeps running and stays
admitted; its evicted replicas are optional pods the scheduler places again when there is room
(`attempting.retry_partial`, which respects the room nominated for the preemptor).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from gpuyard.apis.scheduling import PodGroup, pod_name
from gpuyard.scheduler.cache.holds import HeldArrays
from gpuyard.scheduler.cache.snapshot import Alloc, Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.gangs.requests import GangRequest
from gpuyard.scheduler.placement.framework import CycleState, Profile
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.preemption.victims import Candidate

__all__ = ["ANNOTATION_ELASTIC", "Shrink", "shrink_plan", "surplus_pods"]

ANNOTATION_ELASTIC = "gpuyard.io/elastic"

Key = tuple[str, str]


def surplus_pods(pg: PodGroup, held: Mapping[str, str]) -> list[str]:
    """The held pods of an elastic `pg` above its minimum (none for a job that is not elastic)."""
    if pg.metadata.annotations.get(ANNOTATION_ELASTIC) != "true":
        return []
    name = pg.metadata.name
    left = len(held)
    floor = pg.spec.minimum()
    out: list[str] = []
    for role in pg.spec.roles:
        pods = [p for i in reversed(range(role.replicas)) if (p := pod_name(name, role.name, i)) in held]
        for pod in pods[: max(0, len(pods) - role.minimum)]:
            if left - 1 < floor:
                return out
            out.append(pod)
            left -= 1
    return out


@dataclass(frozen=True, slots=True)
class Shrink:
    """A plan that evicts only surplus replicas: per job the pods to stop, and where the
    preemptor then goes."""

    pods: dict[Key, tuple[str, ...]]
    placement: Placement


@contextmanager
def _without_pods(snapshot: Snapshot, pods: Iterable[tuple[Key, str]]) -> Iterator[None]:
    taken: list[tuple[Alloc, int]] = []
    for group, pod in pods:
        alloc = snapshot.ledger.pod_alloc(group, pod)
        if alloc is not None and alloc.row >= 0:
            taken.append((alloc, alloc.row))
    for alloc, _ in taken:
        snapshot.unapply(alloc)
    try:
        yield
    finally:
        for alloc, row in reversed(taken):
            snapshot.apply(alloc, row=row, advance_cursor=False)


def _fits(
    snapshot: Snapshot,
    gang: GangRequest,
    profile: Profile,
    pods: dict[Key, tuple[str, ...]],
    held: HeldArrays | None,
) -> Placement | None:
    with _without_pods(snapshot, [(k, p) for k, ps in pods.items() for p in ps]):
        state = CycleState(snapshot, gang, profile)
        if held is not None:
            state.data["held"] = held
        result = place(snapshot, gang, profile, state=state)
    return result if isinstance(result, Placement) and result.pods else None


def shrink_plan(
    snapshot: Snapshot,
    gang: GangRequest,
    profile: Profile,
    candidates: Sequence[Candidate],
    *,
    surplus: Callable[[Key], list[str]],
    violations: Callable[[Sequence[Candidate]], int] | None = None,
    held: HeldArrays | None = None,
) -> Shrink | None:
    """The cheapest surplus-only plan that makes `gang` fit (see the module docstring), or None."""
    order = sorted(
        candidates, key=lambda c: (c.priority, c.gpu_hours_lost / max(c.gpus, 1), -c.start_time, c.key)
    )
    chosen: dict[Key, tuple[str, ...]] = {}
    placement: Placement | None = None
    for c in order:
        if violations is not None and violations([c]) > 0:
            continue
        pods = surplus(c.key)
        if not pods:
            continue
        chosen[c.key] = tuple(pods)
        placement = _fits(snapshot, gang, profile, chosen, held)
        if placement is not None:
            break
    if placement is None:
        return None
    for key in reversed(list(chosen)):  # reprieve the jobs the plan does not need
        trial = {k: v for k, v in chosen.items() if k != key}
        if trial:
            kept = _fits(snapshot, gang, profile, trial, held)
            if kept is not None:
                chosen, placement = trial, kept
    return Shrink(pods=chosen, placement=placement)
