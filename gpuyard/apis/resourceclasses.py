"""ResourceClass (`gpuyard.io/v1alpha1`): GPU types selected by device properties, and request checks.

A ResourceClass names a set of GPUs by their properties. A container asks for GPUs of a class
the way it asks for any resource (`resources.limits: {nvidia.tesla.k80: 1}`); plain
`nvidia.com/gpu` means any GPU. The scheduler chooses only devices the class matches and writes
their indices and ids into the pod's Reservation; the operator hands them to the pod
(`gpuyard.io/devices`, `NVIDIA_VISIBLE_DEVICES`).

This module holds the ResourceClass object, the default class per GPU model, the split of a
pod's request into GPUs and the rest (:func:`parse_gpu_request`) and the submit-time checks
(:func:`validate_gang_request`, :func:`validate_resource_class`). The selectors, their compiled
matchers and a node's device properties are in :mod:`gpuyard.apis.devicematching`. Both are shared by the scheduler (matching) and the operator/HTTP API (validation at
submit time), which must not import each other; everything here is pure and works on the API
models.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

from pydantic import Field, ValidationError

from gpuyard.apis.core import GPU_RESOURCE, Node, PodSpec
from gpuyard.apis.devicematching import (
    DeviceInfo,
    DeviceSelector,
    Matcher,
    compile_selector,
    gpu_devices,
)
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.meta import Resource, StrictK8sModel
from gpuyard.apis.quantity import format_quantity, to_int, to_milli
from gpuyard.apis.scheduling import PodGroup, PodGroupSpec

__all__ = [
    "API_VERSION",
    "CORE_RESOURCES",
    "LABEL_DEFAULT_CLASS",
    "RESOURCE_CLASS_KINDS",
    "GpuRequest",
    "Problem",
    "RequestError",
    "ResourceClass",
    "ResourceClassSpec",
    "default_class",
    "default_class_name",
    "parse_gpu_request",
    "validate_gang_request",
    "validate_resource_class",
]

API_VERSION = "gpuyard.io/v1alpha1"
LABEL_DEFAULT_CLASS = "gpuyard.io/default-class"

# Resource names that are neither GPUs nor extended resources (Kubernetes' own, no domain prefix).
CORE_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage", "storage"})
_CLASS_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


# --- the model --------------------------------------------------------------------------------


class ResourceClassSpec(StrictK8sModel):
    selector: DeviceSelector = Field(default_factory=DeviceSelector)
    description: str = ""


class ResourceClass(Resource):
    """A named GPU type (cluster-scoped): `resources.limits: {<name>: n}` asks for n such GPUs."""

    KIND = "ResourceClass"
    API_VERSION = API_VERSION
    NAMESPACED = False

    spec: ResourceClassSpec = Field(default_factory=ResourceClassSpec)

    def matcher(self) -> Matcher:
        return compile_selector(self.spec.selector)


RESOURCE_CLASS_KINDS: list[type[Resource]] = [ResourceClass]


# --- default classes --------------------------------------------------------------------------


def default_class_name(model: str) -> str:
    """`nvidia.<model>`: the class the scheduler creates for every GPU model in the cluster."""
    return "nvidia." + re.sub(r"[^a-z0-9.-]+", "-", model.lower()).strip("-.")


def default_class(model: str) -> ResourceClass:
    return ResourceClass.model_validate(
        {
            "metadata": {"name": default_class_name(model), "labels": {LABEL_DEFAULT_CLASS: "true"}},
            "spec": {
                "selector": {"matchLabels": {"model": model}},
                "description": f"Any {model} GPU (created by the scheduler for the model found in the cluster).",
            },
        }
    )


# --- requests ---------------------------------------------------------------------------------


class RequestError(ValueError):
    """A pod request that cannot be scheduled as written; `field` names the resource."""

    def __init__(self, resource: str, reason: str) -> None:
        super().__init__(reason)
        self.resource = resource
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """A pod's resources split for scheduling: GPUs (count and class) and everything else.

    `cpu_milli` in thousandths of a CPU, `memory` in bytes, `other` the extended resources (in
    thousandths, as Kubernetes counts them exactly).
    """

    cpu_milli: int
    memory: int
    gpus: int
    gpu_class: str | None
    other: tuple[tuple[str, int], ...]


# Resources that ask for part of one GPU (GPU sharing); never node extended resources.
SHARE_MILLI = "gpuyard.io/gpu-milli"
SHARE_MEMORY_MIB = "gpuyard.io/gpu-memory-mib"
KOORD_CORE = "koordinator.sh/gpu-core"
KOORD_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
KOORD_MEMORY = "koordinator.sh/gpu-memory"
SHARE_RESOURCES = (SHARE_MILLI, SHARE_MEMORY_MIB, KOORD_CORE, KOORD_MEMORY_RATIO, KOORD_MEMORY)


def is_class_resource(name: str) -> bool:
    """A resource name without a domain prefix that Kubernetes does not define: a class request."""
    return "/" not in name and name not in CORE_RESOURCES and not name.startswith("hugepages-")


def parse_gpu_request(
    requests: Mapping[str, Decimal], classes: Iterable[str] | Mapping[str, Any]
) -> GpuRequest:
    """Split a pod's total request; raise :class:`RequestError` for unknown classes or odd GPU counts."""
    known = classes if isinstance(classes, Mapping) else frozenset(classes)
    gpus = 0
    gpu_class: str | None = None
    other = []
    for name, q in requests.items():
        if name in ("cpu", "memory", "pods"):
            continue
        is_gpu = name == GPU_RESOURCE
        if not is_gpu and is_class_resource(name):
            if name not in known:
                allowed = ", ".join(sorted(known)) or "none defined yet"
                raise RequestError(name, f"unknown resource class {name!r}; known classes: {allowed}")
            is_gpu = True
        if is_gpu:
            if q != q.to_integral_value() or q < 0:
                raise RequestError(name, f"{name} must be a whole number of GPUs, got {q}")
            if q == 0:
                continue
            wanted = None if name == GPU_RESOURCE else name
            if gpus and wanted != gpu_class:
                first = gpu_class or GPU_RESOURCE
                raise RequestError(
                    name, f"a pod asks for GPUs of one kind; it requests both {first} and {name}"
                )
            gpus += int(q)
            gpu_class = wanted
        elif q > 0:
            other.append((name, to_milli(q)))
    return GpuRequest(
        cpu_milli=to_milli(requests.get("cpu", Decimal(0))),
        memory=to_int(requests.get("memory", Decimal(0))),
        gpus=gpus,
        gpu_class=gpu_class,
        other=tuple(sorted(other)),
    )


# --- validation at submit time ----------------------------------------------------------------


class Problem(NamedTuple):
    """A `(field, reason)` pair; `get("field")` reads it like the HTTP API's error detail dict."""

    field: str
    reason: str

    def get(self, key: str, default: Any = None) -> Any:
        return {"field": self.field, "reason": self.reason}.get(key, default)


def validate_resource_class(data: Mapping[str, Any] | ResourceClass) -> list[Problem]:
    """`[(field, reason)]` for a ResourceClass definition (unknown operator, non-numeric Gt, ...)."""
    if isinstance(data, ResourceClass):
        data = data.to_dict()
    problems: list[Problem] = []
    try:
        obj = ResourceClass.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            path = ""
            for part in err["loc"]:
                if isinstance(part, int):
                    path += f"[{part}]"
                elif not str(part).startswith("function-after"):
                    path += f".{part}" if path else str(part)
            reason = (
                "unknown field"
                if err["type"] == "extra_forbidden"
                else err["msg"].removeprefix("Value error, ")
            )
            problems.append(Problem(path, reason))
        return problems
    if not _CLASS_NAME_RE.match(obj.metadata.name or ""):
        problems.append(
            Problem(
                "metadata.name",
                f"{obj.metadata.name!r} is not a valid class name; use lowercase letters, digits, '-' and '.'",
            )
        )
    return problems


@dataclass(slots=True)
class _Capacity:
    """The most of each resource any single node offers (what a pod can never exceed)."""

    largest: dict[str, Decimal]
    gpus: int
    per_class: dict[str, int]


_DEVICE_CACHE: dict[tuple[str, str, str], list[DeviceInfo]] = {}


def _devices(node: Node, topology: NodeTopology | None) -> list[DeviceInfo]:
    """`gpu_devices`, remembered per (node, resourceVersion) for stored objects (submit checks run often)."""
    rv = node.metadata.resource_version
    if not rv:
        return gpu_devices(node, topology)
    key = (node.metadata.name, rv, topology.metadata.resource_version if topology is not None else "")
    devices = _DEVICE_CACHE.get(key)
    if devices is None:
        if len(_DEVICE_CACHE) > 50_000:
            _DEVICE_CACHE.clear()
        devices = _DEVICE_CACHE[key] = gpu_devices(node, topology)
    return devices


def _capacity(
    nodes: Sequence[Node], classes: dict[str, ResourceClass], topologies: Mapping[str, NodeTopology]
) -> _Capacity:
    """The largest node's resources and GPU counts per class. Adds to `classes` the default class
    of every GPU model present that has none yet (they are created moments after a node appears)."""
    largest: dict[str, Decimal] = {}
    node_devices = []
    for node in nodes:
        for res, q in node.status.allocatable.items():
            if q > largest.get(res, Decimal(-1)):
                largest[res] = q
        devices = _devices(node, topologies.get(node.metadata.name))
        node_devices.append(devices)
        for model in {d.model for d in devices if d.model}:
            classes.setdefault(default_class_name(model), default_class(model))
    matchers = {name: c.matcher() for name, c in classes.items()}
    per_class = dict.fromkeys(classes, 0)
    gpus = 0
    for devices in node_devices:
        gpus = max(gpus, len(devices))
        for name, m in matchers.items():
            if m.per_device:
                n = sum(1 for d in devices if m.matches(d.properties()))
            else:
                verdicts: dict[int, bool] = {}
                n = 0
                for d in devices:
                    ok = verdicts.get(id(d.shared))
                    if ok is None:
                        ok = verdicts[id(d.shared)] = m.matches(d.shared)
                    n += ok
            if n > per_class[name]:
                per_class[name] = n
    return _Capacity(largest, gpus, per_class)


_LAST_CAPACITY: list[tuple[tuple[object, ...], _Capacity, dict[str, ResourceClass]]] = []


def _capacity_cached(
    nodes: list[Node], classes: dict[str, ResourceClass], topologies: list[NodeTopology]
) -> _Capacity:
    """`_capacity`, reused while the same stored nodes, topologies and classes are asked about
    (a bulk submit validates many jobs against one cluster)."""
    objs = [*nodes, *topologies, *classes.values()]
    if not all(o.metadata.resource_version for o in objs):
        return _capacity(nodes, classes, {t.metadata.name: t for t in topologies})
    key = tuple((o.kind, o.metadata.name, o.metadata.resource_version) for o in objs)
    if _LAST_CAPACITY and _LAST_CAPACITY[0][0] == key:
        _, cap, added = _LAST_CAPACITY[0]
        for name, c in added.items():
            classes.setdefault(name, c)
        return cap
    before = set(classes)
    cap = _capacity(nodes, classes, {t.metadata.name: t for t in topologies})
    _LAST_CAPACITY[:] = [(key, cap, {n: c for n, c in classes.items() if n not in before})]
    return cap


_STORE_KINDS = ("Node", "NodeTopology", "ResourceClass")
_LAST_STORE: list[tuple[weakref.ref[Any], tuple[int, ...], dict[str, ResourceClass], _Capacity | None]] = []


def _stored(store: Any) -> tuple[list[ResourceClass], list[Node], list[NodeTopology]]:
    """The ResourceClasses, Nodes and NodeTopologies `store` holds (kinds it does not know: none)."""
    kinds = set(store.kinds())
    return (
        store.list("ResourceClass") if "ResourceClass" in kinds else [],
        store.list("Node"),
        store.list("NodeTopology") if "NodeTopology" in kinds else [],
    )


def _store_capacity(store: Any) -> tuple[dict[str, ResourceClass], _Capacity | None]:
    """The classes (defaults for the nodes' GPU models added) and the capacity of what `store`
    holds, reused until a node, topology or class is written there (`Store.changed`): a queue of
    100,000 jobs is validated without listing 10,000 nodes per job."""
    changed = getattr(store, "changed", None)  # a store-like object without it: nothing reused
    versions = changed(*_STORE_KINDS) if changed is not None else None
    if versions is not None and _LAST_STORE:
        ref, known, by_name, cap = _LAST_STORE[0]
        if ref() is store and known == versions:
            return dict(by_name), cap
    classes, nodes, topologies = _stored(store)
    by_name = {c.metadata.name: c for c in classes}
    cap = _capacity_cached(nodes, by_name, topologies) if nodes else None
    if versions is not None:
        _LAST_STORE[:] = [(weakref.ref(store), versions, dict(by_name), cap)]
    return by_name, cap


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _pod_specs(request: Any) -> list[tuple[str, PodSpec]]:
    if isinstance(request, PodGroup):
        request = request.spec
    if isinstance(request, PodGroupSpec):
        return [(f"spec.roles[{i}].template", r.template) for i, r in enumerate(request.roles)]
    if isinstance(request, PodSpec):
        return [("spec", request)]
    if isinstance(request, Mapping):
        return list(request.items())
    replica_specs = getattr(request, "replica_specs", None)
    if isinstance(replica_specs, Mapping):  # a training job (TFJob, PyTorchJob, ...): duck-typed
        field = _camel(getattr(request, "REPLICA_FIELD", "replica_specs"))
        return [
            (f"spec.{field}.{role}.template.spec", rs.template.spec) for role, rs in replica_specs.items()
        ]
    return [(f"[{i}]", s) for i, s in enumerate(request)]


def _field_of(prefix: str, spec: PodSpec, resource: str) -> str:
    for kind, containers in (("containers", spec.containers), ("initContainers", spec.init_containers)):
        for j, c in enumerate(containers):
            if resource in c.resources.requests:
                return f"{prefix}.{kind}[{j}].resources.requests.{resource}"
            if resource in c.resources.limits:
                return f"{prefix}.{kind}[{j}].resources.limits.{resource}"
    return f"{prefix}.resources.{resource}"


def _fmt(q: Decimal, resource: str) -> str:
    return (
        format_quantity(q) if resource in ("cpu", "memory") or not q == q.to_integral_value() else str(int(q))
    )


def _placement_rule_problems(prefix: str, spec: PodSpec) -> list[Problem]:
    """A bad podAffinity / podAntiAffinity / topologySpreadConstraints entry, with its field."""
    from gpuyard.apis.podplacement import has_rules, rules_of  # it builds on this module's RequestError

    if not has_rules(spec):
        return []
    try:
        rules_of(spec, namespace="", labels={}, where=prefix)
    except RequestError as exc:
        return [Problem(exc.resource, exc.reason)]
    return []


def validate_gang_request(
    request: Any,
    classes: Iterable[ResourceClass] | None = None,
    nodes: Iterable[Node] | None = None,
    *,
    topologies: Collection[NodeTopology] = (),
    store: Any = None,
) -> list[Problem]:
    """`[(field, reason)]` for pod requests that could never be placed; empty when all is well.

    Catches unknown resource classes, fractional or mixed GPU requests, and requests larger than
    the largest node can ever hold ("requests 16 nvidia.com/gpu per pod; the largest node has 8").
    `request` is a PodGroup, its spec, one PodSpec, a training job (anything with `replica_specs`),
    or field-prefix -> PodSpec. Classes, nodes and topologies default to what `store` holds. With
    no nodes known yet the capacity checks are skipped (nodes may still join).
    """
    if store is not None and classes is None and nodes is None and not topologies:
        by_name, cap = _store_capacity(store)
    else:
        if store is not None:  # what was not given comes from the store
            stored_classes, stored_nodes, stored_topologies = _stored(store)
            classes = stored_classes if classes is None else classes
            nodes = stored_nodes if nodes is None else nodes
            topologies = topologies or stored_topologies
        by_name = {c.metadata.name: c for c in classes or ()}
        node_list = list(nodes or ())
        cap = _capacity_cached(node_list, by_name, list(topologies)) if node_list else None
    problems: list[Problem] = []
    for prefix, spec in _pod_specs(request):
        problems.extend(_placement_rule_problems(prefix, spec))
        requests = spec.requests()
        try:
            parsed = parse_gpu_request(requests, by_name)
        except RequestError as exc:
            problems.append(Problem(_field_of(prefix, spec, exc.resource), exc.reason))
            continue
        if cap is None:
            continue
        if parsed.gpus:
            res = parsed.gpu_class or GPU_RESOURCE
            most = cap.per_class.get(res, 0) if parsed.gpu_class else cap.gpus
            if parsed.gpus > most:
                what = f"GPUs of class {res}" if parsed.gpu_class else GPU_RESOURCE
                tail = f"the largest node has {most}" if most else f"no node has {what}"
                if most and parsed.gpu_class:
                    tail += f" GPUs of class {res}"
                problems.append(
                    Problem(_field_of(prefix, spec, res), f"requests {parsed.gpus} {res} per pod; {tail}")
                )
        for res, q in requests.items():
            if (
                res == GPU_RESOURCE
                or is_class_resource(res)
                or q <= 0
                or res == "pods"
                or res in SHARE_RESOURCES
            ):
                continue
            most_q = cap.largest.get(res, Decimal(0))
            if q > most_q:
                tail = f"the largest node has {_fmt(most_q, res)}" if most_q else f"no node offers {res}"
                problems.append(
                    Problem(_field_of(prefix, spec, res), f"requests {_fmt(q, res)} {res} per pod; {tail}")
                )
    return problems
