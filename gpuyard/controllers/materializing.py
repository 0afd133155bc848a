"""Turning a job's replica into objects: the pod (from its reservation) and its Service.

Pure functions of the job, the role/index, the reservation and the plugin; the planning step
decides *when*, and the apply step writes the results through the writer. A pod is built as the reference
operators build it (`createNewPod`): the replica's template, KubeDL's and Kubeflow's labels
(`pod_labels`), an ownerReference to the job, git-sync code
init container, host-network setup, then the plugin's env wiring; gpuyard then binds it to the
reserved node, names itself in `schedulerName` and adds the reserved devices
(`gpuyard.io/devices`, NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES).

Pods run with `restartPolicy: Never`: gpuyard restarts replicas itself, so that every restart
is counted against `backoffLimit` and a restarted replica can move to a new placement.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from gpuyard.apis.core import (
    GPU_RESOURCE,
    Container,
    ContainerPort,
    Pod,
    PodTemplateSpec,
    Service,
    ServicePort,
    ServiceSpec,
)
from gpuyard.apis.jobkinds import ANNOTATION_GIT_SYNC, TrainingJob
from gpuyard.apis.meta import ObjectMeta, OwnerReference, deep_copy
from gpuyard.apis.scheduling import (
    ANNOTATION_DEVICES,
    LABEL_GROUP_NAME,
    LABEL_JOB_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    Reservation,
)
from gpuyard.controllers.datasetcaching import add_cache_volume
from gpuyard.controllers.delegating import PodScheduling, mark_pod
from gpuyard.controllers.modelversioning import add_model_output
from gpuyard.controllers.workloads.base import (
    Wiring,
    WorkloadPlugin,
    container_port,
    extra_list,
    replica_name,
)

__all__ = [
    "GPUYARD_PLACES",
    "LABEL_JOB_ROLE",
    "GitSyncError",
    "build_pod",
    "build_service",
    "devices_annotation",
    "owner_reference",
    "pod_labels",
    "render_template",
]

LABEL_JOB_ROLE = "job-role"
KUBEFLOW_LABELS = "training.kubeflow.org/"
DEFAULT_GIT_SYNC_IMAGE = "kubedl/git-sync:v1"
DEFAULT_CODE_ROOT = "/code"
GPUYARD_PLACES = PodScheduling()


class GitSyncError(ValueError):
    """The job's `kubedl.io/git-sync-config` annotation is not valid JSON options."""


def group_name(job: TrainingJob) -> str:
    return job.api_version.split("/", 1)[0]


def pod_labels(job: TrainingJob, role: str, index: int, plugin: WorkloadPlugin) -> dict[str, str]:
    """The labels both KubeDL's and Kubeflow's tools select a job's pods by, on every job's pods.

    KubeDL's GenLabels (`group-name`, `job-name`, `replica-type`, `replica-index`, `job-role`) and
    the training-operator's `training.kubeflow.org/` names of the same four, whichever group the
    job is in, so dashboards and scripts of either project find the pods during a migration;
    `training.kubeflow.org/operator-name` only on Kubeflow jobs (it names Kubeflow's operator).
    """
    name = job.metadata.name.replace("/", "-")
    rt = role.lower()
    labels = {
        LABEL_GROUP_NAME: group_name(job),
        LABEL_JOB_NAME: name,
        LABEL_REPLICA_TYPE: rt,
        LABEL_REPLICA_INDEX: str(index),
        f"{KUBEFLOW_LABELS}job-name": name,
        f"{KUBEFLOW_LABELS}replica-type": rt,
        f"{KUBEFLOW_LABELS}replica-index": str(index),
    }
    if job.flavor == "kubeflow":
        labels[f"{KUBEFLOW_LABELS}operator-name"] = f"{job.KIND.lower()}-controller"
    if plugin.is_master(job, role, index):
        labels[LABEL_JOB_ROLE] = "master"
        labels[f"{KUBEFLOW_LABELS}job-role"] = "master"
    return labels


def owner_reference(job: TrainingJob) -> OwnerReference:
    return job.controller_reference()


def inject_git_sync(template: PodTemplateSpec, raw: str) -> None:
    """KubeDL code_sync: a `git-sync-code` init container and the code volume in every container."""
    try:
        opts = json.loads(raw)
    except ValueError as exc:
        raise GitSyncError(f"annotation {ANNOTATION_GIT_SYNC}: not valid JSON: {exc}") from None
    if not isinstance(opts, dict) or not opts.get("source"):
        raise GitSyncError(f'annotation {ANNOTATION_GIT_SYNC}: an object with at least "source" is required')
    source = str(opts["source"])
    root = opts.get("rootPath") or DEFAULT_CODE_ROOT
    dest = opts.get("destPath")
    if not dest:
        dest = source.strip("/").split("/")[-1].removesuffix(".git")
    max_failures = int(opts.get("maxFailures") or 3)
    envs: list[dict[str, str]] = list(opts.get("envs") or [])
    envs.append({"name": "GIT_SYNC_REPO", "value": source})
    envs.append({"name": "GIT_SYNC_ONE_TIME", "value": "true"})
    if max_failures >= 0:
        envs.append({"name": "GIT_SYNC_MAX_SYNC_FAILURES", "value": str(max_failures)})
    for key, env in (
        ("branch", "GIT_SYNC_BRANCH"),
        ("revision", "GIT_SYNC_REV"),
        ("depth", "GIT_SYNC_DEPTH"),
    ):
        if opts.get(key):
            envs.append({"name": env, "value": str(opts[key])})
    envs.append({"name": "GIT_SYNC_ROOT", "value": root})
    envs.append({"name": "GIT_SYNC_DEST", "value": dest})
    if opts.get("ssh"):
        envs.append({"name": "GIT_SYNC_SSH", "value": "true"})
        if opts.get("sshFile"):
            envs.append({"name": "GIT_SSH_KEY_FILE", "value": str(opts["sshFile"])})
    if opts.get("user"):
        envs.append({"name": "GIT_SYNC_USERNAME", "value": str(opts["user"])})
    if opts.get("password"):
        envs.append({"name": "GIT_SYNC_PASSWORD", "value": str(opts["password"])})
    spec = template.spec
    first = spec.containers[0] if spec.containers else None
    init = Container.model_validate(
        {
            "name": "git-sync-code",
            "image": opts.get("image") or DEFAULT_GIT_SYNC_IMAGE,
            "env": envs,
            "imagePullPolicy": "IfNotPresent",
            "volumeMounts": [{"name": "git-sync", "readOnly": False, "mountPath": root}],
            "resources": first.resources.model_dump(mode="json", by_alias=True, exclude_none=True)
            if first
            else {},
        }
    )
    spec.init_containers.append(init)
    extra_list(spec, "volumes").append({"name": "git-sync", "emptyDir": {}})
    code_path = opts.get("relativeCodePath") or dest
    for c in spec.containers:
        extra_list(c, "volumeMounts").append(
            {
                "name": "git-sync",
                "readOnly": False,
                "mountPath": posixpath.join(c.working_dir or "", code_path),
                "subPath": dest,
            }
        )


def _setup_host_network(w: Wiring) -> None:
    """KubeDL setupHostNetwork: host network, ClusterFirstWithHostNet DNS, container port = host port."""
    spec = w.spec
    spec.host_network = True
    spec.dns_policy = "ClusterFirstWithHostNet"
    if w.host_port is None or not spec.containers:
        return
    default = w.port_default
    container = next((c for c in spec.containers if c.name == default.container), spec.containers[0])
    for p in container.ports:
        if p.name == default.name:
            p.container_port = w.host_port
            p.host_port = w.host_port
            return
    container.ports.append(
        ContainerPort(name=default.name, container_port=w.host_port, host_port=w.host_port)
    )


def render_template(
    job: TrainingJob,
    role: str,
    index: int,
    *,
    plugin: WorkloadPlugin,
    host_port: int | None = None,
    cluster_domain: str = "",
) -> Wiring:
    """The replica's pod template, wired: labels, code sync, host network, framework env; the
    last `spotReplicaNumber` replicas of a role get the spot priority class and labels (KubeDL)."""
    template = deep_copy(job.replica_specs[role].template)
    meta = template.metadata
    labels = dict(meta.get("labels") or {})
    labels.update(pod_labels(job, role, index, plugin))
    annotations = dict(meta.get("annotations") or {})
    w = Wiring(
        job=job,
        role=role,
        index=index,
        template=template,
        annotations=annotations,
        host_port=host_port,
        cluster_domain=cluster_domain,
    )
    if ANNOTATION_GIT_SYNC in job.metadata.annotations and template.spec.containers:
        inject_git_sync(template, job.metadata.annotations[ANNOTATION_GIT_SYNC])
    add_model_output(template, job)  # KubeDL: spec.modelVersion's storage and KUBEDL_MODEL_PATH
    add_cache_volume(template, job)  # KubeDL: spec.cacheBackend's claim at its mountPath
    if job.host_network:
        _setup_host_network(w)
    template.spec.restart_policy = "Never"
    plugin.wire(w)
    spot = job.replica_specs[role].spot_replica_spec
    if spot is not None and job.replica_specs[role].is_spot(index):
        # KubeDL's applySpotReplicaSpec: the spot class replaces the template's, labels are added
        template.spec.priority_class_name = spot.priority_class_name or None
        labels.update(spot.labels)
    meta["labels"] = labels
    meta["annotations"] = w.annotations
    return w


def devices_annotation(reservation: Reservation) -> str:
    r = reservation.spec
    value: dict[str, Any] = {
        "gpus": list(r.gpus),
        "gpuIds": list(r.gpu_ids),
        "nics": list(r.nics),
        "hostPorts": list(r.host_ports),
    }
    if r.gpus and r.gpu_milli and r.gpu_milli < 1000:
        value["gpuMilli"] = r.gpu_milli
        if r.gpu_memory_mib:
            value["gpuMemoryMiB"] = r.gpu_memory_mib
    return json.dumps(value, separators=(",", ":"))


_GPU_REQUESTS = (
    GPU_RESOURCE,
    "gpuyard.io/gpu-milli",
    "gpuyard.io/gpu-memory-mib",
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/gpu-memory",
)
"""Container resources that mark the container as the one using the pod's GPU (or share)."""


def _gang_shape(reservation: Reservation, peers: Mapping[str, Reservation]) -> str:
    """GPUs per node of the whole gang, largest first (`7+1`, `4+4`, `8`); nodes without GPUs left out."""
    per_node: dict[str, int] = {}
    held = {**peers, reservation.metadata.name: reservation}
    for res in held.values():
        if res.spec.gpus:
            per_node[res.spec.node] = per_node.get(res.spec.node, 0) + len(res.spec.gpus)
    return "+".join(str(n) for n in sorted(per_node.values(), reverse=True))


def _device_env(pod: Pod, reservation: Reservation, peers: Mapping[str, Reservation] | None = None) -> None:
    """The env a container needs to use exactly its reserved devices (docs/node-agent.md, "Env").

    - `NVIDIA_VISIBLE_DEVICES`: the GPUs' UUIDs (physical indices only when the node's topology knows
      no UUIDs); the NVIDIA container runtime exposes just these, renumbered 0..k-1 in PCI bus order.
    - `CUDA_VISIBLE_DEVICES` = `0..k-1` and `CUDA_DEVICE_ORDER=PCI_BUS_ID`: what the container sees,
      so that CUDA index i is the i-th of `GPUYARD_GPU_INDICES` (the physical indices, ascending) and an
      image's own CUDA_VISIBLE_DEVICES cannot hide reserved GPUs.
    - `NCCL_IB_HCA` = `=<nic>,<nic>` (exact names: a bare `mlx5_1` would also match `mlx5_10`) and
      `GPUYARD_RDMA_DEVICES`: the reserved RDMA NICs.
    - a share also gets `GPUYARD_GPU_MILLI`, `GPUYARD_GPU_MEMORY_LIMIT_MIB` and the MPS limits that enforce
      it: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (milli / 10) and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`0=<MiB>M`:
      CUDA index 0 is the container's one GPU); the MPS pipe directory comes with the GPU from the node
      agent's `gpuyard.io/gpu-share` device plugin (docs/node-agent.md, "Shares");
    - co-located peers of the gang: `LOCAL_WORLD_SIZE`, `GPUYARD_LOCAL_RANK` by pod name order,
      `GPUYARD_LOCAL_GPUS` (the GPUs of every co-located pod in that order, when the peers'
      Reservations are given); `GPUYARD_NVLINK_DOMAIN` (pods with equal values share one node's
      NVLink/NVSwitch fabric) and `GPUYARD_GANG_SHAPE` (GPUs per node of the whole gang, `7+1`).
    """
    spec = reservation.spec
    if not spec.gpus and not spec.nics:
        return
    targets = [
        c
        for c in pod.spec.containers
        if any(c.resources.effective().get(name, 0) > 0 for name in _GPU_REQUESTS)
    ] or pod.spec.containers[:1]
    ids_known = len(spec.gpu_ids) == len(spec.gpus) and all(spec.gpu_ids)
    order = sorted(range(len(spec.gpus)), key=lambda i: spec.gpus[i])
    gpus = [spec.gpus[i] for i in order]
    visible = [spec.gpu_ids[i] for i in order] if ids_known else [str(g) for g in gpus]
    local = sorted([*spec.local_peers, reservation.metadata.name])
    local_gpus: list[int] | None = None
    if spec.local_peers and peers is not None:
        local_gpus = []
        for name in local:
            held = reservation if name == reservation.metadata.name else peers.get(name)
            if held is None:
                local_gpus = None
                break
            local_gpus.extend(held.spec.gpus)
    shared = len(gpus) == 1 and 0 < spec.gpu_milli < 1000
    shape = _gang_shape(reservation, peers) if peers is not None and gpus else ""
    for c in targets:
        if gpus:
            c.set_env("NVIDIA_VISIBLE_DEVICES", ",".join(visible))
            c.set_env("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(len(gpus))))
            c.set_env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            c.set_env("GPUYARD_GPU_INDICES", ",".join(str(g) for g in gpus))
            c.set_env("GPUYARD_NVLINK_DOMAIN", spec.node)
        if shared:  # a GPU share: its compute (MPS thread limit) and memory limit
            c.set_env("GPUYARD_GPU_MILLI", str(spec.gpu_milli))
            c.set_env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(max(1, spec.gpu_milli // 10)))
            if spec.gpu_memory_mib:
                c.set_env("GPUYARD_GPU_MEMORY_LIMIT_MIB", str(spec.gpu_memory_mib))
                c.set_env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={spec.gpu_memory_mib}M")
        if spec.nics:
            c.set_env("GPUYARD_RDMA_DEVICES", ",".join(spec.nics))
            c.set_env("NCCL_IB_HCA", "=" + ",".join(spec.nics))
        if shape:
            c.set_env("GPUYARD_GANG_SHAPE", shape)
        if spec.local_peers:
            c.set_env("LOCAL_WORLD_SIZE", str(len(local)))
            c.set_env("GPUYARD_LOCAL_RANK", str(local.index(reservation.metadata.name)))
            if local_gpus is not None:
                c.set_env("GPUYARD_LOCAL_GPUS", ",".join(str(g) for g in local_gpus))


def build_pod(
    job: TrainingJob,
    role: str,
    index: int,
    *,
    plugin: WorkloadPlugin,
    reservation: Reservation,
    host_port: int | None = None,
    cluster_domain: str = "",
    peers: Mapping[str, Reservation] | None = None,
    scheduling: PodScheduling = GPUYARD_PLACES,
) -> Pod:
    """The pod for replica `index` of `role`, bound to its reservation's node with its devices.

    `peers` (pod name -> Reservation) are the job's other Reservations; those of the co-located
    pods (`reservation.spec.local_peers`) give `GPUYARD_LOCAL_GPUS`. `scheduling` names the
    pod's scheduler (`scheduler.name`: kube-scheduler leaves the pod alone); in delegate mode the
    pod is left unbound, without gpuyard's devices, for the gang scheduler (`delegating.py`).
    """
    w = render_template(
        job,
        role,
        index,
        plugin=plugin,
        host_port=host_port if job.host_network else None,
        cluster_domain=cluster_domain,
    )
    meta = w.template.metadata
    annotations = dict(meta["annotations"])
    annotations[ANNOTATION_DEVICES] = devices_annotation(reservation)
    pod = Pod(
        metadata=ObjectMeta(
            name=replica_name(job.metadata.name, role, index),
            namespace=job.metadata.namespace or "default",
            labels=meta["labels"],
            annotations=annotations,
            owner_references=[owner_reference(job)],
        ),
        spec=w.template.spec,
    )
    mark_pod(pod, job=job, role=role, scheduling=scheduling)
    if scheduling.delegated:
        del pod.metadata.annotations[ANNOTATION_DEVICES]
        return pod
    pod.spec.node_name = reservation.spec.node
    _device_env(pod, reservation, peers)
    return pod


def build_service(
    job: TrainingJob, role: str, index: int, *, plugin: WorkloadPlugin, host_port: int | None = None
) -> Service:
    """One Service per replica: headless normally; in host-network mode a ClusterIP service whose
    `port` is the framework port and `targetPort` the pod's host port (KubeDL CreateNewService)."""
    labels = {
        k: v
        for k, v in pod_labels(job, role, index, plugin).items()
        if k in (LABEL_GROUP_NAME, LABEL_JOB_NAME, LABEL_REPLICA_TYPE, LABEL_REPLICA_INDEX)
    }
    flavor = job.info.flavor(job.api_version)
    port = container_port(job.replica_specs[role].template.spec, flavor.port)
    ports = []
    if port is not None:
        target = host_port if (job.host_network and host_port is not None) else port
        ports.append(ServicePort(name=flavor.port.name, port=port, target_port=target))
    return Service(
        metadata=ObjectMeta(
            name=replica_name(job.metadata.name, role, index),
            namespace=job.metadata.namespace or "default",
            labels=dict(labels),
            owner_references=[owner_reference(job)],
        ),
        spec=ServiceSpec(selector=dict(labels), ports=ports, cluster_ip=None if job.host_network else "None"),
    )
