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
