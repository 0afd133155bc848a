"""Reclaim: give a quota back its guarantee by preempting jobs that borrowed it.

When a waiting job fits its quota's min and runtime (`Admission.owed`) but cannot start —
the cluster has no room, or an ancestor (the cluster itself) is full — the borrowers hold the
room. For a one-pod job of several GPUs the victims are chosen on one node, so that the room is
where the pod can use it (`quota.node_victims.plan_node_reclaim`); other jobs, or when no node
plan exists, get the cluster-wide plan. After `scheduler.reclaim_delay` seconds of that (Koordinator waits 120 s; 0 in tests),
:class:`Reclaimer` asks the pure :func:`plan_reclaim` for victims (whole gangs, lowest priority
first, newest first, never non-preemptible ones) and executes the plan **through the store**:

* it deletes every Reservation of each victim. The job operator already treats a running pod
  whose reservation disappeared as preempted: it stops the pod, marks the job `Restarting`
  ("lost their placement") without counting a restart, and creates the pods again once the
  scheduler places the PodGroup anew — the job is requeued, not failed;
* the victim's PodGroup goes back to `Pending` (reason `Preempted`), it returns to its queue
  keeping its submission time, and its quota charge is released at once;
* Kubernetes-style Events are recorded on the victim ("Preempted: reclaimed by quota team-a
  (min 16)") and on the beneficiary ("Reclaiming: preempted 2 jobs of borrowing quotas ...").

The scheduler never imports the operator; the store is the only channel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import structlog

from gpuyard.apis.core import GPU_RESOURCE
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.assuming import record_event, write_status
from gpuyard.scheduler.gatekeeping import Admission
from gpuyard.scheduler.quota import ReclaimPlan, RunningJob, plan_reclaim
from gpuyard.scheduler.quota.node_victims import plan_node_reclaim
from gpuyard.scheduler.quota.resources import format_amount
from gpuyard.scheduler.snapshot import Snapshot
from gpuyard.state.store import NotFound, Store

__all__ = ["Reclaimer"]

log = structlog.get_logger(__name__)

Key = tuple[str, str]


@dataclass(slots=True)
class Reclaimer:
    """Waits `delay` seconds per owed job, then executes a reclaim plan (see the module docstring)."""

    store: Store
    delay: float = 0.0
    events: bool = True
    owed_since: dict[Key, float] = field(default_factory=dict)
    preempted: int = 0
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

    def consider(
        self,
        adm: Admission,
        key: Key,
        *,
        now: float,
        utcnow: datetime,
        epoch: int,
        snapshot: Snapshot,
        owed: bool | None = None,
    ) -> list[Key]:
        """The waiting job `key` could not start: reclaim for it if it is owed and has waited
        `delay`. Returns the preempted jobs (empty when nothing was done). `owed` is
        `adm.owed(key)` when the caller already knows it (same shape, same state)."""
        if not (adm.owed(key) if owed is None else owed):
            self.forget(key)
            return []
        since = self.owed_since.setdefault(key, now)
        if now - since < self.delay:
            return []
        charge = adm.quotas.charge(key)
        if charge is None:
            return []
        if self._tried_epoch.get(charge.quota) == epoch:
            return []  # one plan per quota per state of the cluster
        self._tried_epoch[charge.quota] = epoch
        running = adm.running_jobs()
        # a one-pod job of several GPUs needs the room on one node: take it there if possible
        plan = self._node_plan(adm, key, charge.quota, charge.usage, running, snapshot)
        if plan is None:
            plan = plan_reclaim(adm.tree, owner=charge.quota, need=charge.usage, running=running)
        if not plan.feasible or not plan.victims:
            if plan.reason:
                log.debug("reclaim.infeasible", job=f"{key[0]}/{key[1]}", reason=plan.reason)
            return []
        return self._execute(adm, key, plan, utcnow=utcnow, snapshot=snapshot)

    def _node_plan(
        self,
        adm: Admission,
        key: Key,
        quota: str,
        usage: Mapping[str, int],
        running: list[RunningJob],
        snapshot: Snapshot,
    ) -> ReclaimPlan | None:
        """For a one-pod job of plain GPUs without node constraints: victims on one node."""
        gpus = usage.get(GPU_RESOURCE, 0)
        if gpus <= 1 or any(r != GPU_RESOURCE and "/" in r and a > 0 for r, a in usage.items()):
            return None  # one GPU always fits where one is free; class requests are left alone
        pg = self.store.get("PodGroup", *key)
        if not isinstance(pg, PodGroup) or sum(r.replicas for r in pg.spec.roles) != 1:
            return None
        spec = pg.spec.roles[0].template
        if spec.node_selector or spec.affinity is not None or spec.tolerations:
            return None
        ok = snapshot.alive & snapshot.ready & snapshot.schedulable & ~snapshot.tainted
        ok &= snapshot.gpu_healthy_count >= gpus
        room = {snapshot.names[r]: int(snapshot.gpu_whole_free[r]) for r in np.flatnonzero(ok)}
        plan = plan_node_reclaim(
            adm.tree, owner=quota, gpus=gpus, running=running, held=snapshot.group_gpus, room=room
        )
        return plan if plan.feasible and plan.victims else None

    def _execute(
        self, adm: Admission, owner_key: Key, plan: ReclaimPlan, *, utcnow: datetime, snapshot: Snapshot
    ) -> list[Key]:
        tree = adm.tree
        mins = ", ".join(
            f"min {format_amount(r, tree.min(plan.owner).get(r, 0))}"
            + ("" if r == "nvidia.com/gpu" else f" {r}")
            for r in sorted(plan.need)
        )
        done: list[Key] = []
        for victim in plan.victims:
            key: Key = victim.job.key  # type: ignore[assignment]
            for pod in snapshot.placed_pods(key):
                try:
                    self.store.delete("Reservation", key[0], pod)
                except NotFound:
                    pass
            adm.requeue(key)
            done.append(key)
            message = (
                f"reclaimed by quota {plan.owner} ({mins}) for {owner_key[0]}/{owner_key[1]}: {victim.reason}"
            )
            pg = self.store.get("PodGroup", *key)
            if isinstance(pg, PodGroup):
                write_status(
                    self.store,
                    key,
                    phase="Pending",
                    reason="Preempted",
                    message=message,
                    placed=0,
                    attempts=pg.status.attempts,
                    now=utcnow,
                )
                if self.events:
                    record_event(
                        self.store,
                        podgroup=pg,
                        reason="Preempted",
                        message=message,
                        type_="Warning",
                        now=utcnow,
                    )
            log.info(
                "job.preempted",
                job=f"{key[0]}/{key[1]}",
                quota=plan.owner,
                beneficiary=f"{owner_key[0]}/{owner_key[1]}",
            )
        self.preempted += len(done)
        owner = self.store.get("PodGroup", *owner_key)
        if self.events and isinstance(owner, PodGroup):
            names = ", ".join(f"{k[0]}/{k[1]}" for k in done)
            record_event(
                self.store,
                podgroup=owner,
                reason="Reclaiming",
                message=f"quota {plan.owner} ({mins}) takes back borrowed capacity: preempted {names}",
                now=utcnow,
            )
        self.forget(owner_key)
        return done
