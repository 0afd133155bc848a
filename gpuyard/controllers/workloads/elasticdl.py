"""ElasticDLJob (KubeDL): one Master, which starts, watches and scales its workers itself.

Reference: KubeDL `controllers/elasticdl/elasticdljob_controller.go` (SetClusterSpec adds nothing,
the Master is the master role, the only replica type) and `status.go` updateGeneralJobStatus (the
job runs while the Master runs, and succeeds when it has). The workers the Master creates are its
own pods, not the job's replicas: gpuyard places and counts the Master only.
"""

from __future__ import annotations

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.controllers.workloads.base import JobView, WorkloadPlugin

__all__ = ["ElasticDLPlugin"]

MASTER = "Master"


class ElasticDLPlugin(WorkloadPlugin):
    kind = "ElasticDLJob"

    def is_master(self, job: TrainingJob, role: str, index: int) -> bool:
        return role == MASTER

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        return view.all_succeeded(MASTER)
