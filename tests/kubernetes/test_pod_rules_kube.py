"""Pod placement rules on the Kubernetes backend (the development API server, gpuyard's CRDs):
two TFJob workers with required anti-affinity on `kubernetes.io/hostname` are bound to different
nodes, and their Reservations on the API server carry the pods' labels and the rule, so a new
leader sees them as the old one did."""

from __future__ import annotations

from typing import Any

from gpuyard.kubecluster.writing import to_json
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import (
    NODES,
    TFJOBS,
    connect,
    eventually,
    job_pods,
    platform,
    settings,
)

__all__ = ["served"]


def apart(name: str) -> dict[str, Any]:
    container = {"name": "tensorflow", "image": "tf:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    rule = {"labelSelector": {"matchLabels": {"app": name}}, "topologyKey": "kubernetes.io/hostname"}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {
                            "containers": [container],
                            "affinity": {
                                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [rule]}
                            },
                        },
                    },
                }
            }
        },
    }


async def test_required_hostname_anti_affinity_binds_workers_to_different_nodes(
    served: FakeApiServerView,
) -> None:
    client = await connect(served)
    try:
        for i in range(2):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False)):
            await client.create(TFJOBS, apart("apart"))
            pods = await eventually(
                lambda: (
                    len(job_pods(served, "apart")) == 2
                    and all(x["spec"].get("nodeName") for x in job_pods(served, "apart"))
                    and job_pods(served, "apart")
                ),
                what="two bound pods",
            )
            assert sorted(p["spec"]["nodeName"] for p in pods) == ["gpu-0", "gpu-1"]
            assert all("podAntiAffinity" in p["spec"]["affinity"] for p in pods)  # kept as written
            reservations = [r for r in served.list("reservations") if r["spec"]["podGroup"] == "apart"]
            assert len(reservations) == 2
            for r in reservations:
                assert r["metadata"]["labels"]["app"] == "apart"
                assert "gpuyard.io/pod-anti-affinity" in r["metadata"]["annotations"]
    finally:
        await client.close()
