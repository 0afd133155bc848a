"""Carrying out a victim plan: ask the operator to stop the victims' pods, requeue them, count.

Shared by priority preemption (`preemption.priority`) and quota reclaim (`reclaim.Reclaimer`):

* every pod of the victim that holds a Reservation goes into its PodGroup's `status.evictions`
  (pod -> why) and the PodGroup goes back to `Pending` with reason `Preempted` and the cause in
  words its owner may see (another namespace's job is never named). The job operator stops those
  pods — the job is `Restarting`, not failed, and no restart is counted — and then releases the
  Reservations, which hold the devices until then (a GPU is never handed out while a pod runs);
* the victim returns to its queue keeping its submission time (`Admission.requeue`);
* an elastic job may instead lose only replicas above its minimum (`pods`, see `elastic`): its
  PodGroup stays `Placed` (reason `Shrunk`), it stays admitted, and only those pods are in
  `status.evictions`;
* a `Preempted` Warning event on the victim, and a count in the recorder's tally (the loop
  turns it into `gpuyard_preemptions_total{reason}` and `gpuyard_gpu_hours_lost_total`): GPUs x
  time since it started, or since its last checkpoint when the job says how often it
  checkpoints (annotation `gpuyard.io/checkpoint-interval`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from gpuyard.apis.durations import parse_duration
from gpuyard.apis.scheduling import PodGroup

if TYPE_CHECKING:
    from gpuyard.scheduler.preemption.needs import Evicting

__all__ = ["ANNOTATION_CHECKPOINT_INTERVAL", "evict", "gpu_hours_lost"]

log = structlog.get_logger(__name__)

Key = tuple[str, str]
ANNOTATION_CHECKPOINT_INTERVAL = "gpuyard.io/checkpoint-interval"


def checkpoint_interval(annotations: Mapping[str, str]) -> float | None:
    raw = annotations.get(ANNOTATION_CHECKPOINT_INTERVAL)
    if not raw:
        return None
    try:
        seconds = parse_duration(raw)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def gpu_hours_lost(*, gpus: int, started: float | None, now: float, interval: float | None = None) -> float:
    """GPU-hours of work a job loses when stopped now: GPUs x time since it started, or since
    its last checkpoint when it checkpoints every `interval` seconds."""
    if started is None:
        return 0.0
    ran = max(0.0, now - started)
    if interval:
        ran %= interval
    return gpus * ran / 3600.0


def evict(
    state: Evicting, key: Key, *, message: str, reason: str, pods: tuple[str, ...] | None = None
) -> float:
    """Stop the running job `key` (see the module docstring); the GPU-hours it loses.
    `reason`: priority | reclaim | migration (the metric's label). `pods`: only these replicas
    above an elastic job's minimum (`elastic`): the job keeps running and stays admitted."""
    if pods is not None:
        return _shrink(state, key, pods=pods, message=message, reason=reason)
    snap, rec, utcnow = state.cache.snapshot, state.recorder, state.utcnow
    tracked = state.admission.jobs.get(key)
    started = tracked.started if tracked is not None else None
    gpus = sum(snap.group_gpus(key).values())
    pg = state.cache.objects.get_of(PodGroup, *key)
    interval = checkpoint_interval(pg.metadata.annotations) if isinstance(pg, PodGroup) else None
    lost = gpu_hours_lost(gpus=gpus, started=started, now=state.now, interval=interval)
    state.admission.requeue(key)
    if isinstance(pg, PodGroup):
        held = snap.placed_pods(key)
        extra: dict[str, object] = {}
        if held:  # the operator stops these pods, then releases their Reservations
            view = rec.view(pg)
            view.evictions = {**view.evictions, **dict.fromkeys(held, message)}
            extra["evictions"] = dict(view.evictions)
        rec.status(
            pg, phase="Pending", reason="Preempted", message=message, placed=0, now=utcnow, extra=extra
        )
        rec.event(pg, reason="Preempted", message=message, type_="Warning", now=utcnow)
    rec.tally.preempted(reason, gpu_hours=lost)
    log.info("job.preempted", job=f"{key[0]}/{key[1]}", reason=reason, gpu_hours_lost=round(lost, 3))
    return lost


def _shrink(state: Evicting, key: Key, *, pods: tuple[str, ...], message: str, reason: str) -> float:
    """Stop only `pods` of the running elastic job `key`; it stays `Placed` and admitted."""
    snap, rec, utcnow = state.cache.snapshot, state.recorder, state.utcnow
    pg = state.cache.objects.get_of(PodGroup, *key)
    if not isinstance(pg, PodGroup):
        return 0.0
    tracked = state.admission.jobs.get(key)
    started = tracked.started if tracked is not None else None
    per_node = snap.placed_pods(key)
    gpus = 0
    for pod in pods:
        alloc = snap.ledger.pod_alloc(key, pod)
        gpus += len(alloc.gpus) if alloc is not None and alloc.gpu_milli >= 1000 else 0
    interval = checkpoint_interval(pg.metadata.annotations)
    lost = gpu_hours_lost(gpus=gpus, started=started, now=state.now, interval=interval)
    view = rec.view(pg)
    view.evictions = {**view.evictions, **dict.fromkeys(pods, message)}
    left = len(per_node) - len(pods)
    text = f"{len(pods)} replica(s) above its elastic minimum stopped ({', '.join(pods)}): {message}"
    rec.status(
        pg,
        phase="Placed",
        reason="Shrunk",
        message=text,
        placed=left,
        now=utcnow,
        extra={"evictions": dict(view.evictions)},
    )
    rec.event(pg, reason="Preempted", message=text, type_="Warning", now=utcnow)
    rec.tally.preempted(reason, gpu_hours=lost)
    log.info(
        "job.shrunk", job=f"{key[0]}/{key[1]}", reason=reason, pods=len(pods), gpu_hours_lost=round(lost, 3)
    )
    return lost
