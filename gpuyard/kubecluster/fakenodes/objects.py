"""What `gpuyard fake-nodes` writes to an API server, as plain Kubernetes objects (pure).

The scenario's nodes (`Scenario.nodes()`: capacity and allocatable for cpu, memory, pods,
`nvidia.com/gpu`, RDMA; labels incl. `nvidia.com/gpu.product` and `gpuyard.io/topology-preset`)
with a Ready condition and a heartbeat time, one `NodeTopology` per node that has one, the node
heartbeat Lease (`kube-node-lease`), one `gpu.nvidia.com` ResourceSlice per node (DRA), and the pod statuses a kubelet reports: Running with
`startTime` and `containerStatuses`, then Succeeded or Failed with each container's exit code.
Every object here validates against the Kubernetes schemas (tests/kubernetes/test_fakenodes.py).
"""

from __future__ import annotations

import zlib
from datetime import datetime
from typing import Any

from gpuyard.apis.core import Pod
from gpuyard.devices.dra import resource_slice
from gpuyard.devices.scenarios import Scenario

__all__ = [
    "NODE_LEASE_NAMESPACE",
    "node_lease",
    "node_objects",
    "ready_condition",
    "running_status",
    "slice_objects",
    "terminated_status",
    "topology_objects",
]

NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuyard-fake-nodes"}


def _time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ready_condition(*, ready: bool, now: datetime, reason: str = "", message: str = "") -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": reason or ("KubeletReady" if ready else "KubeletNotReady"),
        "message": message or ("kubelet is posting ready status" if ready else "node failed"),
        "lastHeartbeatTime": _time(now),
        "lastTransitionTime": _time(now),
    }


def node_objects(
    scenario: Scenario, *, now: datetime, kubelet: tuple[str, int] | None = None
) -> list[dict[str, Any]]:
    """The scenario's Node objects, Ready, with their addresses and a fake kubelet's node info.

    `kubelet`: (address, port) of the kubelet port serving these nodes (`kubeletserver.py`). Each
    node then gives that address as its only address (InternalIP: kube-apiserver dials the first of
    its `--kubelet-preferred-address-types` a node has, Hostname first by default) and the port in
    `status.daemonEndpoints.kubeletEndpoint.Port`; without it, a made-up InternalIP and the node's
    name as Hostname, which no one can dial.
    """
    out = []
    for node in scenario.nodes():
        body = node.to_dict()
        meta = body["metadata"]
        body["metadata"] = {
            "name": meta["name"],
            "labels": {**meta.get("labels", {}), **MANAGED_BY, "type": "fake-gpu-node"},
            "annotations": meta.get("annotations", {}),
        }
        status = body["status"]
        status["conditions"] = [ready_condition(ready=True, now=now)]
        if kubelet is None:
            status["addresses"] = [
                {"type": "InternalIP", "address": node_ip(meta["name"])},
                {"type": "Hostname", "address": meta["name"]},
            ]
        else:
            status["addresses"] = [{"type": "InternalIP", "address": kubelet[0]}]
            status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": kubelet[1]}}
        status["nodeInfo"] = {
            "architecture": "amd64",
            "bootID": "",
            "containerRuntimeVersion": "fake://gpuyard",
            "kernelVersion": "",
            "kubeProxyVersion": "",
            "kubeletVersion": "v1.30.0-fake",
            "machineID": "",
            "operatingSystem": "linux",
            "osImage": "gpuyard fake node",
            "systemUUID": "",
        }
        out.append(body)
    return out


def topology_objects(scenario: Scenario) -> list[dict[str, Any]]:
    """One NodeTopology per node that has one (named like the node)."""
    out = []
    for topo in scenario.topologies():
        body = topo.to_dict()
        body["metadata"] = {"name": topo.metadata.name, "labels": dict(MANAGED_BY)}
        out.append(body)
    return out


FAKE_DRIVER_VERSION = (
    "550.54.15"  # what fake nodes' slices say NVML reports (the real driver always publishes both)
)
FAKE_CUDA_DRIVER_VERSION = "12.4.0"


def slice_objects(scenario: Scenario) -> list[dict[str, Any]]:
    """One `gpu.nvidia.com` ResourceSlice per node with a topology (pool = node name), as NVIDIA's
    DRA driver publishes them (`devices.dra.resource_slice`, driver and CUDA versions included)."""
    out = []
    for topo in scenario.topologies():
        body = resource_slice(
            topo, driver_version=FAKE_DRIVER_VERSION, cuda_driver_version=FAKE_CUDA_DRIVER_VERSION
        )
        body["metadata"]["labels"] = dict(MANAGED_BY)
        out.append(body)
    return out


def node_lease(node: str, *, now: datetime) -> dict[str, Any]:
    """The node's heartbeat Lease, renewed now."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE, "labels": dict(MANAGED_BY)},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": _micro_time(now),
        },
    }


def node_ip(name: str) -> str:
    h = zlib.crc32(name.encode()) & 0xFFFF
    return f"172.16.{h >> 8}.{(h & 0xFF) or 1}"


def _pod_ip(pod: Pod) -> str:
    h = zlib.crc32(f"{pod.metadata.namespace}/{pod.metadata.name}".encode()) & 0xFFFF
    return f"10.244.{h >> 8}.{(h & 0xFF) or 1}"


def _container(c: Any, state: dict[str, Any], *, ready: bool) -> dict[str, Any]:
    return {
        "name": c.name,
        "image": c.image or "unknown",
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "started": ready,
        "state": state,
    }


def running_status(pod: Pod, *, now: datetime) -> dict[str, Any]:
    """The status a kubelet reports once the pod's containers run."""
    host = node_ip(pod.spec.node_name or "")
    started = _time(now)
    return {
        "phase": "Running",
        "hostIP": host,
        "podIP": host if pod.spec.host_network else _pod_ip(pod),
        "startTime": started,
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": started},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": started},
        ],
        "containerStatuses": [
            _container(c, {"running": {"startedAt": started}}, ready=True) for c in pod.spec.containers
        ],
    }


def terminated_status(
    pod: Pod, *, exit_code: int, reason: str, now: datetime, message: str = ""
) -> dict[str, Any]:
    """Succeeded (exit code 0) or Failed, each container terminated with `exit_code`."""
    finished = _time(now)
    terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "finishedAt": finished}
    status: dict[str, Any] = {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": finished}
        ],
        "containerStatuses": [
            _container(c, {"terminated": terminated}, ready=False) for c in pod.spec.containers
        ],
    }
    if exit_code != 0:
        status["reason"] = reason
    if message:
        status["message"] = message
        terminated["message"] = message
    return status
