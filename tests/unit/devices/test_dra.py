"""DRA objects: ResourceSlices as NVIDIA's driver publishes them, claims allocating exactly the chosen
GPUs, templates with ResourceClass selectors as CEL, all valid against the real resource.k8s.io/v1
schema (kubernetes-validate, 1.34 and the newest it ships)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
import pytest

from gpuyard.apis.devicematching import DeviceRequirement, DeviceSelector
from gpuyard.devices import get_preset
from gpuyard.devices.dra import (
    DRIVER,
    UNMATCHED,
    UnsupportedSelector,
    cel_selectors,
    claim_template,
    match_slice_devices,
    node_pools,
    resource_claim,
    resource_slice,
    unmatched_message,
    unmatched_reference,
)
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import BACKEND

VERSIONS = ("1.34.0", kubernetes_validate.utils.latest_version())


def valid(obj: dict[str, Any]) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_four_gpu_pod_on_gpus_4_to_7_gets_a_claim_allocating_exactly_those() -> None:
    node = get_preset("dgx-a100", node_name="a100-0")
    claim = resource_claim(node, [4, 5, 6, 7], pod="ddp-worker-0", pod_uid="5f1c-77", namespace="team-a")
    valid(claim)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert results == [
        {"request": "gpus", "driver": DRIVER, "pool": "a100-0", "device": f"gpu-{i}"} for i in (4, 5, 6, 7)
    ]
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "ddp-worker-0", "uid": "5f1c-77"}]
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert terms[0]["matchFields"][0]["values"] == ["a100-0"]
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["count"] == 4
    # the devices named in the claim are the ones the node's slice publishes for those GPUs
    published = resource_slice(node)
    named = {d["name"]: d["attributes"]["index"]["int"] for d in published["spec"]["devices"]}
    assert [named[r["device"]] for r in results] == [4, 5, 6, 7]


def test_a_gpu_the_node_lacks_is_refused() -> None:
    node = get_preset("pcie-t4x4", node_name="t4")
    with pytest.raises(ValueError, match="no GPU \\[5\\]"):
        resource_claim(node, [5], pod="p", pod_uid="u", namespace="default")


@pytest.mark.parametrize("preset", ["dgx1-v100", "dgx-a100", "hgx-h100", "pcie-t4x4"])
def test_slices_are_published_as_nvidias_driver_does(preset: str) -> None:
    node = get_preset(preset, node_name="n1", unhealthy=[1])
    published = resource_slice(node, driver_version="550.54.15", cuda_driver_version="12.4.0")
    valid(published)
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, "n1", "n1")
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(len(node.spec.gpus)) if i != 1]
    first = spec["devices"][0]
    gpu = node.spec.gpus[0]
    attrs = first["attributes"]
    assert attrs["type"] == {"string": "gpu"} and attrs["uuid"] == {"string": gpu.uuid}
    assert attrs["index"] == {"int": 0}
    assert attrs["productName"]["string"] == gpu.model.replace("-", " ", 1)
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:07:00.0"}
    assert first["capacity"]["memory"] == {"value": f"{gpu.memory_mib}Mi"}


async def test_slice_devices_match_by_uuid_or_bus_id_and_strangers_are_reported() -> None:
    node = get_preset("dgx-a100", node_name="a100-0")
    published = resource_slice(node)
    devices = published["spec"]["devices"]
    del devices[2]["attributes"]["uuid"]  # matched by PCI bus id instead
    devices.append({"name": "gpu-99", "attributes": {"uuid": {"string": "GPU-elsewhere"}}})
    match = match_slice_devices(node, published)
    assert match.by_device["gpu-2"] == 2 and len(match.by_device) == 8
    assert match.unmatched == ["gpu-99"]
    ctx = Context.for_tests()
    recorder = EventRecorder(component=BACKEND, store=ctx.store, writer=ctx.writer)  # type: ignore[arg-type]
    message = unmatched_message("a100-0", published["metadata"]["name"], match.unmatched)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    event = await recorder.record(
        unmatched_reference("a100-0"), reason=UNMATCHED, message=message, type="Warning", at=at
    )
    assert event is not None
    body = event.model_dump(by_alias=True, exclude_none=True, mode="json")
    valid(body)
    assert body["involvedObject"]["name"] == "a100-0" and "gpu-99" in body["message"]
    assert body["source"] == {"component": BACKEND} and body["reportingComponent"] == BACKEND


def test_resource_class_selectors_become_cel_in_a_valid_template() -> None:
    selector = DeviceSelector(
        match_labels={"model": "a100"},
        match_expressions=[
            DeviceRequirement(key="memory", operator="Gt", values=["10Gi"]),
            DeviceRequirement(key="index", operator="NotIn", values=["0", "1"]),
        ],
    )
    cel = cel_selectors(selector)
    assert cel[1] == 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("10Gi")) > 0'
    assert (
        cel[2]
        == '!(device.attributes["gpu.nvidia.com"].index == 0 || device.attributes["gpu.nvidia.com"].index == 1)'
    )
    template = claim_template(job="ddp", namespace="team-a", role="Worker", count=4, selectors=cel)
    valid(template)
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["count"] == 4 and len(request["exactly"]["selectors"]) == 3
    assert template["metadata"]["name"] == "ddp-worker-gpus"


def test_a_node_label_requirement_is_not_a_device_selector() -> None:
    selector = DeviceSelector(match_labels={"topology.gpuyard.io/block": "block-a"})
    with pytest.raises(UnsupportedSelector, match="node label"):
        cel_selectors(selector)


def test_an_invalid_claim_is_caught_by_the_schema() -> None:
    node = get_preset("dgx-a100", node_name="a100-0")
    claim = resource_claim(node, [4], pod="p", pod_uid="u", namespace="default")
    claim["status"]["allocation"]["devices"]["results"][0]["devicee"] = "typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(claim, VERSIONS[0], strict=True)


# --- slices as NVIDIA's DRA driver (k8s-dra-driver-gpu) writes them --------------------------------


def driver_device(node_gpu: Any, *, minor: int, beta: bool = False) -> dict[str, Any]:
    """One full GPU as the real driver publishes it.

    v1 shape: k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/deviceinfo.go` `GpuInfo.GetDevice()` on
    `k8s.io/api/resource/v1`: name `gpu-<minor>` (the device node's minor, not the NVML index),
    attributes `type`, `uuid`, `productName`, `brand`, `architecture`, `cudaComputeCapability`,
    `driverVersion`, `cudaDriverVersion` (versions), `pcieBusID` (go-nvlib's `GetPCIBusID()`:
    `0000:07:00.0`), `addressingMode`, and capacity `memory` in bytes as a BinarySI quantity; no
    `index` or `minor`. v1beta1 shape (`beta`): the earlier release on `resource/v1beta1`, the same
    under `basic`, with `index` and `minor` and without `pcieBusID`."""
    attrs: dict[str, Any] = {
        "type": {"string": "gpu"},
        "uuid": {"string": node_gpu.uuid},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Ampere"},
        "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
    }
    capacity = {"memory": {"value": "80Gi"}}
    if beta:
        attrs |= {"index": {"int": node_gpu.index}, "minor": {"int": minor}}
        return {"name": f"gpu-{node_gpu.index}", "basic": {"attributes": attrs, "capacity": capacity}}
    bus = node_gpu.pci_bus_id.lower()[4:]  # NVML 00000000:07:00.0 -> 0000:07:00.0
    attrs |= {"pcieBusID": {"string": bus}, "addressingMode": {"string": ""}}
    return {"name": f"gpu-{minor}", "attributes": attrs, "capacity": capacity}


def driver_slice(
    node: str, pool: str, devices: list[dict[str, Any]], *, generation: int, count: int, part: int
) -> dict[str, Any]:
    """A slice of a node-local pool as the kubelet plugin helper writes it (`<node>-gpu.nvidia.com-<random>`)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-{generation}x{part}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


# minors in another order than the NVML indices: the claim must name what is published
MINORS = [1, 0, 3, 2, 5, 4, 7, 6]


def test_pools_of_the_real_driver_newest_generation_complete_pools_only() -> None:
    node = get_preset("dgx-a100", node_name="a100-0")
    other = get_preset("dgx-a100", node_name="a100-1")
    devices = [driver_device(g, minor=MINORS[g.index]) for g in node.spec.gpus]
    slices = [
        # generation 1: one slice with a device the driver no longer publishes
        driver_slice(
            "a100-0", "a100-0", [{"name": "gpu-42", "attributes": {}}], generation=1, count=1, part=0
        ),
        # generation 2: the pool split in two slices
        driver_slice("a100-0", "a100-0", devices[:4], generation=2, count=2, part=0),
        driver_slice("a100-0", "a100-0", devices[4:], generation=2, count=2, part=1),
        # a100-1: one of its two slices is not there yet
        driver_slice(
            "a100-1", "a100-1", [driver_device(other.spec.gpus[0], minor=0)], generation=1, count=2, part=0
        ),
        # another driver's slice on the same node
        {
            **driver_slice("a100-0", "a100-0", [], generation=9, count=1, part=0),
            "spec": {
                "driver": "nic.example.com",
                "nodeName": "a100-0",
                "pool": {"name": "a100-0", "generation": 9, "resourceSliceCount": 1},
                "devices": [],
            },
        },
    ]
    for s in slices[:4]:
        valid(s)
    pools, incomplete = node_pools(slices)
    assert list(pools) == ["a100-0"] and incomplete == ["a100-1"]
    pool = pools["a100-0"]
    assert (pool.name, pool.generation, len(pool.slices)) == ("a100-0", 2, 2)
    assert [d.name for d in pool.devices] == [f"gpu-{m}" for m in MINORS]
    first = pool.devices[0]
    assert (first.uuid, first.pci_bus_id, first.product, first.memory) == (
        node.spec.gpus[0].uuid,
        "0000:07:00.0",
        "NVIDIA A100-SXM4-80GB",
        "80Gi",
    )
    assert first.index is None and first.minor is None  # the v1 driver publishes neither
    match = match_slice_devices(node, pool)
    assert match.unmatched == [] and match.pool == "a100-0"
    assert match.by_index == {g.index: f"gpu-{MINORS[g.index]}" for g in node.spec.gpus}
    claim = resource_claim(node, [0, 1, 4], pod="p", pod_uid="u", namespace="default", published=match)
    valid(claim)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["pool"], r["device"]) for r in results] == [
        ("a100-0", "gpu-1"),
        ("a100-0", "gpu-0"),
        ("a100-0", "gpu-5"),
    ]


def test_devices_match_by_bus_id_alone_and_in_the_v1beta1_shape() -> None:
    node = get_preset("dgx-a100", node_name="a100-0")
    v1 = [driver_device(g, minor=g.index) for g in node.spec.gpus]
    for d in v1:
        del d["attributes"]["uuid"]  # matched by pcieBusID
    pools, _ = node_pools([driver_slice("a100-0", "a100-0", v1, generation=1, count=1, part=0)])
    assert len(match_slice_devices(node, pools["a100-0"]).by_device) == 8
    beta = [driver_device(g, minor=g.index, beta=True) for g in node.spec.gpus]
    pools, _ = node_pools([driver_slice("a100-0", "a100-0", beta, generation=1, count=1, part=0)])
    published = pools["a100-0"].devices[3]
    assert (published.index, published.minor, published.uuid) == (3, 3, node.spec.gpus[3].uuid)
    assert match_slice_devices(node, pools["a100-0"]).by_index[3] == "gpu-3"


def test_a_gpu_the_pool_does_not_publish_is_refused_in_the_claim() -> None:
    node = get_preset("dgx-a100", node_name="a100-0")
    devices = [driver_device(g, minor=g.index) for g in node.spec.gpus if g.index != 5]
    pools, _ = node_pools([driver_slice("a100-0", "a100-0", devices, generation=1, count=1, part=0)])
    match = match_slice_devices(node, pools["a100-0"])
    with pytest.raises(ValueError, match=r"GPUs \[5\] .* not published in pool a100-0"):
        resource_claim(node, [4, 5], pod="p", pod_uid="u", namespace="default", published=match)
