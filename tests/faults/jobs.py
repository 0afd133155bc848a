"""Job documents the fault suite submits: a PyTorch gang with a restart policy and a run time."""

from __future__ import annotations

from typing import Any


def gang(
    name: str,
    *,
    workers: int = 1,
    gpus: int = 4,
    policy: str = "ExitCode",
    duration: str = "600",
    backoff: int = 3,
    namespace: str = "default",
    exit_code: int | None = None,
) -> dict[str, Any]:
    """A PyTorchJob: a Master and `workers` Workers of `gpus` GPUs each, all running `duration`."""
    annotations = {"fake.gpuyard.io/duration": duration}
    if exit_code is not None:
        annotations["fake.gpuyard.io/exit-code"] = str(exit_code)

    def role(replicas: int) -> dict[str, Any]:
        return {
            "replicas": replicas,
            "restartPolicy": policy,
            "template": {
                "metadata": {"annotations": dict(annotations)},
                "spec": {
                    "containers": [
                        {
                            "name": "pytorch",
                            "image": "train:1",
                            "resources": {"limits": {"nvidia.com/gpu": gpus, "cpu": "4", "memory": "16Gi"}},
                        }
                    ]
                },
            },
        }

    specs = {"Master": role(1)}
    if workers:
        specs["Worker"] = role(workers)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runPolicy": {"backoffLimit": backoff}, "pytorchReplicaSpecs": specs},
    }
