"""KubeDL's Tensorboard of a job: the `kubedl.io/tensorboard-config` annotation, as data.

A job whose annotation holds a JSON object such as

    {"logDir": "/mnt/logs/mnist", "ttlSecondsAfterJobFinished": 3600,
     "image": "tensorflow/tensorflow:2.15.0",
     "ingressSpec": {"host": "tb.example.com", "pathPrefix": "/tb", "annotations": {...}}}

gets a Tensorboard serving `logDir` on port 6006 under the path `/<pathPrefix>/<namespace>/<job>/`
(KubeDL `pkg/tensorboard/tensorboard.go`); `controllers/tensorboards.py` makes its objects.
:func:`tensorboard_problems` checks the annotation at submit (the field named, what is allowed);
:func:`tensorboard_address` is where a person reaches it (`describe job`).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from datetime import datetime

from pydantic import Field, ValidationError, field_validator

from gpuyard.apis.labels import annotation_problems
from gpuyard.apis.meta import K8sModel, dns_subdomain_problem

__all__ = [
    "ANNOTATION_TENSORBOARD",
    "TENSORBOARD_PORT",
    "TensorboardConfig",
    "TensorboardIngress",
    "parse_tensorboard",
    "tensorboard_address",
    "tensorboard_name",
    "tensorboard_path",
    "tensorboard_problems",
]

ANNOTATION_TENSORBOARD = "kubedl.io/tensorboard-config"
TENSORBOARD_PORT = 6006
_FIELD = f"metadata.annotations.{ANNOTATION_TENSORBOARD}"
INT32_MAX = 2**31 - 1


class TensorboardIngress(K8sModel):
    """`ingressSpec`: expose the Tensorboard at `http://<host>/<pathPrefix>/<namespace>/<job>/`."""

    host: str | None = None
    path_prefix: str | None = None
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        if value is not None and (problem := dns_subdomain_problem(value)):
            raise ValueError(problem)
        return value


class TensorboardConfig(K8sModel):
    """The annotation's JSON (KubeDL's `TensorBoard` struct)."""

    log_dir: str = Field(min_length=1, description="The log directory Tensorboard reads (required).")
    ttl_seconds_after_job_finished: int = Field(default=0, ge=0, le=INT32_MAX)
    update_timestamp: datetime | None = None
    image: str | None = None
    ingress_spec: TensorboardIngress | None = None

    @property
    def host(self) -> str | None:
        return self.ingress_spec.host if self.ingress_spec is not None else None


def parse_tensorboard(raw: str) -> TensorboardConfig:
    """The annotation's config; ValueError (its message names the field) when it is not one."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError('must be a JSON object such as {"logDir": "/logs"}')
    try:
        return TensorboardConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise ValueError(f"{where}: {err['msg']}") from None


def tensorboard_problems(annotations: Mapping[str, str]) -> list[dict[str, str]]:
    """422 details for a job's tensorboard annotation (none when absent or valid)."""
    raw = annotations.get(ANNOTATION_TENSORBOARD)
    if raw is None:
        return []
    try:
        config = parse_tensorboard(raw)
    except ValueError as exc:
        allowed = (
            "allowed: a JSON object with logDir (required), ttlSecondsAfterJobFinished (0 or more), "
            "image, ingressSpec {host (a DNS-1123 subdomain), pathPrefix, annotations}"
        )
        return [{"field": _FIELD, "reason": f"{exc}; {allowed}"}]
    if config.ingress_spec is not None:
        return annotation_problems(config.ingress_spec.annotations, field=f"{_FIELD}.ingressSpec.annotations")
    return []


def tensorboard_name(job_name: str) -> str:
    """The name of the Tensorboard's Deployment, Service and Ingress (KubeDL's `<job>-tensorboard-0`)."""
    return f"{job_name}-tensorboard-0"


def tensorboard_path(config: TensorboardConfig, *, namespace: str, job_name: str) -> str:
    """Tensorboard's `--path_prefix`: `/<pathPrefix>/<namespace>/<job>`."""
    prefix = config.ingress_spec.path_prefix if config.ingress_spec is not None else None
    return posixpath.join("/", prefix or "", namespace, job_name)


def tensorboard_address(config: TensorboardConfig, *, namespace: str, job_name: str) -> str:
    """Where a person opens it: through the Ingress's host, else the Service inside the cluster."""
    path = tensorboard_path(config, namespace=namespace, job_name=job_name) + "/"
    if config.host:
        return f"http://{config.host}{path}"
    return f"http://{tensorboard_name(job_name)}.{namespace}.svc:{TENSORBOARD_PORT}{path}"
