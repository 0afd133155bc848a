"""A PyTorchJob's `elasticPolicy.metrics`: autoscaling/v2 MetricSpecs, checked and read.

training-operator (`pkg/controller.v1/pytorch/hpa.go`) turns them into a HorizontalPodAutoscaler
on the job's `scale` subresource (the Worker replicas, between `minReplicas` and `maxReplicas`);
gpuyard does the same (`controllers/autoscalers.py`). :func:`metric_problems` checks them at
submit as the API server checks an HPA's metrics (the field named, what is allowed);
:func:`metric_target` reads one back for the fake cluster's autoscaler (`fakecluster/autoscaling.py`).

    metrics:
      - type: Resource
        resource: {name: cpu, target: {type: Utilization, averageUtilization: 80}}
      - type: Pods
        pods: {metric: {name: samples_per_second}, target: {type: AverageValue, averageValue: "200"}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from gpuyard.apis.quantity import parse_quantity

__all__ = ["METRIC_SOURCES", "MetricTarget", "metric_problems", "metric_target"]

METRIC_SOURCES = {
    "Resource": "resource",
    "ContainerResource": "containerResource",
    "Pods": "pods",
    "Object": "object",
    "External": "external",
}
"""A MetricSpec's `type` -> the field that holds its source."""
_TARGET_FIELD = {"Utilization": "averageUtilization", "AverageValue": "averageValue", "Value": "value"}


@dataclass(frozen=True, slots=True)
class MetricTarget:
    """One metric as the autoscaler compares it: its name, target type and target number."""

    name: str
    target_type: str  # Utilization | AverageValue | Value
    target: float


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(parse_quantity(value))
        except (ValueError, InvalidOperation):
            return None
    if isinstance(value, Decimal):
        return float(value)
    return None


def metric_target(spec: Mapping[str, Any]) -> MetricTarget:
    """The name and target of one MetricSpec (ValueError naming the field when it has none)."""
    kind = spec.get("type")
    if kind not in METRIC_SOURCES:
        raise ValueError(f"type: {kind!r} is not one of {', '.join(METRIC_SOURCES)}")
    field = METRIC_SOURCES[str(kind)]
    source = spec.get(field)
    if not isinstance(source, Mapping):
        raise ValueError(f"{field}: required for type {kind}")
    if kind in ("Resource", "ContainerResource"):
        name = source.get("name")
        where = f"{field}.name"
    else:
        metric = source.get("metric")
        name = metric.get("name") if isinstance(metric, Mapping) else None
        where = f"{field}.metric.name"
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: required")
    target = source.get("target")
    if not isinstance(target, Mapping):
        raise ValueError(f"{field}.target: required")
    target_type = target.get("type")
    if target_type not in _TARGET_FIELD:
        raise ValueError(f"{field}.target.type: {target_type!r} is not one of {', '.join(_TARGET_FIELD)}")
    if kind == "Pods" and target_type != "AverageValue":
        raise ValueError(f"{field}.target.type: must be AverageValue for type Pods")
    if kind in ("Resource", "ContainerResource") and target_type == "Value":
        raise ValueError(f"{field}.target.type: must be Utilization or AverageValue for type {kind}")
    value_field = _TARGET_FIELD[str(target_type)]
    value = _number(target.get(value_field))
    if value is None or value <= 0:
        raise ValueError(f"{field}.target.{value_field}: a number above 0 is required for {target_type}")
    return MetricTarget(name=name, target_type=str(target_type), target=value)


def metric_problems(
    metrics: Sequence[Any] | None, *, field: str, kubeflow: bool = True
) -> list[dict[str, str]]:
    """422 details for `elasticPolicy.metrics` at `field` (`kubeflow`: the job is a `kubeflow.org`
    PyTorchJob, whose CRD serves the `scale` subresource an autoscaler writes; KubeDL's has none)."""
    out: list[dict[str, str]] = []
    if metrics and not kubeflow:
        out.append(
            {
                "field": field,
                "reason": "metrics scale a PyTorchJob through its scale subresource, which only "
                "kubeflow.org/v1 PyTorchJobs serve; allowed: apiVersion kubeflow.org/v1, or no metrics",
            }
        )
    for i, spec in enumerate(metrics or ()):
        if not isinstance(spec, Mapping):
            out.append({"field": f"{field}.{i}", "reason": "must be an autoscaling/v2 MetricSpec object"})
            continue
        try:
            metric_target(spec)
        except ValueError as exc:
            where, _, why = str(exc).partition(": ")
            out.append(
                {
                    "field": f"{field}.{i}.{where}",
                    "reason": f"{why}; allowed: type Resource, ContainerResource, Pods, Object or External "
                    "with its source's target (Utilization, AverageValue or Value)",
                }
            )
    return out
