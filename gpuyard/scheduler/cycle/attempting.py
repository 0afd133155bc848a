"""One cycle's walk over the queues, and each attempt: a PodGroup (with its gang group) is
placed and assumed, or set aside.

A :class:`Walk` takes the FairQueue's candidates in order; `offer` checks quota and
ResourceQuota admission first (a blocked job is parked with the cause and may reclaim borrowed
capacity when its quota is owed its min, `preempting`), then tries to place it.

`schedule_one(state, key)` reads the PodGroup from the core's objects, holds back a gang whose
`minResources` the free capacity does not cover (`minresources`), builds the plain gang
request (`gang_requests.build_gang`), answers from the per-epoch "does not fit" cache when the
same shape failed since the snapshot last changed, else calls the pure `place()`. A placement
is *assumed* at once (`assuming.assume`: its Reservations recorded in the snapshot) and becomes
a :class:`~gpuyard.scheduler.decisions.PlaceGang` with the `Placed` statuses and `Scheduled`
events to write after it; a gang that does not start is parked with a readable reason. It is
synchronous: between taking a job and recording its placement nothing else runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog

from gpuyard.apis.resourceclasses import RequestError
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.admission.gatekeeping import JobShape
from gpuyard.scheduler.admission.recording import Key, is_complete
from gpuyard.scheduler.cache.assuming import assume
from gpuyard.scheduler.cache.holds import HeldArrays
from gpuyard.scheduler.cycle.backfilling import Capacity, never_fits, plan_head
from gpuyard.scheduler.cycle.faults import FAULT_REASON, fault_of
from gpuyard.scheduler.cycle.memo import GangSignature, Walk
from gpuyard.scheduler.cycle.topowait import TopologyWait, topology_wait
from gpuyard.scheduler.decisions import PlaceGang
from gpuyard.scheduler.gangs.outcomes import Placement, Refusal, Unschedulable
from gpuyard.scheduler.gangs.requests import GangRequest, PodShape, build_gang
from gpuyard.scheduler.placement.framework import CycleState
from gpuyard.scheduler.placement.minresources import MIN_RESOURCES, min_resources_short
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.preemption.priority import preempt_for

if TYPE_CHECKING:
    from gpuyard.scheduler.cycle.needs import Cycling

__all__ = ["Walk", "backoff", "invalid_request", "offer", "retry_partial", "schedule_one", "waiting"]

log = structlog.get_logger(__name__)


def offer(state: Cycling, walk: Walk, job: Any) -> None:
    """Quota admission, then an attempt to place; the walk hears how it went."""
    adm, candidates = state.admission, walk.candidates
    key: Key = job.key
    state.memo.positions[key] = walk.seen.get(job.queue, 0)
    walk.seen[job.queue] = state.memo.positions[key] + 1
    state.parking.unpark(key)
    pg = state.cache.objects.get_of(PodGroup, *key)
    if isinstance(pg, PodGroup) and state.recorder.evicting(pg):
        # its stopped pods still hold their room; its `Preempted` status stands until released
        candidates.blocked(job, "", reserve=False)
        state.admission.queue.park(key, epoch=state.epoch(), reserve=False)
        return
    try:
        never = never_placed(state, key, pg) if isinstance(pg, PodGroup) else None
        if adm.never_fits(key, never is not None):
            walk.verdicts.clear()  # quota runtimes changed
        if never is not None:
            # the most fundamental reason: no quota, preemption or held room can help it; the
            # attempt says why in full (`place`), and the job holds and protects nothing
            state.claims.holds.drop(key)
            token, _, told = state.memo.never_jobs[key]
            if told:  # its status says so already: the change that woke it cannot have helped
                candidates.blocked(job, "", reserve=False)
                state.admission.queue.park(key, epoch=state.epoch(), reserve=False)
                return
            outcome = schedule_one(state, key)
            if outcome is None:
                state.admission.queue.park(key, epoch=state.epoch(), reserve=False)
            elif isinstance(outcome, Placement):  # cannot be (`never_fits` is conservative)
                candidates.placed(job)
            else:
                candidates.blocked(job, outcome.full_message(), reserve=False)
                state.memo.never_jobs[key] = (token, never, True)
            return
        shape = adm.shape(key)
        known = walk.verdicts.get(shape) if shape is not None else None
        refusal = known[0] if known is not None else adm.check(key)
        if refusal is not None:
            candidates.blocked(job, refusal.message, reserve=False)
            quota_blocked(state, key, refusal, shape=shape)
            outcome = None
            if (
                refusal.code != "ResourceQuotaExceeded"
                and not (known[1] if known is not None else adm.owed(key))  # same shape, same state
                and preempt_for(state, key, quota_blocked=True)
            ):
                walk.verdicts.clear()
        else:
            # the first job of the cycle that waits for room becomes the protected head
            head = candidates.head is None and state.admission.queue.backfill
            outcome = schedule_one(state, key, head=head)
            if outcome is None:  # gone, suspended, or nothing to place: a change brings it back
                state.admission.queue.park(key, epoch=state.epoch(), reserve=False)
            if isinstance(outcome, Placement):
                candidates.placed(job)
                walk.verdicts.clear()
            elif (
                outcome is not None
                and outcome.reason == "Unschedulable"
                and not outcome.never
                and preempt_for(state, key)
            ):
                candidates.blocked(job, outcome.full_message(), reserve=False)
                walk.verdicts.clear()
                outcome = None  # no reclaim on top: the room is coming
            else:
                why = outcome.full_message() if outcome is not None else ""
                reserve = outcome is not None and outcome.reason != MIN_RESOURCES  # gated: holds nothing
                candidates.blocked(job, why, reserve=reserve)
        if outcome is not None or refusal is not None:
            if refusal is not None and shape is not None and known is None:
                known = walk.verdicts[shape] = (refusal, adm.owed(key))
            if maybe_reclaim(state, key, owed=known[1] if known is not None else None):
                walk.verdicts.clear()
    except RequestError as exc:  # a request of this job that no cycle can read: retrying cannot help
        invalid_request(state, key, f"{exc.resource}: {exc.reason}")
        walk.verdicts.clear()
    except Exception:  # a bug (never the job's fault): logged, and the job retried later
        log.exception("scheduler.cycle_failed", job=f"{key[0]}/{key[1]}")
        state.admission.queue.backoff(key, until=state.now + state.recorder.backoff_delay(key))
        walk.verdicts.clear()


def invalid_request(state: Cycling, key: Key, message: str) -> None:
    """Fail the attempt for good: the PodGroup says why (`InvalidRequest`) and the job is set
    aside until it or the cluster changes, instead of failing again every cycle."""
    log.warning("scheduler.invalid_request", job=f"{key[0]}/{key[1]}", error=message)
    state.admission.queue.park(key, epoch=state.epoch(), reason=message, reserve=False)
    pg = state.cache.objects.get_of(PodGroup, *key)
    if isinstance(pg, PodGroup):
        _not_placed(state, [pg], Unschedulable(reason="InvalidRequest", message=message))


def retry_partial(state: Cycling) -> None:
    """Running jobs with pods still unplaced (elastic minimum, failover): try again when the
    cluster changed since their last try. Owners whose reclaim delay ended are tried again."""
    for key in state.claims.reclaimer.due(state.now):
        job = state.admission.queue.get(key)
        if job is not None and state.admission.queue.is_held(key):
            state.admission.queue.add(job)
    epoch = state.epoch()
    for key, tried in list(state.memo.partial.items()):
        if tried < epoch and key in state.memo.partial:
            state.memo.partial[key] = epoch
            schedule_one(state, key)


def maybe_reclaim(state: Cycling, key: Key, *, owed: bool | None = None) -> bool:
    """Reclaim for `key` if it is owed; whether jobs were preempted."""
    return bool(state.claims.reclaimer.consider(state, key, owed=owed))


def quota_blocked(state: Cycling, key: Key, refusal: Refusal, *, shape: JobShape | None = None) -> None:
    state.admission.queue.park(key, epoch=state.epoch(), reason=refusal.message, reserve=False)
    state.parking.park(key, shape)
    pg = state.cache.objects.get_of(PodGroup, *key)
    if not isinstance(pg, PodGroup):
        return
    state.recorder.attempted(pg)
    waiting(state, pg, refusal.code, refusal.message, held=0)


def never_placed(state: Cycling, key: Key, pg: PodGroup) -> Unschedulable | None:
    """ "can never fit on this cluster: ..." (`backfilling.never_fits`) for a waiting job that
    holds nothing, else None. Asked before quota admission, since no quota could help it, and
    cached per job until the job or the cluster's nodes change."""
    snap = state.cache.snapshot
    if pg.spec.suspend or snap.placed_pods(key):
        return None
    token = (pg.metadata.generation, snap.static_version, snap.node_count)
    cached = state.memo.never_jobs.get(key)
    if cached is not None and cached[0] == token:
        return cached[1]
    result = None
    members, waiting_for = state.cache.groups.members(pg, lambda k: state.cache.objects.get_of(PodGroup, *k))
    if not waiting_for:
        try:
            gang = build_gang(
                members,
                placed={m.key[1:]: snap.placed_pods(m.key[1:]) for m in members},
                classes=snap.class_names,
                cache=state.cache.shapes,
            )
        except RequestError:
            gang = None  # said when it is tried (`schedule_one`)
        if gang is not None and gang.parts:
            message = never_fits(_capacity(state), gang, _signature(gang))
            if message is not None:
                result = Unschedulable(reason="Unschedulable", message=message, never=True)
    if len(state.memo.never_jobs) > 100_000:
        state.memo.never_jobs.clear()
    state.memo.never_jobs[key] = (token, result, False)
    return result


def waiting(state: Cycling, pg: PodGroup, code: str, cause: str, *, held: int, never: bool = False) -> None:
    """Why a queued job waits: its position and queue share, then the first blocking cause. The
    most fundamental reason comes first: "can never fit" (`never`), then a failed node or GPU its
    pods must move off (`faults`), then quota or room (`cause`)."""
    key = (pg.metadata.namespace, pg.metadata.name)
    fault = None if never else fault_of(state.cache.snapshot, pg)
    if fault is not None:
        code, cause = FAULT_REASON, f"{fault}; {cause}"
    where = None
    if state.admission.tenancy:
        job = state.admission.queue.get(key)
        qname = job.queue if job is not None else (pg.spec.queue or pg.metadata.namespace)
        pos = state.memo.positions.get(key)
        place_ = f"#{pos + 1} in queue {qname}" if pos is not None else f"queue {qname}"
        where = f"{place_} (share {state.admission.queue.share(qname):.2f})"
    state.recorder.waiting(pg, code, cause, held=held, now=state.now, utcnow=state.utcnow, where=where)


def backoff(state: Cycling, pg: PodGroup, message: str) -> None:
    key = (pg.metadata.namespace, pg.metadata.name)
    delay = state.recorder.backoff_delay(key)
    state.admission.queue.backoff(key, until=state.now + delay, reason=message)
    held = len(state.cache.snapshot.placed_pods(key))
    state.recorder.status(
        pg,
        phase="Placed" if held else "Pending",
        reason="AssumeFailed",
        message=f"{message}; retrying in {delay:g}s",
        placed=held,
        now=state.utcnow,
    )
    log.warning("job.assume_failed", job=f"{key[0]}/{key[1]}", error=message, retry_in=delay)


def schedule_one(state: Cycling, key: Key, *, head: bool = False) -> Placement | Unschedulable | None:
    """Try to place the PodGroup `key` (and its gang group) now; None when there is nothing to
    place (gone, suspended, complete, or stopped pods still hold their room).

    Room held for other gangs (`holds`) is not free to it. `head`: it is the cycle's protected
    head; if it does not fit, the room of its planned placement is held for it (`backfilling`)."""
    objects = state.cache.objects
    pg = objects.get_of(PodGroup, *key)
    if not isinstance(pg, PodGroup) or pg.spec.suspend:
        return None
    state.memo.generation[key] = pg.metadata.generation
    short = (
        None
        if state.cache.snapshot.placed_pods(key)
        else min_resources_short(state.cache.snapshot, pg.spec.min_resources)
    )
    if short is not None:  # Volcano's enqueue gate: not tried until free capacity covers it
        result = Unschedulable(reason=MIN_RESOURCES, message=short)
        _not_placed(state, [pg], result)
        state.claims.holds.drop(key)
        return result
    members, waiting_for = state.cache.groups.members(pg, lambda k: objects.get_of(PodGroup, *k))
    if any(state.recorder.evicting(m) for m in members):
        return None  # placed again once the operator released the evicted pods' Reservations
    if waiting_for:
        msg = f"waiting for gang-group members: {', '.join(waiting_for)}"
        result = Unschedulable(reason="WaitingForGangGroup", message=msg)
        _not_placed(state, members, result)
        return result
    snap = state.cache.snapshot
    try:
        gang = build_gang(
            members,
            placed={m.key[1:]: snap.placed_pods(m.key[1:]) for m in members},
            classes=snap.class_names,
            cache=state.cache.shapes,
        )
    except RequestError as exc:
        result = Unschedulable(reason="InvalidRequest", message=f"{exc.resource}: {exc.reason}")
        _not_placed(state, members, result)
        return result
    if not gang.parts:
        return None
    wait = topology_wait(gang, pg, profile=state.profile, snapshot=snap, utcnow=state.utcnow)
    if wait is not None and wait.waiting:  # its own choice: one node (or block) until its wait ends
        gang.topology_required = wait.level
    mine = {m.key[1:] for m in members}
    holder = any(state.claims.holds.get(k) is not None for k in mine)
    # its own hold makes its answer its own; so do others' holds (which apply by its queue order)
    waits = wait is not None and wait.waiting
    signature = None if holder or state.claims.holds or waits else _signature(gang)
    token = (snap.epoch, state.claims.holds.version)
    cached = state.memo.no_fit.get(signature) if signature is not None else None
    if cached is not None and cached[0] == token:
        result = _why_waiting(state, key, gang, cached[1], signature=signature, head=head, members=mine)
        _not_placed(state, members, result)
        return result
    cycle = CycleState(snap, gang, state.profile)
    # Held room: a job first goes around every hold of an owner not behind it by priority and
    # submit time; a job of a queue ahead of an owner by fair share takes that owner's room only
    # when nothing else fits (the queue order decides, as the walk and the liveness rule do).
    around = ahead = None
    if state.claims.holds:
        tracked = state.admission.jobs.get(key)
        duration = tracked.job.expected_duration if tracked is not None else None
        common: dict[str, Any] = {
            "exclude": mine,
            "ends_at": state.now + duration if duration is not None else None,
            "priority": tracked.job.priority if tracked is not None else None,
            "submitted": tracked.job.submit_time if tracked is not None else None,
        }
        around = state.claims.holds.arrays(snap.node_rows.index, snap.n, **common)
        ahead = state.claims.holds.arrays(
            snap.node_rows.index,
            snap.n,
            **common,
            queue=tracked.job.queue if tracked is not None else None,
            share=state.admission.queue.share,
        )
        if around is not None:
            cycle.data["held"] = around
    outcome: Placement | Unschedulable = place(snap, gang, state.profile, state=cycle)
    if isinstance(outcome, Unschedulable) and around is not None and not _same_room(around, ahead):
        cycle = CycleState(snap, gang, state.profile)
        if ahead is not None:
            cycle.data["held"] = ahead
        outcome = place(snap, gang, state.profile, state=cycle)
    if isinstance(outcome, Placement) and not outcome.pods:  # nothing required, nothing fits
        n = len(outcome.deferred)
        outcome = Unschedulable(
            reason="Unschedulable",
            message=f"none of the {n} pod{'s' if n != 1 else ''} above the minimum fits now; they wait for room",
        )
        _not_placed(state, members, outcome)
    elif isinstance(outcome, Placement):
        _commit(state, members, outcome, note=_wait_note(state, wait, outcome))
    else:
        if signature is not None:
            if len(state.memo.no_fit) > 10_000:
                state.memo.no_fit.clear()
            state.memo.no_fit[signature] = (token, outcome)
        outcome = _why_waiting(state, key, gang, outcome, signature=signature, head=head, members=mine)
        until = None
        if wait is not None and wait.waiting and not outcome.never:
            outcome = replace(outcome, notes=[*outcome.notes, f"It {wait.waiting_note()}."])
            until = state.now + max(0.0, (wait.until - state.utcnow).total_seconds())
        _not_placed(state, members, outcome, until=until)
    state.recorder.tally.attempt(pods=len(outcome.pods) if isinstance(outcome, Placement) else None)
    return outcome


def _why_waiting(
    state: Cycling,
    key: Key,
    gang: GangRequest,
    result: Unschedulable,
    *,
    signature: GangSignature | None,
    head: bool,
    members: set[Key],
) -> Unschedulable:
    """The explanation of a gang that does not fit now, completed: "can never fit on this
    cluster: ..." when no empty cluster of these nodes could hold it, and for the head the room
    held for its planned placement (`backfilling`)."""
    if result.reason != "Unschedulable":
        return result
    if result.never:  # `place` found it out already
        for k in members:
            state.claims.holds.drop(k)
        return result
    if signature is not None or head:
        never = never_fits(_capacity(state), gang, signature)
        if never is not None:
            for k in members:
                state.claims.holds.drop(k)
            return replace(result, message=never, notes=[], never=True)
    if not head:
        return result
    note = plan_head(state, key, gang, members=members)
    if not note:
        return result
    return replace(result, notes=[*result.notes, f"({note})"])


def _wait_note(state: Cycling, wait: TopologyWait | None, placement: Placement) -> str:
    """What a gang that had a topology wait says once placed: split after its wait, or placed in
    one domain after waiting (nothing when it got one domain at once)."""
    if wait is None:
        return ""
    rows = {pp.row for pp in placement.pods if pp.gpus}
    split = len(rows) > 1
    waited = max(0.0, wait.seconds - (wait.until - state.utcnow).total_seconds())
    if not split and waited < 1.0:
        return ""
    return wait.note(split=split, waited=waited)


def _commit(state: Cycling, members: list[PodGroup], placement: Placement, *, note: str = "") -> None:
    """Assume the placement and decide what to write: Reservations, then statuses and events.
    `note`: said after the placement's summary (a topology wait's outcome)."""
    owners = {m.key[1:]: m.metadata.uid for m in members}
    reservations = assume(state.cache.snapshot, placement, owners=owners)
    state.cache.assumed(reservations)
    decision = PlaceGang(
        key=placement.gang.key,
        members=tuple(m.key[1:] for m in members),
        reservations=reservations,
    )
    state.count_placed(decision)
    rec, now, utcnow = state.recorder, state.now, state.utcnow
    summary = placement.summary()
    by_member: dict[Key, int] = {}
    for pp in placement.pods:
        k = (pp.pod.namespace, pp.pod.group)
        by_member[k] = by_member.get(k, 0) + 1
    for m in members:
        key: Key = m.key[1:]
        state.claims.placed(key)  # its nomination or backfill hold is used now
        rec.failures.pop(key, None)
        held_pods = state.cache.snapshot.placed_pods(key)
        state.admission.start(key, now=now)
        state.parking.unpark(key)
        rec.last_cause.pop(key, None)
        if is_complete(m, held_pods):
            state.memo.partial.pop(key, None)
        else:
            state.memo.partial[key] = state.epoch()
        rec.status(
            m,
            phase="Placed",
            reason="Placed",
            message=placement.summary(held_pods, by_member.get(key, 0)) + (f"; {note}" if note else ""),
            placed=len(held_pods),
            now=utcnow,
            into=decision.then,
        )
        if by_member.get(key):
            nodes = placement.nodes
            rec.event(
                m,
                reason="Scheduled",
                message=f"{summary}: {', '.join(nodes[:8])}{' ...' if len(nodes) > 8 else ''}"
                + (f"; {note}" if note else ""),
                now=utcnow,
                into=decision.then,
            )
    rec.out.append(decision)
    log.info(
        "job.placed",
        job=f"{decision.key[0]}/{decision.key[1]}",
        pods=len(placement.pods),
        nodes=len(placement.nodes),
        deferred=len(placement.deferred),
    )


def _not_placed(
    state: Cycling,
    members: list[PodGroup],
    result: Unschedulable,
    *,
    reserve: bool = True,
    until: float | None = None,
) -> None:
    epoch = state.epoch()
    message = result.full_message()
    fits = state.admission.has_quotas and result.reason == "Unschedulable" and not result.never
    cause = f"fits quota, waiting for room: {message}" if fits else message
    reserve = reserve and not result.never  # a job that can never fit is nobody's head
    for m in members:
        key: Key = m.key[1:]
        state.admission.queue.park(key, epoch=epoch, reason=cause, reserve=reserve, until=until)
        state.parking.unpark(key)
        if key in state.memo.partial:
            state.memo.partial[key] = epoch
        held = len(state.cache.snapshot.placed_pods(key))
        state.recorder.attempted(m)
        waiting(state, m, result.reason, cause, held=held, never=result.never)


def _signature(gang: GangRequest) -> GangSignature | None:
    """Gangs with the same roles, shapes and counts fit or not alike within one epoch.

    None (do not cache) for gang groups and failover hints, whose explanations name more.
    """
    if len(gang.members) > 1:
        return None
    parts: list[tuple[str, PodShape, int, int]] = []
    for p in gang.parts:
        if any(pod.preferred_node for pod in p.pods):
            return None
        parts.append((p.role, p.shape, p.required, len(p.pods)))
    return tuple(parts)


def _capacity(state: Cycling) -> Capacity:
    """What `never_fits` reads: the snapshot, the profile and its per-shape answers."""
    return Capacity(state.cache.snapshot, state.profile, state.memo.never_fit)


def _same_room(a: HeldArrays | None, b: HeldArrays | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
