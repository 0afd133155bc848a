"""Which controller manages a job: Kubeflow's `runPolicy.managedBy` (training-operator v1.9).

A job names the controller that reconciles it in `spec.runPolicy.managedBy` (Kubeflow
`kubeflow.org/v1`; KubeDL jobs, whose run policy is inlined in `spec`, take `spec.managedBy`).
As training-operator v1.9 does:

* absent, or :data:`TRAINING_OPERATOR` (`kubeflow.org/training-operator`, the value of the
  operator gpuyard stands in for): gpuyard's job;
* :data:`MULTIKUEUE` (`kueue.x-k8s.io/multikueue`): another controller's. On a MultiKueue manager
  cluster Kueue copies the job to a worker cluster and mirrors its status back, so gpuyard leaves
  it alone: no pods, services or PodGroup, no status write, nothing for the scheduler;
* any other value is refused at submit (`spec.runPolicy.managedBy: Unsupported value`, as
  training-operator's webhook's `ValidateRunPolicyCreate`), and the field is immutable: a merge
  patch cannot change it (`apis/jobpatches.py` lets only a few fields change) and the CRD's
  transition rule refuses a change made with kubectl.

The job operator (`controllers/reconciling.py`) asks :func:`external_manager` before it plans;
the Kubernetes backend (`kubecluster/invalid.py`) asks :func:`raw_external_manager` before it
reports a stored job as invalid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = [
    "MULTIKUEUE",
    "SUPPORTED_MANAGERS",
    "TRAINING_OPERATOR",
    "external_manager",
    "managed_by_problems",
    "raw_external_manager",
]

TRAINING_OPERATOR = "kubeflow.org/training-operator"
"""training-operator's `KubeflowJobsController`: the jobs it (and so gpuyard) reconciles."""
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
"""Kueue's `MultiKueueControllerName`: the job runs on a worker cluster Kueue picks."""
SUPPORTED_MANAGERS = (TRAINING_OPERATOR, MULTIKUEUE)


class _HasRunPolicy(Protocol):
    @property
    def run_policy(self) -> Any: ...


def external_manager(job: _HasRunPolicy) -> str | None:
    """The controller that manages `job` when it is not gpuyard (None: gpuyard's job)."""
    value = getattr(job.run_policy, "managed_by", None)
    if value is None or value == TRAINING_OPERATOR:
        return None
    return str(value)


def raw_external_manager(raw: Mapping[str, Any]) -> str | None:
    """:func:`external_manager` of a job as stored on a Kubernetes API server (a plain mapping)."""
    spec = raw.get("spec")
    if not isinstance(spec, Mapping):
        return None
    nested = spec.get("runPolicy")
    value = nested.get("managedBy") if isinstance(nested, Mapping) else None
    if value is None:
        value = spec.get("managedBy")
    if value is None or value == TRAINING_OPERATOR:
        return None
    return str(value)


def managed_by_problems(spec: Mapping[str, Any]) -> list[dict[str, str]]:
    """The problems of a submitted job's `managedBy` (`spec`: the document's `spec` mapping)."""
    out: list[dict[str, str]] = []
    nested = spec.get("runPolicy")
    places = [("spec.managedBy", spec.get("managedBy"))]
    if isinstance(nested, Mapping):
        places.append(("spec.runPolicy.managedBy", nested.get("managedBy")))
    for where, value in places:
        if value is None or value in SUPPORTED_MANAGERS:
            continue
        out.append(
            {
                "field": where,
                "reason": f"Unsupported value {value!r}; allowed: {', '.join(SUPPORTED_MANAGERS)}",
            }
        )
    return out
