"""Metric values for the fake cluster's autoscaler: a scenario's `hpaMetrics`.

On Kubernetes a HorizontalPodAutoscaler reads its metrics from the cluster's metrics APIs. The
fake cluster has none, so a scenario says what they would answer, per job and metric name, from
a time on (seconds since the fake cluster started, or a Go-style duration):

    hpaMetrics:
      - {job: torch-elastic, metric: cpu, value: 180}            # from the start
      - {job: torch-elastic, metric: cpu, at: 5m, value: 40}     # from five minutes on

`metric` is the name the HorizontalPodAutoscaler's metric carries (`resource.name` such as `cpu`,
or `pods`/`object`/`external` `metric.name`); `value` is compared with that metric's target as
the autoscaler does: a percentage for `Utilization` targets, else the (average) value.
`fakecluster/autoscaling.py` reads them on the virtual clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import Field, field_validator

from gpuyard.apis.durations import parse_duration
from gpuyard.apis.meta import StrictK8sModel

__all__ = ["HpaMetric", "metric_value"]


class HpaMetric(StrictK8sModel):
    """What the metrics API answers for one job's metric from `at` on."""

    job: str = Field(min_length=1, description="The job's name.")
    namespace: str = "default"
    metric: str = Field(
        min_length=1, description="The metric's name in the HorizontalPodAutoscaler (cpu, ...)."
    )
    at: float = Field(
        default=0.0, ge=0, description="Seconds since the fake cluster started, or a duration (5m)."
    )
    value: float = Field(ge=0, description="Percent for Utilization targets, else the (average) value.")

    @field_validator("at", mode="before")
    @classmethod
    def _at(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str | int | float) else value


def metric_value(
    metrics: Iterable[HpaMetric], *, namespace: str, job: str, metric: str, elapsed: float
) -> float | None:
    """The value in force `elapsed` seconds after the start (the latest `at` not after it)."""
    best: HpaMetric | None = None
    for m in metrics:
        if m.namespace == namespace and m.job == job and m.metric == metric and m.at <= elapsed:
            if best is None or m.at >= best.at:
                best = m
    return best.value if best is not None else None
