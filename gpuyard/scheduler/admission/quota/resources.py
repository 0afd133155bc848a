"""Resource vectors in quota units, and the conversions from API objects into them.

Quota, admission, reclaim and queue ordering work on plain `dict[str, int]` vectors keyed by
resource name (sparse: a missing name is 0), never on pydantic objects. Units are Koordinator's:
`cpu` in thousandths of a CPU, everything else in whole units rounded up (memory in bytes, GPUs,
GPU classes, extended resources).

GPU classes: a request for `nvidia.v100: 4` (a ResourceClass name) is also 4 `nvidia.com/gpu`,
so a quota on `nvidia.com/gpu` bounds all GPUs and a quota on `nvidia.v100` bounds that type;
a plain `nvidia.com/gpu` request counts only against `nvidia.com/gpu`.

This module is the one place that reads API objects (PodGroup, Node, ElasticQuota, Queue,
ResourceQuota) for the quota package; the rest of the package is plain data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from decimal import Decimal

from gpuyard.apis.core import GPU_RESOURCE, Node
from gpuyard.apis.devicematching import gpu_devices
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.quantity import format_quantity, to_int, to_milli
from gpuyard.apis.resourceclasses import ResourceClass, is_class_resource
from gpuyard.apis.scheduling import PodGroup

__all__ = [
    "GPU",
    "Vector",
    "add",
    "capacity_of",
    "dominant_share",
    "fits",
    "format_amount",
    "podgroup_usage",
    "quantities_of",
    "sub",
    "to_units",
    "usage_of_requests",
    "vector_of",
]

GPU = GPU_RESOURCE
Vector = dict[str, int]


def to_units(name: str, value: Decimal) -> int:
    """One quantity in quota units: `cpu` in milli, anything else whole units rounded up."""
    return to_milli(value) if name == "cpu" else to_int(value)


def vector_of(values: Mapping[str, Decimal]) -> Vector:
    """A resource list (`{cpu: 500m, memory: 2Gi}`) as a vector in quota units."""
    return {name: to_units(name, q) for name, q in values.items()}


def quantities_of(v: Mapping[str, int]) -> dict[str, Decimal]:
    """A vector back as Kubernetes quantities (for `status.used` / `status.runtime` writes)."""
    return {name: Decimal(a) / 1000 if name == "cpu" else Decimal(a) for name, a in sorted(v.items())}


def usage_of_requests(requests: Mapping[str, Decimal], *, count: int = 1) -> Vector:
    """What `count` pods with this request charge to a quota (GPU classes also count as GPUs)."""
    out: Vector = {}
    for name, q in requests.items():
        if q <= 0:
            continue
        amount = to_units(name, q) * count
        out[name] = out.get(name, 0) + amount
        if name != GPU and is_class_resource(name):
            out[GPU] = out.get(GPU, 0) + amount
    return out


def podgroup_usage(pg: PodGroup) -> Vector:
    """A whole job's demand: every replica of every role (what its quota must hold to run it all)."""
    out: Vector = {}
    for role in pg.spec.roles:
        if role.replicas:
            add(out, usage_of_requests(role.template.requests(), count=role.replicas))
    return out


def add(into: Vector, delta: Mapping[str, int], *, sign: int = 1) -> Vector:
    """`into += sign * delta`, in place; returns `into`."""
    for name, amount in delta.items():
        if amount:
            into[name] = into.get(name, 0) + sign * amount
    return into


def sub(a: Mapping[str, int], b: Mapping[str, int]) -> Vector:
    out = dict(a)
    return add(out, b, sign=-1)


def fits(request: Mapping[str, int], free: Mapping[str, int]) -> bool:
    """Every positive amount of `request` is available in `free`."""
    return all(amount <= free.get(name, 0) for name, amount in request.items() if amount > 0)


def dominant_share(usage: Mapping[str, int], capacity: Mapping[str, int]) -> float:
    """max over resources of usage / capacity (resources the cluster lacks count as fully used)."""
    share = 0.0
    for name, amount in usage.items():
        if amount <= 0:
            continue
        cap = capacity.get(name, 0)
        share = max(share, amount / cap if cap > 0 else math.inf)
    return share


def format_amount(name: str, amount: int) -> str:
    """`1500m`/`2` CPU, `64Gi` memory, `5` GPUs: how a person writes it."""
    if name == "cpu":
        return format_quantity(Decimal(amount) / 1000)
    if name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
        return format_quantity(Decimal(amount))
    return str(amount)


def capacity_of(
    nodes: Iterable[Node],
    *,
    classes: Iterable[ResourceClass] = (),
    topologies: Mapping[str, NodeTopology] | None = None,
) -> Vector:
    """The cluster total a quota tree divides: allocatable of ready nodes, plus GPUs per class.

    Unhealthy GPUs are not counted for classes (they are for `nvidia.com/gpu` only if the node
    still advertises them as allocatable).
    """
    total: Vector = {}
    matchers = [(c.metadata.name, c.matcher()) for c in classes]
    for node in nodes:
        if not node.ready or node.spec.unschedulable:
            continue
        for name, q in node.status.allocatable.items():
            if name == "pods":
                continue
            total[name] = total.get(name, 0) + to_units(name, q)
        if not matchers:
            continue
        topo = topologies.get(node.metadata.name) if topologies else None
        devices = [d for d in gpu_devices(node, topo) if d.healthy]
        for cname, m in matchers:
            n = sum(1 for d in devices if m.matches(d.properties() if m.per_device else d.shared))
            if n:
                total[cname] = total.get(cname, 0) + n
    return total
