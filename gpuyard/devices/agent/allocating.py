"""Which pod a kubelet device-plugin call is for, and what it gets: the pure rule of device-plugin mode.

The kubelet's `Allocate` call names device IDs, not the pod (the known race of device plugins: with
several pods starting on a node the plugin cannot tell which one it serves). gpuyard removes the
guess in two steps:

1. `GetPreferredAllocation(available, mustInclude, size)`: the candidates are the gpuyard pods bound
   to this node that have not started (phase Pending) and whose `gpuyard.io/devices` annotation holds
   exactly `size` devices of this resource, all in `available` and covering `mustInclude`. Exactly
   one candidate: its devices are the preferred allocation, which the kubelet then allocates. None or
   several: no preference (an empty answer), and step 2 decides.
2. `Allocate(ids)`: the pod is the one pending gpuyard pod on this node whose devices of this resource
   are exactly `ids`. The scheduler never gives one device to two pods, so at most one pod matches.
   No match is an error naming the node, the IDs and the pending pods: the pod was not placed by
   gpuyard (`schedulerName: gpuyard`), or the kubelet chose other devices than the scheduler did.
   Never a guess: a wrong guess would run two pods on swapped GPUs and gpuyard's books would drift.

Device IDs are GPU UUIDs (`gpuyard.io/gpu`) and NIC names (`gpuyard.io/rdma`), as in the NodeTopology.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gpuyard.apis.scheduling import ANNOTATION_DEVICES

__all__ = [
    "RESOURCE_GPU",
    "RESOURCE_RDMA",
    "AllocationError",
    "PendingPod",
    "PodLookup",
    "allocation_env",
    "match_allocation",
    "pending_pods_from",
    "preferred_allocation",
]

RESOURCE_GPU = "gpuyard.io/gpu"
RESOURCE_RDMA = "gpuyard.io/rdma"
Resource = Literal["gpuyard.io/gpu", "gpuyard.io/rdma"]


class AllocationError(LookupError):
    """No pod to give these devices to; the message says which node, IDs and pods were seen."""


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A gpuyard pod bound to this node that has not started, with the devices it was given."""

    namespace: str
    name: str
    gpu_ids: tuple[str, ...]
    gpus: tuple[int, ...]
    nics: tuple[str, ...]

    def ids(self, resource: str) -> tuple[str, ...]:
        return self.gpu_ids if resource == RESOURCE_GPU else self.nics

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodLookup(Protocol):
    """Answers "which gpuyard pods bound to node N have not started" (gpuyard API or Kubernetes)."""

    async def pending_pods(self, node: str) -> list[PendingPod]: ...


def pending_pods_from(pods: Iterable[Mapping[str, Any]]) -> list[PendingPod]:
    """Pending pods with a `gpuyard.io/devices` annotation, from pod documents (API or Kubernetes)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if status.get("phase", "Pending") != "Pending":
            continue
        raw = (meta.get("annotations") or {}).get(ANNOTATION_DEVICES)
        if not raw:
            continue
        try:
            devices = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(devices, dict):
            continue
        out.append(
            PendingPod(
                namespace=str(meta.get("namespace") or "default"),
                name=str(meta.get("name") or ""),
                gpu_ids=tuple(str(i) for i in devices.get("gpuIds") or []),
                gpus=tuple(int(g) for g in devices.get("gpus") or []),
                nics=tuple(str(n) for n in devices.get("nics") or []),
            )
        )
    return out


def preferred_allocation(
    pods: Sequence[PendingPod],
    *,
    resource: str,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """Step 1 of the module doc: the one candidate pod's devices, or [] (no preference)."""
    free = set(available)
    need = set(must_include)
    candidates = [
        p
        for p in pods
        if len(p.ids(resource)) == size and set(p.ids(resource)) <= free and need <= set(p.ids(resource))
    ]
    return list(candidates[0].ids(resource)) if len(candidates) == 1 else []


def match_allocation(
    pods: Sequence[PendingPod], *, node: str, resource: str, ids: Sequence[str]
) -> PendingPod:
    """Step 2 of the module doc: the pod whose devices are exactly `ids`; AllocationError otherwise."""
    wanted = set(ids)
    found = [p for p in pods if set(p.ids(resource)) == wanted and len(p.ids(resource)) == len(ids)]
    if len(found) == 1:
        return found[0]
    seen = ", ".join(f"{p.key} {list(p.ids(resource))}" for p in pods) or "none"
    if not found:
        raise AllocationError(
            f"no pending gpuyard pod on node {node} was given {resource} {sorted(wanted)}; "
            f"pending pods: {seen}. Pods using {resource} must be placed by gpuyard (schedulerName: gpuyard)"
        )
    raise AllocationError(  # cannot happen while the scheduler never double-books a device
        f"pods {[p.key for p in found]} on node {node} were all given {resource} {sorted(wanted)}; refusing to guess"
    )


def allocation_env(pod: PendingPod, *, resource: str) -> dict[str, str]:
    """The env the kubelet adds to the container: what the NVIDIA runtime and NCCL need."""
    if resource == RESOURCE_GPU:
        pairs = sorted(zip(pod.gpus, pod.gpu_ids, strict=False))  # physical order, as materializing.py
        ids = [uuid for _, uuid in pairs] if len(pairs) == len(pod.gpu_ids) else list(pod.gpu_ids)
        return {
            "NVIDIA_VISIBLE_DEVICES": ",".join(ids),
            "GPUYARD_GPU_INDICES": ",".join(str(g) for g in sorted(pod.gpus)),
        }
    return {"NCCL_IB_HCA": "=" + ",".join(pod.nics), "GPUYARD_RDMA_DEVICES": ",".join(pod.nics)}
