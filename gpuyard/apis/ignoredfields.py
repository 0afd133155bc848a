"""Job fields gpuyard accepts but does not act on, each with the reason: the one table of them.

A job written for KubeDL, Kubeflow or plain Kubernetes may carry fields that gpuyard keeps (they
pass through to the stored object and, for pod templates, to the pods) but whose meaning it does
not carry out. Such a field is not unknown, so `?fieldValidation=` would not name it; a user who
wrote it would get a different job from the one asked for. :data:`IGNORED_FIELDS` lists them and
:func:`ignored_fields` finds them in a submitted document:

* `POST /api/v1/jobs?fieldValidation=Strict` (`gpuyard submit --validate=strict`) refuses the
  job with a 422 naming each (`accepted but not acted on: REASON`); the default `Warn` accepts it
  with one `Warning` header per field; `Ignore` is silent (`platform/api/fields.py`);
* `gpuyard validate` prints each as a warning, and `--strict` fails on it (exit 2).

An entry leaves the table when gpuyard starts acting on its field. Fields being implemented
elsewhere (spot replicas, pod affinity and spread constraints, elastic metrics, cron, model
versions, cache backends, TensorBoard, Mars' web host) are not listed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["IGNORED_FIELDS", "IgnoredField", "ignored_fields"]


@dataclass(frozen=True, slots=True)
class IgnoredField:
    """A field gpuyard accepts without acting on it.

    `path`: dotted, relative to the document (`spec.launcherCreationPolicy`) or, with `pod`, to a
    role's pod template spec (`schedulingGates`: `spec.<replicaSpecs>.<role>.template.spec.schedulingGates`).
    `kinds`: the kinds it applies to (empty: every kind)."""

    path: str
    reason: str
    kinds: tuple[str, ...] = ()
    pod: bool = False


IGNORED_FIELDS: tuple[IgnoredField, ...] = (
    IgnoredField(
        "spec.launcherCreationPolicy",
        "the launcher always starts once every worker is Running (WaitForWorkersReady); AtStartup is not honoured",
        kinds=("MPIJob",),
    ),
    IgnoredField(
        "spec.mpiImplementation",
        "the MPI flavour is read from spec.mpiDistribution (OpenMPI, IntelMPI, MPICH); set that instead",
        kinds=("MPIJob",),
    ),
    IgnoredField(
        "spec.sshAuthMountPath",
        "ranks are started through kubexec (kubectl exec), not SSH: no SSH key Secret is made or mounted",
        kinds=("MPIJob",),
    ),
    IgnoredField(
        "spec.runLauncherAsWorker",
        "the launcher is in the hostfile only when it requests GPUs, whatever this field says",
        kinds=("MPIJob",),
    ),
    IgnoredField(
        "spec.gitSyncConfig",
        "git-sync options are read from the kubedl.io/git-sync-config annotation (the same options), "
        "not from this field",
        kinds=("ElasticDLJob",),
    ),
    IgnoredField(
        "schedulingGates",
        "gpuyard places and binds a job's pods as one gang; a pod's scheduling gates are not waited for",
        pod=True,
    ),
    IgnoredField(
        "overhead",
        "placement counts the containers' requests only; a RuntimeClass's pod overhead is not added",
        pod=True,
    ),
)


def _at(data: Any, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return data is not None


def ignored_fields(doc: Any, *, replica_field: str, prefix: str = "") -> list[tuple[str, str]]:
    """`(path, reason)` for each field of :data:`IGNORED_FIELDS` that the job document `doc` sets."""
    if not isinstance(doc, Mapping):
        return []
    kind = doc.get("kind")
    spec = doc.get("spec")
    roles = spec.get(replica_field) if isinstance(spec, Mapping) else None
    out: list[tuple[str, str]] = []
    for entry in IGNORED_FIELDS:
        if entry.kinds and kind not in entry.kinds:
            continue
        if not entry.pod:
            if _at(doc, entry.path):
                out.append((prefix + entry.path, entry.reason))
            continue
        if not isinstance(roles, Mapping):
            continue
        for role, replica in roles.items():
            if _at(replica, f"template.spec.{entry.path}"):
                out.append((f"{prefix}spec.{replica_field}.{role}.template.spec.{entry.path}", entry.reason))
    return out
