"""PyTorchJob: `MASTER_ADDR`/`MASTER_PORT`/`WORLD_SIZE`/`RANK` and torchrun's `PET_*` variables.

Two references, one per API group, reproduced exactly:

* KubeDL (`controllers/pytorch/pytorchjob_controller.go` SetClusterSpec): on every container
  MASTER_PORT, MASTER_ADDR (`localhost` on the master itself, feature gate
  PyTorchLocalMasterAddr on by default), RANK (workers: index + 1), PYTHONUNBUFFERED=0, WORLD_SIZE
  (all replicas except AIMaster). In host-network mode the master's own MASTER_PORT is its host port.
* Kubeflow v1.7+ (`pkg/controller.v1/pytorch/envvar.go`, `master.go`, `elastic.go`):
  PYTHONUNBUFFERED=1; with a Master: MASTER_PORT, PET_MASTER_PORT, MASTER_ADDR, PET_MASTER_ADDR,
  WORLD_SIZE (replicas x nprocPerNode), RANK, PET_NPROC_PER_NODE, PET_NODE_RANK; then either the
  elastic set (PET_RDZV_ENDPOINT, PET_RDZV_BACKEND, PET_NNODES=min:max, PET_MAX_RESTARTS, ...) or
  PET_NNODES = replicas.
"""

from __future__ import annotations

from gpuyard.apis.core import Container
from gpuyard.apis.jobkinds import PyTorchJob, TrainingJob
from gpuyard.apis.jobspecs import DAGCondition, ElasticPolicy
from gpuyard.controllers.workloads.base import JobView, Wiring, WorkloadPlugin, add_env, dependencies

__all__ = ["PyTorchPlugin"]

MASTER = "Master"
WORKER = "Worker"
AIMASTER = "AIMaster"


class PyTorchPlugin(WorkloadPlugin):
    kind = "PyTorchJob"

    def default_dependencies(self, job: TrainingJob) -> dict[str, list[DAGCondition]]:
        # AIMaster -> Master -> Worker (AIMaster -> Worker when there is no Master)
        pairs = [(WORKER, MASTER), (MASTER, AIMASTER)]
        if MASTER not in job.replica_specs:
            pairs.append((WORKER, AIMASTER))
        return dependencies(pairs, job)

    def is_master(self, job: TrainingJob, role: str, index: int) -> bool:
        return role == MASTER

    def wire(self, w: Wiring) -> None:
        if w.flavor == "kubeflow":
            self._wire_kubeflow(w)
        else:
            self._wire_kubedl(w)

    def _master_port(self, w: Wiring) -> int | None:
        port = w.port_of(MASTER)
        if w.host_network and w.role == MASTER:
            port = w.host_port  # the master binds its host port; others go through the Service
        return port

    def _wire_kubedl(self, w: Wiring) -> None:
        if MASTER not in w.specs():
            return  # KubeDL requires the master's port to wire anything
        master_port = self._master_port(w)
        master = w.role == MASTER
        master_addr = "localhost" if master else w.host(MASTER, 0)
        rank = w.index if master else w.index + 1
        world = w.total_replicas(exclude=(AIMASTER,))
        for c in w.containers():
            add_env(c, "MASTER_PORT", str(master_port))
            add_env(c, "MASTER_ADDR", master_addr)
            add_env(c, "RANK", str(rank))
            add_env(c, "PYTHONUNBUFFERED", "0")
            add_env(c, "WORLD_SIZE", str(world))

    def _wire_kubeflow(self, w: Wiring) -> None:
        job = w.job
        assert isinstance(job, PyTorchJob)
        spec = job.spec
        total = w.total_replicas()
        nproc = spec.nproc_per_node
        nproc_int = int(nproc) if nproc is not None and nproc.isdigit() else 1
        for c in w.containers():
            add_env(c, "PYTHONUNBUFFERED", "1")
            if MASTER in w.specs():
                port = str(self._master_port(w))
                addr = w.host(MASTER, 0)
                add_env(c, "MASTER_PORT", port)
                add_env(c, "PET_MASTER_PORT", port)
                add_env(c, "MASTER_ADDR", addr)
                add_env(c, "PET_MASTER_ADDR", addr)
                rank = w.index + 1 if w.role == WORKER else w.index
                add_env(c, "WORLD_SIZE", str(total * nproc_int))
                add_env(c, "RANK", str(rank))
                if nproc is not None:
                    add_env(c, "PET_NPROC_PER_NODE", nproc)
                add_env(c, "PET_NODE_RANK", str(rank))
            ep = spec.elastic_policy
            if ep is not None:
                self._elastic(w, c, ep)
            else:
                add_env(c, "PET_NNODES", str(total))

    def _elastic(self, w: Wiring, c: Container, ep: ElasticPolicy) -> None:
        host = ep.rdzv_host if ep.rdzv_host is not None else f"{w.name}-worker-0"
        port = ep.rdzv_port if ep.rdzv_port is not None else w.port_of(WORKER)
        add_env(c, "PET_RDZV_ENDPOINT", f"{host}:{port}")
        add_env(c, "PET_RDZV_BACKEND", ep.rdzv_backend or "c10d")
        if ep.min_replicas is None and ep.max_replicas is None:
            add_env(c, "PET_NNODES", str(w.replicas(WORKER)))
        else:
            add_env(c, "PET_NNODES", f"{ep.min_replicas}:{ep.max_replicas}")
        if ep.max_restarts is not None:
            add_env(c, "PET_MAX_RESTARTS", str(ep.max_restarts))
        if ep.n_proc_per_node is not None:
            add_env(c, "PET_NPROC_PER_NODE", str(ep.n_proc_per_node))
        if ep.rdzv_id is not None:
            add_env(c, "PET_RDZV_ID", ep.rdzv_id)
        if ep.rdzv_conf:
            add_env(c, "PET_RDZV_CONF", ",".join(f"{kv.key}={kv.value}" for kv in ep.rdzv_conf))
        if ep.standalone:
            add_env(c, "PET_STANDALONE", "")

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        if MASTER in job.replica_specs:
            return view.all_succeeded(MASTER)
        return view.all_succeeded(WORKER) or view.index_completed(WORKER, 0)
