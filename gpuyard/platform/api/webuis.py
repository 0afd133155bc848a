"""Where a person reaches a job's web UIs: its Tensorboard and a MarsJob's web service.

`GET /api/v1/namespaces/{ns}/jobs/{name}` carries them as `summary.webUIs` (and `gpuyard describe
job` prints them): one entry per UI with its `address`, the objects that serve it and whether
they exist now (`ready`: made by the operator; a Tensorboard also goes
`ttlSecondsAfterJobFinished` after its job). Read from the job and the store, on every backend.
"""

from __future__ import annotations

from typing import Any

from gpuyard.apis.core import Service
from gpuyard.apis.jobkinds import MarsJob, TrainingJob
from gpuyard.apis.tensorboards import (
    ANNOTATION_TENSORBOARD,
    parse_tensorboard,
    tensorboard_address,
    tensorboard_name,
)
from gpuyard.controllers.marsweb import WEB_REPLICA_TYPE, web_address
from gpuyard.state.store import Store

__all__ = ["web_uis"]


def web_uis(store: Store, job: TrainingJob) -> list[dict[str, Any]]:
    """The job's web UIs (see the module docstring); [] when it has none."""
    ns, name = job.metadata.namespace, job.metadata.name
    out: list[dict[str, Any]] = []
    raw = job.metadata.annotations.get(ANNOTATION_TENSORBOARD)
    if raw is not None:
        try:
            config = parse_tensorboard(raw)
        except ValueError:
            config = None
        if config is not None:
            tb = tensorboard_name(name)
            kinds = ["Deployment", "Service", *(["Ingress"] if config.host else [])]
            out.append(
                {
                    "name": "tensorboard",
                    "address": tensorboard_address(config, namespace=ns, job_name=name),
                    "objects": [f"{k.lower()}/{tb}" for k in kinds],
                    "ready": all(store.get(k, ns, tb) is not None for k in kinds),
                }
            )
    if isinstance(job, MarsJob) and job.spec.web_host:
        selector = {"job-name": name, "replica-type": WEB_REPLICA_TYPE}
        services = sorted(s.metadata.name for s in store.list_of(Service, namespace=ns, selector=selector))
        for svc in services or [f"{name}-webservice-0"]:
            out.append(
                {
                    "name": "mars-web",
                    "address": web_address(job.spec.web_host, namespace=ns, service=svc),
                    "objects": [f"ingress/{svc}"],
                    "ready": store.get("Ingress", ns, svc) is not None,
                }
            )
    return out
