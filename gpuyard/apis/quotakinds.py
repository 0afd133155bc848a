"""Quota and queue kinds: ElasticQuota (Koordinator), ResourceQuota (v1) and Queue (gpuyard).

* **ElasticQuota** (`scheduling.sigs.k8s.io/v1alpha1`) as Koordinator reads it: `spec.min` (the
  guaranteed part), `spec.max` (the ceiling), the tree written as labels
  (`quota.scheduling.koordinator.sh/parent`, `/is-parent`, `/allow-lent-resource`) and the
  annotations `quota.scheduling.koordinator.sh/shared-weight` (a JSON resource list; default:
  `max`) and `quota.scheduling.koordinator.sh/namespaces` (a JSON list; gpuyard also accepts
  `spec.namespaces`). Resource names are Kubernetes' (`cpu`, `memory`, `nvidia.com/gpu`) and
  ResourceClass names (`nvidia.v100`).
* **ResourceQuota** (`v1`): per-namespace hard limits (`requests.cpu`, `nvidia.com/gpu`,
  `count/jobs`, per GPU class `nvidia.tesla.k80`, ...).
* **Queue** (`gpuyard.io/v1alpha1`): a tenant queue's weight for fair share, its queueing
  strategy, the most jobs it may run, its aging settings and the namespaces whose jobs may name
  it (`spec.namespaces`, the tenant binding the API enforces).

This module holds the models and the label/annotation keys (of quotas and of the jobs charged to
them); validation and parsing of a submitted document are in :mod:`gpuyard.apis.quota`, which
re-exports everything here.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Literal

from pydantic import Field, field_validator

from gpuyard.apis.durations import parse_duration
from gpuyard.apis.meta import K8sModel, Resource, StrictK8sModel
from gpuyard.apis.quantity import Quantity, QuantityError, parse_quantity

__all__ = [
    "ANNOTATION_EXPECTED_DURATION",
    "ANNOTATION_QUOTA_NAMESPACES",
    "ANNOTATION_SHARED_WEIGHT",
    "API_ELASTIC_QUOTA",
    "API_QUEUE",
    "DEFAULT_QUOTA",
    "LABEL_ALLOW_LENT_RESOURCE",
    "LABEL_PREEMPTIBLE",
    "LABEL_QUOTA_IS_PARENT",
    "LABEL_QUOTA_NAME",
    "LABEL_QUOTA_PARENT",
    "QUEUEING_STRATEGIES",
    "QUOTA_KINDS",
    "ROOT_QUOTA",
    "AgingSpec",
    "ElasticQuota",
    "ElasticQuotaSpec",
    "ElasticQuotaStatus",
    "Queue",
    "QueueSpec",
    "QueueStatus",
    "ResourceQuota",
    "ResourceQuotaSpec",
    "ResourceQuotaStatus",
]

API_ELASTIC_QUOTA = "scheduling.sigs.k8s.io/v1alpha1"
API_QUEUE = "gpuyard.io/v1alpha1"

_PREFIX = "quota.scheduling.koordinator.sh"
LABEL_QUOTA_PARENT = f"{_PREFIX}/parent"
LABEL_QUOTA_IS_PARENT = f"{_PREFIX}/is-parent"
LABEL_ALLOW_LENT_RESOURCE = f"{_PREFIX}/allow-lent-resource"
LABEL_QUOTA_NAME = f"{_PREFIX}/name"  # on a job: the quota it is charged to
LABEL_PREEMPTIBLE = f"{_PREFIX}/preemptible"  # on a job: "false" = runs only within min
ANNOTATION_SHARED_WEIGHT = f"{_PREFIX}/shared-weight"
ANNOTATION_QUOTA_NAMESPACES = f"{_PREFIX}/namespaces"
ANNOTATION_EXPECTED_DURATION = "gpuyard.io/expected-duration"  # on a job: "2h", "90m", "3600"

ROOT_QUOTA = "koordinator-root-quota"  # the implicit root: the whole cluster
DEFAULT_QUOTA = "koordinator-default-quota"  # where jobs no quota covers are charged

QUEUEING_STRATEGIES = ("StrictFIFO", "BestEffortFIFO")


# --- ElasticQuota ------------------------------------------------------------------------------


def _bool_label(value: str | None, *, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() == "true"


class ElasticQuotaSpec(K8sModel):
    min: dict[str, Quantity] = Field(default_factory=dict, description="Guaranteed resources.")
    max: dict[str, Quantity] = Field(
        default_factory=dict, description="Upper limit; a resource not named is unlimited."
    )
    namespaces: list[str] = Field(
        default_factory=list,
        description="gpuyard: namespaces whose jobs are charged to this quota "
        "(the Koordinator annotation quota.scheduling.koordinator.sh/namespaces is read too).",
    )


class ElasticQuotaStatus(K8sModel):
    used: dict[str, Quantity] = Field(default_factory=dict)
    request: dict[str, Quantity] = Field(
        default_factory=dict, description="gpuyard: pending + running demand."
    )
    runtime: dict[str, Quantity] = Field(
        default_factory=dict, description="gpuyard: what the quota may use now."
    )


class ElasticQuota(Resource):
    """One node of the quota tree. Names are unique cluster-wide (the tree is keyed by name)."""

    KIND = "ElasticQuota"
    API_VERSION = API_ELASTIC_QUOTA
    NAMESPACED = True

    spec: ElasticQuotaSpec = Field(default_factory=ElasticQuotaSpec)
    status: ElasticQuotaStatus = Field(default_factory=ElasticQuotaStatus)

    def _meta(self, key: str) -> str | None:
        """A Koordinator setting: a label, or (leniently) an annotation of the same key."""
        value = self.metadata.labels.get(key)
        return value if value is not None else self.metadata.annotations.get(key)

    @property
    def parent_name(self) -> str:
        """The parent quota; quotas without one hang directly under the root (as Koordinator)."""
        parent = (self._meta(LABEL_QUOTA_PARENT) or "").strip()
        if not parent and self.metadata.name != ROOT_QUOTA:
            return ROOT_QUOTA
        return parent

    @property
    def is_parent(self) -> bool:
        return _bool_label(self._meta(LABEL_QUOTA_IS_PARENT), default=False)

    @property
    def allow_lent_resource(self) -> bool:
        return _bool_label(self._meta(LABEL_ALLOW_LENT_RESOURCE), default=True)

    @property
    def shared_weight(self) -> dict[str, Decimal] | None:
        """The annotation's resource list, or None (then the weight is `max`, as Koordinator)."""
        raw = self.metadata.annotations.get(ANNOTATION_SHARED_WEIGHT)
        if not raw:
            return None
        try:
            data = json.loads(raw)
            weights = {str(k): parse_quantity(v) for k, v in data.items()}
        except (ValueError, AttributeError, QuantityError):
            return None
        return weights if any(w != 0 for w in weights.values()) else None

    @property
    def covered_namespaces(self) -> list[str]:
        out = list(self.spec.namespaces)
        raw = self.metadata.annotations.get(ANNOTATION_QUOTA_NAMESPACES)
        if raw:
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
            if isinstance(data, list):
                out.extend(str(n) for n in data if isinstance(n, str) and n not in out)
        return out


# --- ResourceQuota -----------------------------------------------------------------------------


class ResourceQuotaSpec(K8sModel):
    hard: dict[str, Quantity] = Field(default_factory=dict)
    scopes: list[str] = Field(default_factory=list)
    scope_selector: dict[str, Any] | None = None


class ResourceQuotaStatus(K8sModel):
    hard: dict[str, Quantity] = Field(default_factory=dict)
    used: dict[str, Quantity] = Field(default_factory=dict)


class ResourceQuota(Resource):
    """Kubernetes' namespace quota; gpuyard enforces it per job at admission."""

    KIND = "ResourceQuota"
    API_VERSION = "v1"
    NAMESPACED = True

    spec: ResourceQuotaSpec = Field(default_factory=ResourceQuotaSpec)
    status: ResourceQuotaStatus = Field(default_factory=ResourceQuotaStatus)


# --- Queue -------------------------------------------------------------------------------------


class AgingSpec(StrictK8sModel):
    """Effective priority = priority + min(maxBoost, step x whole intervals waited)."""

    interval_seconds: float = Field(default=600, gt=0, description="Wait that earns one step.")
    step: int = Field(default=1, ge=0, description="Priority added per interval (0: no aging).")
    max_boost: int = Field(default=100, ge=0, description="Most priority aging can add.")
    reserve_after_seconds: float | None = Field(
        default=None,
        gt=0,
        description="A head that has waited this long is protected: no job behind it may start "
        "unless it ends before the head's earliest start (no best-effort backfill past it).",
    )


class QueueSpec(StrictK8sModel):
    weight: float = Field(
        default=1.0, gt=0, description="Share of the cluster relative to other queues (DRF)."
    )
    queueing_strategy: Literal["StrictFIFO", "BestEffortFIFO"] = "BestEffortFIFO"
    max_running_jobs: int | None = Field(default=None, ge=0)
    allowed_priority_classes: list[str] | None = Field(
        default=None,
        description="The PriorityClasses a tenant's job in this queue may use (admins: any); none listed: "
        "every class but the built-in system ones, which only admins and kube-system may use.",
    )
    aging: AgingSpec | None = Field(default=None, description="Default: the platform's aging settings.")
    description: str = ""
    preemption_policy: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = Field(
        default="LowerPriority",
        description="Which running jobs a waiting job of this queue may preempt (Kueue's "
        "withinClusterQueue): Never; LowerPriority (default); LowerOrNewerEqualPriority (also jobs "
        "of equal priority that started after it was submitted).",
    )
    preempt_min_runtime: str | float | None = Field(
        default=None,
        description="Jobs of this queue that have run less than this are not preempted "
        "(a duration: 10m, 1h30m, or seconds).",
    )

    @field_validator("preempt_min_runtime")
    @classmethod
    def _duration(cls, value: str | float | None) -> str | float | None:
        if value is None:
            return None
        parse_duration(value)  # ValueError names the allowed forms (negative ones included)
        return value

    def min_runtime_seconds(self) -> float:
        return parse_duration(self.preempt_min_runtime) if self.preempt_min_runtime is not None else 0.0

    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces whose jobs may name this queue in schedulingPolicy.queue ('*': any); "
        "a tenant's job may always use the queue named after its namespace (tenant binding, set by an admin).",
    )


class QueueStatus(K8sModel):
    pending: int = 0
    running: int = 0
    share: float = 0.0


class Queue(Resource):
    """A tenant queue (cluster-scoped). Jobs name it in `schedulingPolicy.queue`, else their namespace."""

    KIND = "Queue"
    API_VERSION = API_QUEUE
    NAMESPACED = False

    spec: QueueSpec = Field(default_factory=QueueSpec)
    status: QueueStatus = Field(default_factory=QueueStatus)


QUOTA_KINDS: list[tuple[type[Resource], bool]] = [(ElasticQuota, True), (ResourceQuota, True), (Queue, True)]
