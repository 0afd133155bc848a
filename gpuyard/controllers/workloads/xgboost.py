"""XGBoostJob: the Rabit tracker address for master and workers (and LightGBM's worker list).

* KubeDL (`controllers/xgboost/pod.go` SetPodEnv): on every container MASTER_PORT, MASTER_ADDR
  (`<job>-master-0`), WORLD_SIZE, RANK (the pod's index, as KubeDL passes it), PYTHONUNBUFFERED=0.
* Kubeflow (`pkg/controller.v1/xgboost/pod.go` SetPodEnv): the same five with worker ranks offset
  by the number of masters, then, when there is more than one replica, WORKER_PORT and
  WORKER_ADDRS (`<job>-worker-0,...`, replicas - 1 entries) for LightGBM.

The master starts first (KubeDL setDefaultXGBoostDAGConditions) and decides success.
"""

from __future__ import annotations

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import DAGCondition
from gpuyard.controllers.workloads.base import JobView, Wiring, WorkloadPlugin, add_env, dependencies

__all__ = ["XGBoostPlugin"]

MASTER = "Master"
WORKER = "Worker"


class XGBoostPlugin(WorkloadPlugin):
    kind = "XGBoostJob"

    def default_dependencies(self, job: TrainingJob) -> dict[str, list[DAGCondition]]:
        return dependencies([(WORKER, MASTER)], job)

    def is_master(self, job: TrainingJob, role: str, index: int) -> bool:
        return role == MASTER

    def wire(self, w: Wiring) -> None:
        if MASTER not in w.specs():
            return  # the tracker's address comes from the master
        rank = w.index
        if w.flavor == "kubeflow" and w.role == WORKER:
            rank += w.replicas(MASTER)
        master_port = w.host_port if (w.host_network and w.role == MASTER) else w.port_of(MASTER)
        total = w.total_replicas()
        worker_addrs = [w.host(WORKER, i) for i in range(total - 1)]
        for c in w.containers():
            add_env(c, "MASTER_PORT", str(master_port))
            add_env(c, "MASTER_ADDR", w.host(MASTER, 0))
            add_env(c, "WORLD_SIZE", str(total))
            add_env(c, "RANK", str(rank))
            add_env(c, "PYTHONUNBUFFERED", "0")
            if w.flavor == "kubeflow" and total > 1:
                add_env(
                    c, "WORKER_PORT", str(w.port_of(WORKER) if WORKER in w.specs() else w.port_default.port)
                )
                add_env(c, "WORKER_ADDRS", ",".join(worker_addrs))

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        if MASTER in job.replica_specs:
            return view.all_succeeded(MASTER)
        return view.all_succeeded(WORKER)
