"""`policy/v1` PodDisruptionBudget: how many of a set of pods may be stopped at once.

Kubernetes' own kind, accepted as written (`kubectl apply`-able): a label `selector`
(`matchLabels`, `matchExpressions` with `In`, `NotIn`, `Exists`, `DoesNotExist`) and exactly one of
`minAvailable` / `maxUnavailable`, each an integer or a percentage ("50%"). gpuyard's preemption
engine reads it when it chooses victims: a plan that stops more matching pods than the budget
allows counts as violating it, and plans with fewer violations win (it is not a hard block, as
in kube-scheduler's preemption). Pods are matched by their job's labels plus `job-name`
and `replica-type` (as the operator labels them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpuyard.apis.meta import K8sModel, Resource, StrictK8sModel

__all__ = [
    "PDB_KINDS",
    "LabelSelectorRequirement",
    "PodDisruptionBudget",
    "PodDisruptionBudgetSpec",
    "PodDisruptionBudgetStatus",
    "PodLabelSelector",
    "resolve_budget",
]

_PERCENT = re.compile(r"^(\d+)%$")


class LabelSelectorRequirement(StrictK8sModel):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        inside = labels.get(self.key) in self.values
        return inside if self.operator == "In" else (self.key not in labels or not inside)


class PodLabelSelector(StrictK8sModel):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes' rule: every label and every expression holds (an empty selector: every pod)."""
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


def _int_or_percent(value: int | str | None) -> int | str | None:
    if value is None or isinstance(value, int):
        if isinstance(value, int) and value < 0:
            raise ValueError("must not be negative")
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    m = _PERCENT.match(text)
    if m is None or int(m.group(1)) > 100:
        raise ValueError(f"{value!r}: allowed an integer >= 0 or a percentage 0%..100%")
    return text


class PodDisruptionBudgetSpec(K8sModel):
    selector: PodLabelSelector = Field(default_factory=PodLabelSelector)
    min_available: int | str | None = Field(default=None, description="Pods that must stay (int or %).")
    max_unavailable: int | str | None = Field(
        default=None, description="Pods that may be stopped (int or %)."
    )

    _check = field_validator("min_available", "max_unavailable", mode="before")(lambda v: _int_or_percent(v))

    @model_validator(mode="after")
    def _one_of(self) -> PodDisruptionBudgetSpec:
        if self.min_available is not None and self.max_unavailable is not None:
            raise ValueError("minAvailable and maxUnavailable are mutually exclusive; set only one")
        return self


class PodDisruptionBudgetStatus(K8sModel):
    disruptions_allowed: int = 0
    current_healthy: int = 0
    expected_pods: int = 0


class PodDisruptionBudget(Resource):
    KIND = "PodDisruptionBudget"
    API_VERSION = "policy/v1"
    NAMESPACED = True

    spec: PodDisruptionBudgetSpec = Field(default_factory=PodDisruptionBudgetSpec)
    status: PodDisruptionBudgetStatus = Field(default_factory=PodDisruptionBudgetStatus)


def _amount(value: int | str, pods: int, *, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    pct = int(value.rstrip("%"))
    exact = pods * pct / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def resolve_budget(spec: PodDisruptionBudgetSpec, pods: int) -> int:
    """How many of `pods` matching (running) pods may be stopped (Kubernetes' disruptionsAllowed:
    percentages of minAvailable and maxUnavailable are rounded up)."""
    if spec.max_unavailable is not None:
        return max(0, _amount(spec.max_unavailable, pods, round_up=True))
    if spec.min_available is not None:
        return max(0, pods - _amount(spec.min_available, pods, round_up=True))
    return pods


PDB_KINDS: list[tuple[type[Resource], bool]] = [(PodDisruptionBudget, True)]
