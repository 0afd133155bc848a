"""The issue's "done when", end to end over HTTP on the demo cluster (operator + scheduler + fake kubelet).

A job asking for 4 GPUs of the V100 default class lands only on V100s with its devices in the
env; an 8-pod gang that does not fit holds no GPU and explains why; a request larger than any
node is a 422 at submit time.
"""

from __future__ import annotations

import aiohttp

from tests.integration.live_platform import live_platform, until

V100_JOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: v100job, namespace: default}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          containers:
            - {name: pytorch, image: train, resources: {limits: {nvidia.v100: 4}}}
"""
BIG_JOB = (
    V100_JOB.replace("v100job", "bigjob")
    .replace("replicas: 1", "replicas: 8")
    .replace("nvidia.v100: 4", "nvidia.com/gpu: 8")
)
TOO_BIG = V100_JOB.replace("v100job", "toobig").replace("nvidia.v100: 4", "nvidia.com/gpu: 16")


async def test_v100_class_job_big_gang_and_a_request_too_large():
    async with live_platform() as platform:
        base = platform.url
        async with aiohttp.ClientSession() as http:

            async def classes_ready() -> bool:
                async with http.get(f"{base}/api/v1/resourceclasses/nvidia.v100") as r:
                    return r.status == 200

            assert await until(classes_ready)
            for body in (V100_JOB, BIG_JOB):
                async with http.post(
                    f"{base}/api/v1/jobs", data=body, headers={"Content-Type": "application/yaml"}
                ) as r:
                    assert r.status == 201, await r.text()
            async with http.post(
                f"{base}/api/v1/jobs", data=TOO_BIG, headers={"Content-Type": "application/yaml"}
            ) as r:
                assert r.status == 422
                details = (await r.json())["error"]["details"]
                assert details == [
                    {
                        "field": "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits.nvidia.com/gpu",
                        "reason": "requests 16 nvidia.com/gpu per pod; the largest node has 8",
                    }
                ]

            async def running_pods() -> list[dict]:
                async with http.get(f"{base}/api/v1/namespaces/default/jobs/v100job/pods") as r:
                    items = (await r.json()).get("items", [])
                return items if items and all(p["summary"]["phase"] == "Running" for p in items) else []

            pods = await until(running_pods)
            assert len(pods) == 1
            pod = pods[0]
            assert pod["summary"]["node"].startswith("dgx1-") and len(pod["summary"]["gpus"]) == 4
            env = pod["summary"]["env"]["pytorch"]
            assert len(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == 4
            async with http.get(f"{base}/api/v1/nodes/{pod['summary']['node']}") as r:
                assert (await r.json())["metadata"]["labels"]["gpuyard.io/gpu-model"] == "v100"

            async def big_explained() -> dict | None:
                async with http.get(f"{base}/api/v1/namespaces/default/jobs/bigjob/explain") as r:
                    body = await r.json() if r.status == 200 else {}
                return body if body.get("reason") == "Unschedulable" else None

            big = await until(big_explained)
            assert big is not None and big["phase"] == "Pending" and big["reservations"] == []
            assert big["message"].startswith(
                "can never fit: asks 64 GPUs, the cluster has 52; "
                "Worker: 8 pods of 8 GPUs must be placed together; at most"
            )
            async with http.get(f"{base}/api/v1/namespaces/default/jobs/bigjob/pods") as r:
                assert (await r.json())["items"] == []
