"""Which pod a kubelet device-plugin call is for, and what it gets: the pure rule of device-plugin mode.

The kubelet's `Allocate` names device IDs, not the pod, and the kubelet may pick other devices than
the plugin preferred: with several pods of a gang pending on one node, the IDs cannot say which pod
is being admitted. gpuyard does what the gpushare and HAMi device plugins do (the scheduler marks
each pod it binds with its devices and a bind time; the plugin answers the pending, not yet
served pod with that mark and the requested device count, oldest mark first) and relies on how the
kubelet admits pods: one at a time, in the order they reach it, sorted by creation time
(`HandlePodAdditions`). So:

- candidates: the gpuyard pods bound to this node that have not started (phase Pending), whose
  `gpuyard.io/devices` annotation holds exactly `size` units of the resource, that the kubelet has
  not admitted yet (it has written no container status) and that this plugin has not served yet;
- the pod being admitted is the first candidate in the kubelet's order: creation time, then the
  bind mark `gpuyard.io/bind-time` (nanoseconds, written by the Kubernetes backend as it binds), then
  the name;
- `GetPreferredAllocation` prefers that pod's own devices, so a kubelet that follows the preference
  (the real one does) books what gpuyard chose; `Allocate` answers that pod's devices whatever IDs
  the kubelet passes (they count, nothing more): env, device nodes or CDI names of exactly
  gpuyard's GPUs, so the container gets them even where the NVIDIA runtime ignores the env;
- a repeated `Allocate` with the same IDs (the kubelet retrying a container) gets the same pod again;
- no candidate at all is an error naming the node and the pending pods: the pod was not placed by
  gpuyard (`schedulerName: gpuyard`). Never another pod's devices by a guess of the IDs.

Resources and their device IDs: `gpuyard.io/gpu` (GPU UUIDs), `gpuyard.io/rdma` (NIC names) and
`gpuyard.io/gpu-share` (`<uuid>::<slot>`, N slots per GPU: one per share pod; the scheduler keeps the
shares within the GPU's compute and memory, the MPS env of :func:`allocation_for` enforces them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuyard.apis.scheduling import ANNOTATION_DEVICES

__all__ = [
    "ANNOTATION_BIND_TIME",
    "RESOURCE_GPU",
    "RESOURCE_GPU_SHARE",
    "RESOURCE_RDMA",
    "SHARE_SLOT_SEPARATOR",
    "Allocation",
    "AllocationError",
    "AllocationOptions",
    "GpuInfo",
    "PendingPod",
    "PodLookup",
    "allocation_env",
    "allocation_for",
    "allocation_for_pod",
    "mps_env",
    "next_pod",
    "pending_pods_from",
    "preferred_allocation",
    "share_gpu",
]

RESOURCE_GPU = "gpuyard.io/gpu"
RESOURCE_RDMA = "gpuyard.io/rdma"
RESOURCE_GPU_SHARE = "gpuyard.io/gpu-share"
ANNOTATION_BIND_TIME = "gpuyard.io/bind-time"
SHARE_SLOT_SEPARATOR = "::"
GPU_MILLI = 1000
# Conditions only the kubelet writes: a pod that has one was admitted (it got its devices already).
_KUBELET_CONDITIONS = frozenset({"Initialized", "PodReadyToStartContainers", "ContainersReady", "Ready"})


class AllocationError(LookupError):
    """No pod to give these devices to; the message says which node, IDs and pods were seen."""


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A gpuyard pod bound to this node that has not started, with the devices it was given."""

    namespace: str
    name: str
    gpu_ids: tuple[str, ...]
    gpus: tuple[int, ...]
    nics: tuple[str, ...]
    uid: str = ""
    created: str = ""  # metadata.creationTimestamp (RFC 3339: sorts as text)
    bind_time: int = 0  # the gpuyard.io/bind-time mark, 0 when absent
    gpu_milli: int = 0  # a share: thousandths of its one GPU (0: whole GPUs)
    gpu_memory_mib: int = 0  # a share's GPU memory (0: its compute fraction of the GPU's memory)
    admitted: bool = False  # the kubelet wrote its status: admitted, devices already given

    @property
    def shared(self) -> bool:
        return len(self.gpus) == 1 and 0 < self.gpu_milli < GPU_MILLI

    def ids(self, resource: str) -> tuple[str, ...]:
        """The devices of `resource` this pod was given (a share: its one GPU's UUID)."""
        if resource == RESOURCE_GPU:
            return () if self.shared else self.gpu_ids
        if resource == RESOURCE_GPU_SHARE:
            return self.gpu_ids if self.shared else ()
        return self.nics

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ident(self) -> str:
        return self.uid or self.key

    @property
    def order(self) -> tuple[str, int, str, str]:
        return (self.created, self.bind_time, self.namespace, self.name)


class PodLookup(Protocol):
    """Answers "which gpuyard pods bound to node N have not started" (gpuyard API or Kubernetes)."""

    async def pending_pods(self, node: str) -> list[PendingPod]: ...


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _admitted(status: Mapping[str, Any]) -> bool:
    if status.get("containerStatuses") or status.get("initContainerStatuses"):
        return True
    return any(
        isinstance(c, Mapping) and c.get("type") in _KUBELET_CONDITIONS
        for c in status.get("conditions") or []
    )


def pending_pods_from(pods: Iterable[Mapping[str, Any]]) -> list[PendingPod]:
    """Pending pods with a `gpuyard.io/devices` annotation, from pod documents (API or Kubernetes)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if status.get("phase", "Pending") != "Pending":
            continue
        annotations = meta.get("annotations") or {}
        raw = annotations.get(ANNOTATION_DEVICES)
        if not raw:
            continue
        try:
            devices = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(devices, dict):
            continue
        out.append(
            PendingPod(
                namespace=str(meta.get("namespace") or "default"),
                name=str(meta.get("name") or ""),
                gpu_ids=tuple(str(i) for i in devices.get("gpuIds") or []),
                gpus=tuple(int(g) for g in devices.get("gpus") or []),
                nics=tuple(str(n) for n in devices.get("nics") or []),
                uid=str(meta.get("uid") or ""),
                created=str(meta.get("creationTimestamp") or ""),
                bind_time=_int(annotations.get(ANNOTATION_BIND_TIME)),
                gpu_milli=_int(devices.get("gpuMilli")),
                gpu_memory_mib=_int(devices.get("gpuMemoryMiB")),
                admitted=_admitted(status),
            )
        )
    return out


def share_gpu(device_id: str) -> str:
    """The GPU UUID of a `gpuyard.io/gpu-share` slot ID (`<uuid>::<slot>`)."""
    return device_id.split(SHARE_SLOT_SEPARATOR, 1)[0]


def _units(pod: PendingPod, resource: str) -> int:
    ids = pod.ids(resource)
    return min(len(ids), 1) if resource == RESOURCE_GPU_SHARE else len(ids)


def next_pod(
    pods: Sequence[PendingPod], *, resource: str, size: int, served: Iterable[str] = ()
) -> PendingPod | None:
    """The pod the kubelet admits next for `size` units of `resource` (module doc), or None."""
    done = set(served)
    candidates = [
        p for p in pods if size > 0 and _units(p, resource) == size and not p.admitted and p.ident not in done
    ]
    return min(candidates, key=lambda p: p.order) if candidates else None


def preferred_allocation(
    pods: Sequence[PendingPod],
    *,
    resource: str,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    served: Iterable[str] = (),
) -> list[str]:
    """The next pod's own devices as far as the kubelet can still give them; [] for no preference."""
    pod = next_pod(pods, resource=resource, size=size, served=served)
    if pod is None:
        return []
    free = list(available)
    chosen = [d for d in must_include if d in free]
    if resource == RESOURCE_GPU_SHARE:
        mine = [d for d in free if share_gpu(d) in pod.gpu_ids]
    else:
        mine = [d for d in pod.ids(resource) if d in free]
    for device in [*mine, *free]:
        if len(chosen) >= size:
            break
        if device not in chosen:
            chosen.append(device)
    return chosen if len(chosen) == size else []


def allocation_for(
    pods: Sequence[PendingPod],
    *,
    node: str,
    resource: str,
    ids: Sequence[str],
    served: Mapping[str, frozenset[str]],
) -> PendingPod:
    """The pod an `Allocate` of `ids` is for (module doc); AllocationError when there is none.

    `served` maps each pod already answered (`PendingPod.ident`) to the kubelet's IDs of that answer.
    """
    wanted = frozenset(ids)
    for retried in pods:  # the kubelet retrying one container: the same IDs, the same pod
        if served.get(retried.ident) == wanted and not retried.admitted:
            return retried
    pod = next_pod(pods, resource=resource, size=len(ids), served=served)
    if pod is not None:
        return pod
    seen = ", ".join(f"{p.key} {list(p.ids(resource))}" for p in pods if p.ids(resource)) or "none"
    raise AllocationError(
        f"no pending gpuyard pod on node {node} waits for {len(ids)} {resource} "
        f"(the kubelet offered {sorted(wanted)}); pending pods: {seen}. "
        f"Pods using {resource} must be placed by gpuyard (schedulerName: gpuyard)"
    )


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What the plugin knows of one GPU of its node: device node minor and memory."""

    uuid: str
    minor: int
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class AllocationOptions:
    """How an allocation reaches the container.

    `cdi`: CDI device names (`nvidia.com/gpu=<uuid>`, for runtimes with CDI) instead of device nodes
    (`/dev/nvidia<minor>`, `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`); either way
    the env is set too. `mps_pipe_directory`: the node's MPS pipe directory, mounted into share pods
    (None: not mounted; the pod must reach an MPS daemon some other way)."""

    cdi: bool = False
    cdi_kind: str = "nvidia.com/gpu"
    mps_pipe_directory: str | None = "/tmp/nvidia-mps"
    dev_root: str = "/dev"


@dataclass(slots=True)
class Allocation:
    """One container's answer: env, device nodes (container, host, permissions), CDI names, mounts."""

    envs: dict[str, str] = field(default_factory=dict)
    devices: list[tuple[str, str, str]] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)


def _gpu_order(pod: PendingPod) -> list[tuple[int, str]]:
    pairs = sorted(zip(pod.gpus, pod.gpu_ids, strict=False))  # physical order, as materializing.py
    if len(pairs) == len(pod.gpu_ids):
        return pairs
    return [(g, u) for g, u in zip(range(len(pod.gpu_ids)), pod.gpu_ids, strict=False)]


def allocation_env(pod: PendingPod, *, resource: str) -> dict[str, str]:
    """The env the kubelet adds to the container: what the NVIDIA runtime and NCCL need."""
    if resource == RESOURCE_RDMA:
        return {"NCCL_IB_HCA": "=" + ",".join(pod.nics), "GPUYARD_RDMA_DEVICES": ",".join(pod.nics)}
    pairs = _gpu_order(pod)
    return {
        "NVIDIA_VISIBLE_DEVICES": ",".join(u for _, u in pairs),
        "GPUYARD_GPU_INDICES": ",".join(str(g) for g in sorted(pod.gpus)),
    }


def mps_env(pod: PendingPod, *, gpu_memory_mib: int = 0) -> dict[str, str]:
    """The MPS limits of a share: its compute (active thread percentage) and its GPU memory, pinned
    on the container's one visible GPU (CUDA index 0). The memory is the share's, else its compute
    fraction of `gpu_memory_mib` (the GPU's), else left unlimited."""
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, pod.gpu_milli // 10))}
    memory = pod.gpu_memory_mib or (gpu_memory_mib * pod.gpu_milli // GPU_MILLI)
    if memory:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory}M"
    return env


def allocation_for_pod(
    pod: PendingPod,
    *,
    resource: str,
    gpus: Mapping[str, GpuInfo],
    options: AllocationOptions = AllocationOptions(),
) -> Allocation:
    """Everything the container needs to use exactly `pod`'s devices of `resource` (GPUs and shares;
    RDMA device nodes come from sysfs, in the plugin)."""
    out = Allocation(envs=allocation_env(pod, resource=resource))
    if resource == RESOURCE_RDMA:
        return out
    uuids = [u for _, u in _gpu_order(pod)]
    if options.cdi:
        out.cdi_devices = [f"{options.cdi_kind}={u}" for u in uuids]
    else:
        dev = options.dev_root.rstrip("/")
        for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
            out.devices.append((f"/dev/{name}", f"{dev}/{name}", "rw"))
        for uuid in uuids:
            info = gpus.get(uuid)
            if info is not None:
                out.devices.append((f"/dev/nvidia{info.minor}", f"{dev}/nvidia{info.minor}", "rw"))
    if resource == RESOURCE_GPU_SHARE and pod.shared:
        info = gpus.get(pod.gpu_ids[0]) if pod.gpu_ids else None
        out.envs.update(mps_env(pod, gpu_memory_mib=info.memory_mib if info else 0))
        if options.mps_pipe_directory:
            out.envs["CUDA_MPS_PIPE_DIRECTORY"] = options.mps_pipe_directory
            out.mounts.append((options.mps_pipe_directory, options.mps_pipe_directory, False))
    return out
