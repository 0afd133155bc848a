"""The fake kubelet's pod admission: does a pod bound to a node fit what the node's other pods left?

A real kubelet admits every pod bound to its node before running it (`pkg/kubelet/lifecycle/
predicate.go`, `predicateAdmitHandler.Admit`): the scheduler's resource fit, run again on the node's
allocatable against the requests of the pods it already admitted that have not finished. Two
schedulers binding onto the same node (kube-scheduler beside gpuyard) can over-commit it; the kubelet
is where that shows: the pod it cannot fit fails at once, `status.phase: Failed`, with reason
`OutOfcpu`, `OutOfmemory`, `OutOfephemeral-storage`, `OutOfpods` or `OutOf<resource>` for any other
(`OutOfnvidia.com/gpu`), and message `Pod was rejected: Node didn't have enough resource: cpu,
requested: 4000, used: 62000, capacity: 64000` (cpu in millicores, the rest in units).

What is checked, in the kubelet's order (it reports the first failure): the pod count, cpu,
memory, ephemeral-storage, then every other resource the pod requests, by name. An extended
resource (a name with a domain other than `kubernetes.io`, e.g. `nvidia.com/gpu`, `gpuyard.io/gpu`)
that the node does not advertise is not checked, as the kubelet drops it (`removeMissingExtended
Resources`: cluster-level and DRA-backed resources). A pod's request is the sum over its
containers, at least each init container's (`PodSpec.requests`).

Pure: :mod:`gpuyard.kubecluster.fakenodes.kubelets` calls :func:`admit` with the node's
allocatable and the pods it admitted there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from gpuyard.apis.core import Pod

__all__ = ["Rejection", "admit", "rejected_status"]

FIRST = ("cpu", "memory", "ephemeral-storage")
SHORT_REASONS = {"cpu": "OutOfcpu", "memory": "OutOfmemory", "ephemeral-storage": "OutOfephemeral-storage"}


@dataclass(frozen=True)
class Rejection:
    """Why a pod was not admitted: the kubelet's reason and message."""

    reason: str
    message: str


def _is_extended(name: str) -> bool:
    """A resource name outside Kubernetes' own (`v1helper.IsExtendedResourceName`)."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")


def _checked(name: str) -> bool:
    """Resources the scheduler's fit (and so the kubelet) tracks at all."""
    return name in FIRST or name.startswith("hugepages-") or _is_extended(name)


def _units(name: str, q: Decimal) -> int:
    """The kubelet's integer units: millicores for cpu, whole units (rounded up) for the rest."""
    return math.ceil(q * 1000) if name == "cpu" else math.ceil(q)


def _insufficient(name: str, *, requested: int, used: int, capacity: int) -> Rejection:
    reason = SHORT_REASONS.get(name, f"OutOf{name}")
    return Rejection(
        reason=reason,
        message=(
            f"Node didn't have enough resource: {name}, requested: {requested}, used: {used}, "
            f"capacity: {capacity}"
        ),
    )


def admit(pod: Pod, *, allocatable: Mapping[str, Decimal], admitted: Iterable[Pod]) -> Rejection | None:
    """None if `pod` fits the node of `allocatable` beside the `admitted` pods (those not finished),
    else the kubelet's rejection."""
    others = list(admitted)
    pods = allocatable.get("pods")
    if pods is not None and len(others) + 1 > int(pods):
        return _insufficient("pods", requested=1, used=len(others), capacity=int(pods))
    request = {
        name: q
        for name, q in pod.spec.requests().items()
        if q > 0 and _checked(name) and (name in allocatable or not _is_extended(name))
    }
    if not request:
        return None
    used: dict[str, Decimal] = {}
    for other in others:
        for name, q in other.spec.requests().items():
            if name in request:
                used[name] = used.get(name, Decimal(0)) + q
    order = [n for n in FIRST if n in request] + sorted(n for n in request if n not in FIRST)
    for name in order:
        want = _units(name, request[name])
        have = _units(name, used.get(name, Decimal(0)))
        capacity = _units(name, allocatable.get(name, Decimal(0)))
        if want > capacity - have:
            return _insufficient(name, requested=want, used=have, capacity=capacity)
    return None


def rejected_status(rejection: Rejection) -> dict[str, str]:
    """The status the kubelet writes for a pod it did not admit (`Kubelet.rejectPod`)."""
    return {
        "phase": "Failed",
        "reason": rejection.reason,
        "message": f"Pod was rejected: {rejection.message}",
    }
