"""Kubernetes objects the job operator creates beside a job's pods: Deployments, Ingresses and
HorizontalPodAutoscalers.

They are the built-in kinds of `apps/v1`, `networking.k8s.io/v1` and `autoscaling/v2`, kept as
written (`spec` and `status` are free-form: the API server defaults and validates them, and
gpuyard compares only the fields it sets, :func:`covers`). Who makes them:

* the Tensorboard of a job (`kubedl.io/tensorboard-config`, `controllers/tensorboards.py`): a
  Deployment, a Service and, with an ingress host, an Ingress;
* a MarsJob's `webHost` (`controllers/marsweb.py`): one Ingress per web-service Service;
* a PyTorchJob's `elasticPolicy.metrics` (`controllers/autoscalers.py`): a HorizontalPodAutoscaler
  on the job's `scale` subresource; on the fake cluster the backend plays the autoscaler
  (`fakecluster/autoscaling.py`).

Each carries the `job-name` label of its job (the Kubernetes backend watches only those) and a
controller owner reference to it, so the API server's garbage collector takes it with the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import Field

from gpuyard.apis.meta import K8sModel, Resource

__all__ = [
    "ADDON_KINDS",
    "Deployment",
    "HorizontalPodAutoscaler",
    "HorizontalPodAutoscalerStatus",
    "Ingress",
    "covers",
]


class Deployment(Resource):
    """`apps/v1` Deployment (free-form spec and status)."""

    KIND = "Deployment"
    API_VERSION = "apps/v1"

    spec: dict[str, Any] = Field(default_factory=dict)
    status: dict[str, Any] = Field(default_factory=dict)


class Ingress(Resource):
    """`networking.k8s.io/v1` Ingress (free-form spec and status)."""

    KIND = "Ingress"
    API_VERSION = "networking.k8s.io/v1"

    spec: dict[str, Any] = Field(default_factory=dict)
    status: dict[str, Any] = Field(default_factory=dict)


class HorizontalPodAutoscalerStatus(K8sModel):
    """What the autoscaler last decided (the fields gpuyard's fake autoscaler writes; others kept)."""

    current_replicas: int | None = None
    desired_replicas: int | None = None
    last_scale_time: datetime | None = None
    current_metrics: list[dict[str, Any]] | None = None


class HorizontalPodAutoscaler(Resource):
    """`autoscaling/v2` HorizontalPodAutoscaler (free-form spec)."""

    KIND = "HorizontalPodAutoscaler"
    API_VERSION = "autoscaling/v2"

    spec: dict[str, Any] = Field(default_factory=dict)
    status: HorizontalPodAutoscalerStatus = Field(default_factory=HorizontalPodAutoscalerStatus)


ADDON_KINDS: tuple[type[Resource], ...] = (Deployment, Ingress, HorizontalPodAutoscaler)
"""The kinds of this module, registered in the store by `state/kinds.py`."""


def covers(current: Any, desired: Any) -> bool:
    """Whether `current` holds every field of `desired` with the same value (a mapping may have
    more keys: what the API server defaulted; lists must match item by item)."""
    if isinstance(desired, Mapping):
        return isinstance(current, Mapping) and all(
            k in current and covers(current[k], v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(covers(c, d) for c, d in zip(current, desired, strict=True))
        )
    return bool(current == desired)
