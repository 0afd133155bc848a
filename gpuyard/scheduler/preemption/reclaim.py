"""Reclaim: give a quota back its guarantee by asking jobs that borrowed it to stop.

When a waiting job fits its quota's min and runtime (`Admission.owed`) but cannot start —
the cluster has no room, or an ancestor (the cluster itself) is full — the borrowers hold the
room. After `scheduler.reclaim_delay` seconds of that (Koordinator waits 120 s; 0 in tests),
:class:`Reclaimer` asks the pure :func:`plan_reclaim` for victims that give the quota back what
it is owed in every dimension it tracks (whole gangs, lowest priority first, newest first, never
non-preemptible ones), then checks the plan on the real nodes with the preemption engine
(:func:`on_nodes`: the owner's whole gang must fit once the victims are gone, topology and shape
included; if it would not — the freed GPUs lie on other nodes — the engine chooses among the
borrowers' jobs a set that frees the quota *and* the room, in the engine's order) and turns the
plan into decisions:

* each victim's PodGroup gets `status.evictions` (pod -> why) for every pod holding a
  Reservation, and goes back to `Pending` (reason `Preempted`). The job operator stops those
  pods (the job is `Restarting`, not failed, no restart counted) and then releases their
  Reservations through `spec.release`; the Reservations keep holding the devices until then,
  so a GPU is never handed out while a pod still runs on it;
* the victim returns to its queue keeping its submission time, and its quota charge is
  released at once; it is placed again only once every evicted Reservation is gone;
* Kubernetes-style Events are recorded on the victim ("Preempted: reclaimed by quota team-a
  (min 16)") and on the beneficiary ("Reclaiming: preempted 2 jobs of borrowing quotas ...");
* while a plan's victims still hold their Reservations, no new plan is made for the same
  quota (the room is coming; another plan would preempt more than needed).

The scheduler never imports the operator; PodGroup status is the only channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import structlog

from gpuyard.apis.disruption import PodDisruptionBudget
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.admission.quota import ReclaimPlan, RunningJob, Victim, plan_reclaim
from gpuyard.scheduler.admission.quota.resources import format_amount
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.gangs.requests import build_gang
from gpuyard.scheduler.preemption.budgets import violation_counter
from gpuyard.scheduler.preemption.evicting import evict
from gpuyard.scheduler.preemption.fitting import fits_without
from gpuyard.scheduler.preemption.victims import Candidate, select_victims

if TYPE_CHECKING:
    from gpuyard.scheduler.preemption.needs import Preempting

__all__ = ["Reclaimer", "on_nodes"]

log = structlog.get_logger(__name__)

Key = tuple[str, str]


@dataclass(slots=True)
class Reclaimer:
    """Waits `delay` seconds per owed job, then executes a reclaim plan (see the module docstring)."""

    delay: float = 0.0
    owed_since: dict[Key, float] = field(default_factory=dict)
    preempted: int = 0
    evicting: dict[str, set[Key]] = field(default_factory=dict)  # quota -> victims still holding room
    _tried_epoch: dict[str, int] = field(default_factory=dict)
    _fired: set[Key] = field(default_factory=set)

    def next_due(self, now: float) -> float | None:
        """When the earliest waiting owner's delay ends, if still ahead (the loop wakes then)."""
        if self.delay <= 0:
            return None
        ahead = [t + self.delay for k, t in self.owed_since.items() if k not in self._fired]
        return min(ahead) if ahead else None

    def due(self, now: float) -> list[Key]:
        """Owners whose delay has just ended: the loop makes them ready to be tried again."""
        if self.delay <= 0:
            return []
        out = [k for k, t in self.owed_since.items() if k not in self._fired and t + self.delay <= now]
        self._fired.update(out)
        return out

    def forget(self, key: Key) -> None:
        self.owed_since.pop(key, None)
        self._fired.discard(key)

    def released(self, victim: Key) -> None:
        """A victim's evicted Reservations are all gone (or it is gone)."""
        for quota, victims in list(self.evicting.items()):
            victims.discard(victim)
            if not victims:
                del self.evicting[quota]

    def consider(self, state: Preempting, key: Key, *, owed: bool | None = None) -> list[Key]:
        """The waiting job `key` could not start: reclaim for it if it is owed and has waited
        `delay`. Returns the preempted jobs (empty when nothing was done). `owed` is
        `adm.owed(key)` when the caller already knows it (same shape, same state). The plan is
        checked on the real nodes (`on_nodes`) and carried out by the shared `evicting.evict`."""
        adm, now, epoch = state.admission, state.now, state.epoch()
        if not (adm.owed(key) if owed is None else owed):
            self.forget(key)
            return []
        since = self.owed_since.setdefault(key, now)
        if now - since < self.delay:
            return []
        charge = adm.quotas.charge(key)
        if charge is None:
            return []
        if self._tried_epoch.get(charge.quota) == epoch or charge.quota in self.evicting:
            return []  # one plan per quota per state of the cluster; none while room is coming
        self._tried_epoch[charge.quota] = epoch
        running = adm.running_jobs()
        pg = state.cache.objects.get_of(PodGroup, *key)
        plan = plan_reclaim(adm.tree, owner=charge.quota, need=charge.usage, running=running)
        if not plan.feasible or not plan.victims:
            if plan.reason:
                log.debug("reclaim.infeasible", job=f"{key[0]}/{key[1]}", reason=plan.reason)
            return []
        if isinstance(pg, PodGroup):
            found = on_nodes(state, pg, plan, running)
            if found is None:
                log.debug("reclaim.no_room_on_nodes", job=f"{key[0]}/{key[1]}")
                return []
            plan = found
        return self._execute(state, key, plan)

    def _execute(self, state: Preempting, owner_key: Key, plan: ReclaimPlan) -> list[Key]:
        tree, snapshot, objects = state.admission.tree, state.cache.snapshot, state.cache.objects
        mins = ", ".join(
            f"min {format_amount(r, tree.min(plan.owner).get(r, 0))}"
            + ("" if r == "nvidia.com/gpu" else f" {r}")
            for r in sorted(plan.need)
        )
        done: list[Key] = []
        for victim in plan.victims:
            key = cast(Key, victim.job.key)  # running jobs are keyed by (namespace, name)
            done.append(key)
            message = (
                f"reclaimed by quota {plan.owner} ({mins}) for {owner_key[0]}/{owner_key[1]}: {victim.reason}"
            )
            if snapshot.placed_pods(key):
                self.evicting.setdefault(plan.owner, set()).add(key)
            evict(state, key, message=message, reason="reclaim")
        self.preempted += len(done)
        owner = objects.get_of(PodGroup, *owner_key)
        if isinstance(owner, PodGroup):
            names = ", ".join(f"{k[0]}/{k[1]}" for k in done)
            state.recorder.event(
                owner,
                reason="Reclaiming",
                message=f"quota {plan.owner} ({mins}) takes back borrowed capacity: preempted {names}",
                now=state.utcnow,
            )
        self.forget(owner_key)
        return done


def on_nodes(
    state: Preempting, pg: PodGroup, plan: ReclaimPlan, running: list[RunningJob]
) -> ReclaimPlan | None:
    """The quota plan checked on the real nodes (the preemption engine's question): when the
    owner's gang does not fit with the plan's victims gone (their freed room lies where the gang
    cannot use it), the engine chooses among the borrowers' jobs a set that frees enough quota
    *and* lets the gang fit; None when there is none (then nothing is preempted)."""
    key = (pg.metadata.namespace, pg.metadata.name)
    cache = state.cache
    snap = cache.snapshot
    members, waiting_for = cache.groups.members(pg, lambda k: cache.objects.get_of(PodGroup, *k))
    if waiting_for:
        return None
    gang = build_gang(
        members,
        placed={m.key[1:]: snap.placed_pods(m.key[1:]) for m in members},
        classes=snap.class_names,
        cache=cache.shapes,
    )
    if not gang.parts:
        return plan
    tracked = state.admission.jobs.get(key)
    mine = tracked.job.priority if tracked is not None else None
    submitted = tracked.job.submit_time if tracked is not None else None
    held = state.claims.holds.arrays(
        snap.node_rows.index,
        snap.n,
        exclude={key},
        priority=mine,
        submitted=submitted,
        queue=tracked.job.queue if tracked is not None else None,
        share=state.admission.queue.share,
    )
    gone = [cast(Key, v.job.key) for v in plan.victims]
    if isinstance(fits_without(snap, gang, state.profile, gone, held=held), Placement):
        return plan
    tree, charge = state.admission.tree, state.admission.quotas.charge(key)
    if charge is None:
        return None
    shared = set(tree.path(charge.quota))
    by_key = {cast(Key, j.key): j for j in running if j.preemptible and j.quota not in shared}
    candidates = [
        Candidate(
            key=k,
            priority=j.priority,
            start_time=j.start_time,
            gpus=sum(snap.group_gpus(k).values()),
        )
        for k, j in by_key.items()
        if snap.placed_pods(k)
    ]

    def enough(victims: list[Candidate]) -> bool:
        sub = plan_reclaim(
            tree, owner=charge.quota, need=charge.usage, running=[by_key[v.key] for v in victims]
        )
        return sub.feasible

    labels = {k: dict(t.labels) for k in by_key if (t := state.admission.jobs.get(k)) is not None}
    budgets = violation_counter(
        cache.objects.list_of(PodDisruptionBudget),
        {k: (labels.get(k, {}), len(snap.placed_pods(k))) for k in by_key},
    )
    chosen = select_victims(
        snap, gang, state.profile, candidates, enough=enough, held=held, violations=budgets
    )
    if chosen is None:
        return None
    sub = plan_reclaim(
        tree, owner=charge.quota, need=charge.usage, running=[by_key[v.key] for v in chosen.victims]
    )
    reasons = {cast(Key, v.job.key): v.reason for v in sub.victims}
    victims = [
        Victim(
            by_key[v.key],
            reasons.get(v.key, f"its room on the nodes is needed; {charge.quota} is owed its min"),
        )
        for v in chosen.victims
    ]
    return ReclaimPlan(plan.owner, plan.need, plan.shortfall, victims=victims, freed=plan.freed)
