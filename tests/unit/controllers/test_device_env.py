"""Golden tests of the device env a container gets, on GPUs other than 0 (docs/node-agent.md, "Env").

The placements use a real DGX A100 topology (UUIDs, RDMA NICs under the GPUs' PCIe switches), so the
env is what a container on that node would see: `NVIDIA_VISIBLE_DEVICES` = UUIDs, `CUDA_VISIBLE_DEVICES`
renumbered 0..k-1, the physical indices in `GPUYARD_GPU_INDICES`, the NICs for NCCL, and the gang shape.
Regenerate after an intended change with `UPDATE_GOLDEN=1 pytest tests/unit/controllers`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuyard.apis.jobs import parse_job
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import Reservation, ReservationSpec, pod_name
from gpuyard.controllers.materializing import build_pod
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.devices import get_preset, pick_nics
from tests.unit.controllers.test_wiring_golden import check

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def _job(workers: int, gpus: int) -> Any:
    container = {
        "name": "pytorch",
        "image": "pytorch:2",
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
    }
    return parse_job(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "ddp", "namespace": "default"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Worker": {"replicas": workers, "template": {"spec": {"containers": [container]}}}
                }
            },
        }
    )


def _reservation(*, node: str, index: int, gpus: list[int], peers: list[str], rdma: bool) -> Reservation:
    topology = get_preset("dgx-a100", node_name=node)
    nics = pick_nics(topology, gpus, "SamePCIe") if rdma else []
    return Reservation(
        metadata=ObjectMeta(name=pod_name("ddp", "Worker", index), namespace="default"),
        spec=ReservationSpec(
            pod_group="ddp",
            role="Worker",
            index=index,
            node=node,
            gpus=gpus,
            gpu_ids=[topology.spec.gpus[g].uuid for g in gpus],
            gpu_milli=1000,
            nics=nics or [],
            local_peers=peers,
        ),
    )


def _env(res: Reservation, job: Any, peers: dict[str, Reservation] | None) -> dict[str, str]:
    pod = build_pod(job, "Worker", res.spec.index, plugin=plugin_for(job.kind), reservation=res, peers=peers)
    return {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}


def test_four_gpus_on_the_upper_half_of_a_dgx_a100() -> None:
    job = _job(1, 4)
    res = _reservation(node="a100-0", index=0, gpus=[4, 5, 6, 7], peers=[], rdma=True)
    env = _env(res, job, {res.metadata.name: res})
    topology = get_preset("dgx-a100", node_name="a100-0")
    assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == [topology.spec.gpus[g].uuid for g in (4, 5, 6, 7)]
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert env["GPUYARD_GPU_INDICES"] == "4,5,6,7"
    assert env["NCCL_IB_HCA"] == "=" + ",".join(res.spec.nics)
    assert res.spec.nics and all(n.startswith("mlx5_") for n in res.spec.nics)
    check("device-env-dgx-a100-4of8.json", json.dumps(env, indent=2, sort_keys=True) + "\n")


def test_seven_plus_one_shape_names_the_nvlink_domains() -> None:
    job = _job(8, 1)
    names = [pod_name("ddp", "Worker", i) for i in range(8)]
    held: dict[str, Reservation] = {}
    for i in range(7):
        held[names[i]] = _reservation(
            node="a100-0", index=i, gpus=[i + 1], peers=[n for n in names[:7] if n != names[i]], rdma=False
        )
    held[names[7]] = _reservation(node="a100-1", index=7, gpus=[3], peers=[], rdma=False)
    envs = {name: _env(res, job, held) for name, res in held.items()}
    assert {e["GPUYARD_GANG_SHAPE"] for e in envs.values()} == {"7+1"}
    assert [envs[n]["GPUYARD_NVLINK_DOMAIN"] for n in names] == ["a100-0"] * 7 + ["a100-1"]
    assert all(e["CUDA_VISIBLE_DEVICES"] == "0" for e in envs.values())
    assert envs[names[7]]["GPUYARD_GPU_INDICES"] == "3"
    assert envs[names[0]]["GPUYARD_LOCAL_GPUS"] == "1,2,3,4,5,6,7"
    check("device-env-7plus1.json", json.dumps(envs, indent=2, sort_keys=True) + "\n")


def test_indices_stand_in_only_when_no_uuids_are_known() -> None:
    job = _job(1, 2)
    res = _reservation(node="a100-0", index=0, gpus=[6, 2], peers=[], rdma=False)
    res.spec.gpu_ids = []
    env = _env(res, job, None)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "2,6"
    assert env["GPUYARD_GPU_INDICES"] == "2,6"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "GPUYARD_GANG_SHAPE" not in env


def test_uuids_follow_the_ascending_physical_order() -> None:
    job = _job(1, 2)
    res = _reservation(node="a100-0", index=0, gpus=[6, 2], peers=[], rdma=False)
    env = _env(res, job, None)
    assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == [res.spec.gpu_ids[1], res.spec.gpu_ids[0]]
