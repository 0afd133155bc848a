"""JAXJob (Kubeflow): the coordinator (worker 0) address for `jax.distributed.initialize()`.

Reference: Kubeflow `pkg/controller.v1/jax/envvar.go` setPodEnv — on every container
PYTHONUNBUFFERED=1, COORDINATOR_PORT (worker port, default 6666), COORDINATOR_ADDRESS
(`<job>-worker-0`), NUM_PROCESSES (all replicas), PROCESS_ID (the pod's index). Worker 0 is the
master role; the job succeeds when every worker has.
"""

from __future__ import annotations

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.controllers.workloads.base import JobView, Wiring, WorkloadPlugin, add_env

__all__ = ["JAXPlugin"]

WORKER = "Worker"


class JAXPlugin(WorkloadPlugin):
    kind = "JAXJob"

    def is_master(self, job: TrainingJob, role: str, index: int) -> bool:
        return index == 0

    def wire(self, w: Wiring) -> None:
        own = w.host_network and w.role == WORKER and w.index == 0
        port = w.host_port if own else w.port_of(WORKER)
        total = w.total_replicas()
        for c in w.containers():
            add_env(c, "PYTHONUNBUFFERED", "1")
            add_env(c, "COORDINATOR_PORT", str(port))
            add_env(c, "COORDINATOR_ADDRESS", w.host(WORKER, 0))
            add_env(c, "NUM_PROCESSES", str(total))
            add_env(c, "PROCESS_ID", str(w.index))

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        return view.all_succeeded(WORKER)
