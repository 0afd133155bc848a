"""Priority preemption: a waiting gang that does not fit stops lower-priority gangs, and its
room is nominated (held) for it until it is placed.

`preempt_for(state, key)` runs after a job's placement failed for lack of room, or after its own
elastic quota refused it while it is not owed reclaim (then the victims must also free enough of
that quota: Kueue's `withinClusterQueue` preemption):

1. the candidates: running gangs (holding Reservations, not already being stopped, not in a
   gang group; with elastic quotas, of the preemptor's own quota only — another quota's jobs
   are taken back by reclaim, so priority never breaks a quota's guarantee) that
   `protection.protected` allows — lower priority (or newer equal priority under
   `LowerOrNewerEqualPriority`), not non-preemptible, past their queue's `preemptMinRuntime`;
2. first `elastic.shrink_plan`: can evicting only replicas above elastic jobs' minimum make the
   gang fit? (those jobs keep running); else `victims.select_victims` finds the cheapest plan of
   whole gangs that makes the whole gang fit on the real nodes (PodDisruptionBudgets from the
   objects the scheduler watches);
3. the victims are evicted (`evicting.evict`, reason `priority`); the room the gang's planned
   placement takes on each node is held for it (`holds`, cause `nomination`) until it is placed
   or `scheduler.nomination_seconds` pass, so no other job takes the room while the victims'
   pods stop; an event on the preemptor says what it preempted.

While its victims still hold their Reservations no new plan is made for it, and a plan is looked
for at most once per state of the cluster (the core's epoch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuyard.apis.disruption import PodDisruptionBudget
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.cache.holds import Hold
from gpuyard.scheduler.gangs.requests import build_gang
from gpuyard.scheduler.preemption.budgets import violation_counter
from gpuyard.scheduler.preemption.elastic import shrink_plan, surplus_pods
from gpuyard.scheduler.preemption.evicting import checkpoint_interval, evict, gpu_hours_lost
from gpuyard.scheduler.preemption.protection import Preemptee, Preemptor, protected
from gpuyard.scheduler.preemption.victims import Candidate, select_victims

if TYPE_CHECKING:
    from gpuyard.scheduler.preemption.needs import Preempting

__all__ = ["preempt_for", "victim_message"]

Key = tuple[str, str]


def victim_message(victim: Key, preemptor: Key, priority: int) -> str:
    """What the victim's owner reads: the preemptor is named only within the same namespace."""
    if victim[0] == preemptor[0]:
        return f"preempted by higher-priority job {preemptor[1]} (priority {priority})"
    return f"preempted by a higher-priority job (priority {priority}) of another team"


def _candidates(state: Preempting, key: Key, me: Preemptor) -> list[Candidate]:
    adm, cache, now = state.admission, state.cache, state.now
    snap, queue = cache.snapshot, adm.queue
    # with elastic quotas, priority decides only within the preemptor's own quota (Kueue's
    # `withinClusterQueue`); other quotas' jobs are taken back by reclaim, never by priority
    own = adm.jobs[key].quota if adm.has_quotas and key in adm.jobs else None
    out: list[Candidate] = []
    # only running jobs of lower priority (or equal, when newer equal ones may be preempted) can
    # pass `protected`: the index hands out those (of its quota), not every running or tracked job
    equal = me.policy == "LowerOrNewerEqualPriority"
    for other in adm.running.at_most(me.priority, equal=equal, quota=own):
        if other == key:
            continue
        t = adm.jobs[other]
        held = snap.placed_pods(other)
        if not held:
            continue
        pg = cache.objects.get_of(PodGroup, *other)
        if not isinstance(pg, PodGroup) or state.recorder.evicting(pg) or pg.spec.gang_group:
            continue
        if cache.groups.referenced_by.get(other):
            continue  # a member of a gang group: the group is stopped whole or not at all
        started = t.started if t.started is not None else 0.0
        cfg = queue.config_of(t.job.queue)
        wall = state.utcnow.timestamp() - (now - started)  # submit times are wall-clock
        job = Preemptee(
            t.job.priority, started, pg.metadata.labels, min_runtime=cfg.preempt_min_runtime, started_at=wall
        )
        if protected(me, job, now=now) is not None:
            continue
        gpus = sum(snap.group_gpus(other).values())
        lost = gpu_hours_lost(
            gpus=gpus, started=started, now=now, interval=checkpoint_interval(pg.metadata.annotations)
        )
        out.append(
            Candidate(
                key=other,
                priority=t.job.priority,
                start_time=started,
                gpus=gpus,
                gpu_hours_lost=lost,
                labels=tuple(sorted(pg.metadata.labels.items())),
                pods=tuple(sorted(held)),
            )
        )
    return out


def _surplus(state: Preempting, key: Key) -> list[str]:
    """Replicas of the running job `key` above its elastic minimum (none if it is not elastic)."""
    pg = state.cache.objects.get_of(PodGroup, *key)
    return surplus_pods(pg, state.cache.snapshot.placed_pods(key)) if isinstance(pg, PodGroup) else []


def _quota_room(state: Preempting, key: Key) -> Callable[[list[Candidate]], bool] | None:
    """For a job its own quota blocks: whether stopping these jobs of that quota makes room in
    it and every quota above it (`used - freed + need <= runtime`); None when it is not such a job."""
    adm = state.admission
    charge = adm.quotas.charge(key)
    if not adm.has_quotas or charge is None or charge.admitted or not charge.usage:
        return None
    tree = adm.tree
    tree.refresh()
    path = tree.path(charge.quota)
    used = {q: tree.used(q) for q in path}
    runtime = {q: tree.runtime(q) for q in path}
    need = {r: a for r, a in charge.usage.items() if a > 0}
    charge_of = adm.quotas.charge

    def enough(victims: list[Candidate]) -> bool:
        freed: dict[str, int] = {}
        for v in victims:
            c = charge_of(v.key)
            for r, a in (c.usage if c is not None else {}).items():
                freed[r] = freed.get(r, 0) + a
        return all(
            used[q].get(r, 0) - freed.get(r, 0) + a <= runtime[q].get(r, 0)
            for q in path
            for r, a in need.items()
        )

    return enough


def preempt_for(state: Preempting, key: Key, *, quota_blocked: bool = False) -> list[Key]:
    """Preempt for the waiting job `key` if a plan exists (see the module docstring); the victims.
    `quota_blocked`: its own quota has no room for it (it may take it from its quota's
    lower-priority jobs, as Kueue's `withinClusterQueue` preemption does)."""
    claims, cache = state.claims, state.cache
    if claims.preempting.get(key):
        return []  # its victims are still stopping: the room is nominated for it
    token = state.epoch()
    if claims.preempt_tried.get(key) == token:
        return []
    claims.preempt_tried[key] = token
    tracked = state.admission.jobs.get(key)
    pg = cache.objects.get_of(PodGroup, *key)
    if tracked is None or not isinstance(pg, PodGroup):
        return []
    cfg = state.admission.queue.config_of(tracked.job.queue)
    me = Preemptor(tracked.job.priority, tracked.job.submit_time, policy=cfg.preemption_policy)
    if me.policy == "Never":
        return []
    lowest = state.admission.running.lowest()  # kept as jobs start and stop (`RunningPriorities`)
    if lowest is None or lowest > me.priority or (lowest == me.priority and me.policy == "LowerPriority"):
        return []  # nobody it may preempt (cheap: most waiting jobs stop here)
    candidates = _candidates(state, key, me)
    if not candidates:
        return []
    members, waiting_for = cache.groups.members(pg, lambda k: cache.objects.get_of(PodGroup, *k))
    if waiting_for or len(members) > 1:
        return []  # gang groups are not preempted for (their placement spans PodGroups)
    snap = cache.snapshot
    gang = build_gang(
        members, placed={key: snap.placed_pods(key)}, classes=snap.class_names, cache=cache.shapes
    )
    if not gang.parts:
        return []
    running = {c.key: (dict(c.labels), len(c.pods)) for c in candidates}
    count = violation_counter(cache.objects.list_of(PodDisruptionBudget), running)
    held = claims.holds.arrays(
        snap.node_rows.index, snap.n, exclude={key}, priority=me.priority, submitted=tracked.job.submit_time
    )
    enough = _quota_room(state, key) if quota_blocked else None
    if quota_blocked and enough is None:
        return []
    shrink = None
    if enough is None:  # elastic jobs give up replicas above their minimum first (`elastic`)
        shrink = shrink_plan(
            snap,
            gang,
            state.profile,
            candidates,
            surplus=lambda k: _surplus(state, k),
            violations=count,
            held=held,
        )
    lost = 0.0
    if shrink is not None:
        placement = shrink.placement
        victims = list(shrink.pods)
        for victim, pods in shrink.pods.items():
            message = victim_message(victim, key, me.priority)
            lost += evict(state, victim, message=message, reason="priority", pods=pods)
    else:
        plan = select_victims(
            snap, gang, state.profile, candidates, violations=count, held=held, enough=enough
        )
        if plan is None:
            return []
        placement = plan.placement
        victims = [v.key for v in plan.victims]
        for victim in victims:
            lost += evict(state, victim, message=victim_message(victim, key, me.priority), reason="priority")
    # nominate: the room the planned placement takes is held for the preemptor
    room: dict[str, tuple[int, int, int]] = {}
    for pp in placement.pods:
        g, c, m = room.get(pp.node, (0, 0, 0))
        room[pp.node] = (
            g + (0 if pp.shape.shared else len(pp.gpus)),
            c + pp.shape.cpu_milli,
            m + pp.shape.mem_mib,
        )
    claims.holds.drop(key)
    claims.holds.set(
        Hold(
            owner=key,
            cause="nomination",
            nodes=room,
            until=state.now + claims.nomination_seconds,
            priority=me.priority,
            submitted=tracked.job.submit_time,
            queue=tracked.job.queue,
        )
    )
    claims.preempting[key] = set(victims)
    state.recorder.status(
        pg,
        phase="Pending",
        reason="Nominated",
        message=(
            f"preempted {len(victims)} lower-priority job{'s' if len(victims) != 1 else ''}; waiting for "
            f"{'them' if len(victims) != 1 else 'it'} to stop, the room on {', '.join(sorted(room))} is held for it"
        ),
        placed=0,
        now=state.utcnow,
    )
    own = [v[1] for v in victims if v[0] == key[0]]  # other namespaces' job names are not shown
    others = len(victims) - len(own)
    named = ", ".join([*own, *([f"{others} of other teams"] if others else [])])
    state.recorder.event(
        pg,
        reason="Preempting",
        message=(
            f"preempted {len(victims)} lower-priority job{'s' if len(victims) != 1 else ''} ({named}; "
            f"{lost:.2f} GPU-hours of work lost); their room on {', '.join(sorted(room))} is held for it"
        ),
        now=state.utcnow,
    )
    return victims
