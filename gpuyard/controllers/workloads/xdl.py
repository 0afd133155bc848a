"""XDLJob (KubeDL): the XDL cluster spec, task name and index, and the workers' success threshold.

Reference: KubeDL `controllers/xdl/xdljob_controller.go` SetClusterSpec and `xdl_config.go`
genXDLConfigJSON, `status.go` updateGeneralJobStatus and calculateMinFinish:

* on every container: `ZK_ADDR` (when the template sets it) gets `/<job uid>` appended, then
  TASK_NAME (the replica type, lower case) and TASK_INDEX (the pod's index);
* on the default container (`xdl`) also XDL_CONFIG, `{"cluster": {"<rt>": ["<job>-<rt>-<i>:<port>",
  ...]}, "task": {"type": "<rt>", "index": <i>}}` for every replica type (Go's JSON: map keys sorted);
* the job succeeds once enough workers (Worker and ExtendRole replicas) have succeeded:
  `ceil(workers * minFinishWorkRate / 100)` when the rate is set (the default, 90, applies when
  neither is set), else `minFinishWorkNum` (at least one, where KubeDL would finish a job at once);
  KubeDL has no master role, and starts the roles in the order PS, Scheduler, Worker, ExtendRole
  without waiting (no default `dependsOn`).
"""

from __future__ import annotations

import math

from gpuyard.apis.jobkinds import TrainingJob, XDLJob
from gpuyard.controllers.workloads.base import JobView, Wiring, WorkloadPlugin, add_env, go_json, go_map

__all__ = ["XDLPlugin", "min_finished_workers"]

WORKERS = ("Worker", "ExtendRole")
ZK_ADDR = "ZK_ADDR"


def min_finished_workers(job: TrainingJob, workers: int) -> int:
    """How many workers must succeed for the job to (KubeDL's calculateMinFinish, at least 1)."""
    rate = job.spec.min_finish_work_rate if isinstance(job, XDLJob) else None
    num = job.spec.min_finish_work_num if isinstance(job, XDLJob) else None
    if rate is not None:
        need = math.ceil(workers * rate / 100)
    elif num is not None:
        need = num
    else:
        need = workers
    return max(need, 1)


class XDLPlugin(WorkloadPlugin):
    kind = "XDLJob"

    def wire(self, w: Wiring) -> None:
        cluster: dict[str, object] = {}
        for role, spec in w.specs().items():
            hosts = []
            for i in range(spec.count):
                port = w.own_port() if (role == w.role and i == w.index) else w.port_of(role)
                hosts.append(f"{w.host(role, i)}:{port}")
            cluster[role.lower()] = hosts
        config = go_json({"cluster": go_map(cluster), "task": {"type": w.rt, "index": w.index}})
        uid = w.job.metadata.uid
        for c in w.containers():
            for env in c.env:
                if env.name == ZK_ADDR and env.value is not None:
                    env.value += uid if env.value.endswith("/") else "/" + uid
            add_env(c, "TASK_NAME", w.rt)
            add_env(c, "TASK_INDEX", str(w.index))
            if c.name == w.port_default.container:
                add_env(c, "XDL_CONFIG", config)

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        workers = sum(view.replicas.get(r, 0) for r in WORKERS)
        if workers == 0:
            return super().succeeded(job, view)
        done = sum(view.succeeded(r) for r in WORKERS)
        return done >= min_finished_workers(job, workers)
