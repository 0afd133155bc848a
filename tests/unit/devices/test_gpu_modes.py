"""How a placed GPU pod reaches its GPUs on Kubernetes: the `backend.kubernetes.gpu_resource` modes, the
requests a share pod makes (`gpuyard.io/gpu-share`, never a whole `nvidia.com/gpu`) and the MPS limits
its container carries."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuyard.apis.core import Pod
from gpuyard.apis.scheduling import Reservation, ReservationSpec
from gpuyard.controllers.materializing import _device_env
from gpuyard.kubecluster.writing import rename_gpu_requests, share_requests
from gpuyard.state.config import KubernetesConfig


@pytest.mark.parametrize(
    ("gpu_resource", "dra", "mode", "resource"),
    [
        ("auto", "auto", "auto", "gpuyard.io/gpu"),  # the default: slices where published, else the agent
        ("auto", "off", "off", "gpuyard.io/gpu"),
        ("dra", "auto", "on", "gpuyard.io/gpu"),
        ("gpuyard.io/gpu", "auto", "off", "gpuyard.io/gpu"),
        ("nvidia.com/gpu", "auto", "off", "nvidia.com/gpu"),
        ("nvidia.com/gpu", "on", "on", "nvidia.com/gpu"),
    ],
)
def test_gpu_resource_modes(gpu_resource: str, dra: str, mode: str, resource: str) -> None:
    cfg = KubernetesConfig.model_validate({"gpu_resource": gpu_resource, "dra": dra})
    assert (cfg.dra_mode, cfg.device_resource) == (mode, resource)


def test_default_is_auto_and_unknown_values_are_refused() -> None:
    assert KubernetesConfig().gpu_resource == "auto"
    with pytest.raises(ValidationError) as bad:
        KubernetesConfig.model_validate({"gpu_resource": "amd.com/gpu"})
    assert "gpu_resource" in str(bad.value) and "gpuyard.io/gpu" in str(bad.value)


def test_a_share_asks_for_one_gpu_share_slot_and_nothing_whole() -> None:
    body = {
        "spec": {
            "containers": [
                {"name": "side", "image": "x", "resources": {"requests": {"cpu": "1"}}},
                {
                    "name": "main",
                    "image": "y",
                    "resources": {
                        "requests": {"gpuyard.io/gpu-milli": "500", "cpu": "2"},
                        "limits": {"gpuyard.io/gpu-milli": "500", "nvidia.com/gpu": "1"},
                    },
                },
            ]
        }
    }
    share_requests(body)
    side, main = body["spec"]["containers"]
    assert side["resources"] == {"requests": {"cpu": "1"}}
    assert main["resources"] == {
        "requests": {"cpu": "2", "gpuyard.io/gpu-share": "1"},
        "limits": {"gpuyard.io/gpu-share": "1"},
    }


def test_whole_gpus_are_renamed_for_the_agent() -> None:
    body = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    rename_gpu_requests(body, to="gpuyard.io/gpu")
    assert body["spec"]["containers"][0]["resources"] == {"limits": {"gpuyard.io/gpu": "4"}}


def test_a_share_container_carries_its_mps_limits() -> None:
    pod = Pod.model_validate(
        {
            "metadata": {"name": "j-worker-0", "namespace": "default"},
            "spec": {
                "containers": [
                    {"name": "main", "image": "y", "resources": {"limits": {"gpuyard.io/gpu-milli": 300}}}
                ]
            },
        }
    )
    res = Reservation.model_validate(
        {
            "metadata": {"name": "j-worker-0", "namespace": "default"},
            "spec": ReservationSpec(
                pod_group="j",
                role="Worker",
                index=0,
                node="a",
                gpus=[3],
                gpu_ids=["GPU-a-3"],
                gpu_milli=300,
                gpu_memory_mib=8192,
            ).model_dump(by_alias=True),
        }
    )
    _device_env(pod, res)
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"  # CUDA index 0: its one visible GPU
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a-3"
