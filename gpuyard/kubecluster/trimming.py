"""The transform on informer objects (client-go's `SetTransform`): what gpuyard never reads is
dropped before an object is validated and enters the cache.

* Every object: `metadata.managedFields` (the API server's bookkeeping of field owners; gpuyard
  never reads it, and an update that leaves it out keeps the server's, as Kubernetes documents).
* Foreign pods (another scheduler's, not of a gpuyard job) are cut to what the node model reads of
  them (`nodes.py`: the capacity they take): metadata (name, namespace, uid, labels, annotations
  but `kubectl.kubernetes.io/last-applied-configuration`, owner references, finalizers,
  timestamps, resourceVersion), of the spec the node, scheduler name, priority, tolerations, node
  selector, affinity, resource claims and each container's name and `resources` (so
  `PodSpec.requests()` is unchanged), of the status the phase, reason, message, IPs and start time.
  Their env, volumes, volume mounts, probes, commands, security contexts, container statuses and
  conditions are dropped. gpuyard never writes a foreign pod whole (it patches the status of one on a
  lost node and deletes it), so nothing dropped here is ever written back.
* gpuyard's own pods (its scheduler name, the delegated gang scheduler's, the `job-name` label, or an
  owner reference to a job kind or any kind of gpuyard's custom resource groups: a ModelVersion's
  image build pod) and every other kind are kept whole but for `managedFields`:
  controllers read and rewrite them.
"""

from __future__ import annotations

from typing import Any

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.resources import API_RESOURCES
from gpuyard.apis.scheduling import LABEL_JOB_NAME

__all__ = ["LAST_APPLIED", "Trimmer", "is_foreign_pod"]

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_META_KEEP = (
    "name",
    "generateName",
    "namespace",
    "uid",
    "labels",
    "annotations",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "ownerReferences",
    "finalizers",
)
_SPEC_KEEP = (
    "nodeName",
    "schedulerName",
    "priority",
    "priorityClassName",
    "tolerations",
    "nodeSelector",
    "affinity",
    "resourceClaims",
    "resources",
    "overhead",
)
_OWN_GROUPS = frozenset(r.group for r in API_RESOURCES if r.crd or r.gang_scheduler)
_CONTAINER_KEEP = ("name", "resources")
_STATUS_KEEP = ("phase", "reason", "message", "hostIP", "podIP", "startTime", "nominatedNodeName")


def is_foreign_pod(raw: dict[str, Any], *, ours: frozenset[str]) -> bool:
    """A pod another scheduler places and no gpuyard job owns (raw JSON)."""
    spec = raw.get("spec") or {}
    if (spec.get("schedulerName") or "default-scheduler") in ours:
        return False
    meta = raw.get("metadata") or {}
    if LABEL_JOB_NAME in (meta.get("labels") or {}):
        return False
    for ref in meta.get("ownerReferences") or []:
        if not isinstance(ref, dict):
            continue
        group = str(ref.get("apiVersion") or "").rpartition("/")[0]
        if ref.get("kind") in KIND_INFO or group in _OWN_GROUPS:
            return False
    return True


def _pick(data: Any, keep: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, dict):
        return {}
    return {k: data[k] for k in keep if k in data}


class Trimmer:
    """The transform of one backend: `ours` are the scheduler names whose pods are gpuyard's."""

    def __init__(self, *, ours: frozenset[str]) -> None:
        self.ours = ours
        self.trimmed_pods = 0  # foreign pods cut down (a figure for tests and benchmarks)

    def __call__(self, kind: str, raw: dict[str, Any]) -> dict[str, Any]:
        """`raw` without what gpuyard never reads (changed in place and returned)."""
        meta = raw.get("metadata")
        if isinstance(meta, dict):
            meta.pop("managedFields", None)
        if kind != "Pod" or not is_foreign_pod(raw, ours=self.ours):
            return raw
        self.trimmed_pods += 1
        meta = _pick(meta, _META_KEEP)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
        spec = _pick(raw.get("spec"), _SPEC_KEEP)
        for field in ("containers", "initContainers"):
            containers = (raw.get("spec") or {}).get(field)
            if isinstance(containers, list):
                spec[field] = [_pick(c, _CONTAINER_KEEP) for c in containers]
        out: dict[str, Any] = {"apiVersion": raw.get("apiVersion"), "kind": raw.get("kind"), "metadata": meta}
        out["spec"] = spec
        if "status" in raw:
            out["status"] = _pick(raw.get("status"), _STATUS_KEEP)
        return out
