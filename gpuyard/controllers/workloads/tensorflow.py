"""TFJob: `TF_CONFIG` for every task, as KubeDL and Kubeflow generate it (plus GraphLearn).

Reference: KubeDL `controllers/tensorflow/tensorflow.go` (genTFConfigJSONStr / genClusterSpec) and
Kubeflow `pkg/controller.v1/tensorflow/tensorflow.go`. The cluster spec lists every role except
Evaluator as `<job>-<rt>-<i>.<ns>.svc[.<CUSTOM_CLUSTER_DOMAIN>]:<port>`; in host-network mode the
pod's own entry carries its host port (others reach it through the Service). TF_CONFIG is set only
on the `tensorflow` container and only when the job is distributed (more than one replica).

gpuyard extension: a `GraphLearn` role (graph-learning servers) appears in the cluster spec as
`graphlearn`, its endpoints reach every pod as `GRAPHLEARN_SERVERS`, and it starts before workers.
"""

from __future__ import annotations

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import DAGCondition
from gpuyard.controllers.workloads.base import (
    JobView,
    Wiring,
    WorkloadPlugin,
    add_env,
    dependencies,
    go_json,
    go_map,
)

__all__ = ["TensorFlowPlugin"]

EVALUATOR = "Evaluator"
GRAPHLEARN = "GraphLearn"
CHIEF_OR_MASTER = ("Chief", "Master")


class TensorFlowPlugin(WorkloadPlugin):
    kind = "TFJob"

    def default_dependencies(self, job: TrainingJob) -> dict[str, list[DAGCondition]]:
        # KubeDL setDefaultTFDAGCondition: PS -> Worker/Chief/Master; gpuyard: GraphLearn -> Worker
        return dependencies(
            [("Worker", "PS"), ("Chief", "PS"), ("Master", "PS"), ("Worker", GRAPHLEARN)], job
        )

    def is_master(self, job: TrainingJob, role: str, index: int) -> bool:
        if role in CHIEF_OR_MASTER:
            return True
        if job.flavor == "kubeflow" and not any(r in job.replica_specs for r in CHIEF_OR_MASTER):
            return role == "Worker" and index == 0
        return False

    def cluster_spec(self, w: Wiring) -> dict[str, list[str]]:
        cluster: dict[str, list[str]] = {}
        for role, spec in w.specs().items():
            if role == EVALUATOR:
                continue  # evaluator is not part of the training cluster
            rt = role.lower()
            port = w.port_of(role)
            endpoints = []
            for i in range(spec.count):
                host = f"{w.host(role, i)}.{w.namespace}.svc"
                if w.cluster_domain:
                    host += "." + w.cluster_domain
                own = w.host_network and role == w.role and i == w.index
                endpoints.append(f"{host}:{w.host_port if own else port}")
            cluster[rt] = endpoints
        return cluster

    def distributed(self, w: Wiring) -> bool:
        return w.total_replicas() != 1

    def wire(self, w: Wiring) -> None:
        if not self.distributed(w):
            return
        cluster = self.cluster_spec(w)
        task = {"type": w.rt, "index": w.index}
        if w.flavor == "kubeflow" and (w.job.spec.model_extra or {}).get("enableDynamicWorker"):
            sparse: dict[str, object] = {"worker": {}, "ps": []}
            if w.rt == "ps":
                sparse["ps"] = [cluster["ps"][w.index]]
            elif w.rt == "worker":
                sparse["ps"] = cluster.get("ps", [])
                sparse["worker"] = {str(w.index): cluster["worker"][w.index]}
            config = go_json({"sparseCluster": sparse, "task": task})
        else:
            config = go_json({"cluster": go_map(cluster), "task": task, "environment": "cloud"})
        for container in w.containers(w.port_default.container)[:1]:
            add_env(container, "TF_CONFIG", config)
            if "graphlearn" in cluster:
                add_env(container, "GRAPHLEARN_SERVERS", ",".join(cluster["graphlearn"]))

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        specs = job.replica_specs
        for role in CHIEF_OR_MASTER:
            if role in specs:
                return view.all_succeeded(role)
        if "Worker" in specs:
            if job.spec.success_policy == "AllWorkers":
                return view.all_succeeded("Worker")
            return view.all_succeeded("Worker") or view.index_completed("Worker", 0)
        workers = [r for r in specs if r not in ("PS", GRAPHLEARN, EVALUATOR)]
        return bool(workers) and all(view.all_succeeded(r) for r in workers)
