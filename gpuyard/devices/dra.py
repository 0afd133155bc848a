"""Dynamic Resource Allocation objects (`resource.k8s.io/v1`) for gpuyard's topology and placements.

Pure builders of plain dicts (no Kubernetes client here; the Kubernetes backend writes them):

- :func:`resource_slice` -- a node's GPUs the way NVIDIA's DRA driver (`gpu.nvidia.com`) publishes
  them: one pool named like the node, devices `gpu-<minor>` with attributes `type: gpu`, `uuid`,
  `index`, `minor`, `productName` (NVML's spelling, `NVIDIA A100-SXM4-80GB`), `brand`,
  `architecture`, `cudaComputeCapability`, `pcieBusID` and `resource.kubernetes.io/pciBusID`
  (sysfs form `0000:07:00.0`), optional `driverVersion`/`cudaDriverVersion`, and capacity `memory`.
  gpuyard-fake nodes publish these so DRA mode runs without hardware;
- :func:`match_slice_devices` -- a published slice matched to the topology by UUID, else PCI bus id;
  devices that match no GPU are returned apart (the backend reports them, never uses them), and
  :func:`unmatched_message` is what the Warning Event on the node (reason :data:`UNMATCHED`) says,
  recorded through the one Event recorder (`gpuyard.state.events`);
- :func:`claim_template` -- one ResourceClaimTemplate per job role (`count` GPUs of device class
  `gpu.nvidia.com`, with the CEL selectors of the role's ResourceClass);
- :func:`resource_claim` -- the claim of one placed pod: `status.allocation.devices.results` names
  exactly the GPUs the scheduler chose (request, driver, pool, device), the allocation's node
  selector pins the node, and `status.reservedFor` is the pod;
- :func:`cel_selectors` -- a ResourceClass selector as DRA CEL expressions
  (`memory Gt 10Gi` -> `device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("10Gi")) > 0`).

Field names and shapes follow the `resource.k8s.io/v1` schema (Kubernetes 1.34+); tests validate
every built object with `kubernetes-validate`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuyard.apis.devicematching import DeviceRequirement, DeviceSelector, model_key
from gpuyard.apis.devices import GPUDevice, NodeTopology

__all__ = [
    "API_VERSION",
    "DEVICE_CLASS",
    "DRIVER",
    "UNMATCHED",
    "SliceMatch",
    "UnsupportedSelector",
    "cel_selectors",
    "claim_template",
    "device_name",
    "match_slice_devices",
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
class SliceMatch:
    """Published device name -> GPU index, and the devices that match no GPU of the topology."""

    by_device: dict[str, int]
    unmatched: list[str]


def match_slice_devices(topology: NodeTopology, slice_obj: dict[str, Any]) -> SliceMatch:
    """Match a published slice's devices to the topology's GPUs by UUID, else by PCI bus id."""
    by_uuid = {g.uuid: g.index for g in topology.spec.gpus if g.uuid}
    by_bus = {_sysfs_bus(g.pci_bus_id): g.index for g in topology.spec.gpus if g.pci_bus_id}
    found: dict[str, int] = {}
    unmatched: list[str] = []
    for device in (slice_obj.get("spec") or {}).get("devices") or []:
        attrs = device.get("attributes") or {}
        uuid = (attrs.get("uuid") or {}).get("string")
        bus = (attrs.get(PCI_BUS_ID) or attrs.get("pcieBusID") or {}).get("string")
        index = by_uuid.get(uuid) if uuid else None
        if index is None and bus:
            index = by_bus.get(bus.lower())
        if index is None:
            unmatched.append(str(device.get("name")))
        else:
            found[str(device.get("name"))] = index
    return SliceMatch(found, unmatched)


UNMATCHED = "UnmatchedDevices"  # the reason of the Warning Event on the node


def unmatched_reference(node: str) -> dict[str, str]:
    """The `involvedObject` of the Event that reports a node's unmatched devices."""
    return {"apiVersion": "v1", "kind": "Node", "name": node}


def unmatched_message(node: str, slice_name: str, unmatched: Sequence[str]) -> str:
    """What the Warning Event on the node says: these published devices match no GPU of its
    NodeTopology, and gpuyard does not allocate them."""
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
) -> dict[str, Any]:
    """The ResourceClaim of one placed pod, allocated to exactly `gpus` of `topology`'s node and
    reserved for the pod. ValueError for an index the node does not have."""
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
    results = [
        {"request": request, "driver": DRIVER, "pool": node, "device": device_name(known[i])} for i in gpus
    ]
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
