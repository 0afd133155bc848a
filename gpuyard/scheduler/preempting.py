"""Reclaim: give a quota back its guarantee by asking jobs that borrowed it to stop.

When a waiting job fits its quota's min and runtime (`Admission.owed`) but cannot start —
the cluster has no room, or an ancestor (the cluster itself) is full — the borrowers hold the
room. For a one-pod job of several GPUs the victims are chosen on one node, so that the room is
where the pod can use it (`quota.node_victims.plan_node_reclaim`); other jobs, or when no node
plan exists, get the cluster-wide plan. After `scheduler.reclaim_delay` seconds of that (Koordinator waits 120 s; 0 in tests),
:class:`Reclaimer` asks the pure :func:`plan_reclaim` for victims (whole gangs, lowest priority
first, newest first, never non-preemptible ones) and turns the plan into decisions:

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

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

import numpy as np
import structlog

from gpuyard.apis.core import GPU_RESOURCE
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.gatekeeping import Admission
from gpuyard.scheduler.objects import ObjectCache
from gpuyard.scheduler.quota import ReclaimPlan, RunningJob, plan_reclaim
from gpuyard.scheduler.quota.node_victims import plan_node_reclaim
from gpuyard.scheduler.quota.resources import format_amount
from gpuyard.scheduler.recording import Recorder
from gpuyard.scheduler.snapshot import Snapshot

__all__ = ["Reclaimer"]

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

    def consider(
        self,
        adm: Admission,
        key: Key,
        *,
        now: float,
        utcnow: datetime,
        epoch: int,
        snapshot: Snapshot,
        objects: ObjectCache,
        recorder: Recorder,
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
        if self._tried_epoch.get(charge.quota) == epoch or charge.quota in self.evicting:
            return []  # one plan per quota per state of the cluster; none while room is coming
        self._tried_epoch[charge.quota] = epoch
        running = adm.running_jobs()
        # a one-pod job of several GPUs needs the room on one node: take it there if possible
        pg = objects.get_of(PodGroup, *key)
        plan = self._node_plan(adm, pg, charge.quota, charge.usage, running, snapshot)
        if plan is None:
            plan = plan_reclaim(adm.tree, owner=charge.quota, need=charge.usage, running=running)
        if not plan.feasible or not plan.victims:
            if plan.reason:
                log.debug("reclaim.infeasible", job=f"{key[0]}/{key[1]}", reason=plan.reason)
            return []
        return self._execute(
            adm, key, plan, utcnow=utcnow, snapshot=snapshot, objects=objects, recorder=recorder
        )

    def _node_plan(
        self,
        adm: Admission,
        pg: object,
        quota: str,
        usage: Mapping[str, int],
        running: list[RunningJob],
        snapshot: Snapshot,
    ) -> ReclaimPlan | None:
        """For a one-pod job of plain GPUs without node constraints: victims on one node."""
        gpus = usage.get(GPU_RESOURCE, 0)
        if gpus <= 1 or any(r != GPU_RESOURCE and "/" in r and a > 0 for r, a in usage.items()):
            return None  # one GPU always fits where one is free; class requests are left alone
        if not isinstance(pg, PodGroup) or sum(r.replicas for r in pg.spec.roles) != 1:
            return None
        spec = pg.spec.roles[0].template
        if spec.node_selector or spec.affinity is not None or spec.tolerations:
            return None
        ok = snapshot.alive & snapshot.ready & snapshot.schedulable & ~snapshot.tainted
        ok &= snapshot.gpu_healthy_count >= gpus
        names = cast("list[str]", snapshot.names)  # rows in `ok` are alive, and alive rows are named
        room = {names[r]: int(snapshot.gpu_whole_free[r]) for r in np.flatnonzero(ok)}
        # asked only with the keys of `running` (`adm.running_jobs()`): (namespace, name) pairs
        held = cast("Callable[[Hashable], Mapping[str, int]]", snapshot.group_gpus)
        plan = plan_node_reclaim(adm.tree, owner=quota, gpus=gpus, running=running, held=held, room=room)
        return plan if plan.feasible and plan.victims else None

    def _execute(
        self,
        adm: Admission,
        owner_key: Key,
        plan: ReclaimPlan,
        *,
        utcnow: datetime,
        snapshot: Snapshot,
        objects: ObjectCache,
        recorder: Recorder,
    ) -> list[Key]:
        tree = adm.tree
        mins = ", ".join(
            f"min {format_amount(r, tree.min(plan.owner).get(r, 0))}"
            + ("" if r == "nvidia.com/gpu" else f" {r}")
            for r in sorted(plan.need)
        )
        done: list[Key] = []
        for victim in plan.victims:
            key = cast(Key, victim.job.key)  # running jobs are keyed by (namespace, name)
            adm.requeue(key)
            done.append(key)
            message = (
                f"reclaimed by quota {plan.owner} ({mins}) for {owner_key[0]}/{owner_key[1]}: {victim.reason}"
            )
            pg = objects.get_of(PodGroup, *key)
            if isinstance(pg, PodGroup):
                held = snapshot.placed_pods(key)
                extra: dict[str, object] = {}
                if held:  # the operator stops these pods, then releases their Reservations
                    self.evicting.setdefault(plan.owner, set()).add(key)
                    view = recorder.view(pg)
                    view.evictions = {**view.evictions, **dict.fromkeys(held, message)}
                    extra["evictions"] = dict(view.evictions)
                recorder.status(
                    pg,
                    phase="Pending",
                    reason="Preempted",
                    message=message,
                    placed=0,
                    now=utcnow,
                    extra=extra,
                )
                recorder.event(pg, reason="Preempted", message=message, type_="Warning", now=utcnow)
            log.info(
                "job.preempted",
                job=f"{key[0]}/{key[1]}",
                quota=plan.owner,
                beneficiary=f"{owner_key[0]}/{owner_key[1]}",
            )
        self.preempted += len(done)
        owner = objects.get_of(PodGroup, *owner_key)
        if isinstance(owner, PodGroup):
            names = ", ".join(f"{k[0]}/{k[1]}" for k in done)
            recorder.event(
                owner,
                reason="Reclaiming",
                message=f"quota {plan.owner} ({mins}) takes back borrowed capacity: preempted {names}",
                now=utcnow,
            )
        self.forget(owner_key)
        return done
