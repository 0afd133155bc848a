"""Who may be preempted: the protections every preemption decision honours.

A running job is never a victim when

* it is labelled non-preemptible: `quota.scheduling.koordinator.sh/preemptible: "false"` (the
  label quota admission already reads: such a job runs only within its quota's min), or
  `gpuyard.io/preemptible: "false"`;
* it has run less than its queue's `preemptMinRuntime`;
* the preemptor's queue says `preemptionPolicy: Never`;
* its priority is equal to or higher than the preemptor's — except, with the preemptor queue's
  `LowerOrNewerEqualPriority` (Kueue's `withinClusterQueue` values), a job of equal priority that
  started after the preemptor was submitted.

Pure: plain values in, a yes/no (and the reason when no) out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuyard.apis.quotakinds import LABEL_PREEMPTIBLE

__all__ = ["LABEL_GPUYARD_PREEMPTIBLE", "Preemptee", "Preemptor", "protected"]

LABEL_GPUYARD_PREEMPTIBLE = "gpuyard.io/preemptible"


@dataclass(frozen=True, slots=True)
class Preemptor:
    priority: int
    submit_time: float
    policy: str = "LowerPriority"  # its queue's preemptionPolicy


@dataclass(frozen=True, slots=True)
class Preemptee:
    priority: int
    start_time: float  # on the scheduler's clock (`now`)
    labels: Mapping[str, str]
    min_runtime: float = 0.0  # its queue's preemptMinRuntime, in seconds
    started_at: float | None = None  # wall-clock epoch seconds, as the preemptor's submit time


def non_preemptible(labels: Mapping[str, str]) -> bool:
    return any(
        labels.get(k, "").strip().lower() == "false" for k in (LABEL_PREEMPTIBLE, LABEL_GPUYARD_PREEMPTIBLE)
    )


def protected(preemptor: Preemptor, job: Preemptee, *, now: float) -> str | None:
    """Why `job` may not be preempted for `preemptor` (None: it may)."""
    if preemptor.policy == "Never":
        return "the preemptor's queue never preempts"
    if non_preemptible(job.labels):
        return "labelled non-preemptible"
    if now - job.start_time < job.min_runtime:
        return f"has run less than its queue's preemptMinRuntime ({job.min_runtime:g}s)"
    if job.priority < preemptor.priority:
        return None
    started = job.started_at if job.started_at is not None else job.start_time
    if (
        job.priority == preemptor.priority
        and preemptor.policy == "LowerOrNewerEqualPriority"
        and started > preemptor.submit_time
    ):
        return None
    return "priority not lower than the preemptor's"
