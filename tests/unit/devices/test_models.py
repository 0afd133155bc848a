"""The NodeTopology API model: validation messages, camelCase wire form, YAML round trip."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from gpuyard.apis.devices import GPUDevice, NodeTopology, NodeTopologySpec
from gpuyard.devices import PRESETS, from_yaml, get_preset, to_yaml


def _spec(**kwargs: object) -> dict[str, object]:
    base: dict[str, object] = {"gpus": [{"index": 0}, {"index": 1}]}
    base.update(kwargs)
    return base


def test_kind_and_version_are_set() -> None:
    topo = NodeTopology()
    assert (topo.kind, topo.api_version) == ("NodeTopology", "gpuyard.io/v1alpha1")
    assert NodeTopology.NAMESPACED is False


def test_wire_form_is_camel_case() -> None:
    data = get_preset("dgx1-v100").to_dict()
    gpu = data["spec"]["gpus"][0]
    assert {"memoryMib", "pciBusId", "pcieSwitch", "numaNode", "nvlinkPeers"} <= set(gpu)
    assert "bandwidthGbps" in data["spec"]["nics"][0]
    assert "interSocketGbps" in data["spec"]


@pytest.mark.parametrize("preset", PRESETS)
def test_yaml_round_trip(preset: str) -> None:
    topo = get_preset(preset)
    text = to_yaml(topo)
    assert yaml.safe_load(text)["kind"] == "NodeTopology"
    assert from_yaml(text) == topo


def test_from_yaml_rejects_other_kinds() -> None:
    with pytest.raises(ValueError, match="allowed: NodeTopology"):
        from_yaml("kind: Pod\nmetadata: {name: x}\n")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"gpus": [{"index": 1}]}, "gpus\\[0\\].index is 1"),
        (_spec(gpus=[{"index": 0, "nvlinkPeers": {1: 2}}, {"index": 1}]), "must be symmetric"),
        (_spec(gpus=[{"index": 0, "nvlinkPeers": {0: 1}}, {"index": 1}]), "allowed: another GPU index"),
        (_spec(gpus=[{"index": 0, "pcieSwitch": "sw9"}, {"index": 1}]), "'sw9' is not declared"),
        (_spec(partitionPolicy="Honor"), "partitionPolicy is set but partitions is empty"),
        (_spec(partitions=[[0, 5]]), "allowed: 0..1"),
        (_spec(partitions=[[0, 0]]), "repeats a GPU index"),
        (_spec(partitionPolicy="Maybe", partitions=[[0]]), "Honor"),
        (_spec(linkMatrix=[["X", "NV2"], ["NV2", "Q"]]), "allowed: X, NV<n>"),
        (_spec(linkMatrix=[["X", "NV2"], ["NV1", "X"]]), "linkMatrix\\[0\\]\\[1\\] is 'NV2' but"),
        (_spec(linkMatrix=[["X"]]), "must be 2 x 2"),
        (_spec(nics=[{"name": "a"}, {"name": "a"}]), "duplicate NIC names"),
        (_spec(pcieSwitches=[{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}]), "loops"),
        (
            _spec(numaNodes=[{"id": 0}], gpus=[{"index": 0}, {"index": 1, "numaNode": 1}]),
            "numaNode 1 is not declared",
        ),
        (_spec(gpus=[{"index": 0, "health": "Broken"}, {"index": 1}]), "Healthy"),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        NodeTopologySpec.model_validate(spec)


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="nvlinks"):
        GPUDevice.model_validate({"index": 0, "nvlinks": 3})


def test_nic_lookup_names_known_nics() -> None:
    topo = get_preset("dgx-a100")
    assert topo.nic("mlx5_3").pcie_switch == "pcie1"
    with pytest.raises(KeyError, match="mlx5_0"):
        topo.nic("ib9")
