"""MPIJob: the launcher's hostfile (`slots=` per worker), kubexec agent and Open MPI env.

References: KubeDL `controllers/mpi/mpi_config.go` + `mpijob_controller.go` (setupMPIWorker,
setupMPILauncher) and Kubeflow `pkg/controller.v1/mpi/mpijob_controller.go` (newConfigMap,
newLauncher, newWorker). The job's ConfigMap (`<job>-config`: `hostfile`, `kubexec.sh`) is carried
on the pods as the annotation `gpuyard.io/config-files` (path -> content) for the backend to
materialise; the volumes and mounts are those of the reference operators.

Hostfile: one line per worker, `<job>-worker-<i> slots=<slotsPerWorker>` (IntelMPI/MPICH:
`<job>-worker-<i>:<slots>`), preceded by the launcher when it requests GPUs (it then runs ranks
too). Workers start first; the launcher starts when every worker is Running and decides success.
"""

from __future__ import annotations

import json

from gpuyard.apis.core import GPU_RESOURCE, Container
from gpuyard.apis.jobkinds import MPIJob, TrainingJob
from gpuyard.apis.jobspecs import DAGCondition
from gpuyard.controllers.workloads.base import (
    JobView,
    Wiring,
    WorkloadPlugin,
    add_env,
    dependencies,
    extra_list,
)

__all__ = ["ANNOTATION_CONFIG_FILES", "MPIPlugin", "hostfile", "kubexec_script"]

ANNOTATION_CONFIG_FILES = "gpuyard.io/config-files"
LAUNCHER = "Launcher"
WORKER = "Worker"
CONFIG_DIR = "/etc/mpi"
KUBECTL_DIR = "/opt/kube"
KUBECTL_DELIVERY_IMAGE = "mpioperator/kubectl-delivery:latest"


def _volume_names(flavor: str) -> tuple[str, str]:
    """(config volume, kubectl volume) as each project names them."""
    return (
        ("mpi-config-volume", "kubectl-volume")
        if flavor == "kubedl"
        else ("mpi-job-config", "mpi-job-kubectl")
    )


def launcher_requests_gpus(job: MPIJob) -> bool:
    spec = job.replica_specs.get(LAUNCHER)
    return spec is not None and spec.template.spec.requests().get(GPU_RESOURCE, 0) > 0


def hostfile(job: MPIJob) -> str:
    slots = job.spec.slots_per_worker or 1
    workers = job.replica_specs[WORKER].count if WORKER in job.replica_specs else 0
    colon = job.flavor == "kubedl" and job.spec.mpi_distribution in ("IntelMPI", "MPICH")
    lines = []
    if launcher_requests_gpus(job):
        lines.append(f"{job.metadata.name}-launcher-0 slots={slots}\n")
    for i in range(workers):
        host = f"{job.metadata.name}-worker-{i}"
        lines.append(f"{host}:{slots}\n" if colon else f"{host} slots={slots}\n")
    return "".join(lines)


def kubexec_script(job: MPIJob) -> str:
    script = f"#!/bin/sh\nset -x\nPOD_NAME=$1\nshift\n{KUBECTL_DIR}/kubectl exec ${{POD_NAME}}"
    if job.spec.main_container:
        script += f" --container {job.spec.main_container}"
    return script + ' -- /bin/sh -c "$*"'


class MPIPlugin(WorkloadPlugin):
    kind = "MPIJob"

    def default_dependencies(self, job: TrainingJob) -> dict[str, list[DAGCondition]]:
        return dependencies([(LAUNCHER, WORKER)], job)

    def is_master(self, job: TrainingJob, role: str, index: int) -> bool:
        return job.flavor == "kubeflow" and role == LAUNCHER

    def wire(self, w: Wiring) -> None:
        job = w.job
        assert isinstance(job, MPIJob)
        files = {f"{CONFIG_DIR}/kubexec.sh": kubexec_script(job)}
        if w.role == LAUNCHER:
            files[f"{CONFIG_DIR}/hostfile"] = hostfile(job)
            self._launcher(w, job)
        else:
            self._worker(w, job)
        w.annotations[ANNOTATION_CONFIG_FILES] = json.dumps(files, sort_keys=True)

    def _worker(self, w: Wiring, job: MPIJob) -> None:
        config_volume, _ = _volume_names(w.flavor)
        volumes = extra_list(w.spec, "volumes")
        volumes.append(
            {
                "name": config_volume,
                "configMap": {
                    "name": f"{w.name}-config",
                    "items": [{"key": "kubexec.sh", "path": "kubexec.sh", "mode": 0o555}],
                },
            }
        )
        targets = w.containers() if w.flavor == "kubedl" else w.containers()[:1]
        for c in targets:
            idle = not c.command and (not c.args or w.flavor == "kubeflow")
            if idle:
                c.command = ["sleep"]
                c.args = ["365d"]
            extra_list(c, "volumeMounts").append({"name": config_volume, "mountPath": CONFIG_DIR})

    def _launcher(self, w: Wiring, job: MPIJob) -> None:
        config_volume, kubectl_volume = _volume_names(w.flavor)
        init = Container.model_validate(
            {
                "name": "kubectl-delivery",
                "image": KUBECTL_DELIVERY_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "env": [
                    {"name": "TARGET_DIR", "value": KUBECTL_DIR},
                    {"name": "NAMESPACE", "value": w.namespace},
                ],
                "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}},
                "volumeMounts": [
                    {"name": kubectl_volume, "mountPath": KUBECTL_DIR},
                    {"name": config_volume, "mountPath": CONFIG_DIR},
                ],
            }
        )
        w.spec.init_containers.append(init)
        rsh, hosts = "OMPI_MCA_plm_rsh_agent", "OMPI_MCA_orte_default_hostfile"
        if w.flavor == "kubedl" and job.spec.mpi_distribution == "IntelMPI":
            rsh, hosts = "I_MPI_HYDRA_BOOTSTRAP_EXEC", "I_MPI_HYDRA_HOST_FILE"
        elif w.flavor == "kubedl" and job.spec.mpi_distribution == "MPICH":
            rsh, hosts = "HYDRA_LAUNCHER_EXEC", "HYDRA_HOST_FILE"
        targets = w.containers() if w.flavor == "kubedl" else w.containers()[:1]
        gpu_launcher = launcher_requests_gpus(job)
        for c in targets:
            add_env(c, rsh, f"{CONFIG_DIR}/kubexec.sh")
            add_env(c, hosts, f"{CONFIG_DIR}/hostfile")
            if w.flavor == "kubeflow" and not gpu_launcher:
                # keep a CPU launcher off the GPUs whatever the container runtime defaults to
                add_env(c, "NVIDIA_VISIBLE_DEVICES", "")
                add_env(c, "NVIDIA_DRIVER_CAPABILITIES", "")
            mounts = extra_list(c, "volumeMounts")
            mounts.append({"name": kubectl_volume, "mountPath": KUBECTL_DIR})
            mounts.append({"name": config_volume, "mountPath": CONFIG_DIR})
        volumes = extra_list(w.spec, "volumes")
        volumes.append({"name": kubectl_volume, "emptyDir": {}})
        volumes.append(
            {
                "name": config_volume,
                "configMap": {
                    "name": f"{w.name}-config",
                    "items": [
                        {"key": "kubexec.sh", "path": "kubexec.sh", "mode": 0o555},
                        {"key": "hostfile", "path": "hostfile", "mode": 0o444},
                    ],
                },
            }
        )

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        if LAUNCHER in job.replica_specs:
            return view.all_succeeded(LAUNCHER)
        return view.all_succeeded(WORKER)
