"""The fake cluster's horizontal pod autoscaler: what kube-controller-manager does on Kubernetes.

A reconciler over HorizontalPodAutoscalers that target a job (`scaleTargetRef`; the operator
makes them from a PyTorchJob's `elasticPolicy.metrics`, `controllers/autoscalers.py`). Every
`period` seconds of the clock (15, the autoscaler's sync period) it reads each metric's value from
the scenario's `hpaMetrics` (`apis/hpametrics.py`: there is no metrics API here) and decides as
Kubernetes' autoscaler does:

* per metric, `desired = ceil(current * value / target)`, where `current` is the Worker replicas
  (the `scale` subresource's `spec.replicas`) and `target` the metric's target
  (`averageUtilization`, `averageValue` or `value`); a ratio within 10% of 1 keeps `current`
  (the autoscaler's tolerance); a metric without a value is skipped;
* the largest of the metrics' proposals, bounded by `minReplicas` (default 1) and `maxReplicas`;
* scaling down takes the largest recommendation of the last `scale_down_window` seconds (the
  default scale-down stabilization window, 300), scaling up happens at once.

A new replica count is written to the job's Worker replicas (as the `scale` subresource would),
and the decision to the autoscaler's status (`currentReplicas`, `desiredReplicas`,
`lastScaleTime`, `currentMetrics`). A finished or missing job is left alone. It writes as the
backend (`state.ownership.BACKEND`), the fake cluster's controllers' identity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import structlog

from gpuyard.apis.addons import HorizontalPodAutoscaler
from gpuyard.apis.elasticmetrics import metric_target
from gpuyard.apis.hpametrics import HpaMetric, metric_value
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob
from gpuyard.state.clock import Clock
from gpuyard.state.store import Conflict, NotFound, Store
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import Writer

__all__ = ["FakeAutoscaler", "propose"]

log = structlog.get_logger(__name__)

SCALED_ROLE = "Worker"
TOLERANCE = 0.1


def propose(
    current: int, spec: dict[str, Any], values: dict[str, float]
) -> tuple[int | None, list[dict[str, Any]]]:
    """The replicas the metrics ask for (None: no metric has a value), and the metrics read.

    `values`: metric name -> its current value (percent for Utilization targets)."""
    best: int | None = None
    read: list[dict[str, Any]] = []
    for m in spec.get("metrics") or []:
        try:
            target = metric_target(m)
        except ValueError:
            continue
        value = values.get(target.name)
        if value is None:
            continue
        ratio = value / target.target
        proposal = current if abs(ratio - 1.0) <= TOLERANCE else math.ceil(current * ratio)
        best = proposal if best is None else max(best, proposal)
        read.append({"type": m.get("type"), "name": target.name, "value": value, "target": target.target})
    return best, read


class FakeAutoscaler:
    """See the module docstring."""

    name = "fake-autoscaler"
    concurrency = 1

    def __init__(
        self,
        *,
        store: Store,
        writer: Writer,
        clock: Clock,
        metrics: Sequence[HpaMetric],
        period: float = 15.0,
        scale_down_window: float = 300.0,
    ) -> None:
        self.store = store
        self.writer = writer
        self.clock = clock
        self.metrics = list(metrics)
        self.period = period
        self.scale_down_window = scale_down_window
        self.started = clock.now()
        self.watches: Sequence[Watch] = (Watch(HorizontalPodAutoscaler.KIND),)
        self._recommendations: dict[ObjectKey, list[tuple[float, int]]] = {}
        self._due: dict[ObjectKey, float] = {}  # when each autoscaler decides next

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        hpa = self.store.get_of(HorizontalPodAutoscaler, *key)
        if hpa is None:
            self._recommendations.pop(key, None)
            self._due.pop(key, None)
            return None
        ref = hpa.spec.get("scaleTargetRef") or {}
        kind, target_name = ref.get("kind", ""), ref.get("name", "")
        job = self.store.get(kind, key[0], target_name) if kind in KIND_INFO else None
        now = self.clock.now()
        due = self._due.get(key, now)
        if now < due:  # a change of the autoscaler (its own status write): decide at the next sync
            return Requeue(after=due - now)
        self._due[key] = now + self.period
        if not isinstance(job, TrainingJob) or job.status.finished or SCALED_ROLE not in job.replica_specs:
            return Requeue(after=self.period)
        current = job.replica_specs[SCALED_ROLE].count
        values = {
            m.metric: v
            for m in self.metrics
            if (
                v := metric_value(
                    self.metrics,
                    namespace=key[0],
                    job=target_name,
                    metric=m.metric,
                    elapsed=now - self.started,
                )
            )
            is not None
        }
        proposal, read = propose(current, hpa.spec, values)
        if proposal is None:
            return Requeue(after=self.period)
        low = int(hpa.spec.get("minReplicas") or 1)
        high = int(hpa.spec.get("maxReplicas") or current)
        proposal = max(low, min(high, proposal))
        history = [(t, r) for t, r in self._recommendations.get(key, []) if now - t < self.scale_down_window]
        history.append((now, proposal))
        self._recommendations[key] = history
        desired = proposal if proposal >= current else max(r for _, r in history)
        desired = max(low, min(high, desired))
        try:
            if desired != current:
                scaled = job.clone()
                scaled.replica_specs[SCALED_ROLE].replicas = desired
                await self.writer.update(scaled)
                log.info(
                    "fakecluster.autoscaled",
                    job=f"{key[0]}/{target_name}",
                    replicas=f"{current} -> {desired}",
                    metrics=read,
                )
            changes: dict[str, Any] = {
                "current_replicas": current,
                "desired_replicas": desired,
                "current_metrics": read,
            }
            if desired != current:
                changes["last_scale_time"] = self.clock.utcnow()
            status = hpa.status
            if any(getattr(status, k) != v for k, v in changes.items()):
                await self.writer.patch_status(HorizontalPodAutoscaler.KIND, *key, changes)
        except (Conflict, NotFound):
            self._due.pop(key, None)
            return Requeue(after=1.0)
        return Requeue(after=self.period)
