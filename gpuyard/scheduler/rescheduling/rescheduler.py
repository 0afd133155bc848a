"""The defragmenting rescheduler: moves small running jobs so a waiting multi-GPU job fits.

It runs inside the scheduler's synchronous core (it writes only what the scheduler owns:
Reservations and PodGroup status) — periodically when `scheduler.rescheduler.enabled`, and on
request (`POST /api/v1/scheduler:reschedule[?dryRun=true]`, `gpuyard reschedule [--dry-run]`:
the scheduling loop hands the request over with :meth:`Rescheduler.ask`, and the run answers
through the reply it was given). A run:

1. reads the snapshot and the PodGroups into plain data (`inputs.py`): each node's
   free GPUs, CPU and memory;
   the jobs waiting `Unschedulable` for at least `min_wait` seconds whose pods need several whole
   GPUs each (oldest first); the *movers*: placed jobs with every pod on one node, whole GPUs,
   no NICs or host ports, not being evicted or moved, not annotated `gpuyard.io/migratable:
   "false"`, of a priority no higher than the waiting job's, moved fewer than
   `max_migrations_per_job_per_hour` times in the last hour; their cost (`migration_cost`: GPUs
   x time since the last checkpoint, `gpuyard.io/checkpoint-interval`, else since they started);
2. asks the pure planner (`plans.plan_defrag`) for the cheapest moves, within
   `max_migrations_per_cycle` jobs and `max_gpu_hours_lost_per_hour`;
3. executes each move **reservation first**: a Reservation `<pod>.next` (label
   `gpuyard.io/migrating-pod`) at the new place is assumed and written, and only once it is
   stored is `status.evictions[pod]` written (reason `Migrated ...`) with an Event on the mover
   and one on the beneficiary. The operator stops the pod (no restart counted) and releases the
   old Reservation (`spec.release`), as for any eviction, and ignores `.next` Reservations;
4. *promotion* (:meth:`Rescheduler.promote`, called by the core when it handles a PodGroup):
   once a pod's old Reservation is deleted, its eviction is cleared, then its Reservation is
   written again under the pod's own name at the new place and the `.next` one deleted; the
   operator creates the pod there. The room the movers leave on the target node is *held* in the
   snapshot (never written) until every move of the plan is done (or `hold_timeout` passes), so
   no other job takes it before the waiting job.

Dry runs plan and change nothing. Each moved job is counted in the recorder's tally (the loop
turns it into `gpuyard_migrations_total`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import LABEL_MIGRATING_POD, PodGroup, Reservation
from gpuyard.scheduler.cache.assuming import event_about
from gpuyard.scheduler.decisions import PlaceGang
from gpuyard.scheduler.rescheduling.inputs import (
    ANNOTATION_CHECKPOINT_INTERVAL,
    ANNOTATION_MIGRATABLE,
    NEXT_SUFFIX,
    movable_jobs,
    node_rooms,
    waiting_jobs,
)
from gpuyard.scheduler.rescheduling.plans import DefragPlan, NodeRoom, plan_defrag
from gpuyard.state.config import ReschedulerConfig

if TYPE_CHECKING:
    from gpuyard.scheduler.rescheduling.needs import Rescheduling

__all__ = [
    "ANNOTATION_CHECKPOINT_INTERVAL",
    "ANNOTATION_MIGRATABLE",
    "LABEL_MIGRATING_POD",
    "NEXT_SUFFIX",
    "Rescheduler",
    "Result",
]

log = structlog.get_logger(__name__)

Key = tuple[str, str]
_HOLD_GROUP = ("", "gpuyard.rescheduler.hold")  # snapshot-only entries: never a PodGroup
HOUR = 3600.0
Result = dict[str, Any]
"""A run's plan as plain JSON (`Rescheduler.run`)."""


@dataclass(slots=True)
class _InFlight:
    pods: set[Key]  # (namespace, pod) still moving
    holds: list[Key] = field(default_factory=list)  # snapshot entries holding the freed room
    since: float = 0.0


@dataclass(slots=True)
class _Request:
    dry_run: bool
    reply: Callable[[Result], None]


class Rescheduler:
    """Plans and executes migrations inside the scheduler core (see the module docstring)."""

    def __init__(self, config: ReschedulerConfig) -> None:
        self.config = config
        self.last_run: float | None = None
        self.history: dict[Key, deque[float]] = {}  # job -> times it was moved
        self.lost: deque[tuple[float, float]] = deque()  # (time, GPU-hours) of each move
        self.moved_at: dict[Key, datetime] = {}
        self.inflight: dict[Key, _InFlight] = {}  # beneficiary -> moves under way
        self.requests: list[_Request] = []
        self.migrations = 0
        self.gpu_hours_lost = 0.0

    # --- when -------------------------------------------------------------------------------

    def due(self, now: float) -> bool:
        if self.requests or any(now - f.since >= self.config.hold_timeout for f in self.inflight.values()):
            return True
        return self.config.enabled and (self.last_run is None or now - self.last_run >= self.config.interval)

    def next_due(self, now: float) -> float | None:
        """When the next periodic run (or a hold's timeout) is due (None: never)."""
        times = [f.since + self.config.hold_timeout for f in self.inflight.values()]
        if self.config.enabled:
            times.append(now if self.last_run is None else self.last_run + self.config.interval)
        return min(times) if times else None

    def ask(self, *, dry_run: bool, reply: Callable[[Result], None]) -> None:
        """Ask for a run at the next `tick` (the loop starts a cycle); `reply` gets its result."""
        self.requests.append(_Request(dry_run, reply))

    # --- a run -------------------------------------------------------------------------------

    def tick(self, state: Rescheduling) -> None:
        """Run the requests, then the periodic run if due; give up holds that timed out."""
        now = state.now
        for beneficiary, flight in list(self.inflight.items()):
            if state.cache.objects.get_of(PodGroup, *beneficiary) is None:  # gone: nobody to hold room for
                self._release(state, beneficiary)
            elif now - flight.since >= self.config.hold_timeout:
                log.info("reschedule.hold_timeout", job=f"{beneficiary[0]}/{beneficiary[1]}")
                self._release(state, beneficiary)
        requests, self.requests = self.requests, []
        for req in requests:
            req.reply(self.run(state, dry_run=req.dry_run))
        if self.config.enabled and (self.last_run is None or now - self.last_run >= self.config.interval):
            self.run(state, dry_run=False)

    def run(self, state: Rescheduling, *, dry_run: bool) -> Result:
        """Plan (and unless `dry_run`, execute) within the limits; the plan as plain JSON."""
        now = state.now
        if not dry_run:
            self.last_run = now
        self._expire(now)
        plans = self.plan(state)
        if not dry_run:
            for plan in plans:
                self._execute(state, plan)
        moves = [
            {
                "job": f"{m.job[0]}/{m.job[1]}",
                "pod": m.pod,
                "from": {"node": m.from_node, "gpus": list(m.from_gpus)},
                "to": {"node": m.to_node, "gpus": list(m.to_gpus)},
                "costGpuHours": round(m.cost, 4),
                "for": f"{p.beneficiary[0]}/{p.beneficiary[1]}",
            }
            for p in plans
            for m in p.moves
        ]
        beneficiaries = [f"{p.beneficiary[0]}/{p.beneficiary[1]}" for p in plans]
        message = (
            f"{len({(m['job']) for m in moves})} job(s) to move for {', '.join(beneficiaries)}"
            if plans
            else "no job waits on fragmentation alone, or no move is allowed within the limits"
        )
        return {"dryRun": dry_run, "moves": moves, "beneficiaries": beneficiaries, "message": message}

    def plan(self, state: Rescheduling) -> list[DefragPlan]:
        """The plans of one run, within the per-run, per-job and GPU-hour limits."""
        cfg, cache, rec = self.config, state.cache, state.recorder
        nodes = node_rooms(cache.snapshot)
        limit = cfg.max_migrations_per_job_per_hour
        movers_all = movable_jobs(
            cache,
            rec,
            utcnow=state.utcnow,
            moved_too_often=lambda key: len(self.history.get(key, ())) >= limit,
            moved_at=self.moved_at,
        )
        budget_jobs = cfg.max_migrations_per_cycle
        budget_hours = cfg.max_gpu_hours_lost_per_hour - sum(h for _, h in self.lost)
        plans: list[DefragPlan] = []
        for waiting, priority in waiting_jobs(
            cache, rec, utcnow=state.utcnow, min_wait=cfg.min_wait, skip=self.inflight
        ):
            if budget_jobs <= 0:
                break
            movers = [m for m, prio in movers_all if prio <= priority]
            plan = plan_defrag(waiting, list(nodes.values()), movers, max_movers=budget_jobs)
            if plan is None or plan.cost > budget_hours + 1e-9:
                continue
            plans.append(plan)
            budget_jobs -= len(plan.movers)
            budget_hours -= plan.cost
            moved = set(plan.movers)
            movers_all = [(m, p) for m, p in movers_all if m.key not in moved and m.node not in plan.targets]
            for target in plan.targets:
                nodes.pop(target, None)
            for move in plan.moves:
                room = nodes.get(move.to_node)
                if room is not None:
                    nodes[move.to_node] = NodeRoom(
                        room.name,
                        tuple(g for g in room.free if g not in move.to_gpus),
                        room.gpus,
                        room.cpu_free,
                        room.mem_free,
                    )
        return plans

    # --- reading the state -------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        while self.lost and now - self.lost[0][0] >= HOUR:
            self.lost.popleft()
        for key, times in list(self.history.items()):
            while times and now - times[0] >= HOUR:
                times.popleft()
            if not times:
                del self.history[key]

    # --- executing ---------------------------------------------------------------------------

    def _execute(self, state: Rescheduling, plan: DefragPlan) -> None:
        rec, cache, now, utcnow = state.recorder, state.cache, state.now, state.utcnow
        snap = cache.snapshot
        ben = plan.beneficiary
        flight = self.inflight[ben] = _InFlight(pods=set(), since=now)
        per_job: dict[Key, list[Reservation]] = {}
        why: dict[Key, list[str]] = {}
        for move in plan.moves:
            ns = move.job[0]
            old = cache.objects.get_of(Reservation, ns, move.pod)
            row = snap.index.get(move.to_node)
            if not isinstance(old, Reservation) or row is None:
                continue
            new = Reservation(
                metadata=ObjectMeta(
                    name=move.pod + NEXT_SUFFIX,
                    namespace=ns,
                    labels={**old.metadata.labels, LABEL_MIGRATING_POD: move.pod},
                    owner_references=list(old.metadata.owner_references),
                ),
                spec=old.spec.model_copy(
                    update={
                        "node": move.to_node,
                        "gpus": list(move.to_gpus),
                        "gpu_ids": [snap.gpu_id(row, i) for i in move.to_gpus],
                        "local_peers": [],
                    }
                ),
            )
            snap.upsert_reservation(new)
            per_job.setdefault(move.job, []).append(new)
            why.setdefault(move.job, []).append(
                f"{move.pod}: {move.from_node} GPUs {list(move.from_gpus)} -> {move.to_node} GPUs {list(move.to_gpus)}"
            )
            flight.pods.add((ns, move.pod))
        costs = {m.job: m.cost for m in plan.moves if m.cost}
        for job, reservations in per_job.items():
            pg = cache.objects.get_of(PodGroup, *job)
            if not isinstance(pg, PodGroup):
                continue
            cache.assumed(reservations)
            decision = PlaceGang(key=job, members=(job,), reservations=reservations)
            reason = f"Migrated: moved to defragment GPUs for {ben[0]}/{ben[1]}"
            view = rec.view(pg)
            view.evictions = {
                **view.evictions,
                **{r.metadata.name.removesuffix(NEXT_SUFFIX): reason for r in reservations},
            }
            held = len(snap.placed_pods(job))
            rec.status(
                pg,
                phase="Placed",
                reason="Migrating",
                message=f"moving to free room for {ben[0]}/{ben[1]}",
                placed=held,
                now=utcnow,
                into=decision.then,
                extra={"evictions": dict(view.evictions)},
            )
            lost = costs.get(job, 0.0)
            decision.then.append(
                event_about(
                    pg,
                    reason="Migrated",
                    message=f"moved by the rescheduler for {ben[0]}/{ben[1]} ({'; '.join(why[job])}); "
                    f"about {lost:.2f} GPU-hours since the last checkpoint are redone",
                    type_="Warning",
                    now=utcnow,
                )
            )
            rec.out.append(decision)
            self.history.setdefault(job, deque()).append(now)
            self.moved_at[job] = utcnow
            self.lost.append((now, lost))
            self.gpu_hours_lost += lost
            self.migrations += 1
            rec.tally.migrated()
            log.info(
                "job.migrating",
                job=f"{job[0]}/{job[1]}",
                beneficiary=f"{ben[0]}/{ben[1]}",
                cost=round(lost, 3),
            )
        beneficiary = cache.objects.get_of(PodGroup, *ben)
        if isinstance(beneficiary, PodGroup) and per_job:
            names = ", ".join(f"{k[0]}/{k[1]}" for k in per_job)
            rec.event(
                beneficiary,
                reason="Migrating",
                message=f"the rescheduler moves {names} to free {', '.join(plan.targets)} for this job "
                f"(about {plan.cost:.2f} GPU-hours redone)",
                now=utcnow,
            )
        if not flight.pods:
            del self.inflight[ben]

    def promote(self, state: Rescheduling, pg: PodGroup, held: dict[str, str]) -> dict[str, str]:
        """Pods whose old Reservation is gone get their `.next` one under their own name (their
        eviction cleared first); the room they left is held for the beneficiary. The pods held now."""
        nexts = [n for n in held if n.endswith(NEXT_SUFFIX) and n.removesuffix(NEXT_SUFFIX) not in held]
        if not nexts:
            return held
        ns = pg.metadata.namespace
        key = (ns, pg.metadata.name)
        rec, cache = state.recorder, state.cache
        created: list[Reservation] = []
        gone: list[Reservation] = []
        for name in nexts:
            res = cache.objects.get_of(Reservation, ns, name)
            if not isinstance(res, Reservation):
                continue  # not seen back from the store yet
            pod = name.removesuffix(NEXT_SUFFIX)
            labels = {k: v for k, v in res.metadata.labels.items() if k != LABEL_MIGRATING_POD}
            created.append(
                Reservation(
                    metadata=ObjectMeta(
                        name=pod,
                        namespace=ns,
                        labels=labels,
                        owner_references=list(res.metadata.owner_references),
                    ),
                    spec=res.spec.model_copy(),
                )
            )
            gone.append(res)
            self._hold(state, ns, pod)
        if not created:
            return held
        done = {r.metadata.name for r in created}
        view = rec.view(pg)
        rec.evictions(pg, {p: w for p, w in view.evictions.items() if p not in done})  # before the new ones
        for res in gone:  # deleted below, after the new ones are written
            cache.snapshot.remove_reservation((ns, res.metadata.name))
        for res in created:
            cache.snapshot.upsert_reservation(res)
        cache.assumed(created)
        rec.out.append(PlaceGang(key=key, members=(key,), reservations=created))
        for res in gone:
            cache.forget_reservation(ns, res.metadata.name, res.metadata.uid)
        return cache.snapshot.placed_pods(key)

    def _hold(self, state: Rescheduling, ns: str, pod: str) -> None:
        """The pod's old room (its Reservation is being deleted) is held for its beneficiary."""
        for ben, flight in list(self.inflight.items()):
            if (ns, pod) not in flight.pods:
                continue
            flight.pods.discard((ns, pod))
            old = state.cache.objects.get_of(Reservation, ns, pod)
            if isinstance(old, Reservation) and not old.metadata.name.endswith(NEXT_SUFFIX):
                hold = Reservation(
                    metadata=ObjectMeta(name=f"{ns}.{pod}", namespace=_HOLD_GROUP[0]),
                    spec=old.spec.model_copy(update={"pod_group": _HOLD_GROUP[1]}),
                )
                state.cache.snapshot.upsert_reservation(hold)
                flight.holds.append((_HOLD_GROUP[0], hold.metadata.name))
            if not flight.pods:
                self._release(state, ben)

    def _release(self, state: Rescheduling, beneficiary: Key) -> None:
        """Give the held room back (all moves done, or the hold timed out)."""
        flight = self.inflight.pop(beneficiary, None)
        if flight is None:
            return
        for key in flight.holds:
            state.cache.snapshot.remove_reservation(key)
