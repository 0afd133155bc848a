"""Device selectors and the GPU properties they match: the matching half of ResourceClasses.

A ResourceClass (:mod:`gpuyard.apis.resourceclasses`) names GPUs by a :class:`DeviceSelector`
(`matchLabels` and `matchExpressions` over device properties). This module holds the selector
models, :func:`compile_selector` (a selector -> a fast :class:`Matcher` predicate) and
:func:`gpu_devices`, which lists a node's GPUs with the properties a selector can name: `model`
(short key: `v100`, `a100`, ...), `product` (`Tesla-V100-SXM2-32GB`), `memory` (`32768Mi`),
`vendor` (`nvidia`), `index`, `uuid`, and every label of the GPU's node. `Gt`/`Lt` compare
numbers with units (`memory Gt 10Gi`).

The scheduler's snapshot lists each node's GPUs and tests classes against them with these; the
submit-time checks in :mod:`gpuyard.apis.resourceclasses` (which re-exports everything here) use
them too. Everything is pure and works on the API models.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from pydantic import Field, field_validator, model_validator

from gpuyard.apis.core import GPU_RESOURCE, Node
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.meta import StrictK8sModel
from gpuyard.apis.quantity import QuantityError, parse_quantity, to_int

__all__ = [
    "ANNOTATION_UNHEALTHY_GPUS",
    "LABEL_BLOCK",
    "LABEL_GPU_MEMORY",
    "LABEL_GPU_MODEL",
    "LABEL_GPU_PRODUCT",
    "LABEL_LIFECYCLE",
    "LABEL_SPINE",
    "OPERATORS",
    "DeviceInfo",
    "DeviceRequirement",
    "DeviceSelector",
    "Matcher",
    "compile_selector",
    "format_unhealthy",
    "gpu_devices",
    "model_key",
    "unhealthy_indices",
]

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")

LABEL_GPU_MODEL = "gpuyard.io/gpu-model"
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per GPU, as NVIDIA GPU feature discovery writes it
ANNOTATION_UNHEALTHY_GPUS = "gpuyard.io/unhealthy-gpus"  # "0,3": GPU indices the node reports broken
LABEL_BLOCK = "topology.gpuyard.io/block"  # the node's network block (the tightest level)
LABEL_SPINE = "topology.gpuyard.io/spine"  # the node's spine (the level above blocks)
LABEL_LIFECYCLE = "node.kubernetes.io/lifecycle"  # "spot" on spot nodes (spot replicas prefer them)

_PER_DEVICE_KEYS = frozenset({"index", "uuid"})


# --- selectors --------------------------------------------------------------------------------


class DeviceRequirement(StrictK8sModel):
    """`key operator values`, as a Kubernetes node-selector requirement, over device properties."""

    key: str = Field(min_length=1)
    operator: str
    values: list[str] = Field(default_factory=list)

    @field_validator("operator")
    @classmethod
    def _known_operator(cls, value: str) -> str:
        if value not in OPERATORS:
            raise ValueError(f"unknown operator {value!r}; allowed: {', '.join(OPERATORS)}")
        return value

    @model_validator(mode="after")
    def _values_fit_operator(self) -> DeviceRequirement:
        op, values = self.operator, self.values
        if op in ("In", "NotIn") and not values:
            raise ValueError(f"operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"operator {op} takes no values, got {values}")
        if op in ("Gt", "Lt"):
            if len(values) != 1:
                raise ValueError(f"operator {op} needs exactly one value, got {len(values)}")
            try:
                parse_quantity(values[0])
            except QuantityError:
                raise ValueError(
                    f"operator {op} compares numbers; {values[0]!r} is not a number (with an optional unit, e.g. 10Gi)"
                ) from None
        return self


class DeviceSelector(StrictK8sModel):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[DeviceRequirement] = Field(default_factory=list)


# --- matching ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Matcher:
    """A compiled selector: `matches(properties)`; `per_device` if it names `index` or `uuid`."""

    test: Callable[[Mapping[str, str]], bool]
    keys: frozenset[str]

    @property
    def per_device(self) -> bool:
        return bool(self.keys & _PER_DEVICE_KEYS)

    def matches(self, properties: Mapping[str, str]) -> bool:
        return self.test(properties)


def _number(value: str | None) -> Decimal | None:
    if value is None:
        return None
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def _requirement_test(req: DeviceRequirement) -> Callable[[Mapping[str, str]], bool]:
    key, op = req.key, req.operator
    if op == "In":
        allowed = frozenset(req.values)
        return lambda p: p.get(key) in allowed
    if op == "NotIn":
        banned = frozenset(req.values)
        return lambda p: p.get(key) not in banned
    if op == "Exists":
        return lambda p: key in p
    if op == "DoesNotExist":
        return lambda p: key not in p
    bound = parse_quantity(req.values[0])
    if op == "Gt":
        return lambda p: (n := _number(p.get(key))) is not None and n > bound
    return lambda p: (n := _number(p.get(key))) is not None and n < bound


def _label_test(key: str, value: str) -> Callable[[Mapping[str, str]], bool]:
    return lambda p: p.get(key) == value


def compile_selector(selector: DeviceSelector) -> Matcher:
    """A fast predicate over a device's properties (all requirements must hold)."""
    tests = [_label_test(k, v) for k, v in selector.match_labels.items()]
    tests += [_requirement_test(r) for r in selector.match_expressions]
    keys = frozenset(selector.match_labels) | frozenset(r.key for r in selector.match_expressions)
    if not tests:
        return Matcher(lambda p: True, keys)
    if len(tests) == 1:
        return Matcher(tests[0], keys)
    return Matcher(lambda p: all(t(p) for t in tests), keys)


# --- device properties of a node --------------------------------------------------------------

_MODEL_RE = re.compile(r"(?<![a-z0-9])([a-z]{1,2}\d{1,3}[a-z]?)(?![a-z0-9])")


def model_key(product: str) -> str:
    """The short model key of a product name: `Tesla-V100-SXM2-32GB` -> `v100`, `NVIDIA-A100-...` -> `a100`."""
    text = product.lower().replace("_", "-").replace(" ", "-")
    for part in text.split("-"):
        if part in ("tesla", "nvidia", "geforce", "quadro", "rtx"):
            continue
        if _MODEL_RE.fullmatch(part):
            return part
    match = _MODEL_RE.search(text)
    return match.group(1) if match else text


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One GPU of a node: index, id, health and the properties a ResourceClass selects on.

    `shared` holds the node-level properties (model, product, memory, vendor, node labels); GPUs
    of a node whose properties come from labels share one mapping, so a class is tested once per
    node unless it names `index` or `uuid`.
    """

    index: int
    uuid: str
    healthy: bool
    model: str
    memory_mib: int
    shared: Mapping[str, str]

    def properties(self) -> dict[str, str]:
        props = dict(self.shared)
        props["index"] = str(self.index)
        props["uuid"] = self.uuid
        return props


def unhealthy_indices(node: Node) -> frozenset[int]:
    """GPU indices listed in the node's `gpuyard.io/unhealthy-gpus` annotation."""
    raw = node.metadata.annotations.get(ANNOTATION_UNHEALTHY_GPUS, "")
    out = set()
    for part in raw.split(","):
        part = part.strip()
        if part.isdigit():
            out.add(int(part))
    return frozenset(out)


def format_unhealthy(gpus: Iterable[int]) -> str:
    """The `gpuyard.io/unhealthy-gpus` value for a set of GPU indices ("" for none)."""
    return ",".join(str(g) for g in sorted(set(gpus)))


def gpu_devices(node: Node, topology: NodeTopology | None = None) -> list[DeviceInfo]:
    """The GPUs of `node` (as many as its allocatable `nvidia.com/gpu`), with their properties.

    Properties come from the NodeTopology when one is given (UUIDs, model, memory, health per
    GPU), else from the GPU feature discovery labels; GPU ids default to `GPU-<node>-<index>`.
    """
    count = to_int(node.status.allocatable.get(GPU_RESOURCE, Decimal(0)) // 1)
    if count <= 0:
        return []
    labels = node.metadata.labels
    name = node.metadata.name
    product = labels.get(LABEL_GPU_PRODUCT, "")
    model = labels.get(LABEL_GPU_MODEL) or (model_key(product) if product else "")
    mem_label = labels.get(LABEL_GPU_MEMORY, "")
    memory = int(mem_label) if mem_label.isdigit() else 0
    broken = unhealthy_indices(node)
    base: dict[str, str] = dict(labels)
    base["vendor"] = "nvidia"

    def shared_props(model_: str, product_: str, memory_: int) -> dict[str, str]:
        props = dict(base)
        if model_:
            props["model"] = model_
        if product_:
            props["product"] = product_
        if memory_:
            props["memory"] = f"{memory_}Mi"
        return props

    node_props = shared_props(model, product, memory)
    topo_gpus = topology.spec.gpus if topology is not None else []
    out = []
    for i in range(count):
        if i < len(topo_gpus):
            g = topo_gpus[i]
            g_product = g.model or product
            g_model = g.model_key or (model_key(g.model) if g.model else model)
            g_memory = g.memory_mib or memory
            same = (g_model, g_product, g_memory) == (model, product, memory)
            out.append(
                DeviceInfo(
                    index=i,
                    uuid=g.uuid or f"GPU-{name}-{i}",
                    healthy=g.health == "Healthy" and i not in broken,
                    model=g_model,
                    memory_mib=g_memory,
                    shared=node_props if same else shared_props(g_model, g_product, g_memory),
                )
            )
        else:
            out.append(
                DeviceInfo(
                    index=i,
                    uuid=f"GPU-{name}-{i}",
                    healthy=i not in broken,
                    model=model,
                    memory_mib=memory,
                    shared=node_props,
                )
            )
    return out
