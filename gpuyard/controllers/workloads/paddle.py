"""PaddleJob (Kubeflow): `PADDLE_*` rendezvous variables for collective and parameter-server mode.

Reference: Kubeflow `pkg/controller.v1/paddlepaddle/envvar.go` setPodEnv — on every container
PYTHONUNBUFFERED=0, PADDLE_JOB_ID, PADDLE_NNODES, then PADDLE_MASTER: the rendezvous pod
(worker 0 in collective mode, master 0 in PS mode) gets `$(POD_IP_DUMMY):<port>` with POD_IP_DUMMY
from the downward API, every other pod `<job>-<role>-0:<port>`; in PS mode masters get
PADDLE_SERVER_NUM=1 and workers PADDLE_TRAINER_NUM=1.
"""

from __future__ import annotations

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import DAGCondition
from gpuyard.controllers.workloads.base import JobView, Wiring, WorkloadPlugin, add_env, dependencies

__all__ = ["PaddlePlugin"]

MASTER = "Master"
WORKER = "Worker"


class PaddlePlugin(WorkloadPlugin):
    kind = "PaddleJob"

    def default_dependencies(self, job: TrainingJob) -> dict[str, list[DAGCondition]]:
        return dependencies([(WORKER, MASTER)], job)

    def is_master(self, job: TrainingJob, role: str, index: int) -> bool:
        return role == MASTER

    def wire(self, w: Wiring) -> None:
        total = w.total_replicas()
        ps_mode = MASTER in w.specs()
        rendezvous_role = MASTER if ps_mode else WORKER
        is_rendezvous = w.index == 0 and (w.role == MASTER if ps_mode else True)
        port = (
            w.host_port
            if (w.host_network and is_rendezvous and w.role == rendezvous_role)
            else w.port_of(rendezvous_role)
        )
        for c in w.containers():
            add_env(c, "PYTHONUNBUFFERED", "0")
            add_env(c, "PADDLE_JOB_ID", w.name)
            add_env(c, "PADDLE_NNODES", str(total))
            if is_rendezvous:
                add_env(c, "POD_IP_DUMMY", field_path="status.podIP")
                add_env(c, "PADDLE_MASTER", f"$(POD_IP_DUMMY):{port}")
            else:
                add_env(c, "PADDLE_MASTER", f"{w.host(rendezvous_role, 0)}:{port}")
            if ps_mode:
                add_env(c, "PADDLE_SERVER_NUM" if w.role == MASTER else "PADDLE_TRAINER_NUM", "1")

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        if MASTER in job.replica_specs:
            return view.all_succeeded(MASTER)
        return view.all_succeeded(WORKER)
