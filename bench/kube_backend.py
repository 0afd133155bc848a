"""Kubernetes backend figures over the in-process test API server; prints one JSON object.

* `sync_seconds`: from `run()` to `synced` for an API server holding `--nodes` GPU nodes and
  `--pods` foreign (DaemonSet-like) pods, one per node and then round-robin (LIST + mirror of every
  watched resource, foreign capacity applied).
* `gang_bound_seconds`: from creating a TFJob of `--workers` one-GPU workers through the API
  server to every pod bound by gpuyard (create + `pods/binding` each), one platform, no election.

    python bench/kube_backend.py --nodes 200 --pods 2000 --workers 32   (--small: the CI size)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuyard.apis.core import GPU_RESOURCE, Container, Node, NodeCondition, NodeStatus, Pod, PodSpec
from gpuyard.apis.core import ResourceRequirements as Requirements
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quantity import parse_quantity
from gpuyard.kubecluster.writing import to_json
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import RealClock
from gpuyard.state.config import Settings
from gpuyard.testing.apiserver.server import FakeApiServer


def _node(name: str) -> dict[str, Any]:
    cap = {
        "cpu": parse_quantity("64"),
        "memory": parse_quantity("512Gi"),
        "pods": parse_quantity(110),
        GPU_RESOURCE: parse_quantity(8),
    }
    node = Node(
        metadata=ObjectMeta(name=name, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
        status=NodeStatus(
            capacity=cap, allocatable=dict(cap), conditions=[NodeCondition(type="Ready", status="True")]
        ),
    )
    return to_json(node)


def _foreign_pod(i: int, node: str) -> dict[str, Any]:
    limits = {"cpu": parse_quantity("100m"), "memory": parse_quantity("128Mi")}
    pod = Pod(
        metadata=ObjectMeta(name=f"agent-{i}", namespace="kube-system"),
        spec=PodSpec(
            node_name=node,
            scheduler_name="default-scheduler",
            containers=[Container(name="a", image="x", resources=Requirements(limits=limits))],
        ),
    )
    return to_json(pod)


def _tfjob(workers: int) -> dict[str, Any]:
    container = {"name": "tensorflow", "image": "tf:1", "resources": {"limits": {GPU_RESOURCE: 1}}}
    spec = {
        "Worker": {
            "replicas": workers,
            "restartPolicy": "Never",
            "template": {"spec": {"containers": [container]}},
        }
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "bench", "namespace": "default"},
        "spec": {"tfReplicaSpecs": spec},
    }


async def main(nodes: int, pods: int, workers: int) -> dict[str, Any]:
    server = FakeApiServer(port=0, bookmark_interval=1.0)
    await server.start()
    try:
        server.install_gpuyard_crds()
        catalog = server.catalog
        node_res = catalog.get("", "v1", "nodes")
        pod_res = catalog.get("", "v1", "pods")
        for i in range(nodes):
            server.objects.create(node_res, _node(f"n{i:04d}"))
        for i in range(pods):
            server.objects.create(pod_res, _foreign_pod(i, f"n{i % nodes:04d}"), namespace="kube-system")
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = server.write_kubeconfig(Path(tmp) / "kc.yaml")
            settings = Settings(
                server={"port": 0},
                backend={
                    "kind": "kubernetes",
                    "data_dir": None,
                    "kubernetes": {"kubeconfig": str(kubeconfig), "leader_election": {"enabled": False}},
                },
            )
            platform = Platform(settings, clock=RealClock(), serve_http=False)
            started = time.perf_counter()
            task = asyncio.create_task(platform.run())
            await platform.backend.synced.wait()
            sync_seconds = time.perf_counter() - started
            jobs = catalog.get("kubeflow.org", "v1", "tfjobs")
            started = time.perf_counter()
            server.objects.create(jobs, _tfjob(workers), namespace="default")
            while True:
                items = server.objects.list(pod_res, namespace="default")["items"]
                if len([p for p in items if p["spec"].get("nodeName")]) >= workers:
                    break
                await asyncio.sleep(0.005)
            gang_seconds = time.perf_counter() - started
            platform.stop()
            await task
    finally:
        await server.stop()
    return {
        "nodes": nodes,
        "foreign_pods": pods,
        "workers": workers,
        "sync_seconds": round(sync_seconds, 3),
        "gang_bound_seconds": round(gang_seconds, 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--small", action="store_true", help="CI size: 20 nodes, 100 pods, 4 workers.")
    args = parser.parse_args()
    if args.small:
        args.nodes, args.pods, args.workers = 20, 100, 4
    print(json.dumps(asyncio.run(main(args.nodes, args.pods, args.workers))))
