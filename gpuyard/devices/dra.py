"""Dynamic Resource Allocation objects (`resource.k8s.io/v1`) for gpuyard's topology and placements.

Pure builders of plain dicts (no Kubernetes client here; the Kubernetes backend writes them):

- :func:`resource_slice` -- a node's GPUs the way NVIDIA's DRA driver (`gpu.nvidia.com`) publishes
  them: one pool named like the node, devices `gpu-<minor>` with attributes `type: gpu`, `uuid`,
  `index`, `minor`, `productName` (NVML's spelling, `NVIDIA A100-SXM4-80GB`), `brand`,
  `architecture`, `cudaComputeCapability`, `pcieBusID` and `resource.kubernetes.io/pciBusID`
  (sysfs form `0000:07:00.0`), optional `driverVersion`/`cudaDriverVersion`, and capacity `memory`.
  gpuyard-fake nodes publish these so DRA mode runs without hardware;
- :func:`node_pools` -- the complete `gpu.nvidia.com` pools of the published slices, one per node,
  read as the real driver (k8s-dra-driver-gpu) writes them: a pool may span several slices
  (`spec.pool.name`, `generation`, `resourceSliceCount`), only the newest generation of a pool
  counts, and a pool is used only once all `resourceSliceCount` slices of that generation are seen;
  devices are read in the `resource.k8s.io/v1` shape and the v1beta1 one (attributes under `basic`),
  by their published names, through :func:`published_device` (`uuid`, `pcieBusID` or the standard
  `resource.kubernetes.io/pciBusID`, `productName`, capacity `memory`; `index`/`minor` only where
  published: the driver's v1 releases no longer publish them);
- :func:`match_slice_devices` -- a published pool (or one slice) matched to the topology by UUID,
  else PCI bus id; devices that match no GPU are returned apart (the backend reports them, never
  uses them), and :func:`unmatched_message` is what the Warning Event on the node (reason
  :data:`UNMATCHED`) says, recorded through the one Event recorder (`gpuyard.state.events`);
- :func:`claim_template` -- one ResourceClaimTemplate per job role (`count` GPUs of device class
  `gpu.nvidia.com`, with the CEL selectors of the role's ResourceClass);
- :func:`resource_claim` -- the claim of one placed pod: `status.allocation.devices.results` names
  exactly the GPUs the scheduler chose (request, driver, pool, device: the published pool and device
  names where a match is given, else the node and `gpu-<minor>`), the allocation's node selector
  pins the node, and `status.reservedFor` is the pod;
- :func:`cel_selectors` -- a ResourceClass selector as DRA CEL expressions
  (`memory Gt 10Gi` -> `device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("10Gi")) > 0`).

Field names and shapes follow the `resource.k8s.io/v1` schema (Kubernetes 1.34+); tests validate
every built object with `kubernetes-validate`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuyard.apis.devicematching import DeviceRequirement, DeviceSelector, model_key
from gpuyard.apis.devices import GPUDevice, NodeTopology

__all__ = [
    "API_VERSION",
    "DEVICE_CLASS",
    "DRIVER",
    "UNMATCHED",
    "PublishedDevice",
    "PublishedPool",
    "SliceMatch",
    "UnsupportedSelector",
    "cel_selectors",
    "claim_template",
    "device_name",
    "match_slice_devices",
    "node_pools",
    "published_device",
    "resource_claim",
    "resource_slice",
    "unmatched_message",
    "unmatched_reference",
]

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
_ARCH = {
    "k80": ("Kepler", "3.7.0"),
    "p100": ("Pascal", "6.0.0"),
    "v100": ("Volta", "7.0.0"),
    "t4": ("Turing", "7.5.0"),
    "a100": ("Ampere", "8.0.0"),
    "a30": ("Ampere", "8.0.0"),
    "a10": ("Ampere", "8.6.0"),
    "l40s": ("Ada Lovelace", "8.9.0"),
    "h100": ("Hopper", "9.0.0"),
    "h800": ("Hopper", "9.0.0"),
    "h20": ("Hopper", "9.0.0"),
}
_NAME_RE = re.compile(r"[^a-z0-9-]+")


class UnsupportedSelector(ValueError):
    """A ResourceClass requirement DRA device selectors cannot express; names the key and why."""


def device_name(gpu: GPUDevice) -> str:
    """NVIDIA's canonical device name: `gpu-<minor>` (the minor number, the index when unknown)."""
    return f"gpu-{gpu.minor if gpu.minor is not None else gpu.index}"


def _sysfs_bus(nvml_bus: str) -> str:
    domain, bus, rest = nvml_bus.split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}"


def _product_name(gpu: GPUDevice) -> str:
    """NVML's product name: presets write `NVIDIA-A100-SXM4-80GB`, NVML says `NVIDIA A100-SXM4-80GB`."""
    return gpu.model.replace("-", " ", 1) if " " not in gpu.model else gpu.model


def _device(gpu: GPUDevice, *, driver_version: str | None, cuda_driver_version: str | None) -> dict[str, Any]:
    key = gpu.model_key or model_key(gpu.model)
    arch, capability = _ARCH.get(key.split("-")[0], ("", ""))
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor if gpu.minor is not None else gpu.index},
        "productName": {"string": _product_name(gpu)},
        "brand": {"string": "Nvidia"},
    }
    if arch:
        attributes["architecture"] = {"string": arch}
        attributes["cudaComputeCapability"] = {"version": capability}
    if driver_version:
        attributes["driverVersion"] = {"version": driver_version}
    if cuda_driver_version:
        attributes["cudaDriverVersion"] = {"version": cuda_driver_version}
    if gpu.pci_bus_id:
        bus = _sysfs_bus(gpu.pci_bus_id)
        attributes["pcieBusID"] = {"string": bus}
        attributes[PCI_BUS_ID] = {"string": bus}
    return {
        "name": device_name(gpu),
        "attributes": attributes,
        "capacity": {"memory": {"value": f"{gpu.memory_mib}Mi"}},
    }


def resource_slice(
    topology: NodeTopology,
    *,
    generation: int = 1,
    driver_version: str | None = None,
    cuda_driver_version: str | None = None,
) -> dict[str, Any]:
    """The ResourceSlice publishing a node's healthy GPUs (an unhealthy GPU is not offered)."""
    node = topology.metadata.name
    devices = [
        _device(g, driver_version=driver_version, cuda_driver_version=cuda_driver_version)
        for g in topology.spec.gpus
        if g.health == "Healthy"
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"[:253]},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One device of a published slice, as gpuyard reads it (None: not published)."""

    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None  # sysfs form, lower case: `0000:07:00.0`
    product: str | None = None  # `productName`: NVML's name, `NVIDIA A100-SXM4-80GB`
    memory: str | None = None  # capacity `memory`, a quantity (`81920Mi`, `80Gi`)
    index: int | None = None  # only older driver releases publish `index` and `minor`
    minor: int | None = None


def _attr(attrs: Mapping[str, Any], *names: str) -> Any:
    """The value of the first of `names` that is published (a DeviceAttribute holds one of
    `string`, `int`, `bool`, `version`)."""
    for name in names:
        value = attrs.get(name)
        if isinstance(value, dict):
            for kind in ("string", "int", "version", "bool"):
                if value.get(kind) is not None:
                    return value[kind]
    return None


def published_device(device: Mapping[str, Any]) -> PublishedDevice:
    """A slice's device in the `resource.k8s.io/v1` shape (`attributes`, `capacity` on the device)
    or the v1beta1 one (under `basic`)."""
    basic = device.get("basic")
    body: Mapping[str, Any] = basic if isinstance(basic, dict) else device
    attrs = body.get("attributes") or {}
    memory = (body.get("capacity") or {}).get("memory")
    bus = _attr(attrs, PCI_BUS_ID, "pcieBusID")
    index, minor = _attr(attrs, "index"), _attr(attrs, "minor")
    return PublishedDevice(
        name=str(device.get("name")),
        uuid=_attr(attrs, "uuid"),
        pci_bus_id=str(bus).lower() if bus else None,
        product=_attr(attrs, "productName"),
        memory=str(memory.get("value")) if isinstance(memory, dict) and memory.get("value") else None,
        index=index if isinstance(index, int) else None,
        minor=minor if isinstance(minor, int) else None,
    )


@dataclass(frozen=True, slots=True)
class PublishedPool:
    """A complete pool of one node: the slices of its newest generation, their devices."""

    name: str
    node: str
    generation: int
    slices: tuple[str, ...]  # the slices' names
    devices: tuple[PublishedDevice, ...]


def _pool_of(slices: Sequence[Mapping[str, Any]]) -> PublishedPool:
    spec = slices[0].get("spec") or {}
    pool = spec.get("pool") or {}
    return PublishedPool(
        name=str(pool.get("name") or spec.get("nodeName")),
        node=str(spec.get("nodeName")),
        generation=int(pool.get("generation") or 0),
        slices=tuple(str((s.get("metadata") or {}).get("name")) for s in slices),
        devices=tuple(
            published_device(d) for s in slices for d in (s.get("spec") or {}).get("devices") or []
        ),
    )


def _generation(slice_obj: Mapping[str, Any]) -> int:
    return int(((slice_obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def node_pools(
    slices: Iterable[Mapping[str, Any]], *, driver: str = DRIVER
) -> tuple[dict[str, PublishedPool], list[str]]:
    """The complete pools of `driver` by node, and the names of the pools left out as incomplete.

    Slices of other drivers and slices not local to one node (`nodeName` unset: `allNodes`, a node
    selector, per-device node selection) are skipped. Of a pool only its newest `generation`
    counts; it is complete once as many slices of that generation are seen as they say
    (`resourceSliceCount`); a node with several complete pools gets the one named like it, else the
    first by name."""
    by_pool: dict[str, list[Mapping[str, Any]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != driver or not spec.get("nodeName"):
            continue
        name = str((spec.get("pool") or {}).get("name") or spec["nodeName"])
        by_pool.setdefault(name, []).append(s)
    pools: dict[str, PublishedPool] = {}
    incomplete: list[str] = []
    for name in sorted(by_pool):
        newest = max(_generation(s) for s in by_pool[name])
        current = sorted(
            (s for s in by_pool[name] if _generation(s) == newest),
            key=lambda s: str((s.get("metadata") or {}).get("name")),
        )
        wanted = max(int((current[0]["spec"].get("pool") or {}).get("resourceSliceCount") or 1), 1)
        if len(current) < wanted:
            incomplete.append(name)
            continue
        pool = _pool_of(current)
        held = pools.get(pool.node)
        if held is None or (pool.name == pool.node and held.name != held.node):
            pools[pool.node] = pool
    return pools, incomplete


@dataclass(frozen=True, slots=True)
class SliceMatch:
    """Published device name -> GPU index, and the devices that match no GPU of the topology."""

    by_device: dict[str, int]
    unmatched: list[str]
    pool: str = ""  # the published pool the device names belong to

    @property
    def by_index(self) -> dict[int, str]:
        """GPU index -> the published name of its device."""
        return {index: name for name, index in self.by_device.items()}


def match_slice_devices(topology: NodeTopology, published: PublishedPool | Mapping[str, Any]) -> SliceMatch:
    """Match a published pool's devices (or one slice's) to the topology's GPUs by UUID, else by
    PCI bus id."""
    pool = published if isinstance(published, PublishedPool) else _pool_of([published])
    by_uuid = {g.uuid: g.index for g in topology.spec.gpus if g.uuid}
    by_bus = {_sysfs_bus(g.pci_bus_id): g.index for g in topology.spec.gpus if g.pci_bus_id}
    found: dict[str, int] = {}
    unmatched: list[str] = []
    for device in pool.devices:
        index = by_uuid.get(device.uuid) if device.uuid else None
        if index is None and device.pci_bus_id:
            index = by_bus.get(device.pci_bus_id)
        if index is None:
            unmatched.append(device.name)
        else:
            found[device.name] = index
    return SliceMatch(found, unmatched, pool.name)


UNMATCHED = "UnmatchedDevices"  # the reason of the Warning Event on the node


def unmatched_reference(node: str) -> dict[str, str]:
    """The `involvedObject` of the Event that reports a node's unmatched devices."""
    return {"apiVersion": "v1", "kind": "Node", "name": node}


def unmatched_message(node: str, slice_name: str, unmatched: Sequence[str]) -> str:
    """What the Warning Event on the node says: these published devices match no GPU of its
    NodeTopology, and gpuyard does not allocate them (`slice_name`: the slice, or `pool <name>`)."""
    return (
        f"ResourceSlice {slice_name} publishes {', '.join(unmatched)}, which match no GPU of NodeTopology "
        f"{node} by UUID or PCI bus id; gpuyard does not allocate them"
    )


# --- ResourceClass selectors as CEL ---------------------------------------------------------------

_ATTR = f'device.attributes["{DRIVER}"]'
_CAP = f'device.capacity["{DRIVER}"]'


def _quote(value: str) -> str:
    return json.dumps(value)  # a CEL string literal: double quotes, JSON escapes


def _requirement_cel(req: DeviceRequirement) -> str:
    key, op, values = req.key, req.operator, req.values
    if key == "memory" and op in ("Gt", "Lt"):
        sign = ">" if op == "Gt" else "<"
        return f"{_CAP}.memory.compareTo(quantity({_quote(values[0])})) {sign} 0"
    if op in ("Gt", "Lt") and key == "index":
        sign = ">" if op == "Gt" else "<"
        return f"{_ATTR}.index {sign} {int(values[0])}"
    terms: list[str]
    if key == "model":
        terms = [
            f"{_ATTR}.productName.lowerAscii().matches({_quote(f'(^|[^a-z0-9]){re.escape(v.lower())}([^a-z0-9]|$)')})"
            for v in values
        ]
    elif key == "product":
        terms = [f'{_ATTR}.productName.replace(" ", "-") == {_quote(v)}' for v in values]
    elif key == "uuid":
        terms = [f"{_ATTR}.uuid == {_quote(v)}" for v in values]
    elif key == "index":
        terms = [f"{_ATTR}.index == {int(v)}" for v in values]
    elif key == "vendor":
        terms = [f"device.driver == {_quote(DRIVER)}" if v.lower() == "nvidia" else "false" for v in values]
    elif key == "memory":
        terms = [f"{_CAP}.memory.compareTo(quantity({_quote(v)})) == 0" for v in values]
    else:
        raise UnsupportedSelector(
            f"{key!r} is a node label, not a device attribute: DRA device selectors cannot test it; "
            "select the nodes with the pod's nodeSelector/affinity instead"
        )
    if op in ("Exists", "DoesNotExist"):
        raise UnsupportedSelector(
            f"{key!r} {op}: every {DRIVER} GPU has this attribute; drop the requirement"
        )
    if op in ("Gt", "Lt"):
        raise UnsupportedSelector(f"{key!r} {op}: only memory and index compare as numbers")
    either = " || ".join(terms)
    joined = either if len(terms) == 1 else f"({either})"
    return f"!{joined}" if op == "NotIn" else joined


def cel_selectors(selector: DeviceSelector) -> list[str]:
    """One CEL expression per requirement (DRA ANDs the selectors of a request);
    UnsupportedSelector for a requirement on a node label or an operator DRA cannot express."""
    reqs = [DeviceRequirement(key=k, operator="In", values=[v]) for k, v in selector.match_labels.items()]
    reqs += list(selector.match_expressions)
    return [_requirement_cel(r) for r in reqs]


# --- claims ---------------------------------------------------------------------------------------


def _dns_name(*parts: str) -> str:
    text = _NAME_RE.sub("-", "-".join(parts).lower()).strip("-")
    return text[:253].rstrip("-") or "claim"


def claim_template(
    *, job: str, namespace: str, role: str, count: int, selectors: Sequence[str] = (), request: str = "gpus"
) -> dict[str, Any]:
    """The ResourceClaimTemplate of a role: `count` GPUs of class gpu.nvidia.com matching `selectors`."""
    exactly: dict[str, Any] = {
        "deviceClassName": DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": _dns_name(job, role, request), "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}},
    }


def resource_claim(
    topology: NodeTopology,
    gpus: Sequence[int],
    *,
    pod: str,
    pod_uid: str,
    namespace: str,
    selectors: Sequence[str] = (),
    request: str = "gpus",
    published: SliceMatch | None = None,
) -> dict[str, Any]:
    """The ResourceClaim of one placed pod, allocated to exactly `gpus` of `topology`'s node and
    reserved for the pod; `published`: the node's pool matched to the topology, whose pool and
    device names the allocation uses (None: pool = node, devices `gpu-<minor>`). ValueError for an
    index the node does not have, or one the pool does not publish."""
    node = topology.metadata.name
    known = {g.index: g for g in topology.spec.gpus}
    missing = [i for i in gpus if i not in known]
    if missing:
        raise ValueError(f"node {node} has no GPU {missing}; allowed: 0..{len(known) - 1}")
    exactly: dict[str, Any] = {
        "deviceClassName": DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": len(gpus),
    }
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if published is None:
        pool, names = node, {i: device_name(g) for i, g in known.items()}
    else:
        pool, names = published.pool, published.by_index
        unpublished = [i for i in gpus if i not in names]
        if unpublished:
            raise ValueError(f"GPUs {unpublished} of node {node} are not published in pool {pool}")
    results = [{"request": request, "driver": DRIVER, "pool": pool, "device": names[i]} for i in gpus]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": _dns_name(pod, request), "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
        },
    }
