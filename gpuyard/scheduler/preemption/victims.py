"""Choosing victims: which running gangs to stop so that a waiting gang fits on the real nodes.

:func:`select_victims` is the engine priority preemption and quota reclaim share (the caller
decides who *may* be preempted: :mod:`~gpuyard.scheduler.preemption.protection`). It is pure over
the snapshot (used as scratch space and left as it was) and plain :class:`Candidate` records:

1. **pre-filter** (vectorised, kube-scheduler's `nodesWherePreemptionMightHelp`): per node the
   idle GPUs plus the GPUs candidates hold there; when even all of them cannot give the gang
   its GPUs there is no plan (and none when the gang does not fit with every candidate gone:
   `fitting.fits_without`, the real placement: topology, shapes, CPU and memory);
2. **candidate plans**: one per promising node (the candidates on that node only; nodes in the
   order of the cheapest set of their candidates that gives the largest pod its GPUs), at most
   `max_nodes` nodes; for a gang of several pods, the cheapest nodes' cheapest victims node after
   node until the gang fits; and only when none of these fits, one cluster-wide plan (every
   candidate, cheapest first, until the gang fits). Prefixes are found by doubling then
   bisecting. Each plan spares at once the victims with nothing on
   the nodes its placement uses, then *reprieves* the others it does not need, most expensive
   first (kube-scheduler's reprieve); at most `max_checks` placements are tried in all;
3. **the choice**, in order (kube-scheduler's `pickOneNodeForPreemption`, extended with the work
   lost): fewest PodDisruptionBudget violations, lowest highest-victim priority, lowest sum of
   priorities, fewest victims, fewest GPU-hours lost, latest start (the plan whose earliest
   started victim started last), then the victims' names.

Victims are whole gangs: every Reservation of a victim is taken away (a gang is never partly
preempted). `enough(victims)` is an extra condition a plan must meet (quota reclaim: the victims
free enough of the borrowed quota).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuyard.scheduler.cache.holds import HeldArrays
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.gangs.requests import GangRequest
from gpuyard.scheduler.placement.framework import Profile
from gpuyard.scheduler.preemption.fitting import fits_without

__all__ = ["Candidate", "Plan", "plan_cost", "select_victims"]

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running gang that may be preempted, as victim selection sees it."""

    key: Key
    priority: int = 0
    start_time: float = 0.0
    gpus: int = 0
    gpu_hours_lost: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()
    pods: tuple[str, ...] = ()


@dataclass(slots=True)
class Plan:
    """Victims whose removal lets the gang fit, the placement it would get, and the PDB cost."""

    victims: list[Candidate]
    placement: Placement
    pdb_violations: int = 0
    cost: tuple[object, ...] = field(default=())


def plan_cost(victims: Sequence[Candidate], pdb_violations: int = 0) -> tuple[object, ...]:
    """The order plans are chosen in (smaller first; see the module docstring)."""
    prios = [v.priority for v in victims]
    return (
        pdb_violations,
        max(prios, default=-(2**63)),
        sum(prios),
        len(victims),
        round(sum(v.gpu_hours_lost for v in victims), 6),
        -min((v.start_time for v in victims), default=0.0),
        tuple(sorted(v.key for v in victims)),
    )


def _cheapest_first(c: Candidate) -> tuple[object, ...]:
    return (c.priority, c.gpu_hours_lost, -c.start_time, c.key)


class _Search:
    """One selection's shared state: the placements tried so far, bounded by `max_checks`."""

    def __init__(
        self,
        snapshot: Snapshot,
        gang: GangRequest,
        profile: Profile,
        *,
        held: HeldArrays | None,
        max_checks: int,
    ) -> None:
        self.snapshot, self.gang, self.profile, self.held = snapshot, gang, profile, held
        self.left = max_checks
        self.seen: dict[frozenset[Key], Placement | None] = {}

    def fits(self, victims: Sequence[Candidate]) -> Placement | None:
        keys = frozenset(v.key for v in victims)
        if keys in self.seen:
            return self.seen[keys]
        if self.left <= 0:
            return None
        self.left -= 1
        got = fits_without(self.snapshot, self.gang, self.profile, keys, held=self.held)
        out = got if isinstance(got, Placement) else None
        self.seen[keys] = out
        return out

    def smallest_prefix(
        self, order: list[Candidate], enough: Callable[[list[Candidate]], bool]
    ) -> tuple[list[Candidate], Placement] | None:
        """The shortest prefix of `order` that lets the gang fit (and is `enough`)."""
        n = len(order)
        hi, found = 1, None
        while True:
            prefix = order[:hi]
            got = self.fits(prefix) if enough(prefix) else None
            if got is not None:
                found = got
                break
            if hi >= n or self.left <= 0:
                return None
            hi = min(2 * hi, n)
        lo = hi // 2
        while hi - lo > 1 and self.left > 0:
            mid = (lo + hi) // 2
            prefix = order[:mid]
            got = self.fits(prefix) if enough(prefix) else None
            if got is not None:
                hi, found = mid, got
            else:
                lo = mid
        return order[:hi], found

    def reprieve(
        self, victims: list[Candidate], placement: Placement, enough: Callable[[list[Candidate]], bool]
    ) -> tuple[list[Candidate], Placement]:
        """Spare the victims the plan does not need, most expensive first."""
        chosen = list(victims)
        for victim in sorted(victims, key=_cheapest_first, reverse=True):
            if len(chosen) <= 1 or self.left <= 0:
                break
            rest = [v for v in chosen if v.key != victim.key]
            if not enough(rest):
                continue
            got = self.fits(rest)
            if got is not None:
                chosen, placement = rest, got
        return chosen, placement


def select_victims(
    snapshot: Snapshot,
    gang: GangRequest,
    profile: Profile,
    candidates: Sequence[Candidate],
    *,
    violations: Callable[[Sequence[Candidate]], int] | None = None,
    enough: Callable[[list[Candidate]], bool] | None = None,
    held: HeldArrays | None = None,
    max_nodes: int = 8,
    max_checks: int = 64,
) -> Plan | None:
    """The best plan of victims among `candidates` for `gang` (see the module docstring), or None
    when no set of them lets the whole gang fit."""
    if not candidates:
        return None
    ok = enough or (lambda _victims: True)
    count = violations or (lambda _victims: 0)
    search = _Search(snapshot, gang, profile, held=held, max_checks=max_checks)
    # 1. pre-filter: the GPUs all candidates could give, per node, against what the gang asks
    rows = snapshot.node_rows.index
    potential = snapshot.gpu_whole_free.astype(np.int64).copy()
    by_node: dict[str, list[Candidate]] = {}  # each cheapest first (built from the sorted list)
    everyone = sorted(candidates, key=_cheapest_first)
    holdings = {c.key: snapshot.group_gpus(c.key) for c in everyone}
    for c in everyone:
        for node, n in holdings[c.key].items():
            row = rows.get(node)
            if row is not None and row < len(potential):
                potential[row] += n
                by_node.setdefault(node, []).append(c)
    asked = sum(p.required * p.shape.gpus for p in gang.parts if not p.shape.shared)
    alive = snapshot.alive & snapshot.ready & snapshot.schedulable
    if asked and int(potential[alive].sum()) < asked:
        return None
    plans: list[Plan] = []

    def add(found: tuple[list[Candidate], Placement] | None) -> None:
        if found is None:
            return
        victims, placement = found
        # victims with nothing on the nodes the placement uses are spared at once (no check)
        used = set(placement.nodes)
        kept = [v for v in victims if any(n in used for n in holdings[v.key])]
        if len(kept) < len(victims) and ok(kept):
            again = search.fits(kept)
            if again is not None:
                victims, placement = kept, again
        victims, placement = search.reprieve(victims, placement, ok)
        v = count(victims)
        plans.append(Plan(victims, placement, v, plan_cost(victims, v)))

    # 2. per-node plans where one node could take the largest pod (small, cheap to check), then
    # the cluster-wide plan with the checks left
    largest = max((p.shape.gpus for p in gang.parts if p.required and not p.shape.shared), default=0)
    names = snapshot.names
    promising = [
        int(row)
        for row in np.flatnonzero(alive & (potential >= largest))
        if int(snapshot.gpu_whole_free[row]) < max(largest, 1) and names[int(row)] in by_node
    ]

    cheapest: dict[int, list[Candidate]] = {}

    def node_bound(row: int) -> tuple[object, ...]:
        """A lower bound of the node's plan cost: its cheapest candidates that give the GPUs."""
        name = names[row] or ""
        need = max(largest, 1) - int(snapshot.gpu_whole_free[row])
        taken: list[Candidate] = []
        for cand in by_node.get(name, ()):
            if need <= 0:
                break
            taken.append(cand)
            need -= holdings[cand.key].get(name, 0)
        cheapest[row] = taken
        prios = [v.priority for v in taken]
        return (max(prios, default=0), sum(prios), len(taken), sum(v.gpu_hours_lost for v in taken))

    promising.sort(key=node_bound)
    for row in promising[:max_nodes]:
        if search.left <= 0:
            break
        add(search.smallest_prefix(by_node.get(names[row] or "", []), ok))
    pods = sum(p.required for p in gang.parts)
    if plans and pods <= 1:
        return min(plans, key=lambda p: p.cost)  # one pod: its best plan is on one node
    if pods > 1 and promising and search.left > 0:
        # several pods: the cheapest nodes' cheapest victims, node after node, until it fits
        union: list[Candidate] = []
        seen: set[Key] = set()
        for row in promising:
            for cand in cheapest[row]:
                if cand.key not in seen:
                    seen.add(cand.key)
                    union.append(cand)
        add(search.smallest_prefix(union, ok))
        if plans:
            return min(plans, key=lambda p: p.cost)
    if not ok(everyone) or search.fits(everyone) is None:
        return min(plans, key=lambda p: p.cost) if plans else None
    add(search.smallest_prefix(everyone, ok))
    if not plans:
        return None
    return min(plans, key=lambda p: p.cost)
