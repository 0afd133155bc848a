"""MarsJob: scheduler, web service and worker endpoints (`MARS_TASK_DETAIL`) and resource hints.

Reference: KubeDL `controllers/mars/mars.go` (marsConfigInJson, genClusterSpec) and
`marsjob_controller.go` SetClusterSpec. On the `mars` container: MARS_CPU_TOTAL, MARS_MEMORY_TOTAL
(requests, else limits), MARS_CPU_USE_PROCESS_STAT=1, MARS_MEM_USE_CGROUP_STAT=1, MARS_BIND_PORT,
MARS_K8S_GROUP_LABELS=job-name, pod IP/name/namespace from the downward API, MARS_TASK_DETAIL
(`{"cluster": {role: [<job>-<rt>-<i>.<ns>.svc:<port>]}, "task": {"type", "index"[, "resources"]}}`)
and, on workers, the memory-tuning variables (spill dirs, plasma store, lock-free IO, cache size).
Scheduler starts first; the job succeeds when the scheduler exits successfully.
"""

from __future__ import annotations

from decimal import Decimal

from gpuyard.apis.core import Container, ResourceRequirements
from gpuyard.apis.jobkinds import MarsJob, TrainingJob
from gpuyard.apis.jobspecs import DAGCondition
from gpuyard.apis.quantity import to_int
from gpuyard.controllers.workloads.base import (
    JobView,
    Wiring,
    WorkloadPlugin,
    dependencies,
    extra_list,
    go_json,
    go_map,
    set_env,
)

__all__ = ["MarsPlugin"]

SCHEDULER = "Scheduler"
WORKER = "Worker"
WEBSERVICE = "WebService"
DEFAULT_PLASMA = "/dev/shm"
MIB = 1024 * 1024


def _request_or_limit(rr: ResourceRequirements, name: str) -> int:
    """resourceRequestOrLimits: the request if given, else the limit, as a whole number (rounded up)."""
    q = rr.requests.get(name)
    if q is None:
        q = rr.limits.get(name)
    return to_int(q) if q is not None else 0


class MarsPlugin(WorkloadPlugin):
    kind = "MarsJob"

    def default_dependencies(self, job: TrainingJob) -> dict[str, list[DAGCondition]]:
        return dependencies([(WORKER, SCHEDULER), (WEBSERVICE, SCHEDULER)], job)

    def fatal_roles(self, job: TrainingJob) -> frozenset[str]:
        # the scheduler keeps the job's state in memory: its failure fails the job (KubeDL status.go)
        return frozenset({SCHEDULER})

    def task_detail(self, w: Wiring) -> str:
        cluster: dict[str, list[str]] = {}
        for role, spec in w.specs().items():
            port = w.port_of(role)
            endpoints = []
            for i in range(spec.count):
                own = w.host_network and role == w.role and i == w.index
                endpoints.append(f"{w.host(role, i)}.{w.namespace}.svc:{w.host_port if own else port}")
            cluster[role.lower()] = endpoints
        task: dict[str, object] = {"type": w.rt, "index": w.index}
        if w.role == WORKER:
            requests = w.job.replica_specs[WORKER].template.spec.requests()
            task["resources"] = {
                "cpu_procs": to_int(requests.get("cpu", Decimal(0))),
                "phy_mem": to_int(requests.get("memory", Decimal(0))) // MIB,
            }
        return go_json({"cluster": go_map(cluster), "task": task})

    def wire(self, w: Wiring) -> None:
        job = w.job
        assert isinstance(job, MarsJob)
        for c in w.containers(w.port_default.container)[:1]:
            self._wire_container(w, job, c)

    def _wire_container(self, w: Wiring, job: MarsJob, c: Container) -> None:
        cpu = _request_or_limit(c.resources, "cpu")
        mem = _request_or_limit(c.resources, "memory")
        bind_port = w.host_port if w.host_network else w.port_default.port
        set_env(c, "MARS_CPU_TOTAL", str(cpu))
        set_env(c, "MARS_MEMORY_TOTAL", str(mem))
        set_env(c, "MARS_CPU_USE_PROCESS_STAT", "1")
        set_env(c, "MARS_MEM_USE_CGROUP_STAT", "1")
        set_env(c, "MARS_BIND_PORT", str(bind_port))
        set_env(c, "MARS_K8S_GROUP_LABELS", "job-name")
        set_env(c, "MARS_CONTAINER_IP", field_path="status.podIP")
        set_env(c, "MARS_K8S_POD_NAME", field_path="metadata.name")
        set_env(c, "MARS_K8S_POD_NAMESPACE", field_path="metadata.namespace")
        set_env(c, "MARS_TASK_DETAIL", self.task_detail(w))
        if w.role != WORKER:
            return
        policy = job.spec.worker_memory_tuning_policy
        spill = policy.spill_dirs if policy is not None else None
        plasma = (
            policy.plasma_store if policy is not None and policy.plasma_store is not None else DEFAULT_PLASMA
        )
        lock_free = (
            policy.lock_free_file_io if policy is not None and policy.lock_free_file_io is not None else True
        )
        if spill:
            self._spill_dirs(w, c, spill)
            set_env(c, "MARS_SPILL_DIRS", ",".join(spill))
        if plasma:
            set_env(c, "MARS_PLASMA_DIRS", plasma)
        set_env(c, "MARS_LOCK_FREE_FILEIO", "1" if lock_free else "0")
        cache = -1
        if policy is not None and policy.worker_cache_size is not None:
            cache = to_int(policy.worker_cache_size)
        elif policy is not None and policy.worker_cache_percentage is not None:
            cache = mem * min(policy.worker_cache_percentage, 100) // 100
        if cache > 0:
            set_env(c, "MARS_CACHE_MEM_SIZE", str(cache))
            self._shared_cache(w, c, cache, plasma or DEFAULT_PLASMA)

    def _spill_dirs(self, w: Wiring, c: Container, paths: list[str]) -> None:
        storage = c.resources.requests.get("ephemeral-storage")
        mounts = extra_list(c, "volumeMounts")
        volumes = extra_list(w.spec, "volumes")
        for i, path in enumerate(paths):
            name = f"mars-empty-dir-{i}"
            if any(m.get("name") == name for m in mounts):
                continue
            empty: dict[str, object] = {}
            if storage:
                empty["sizeLimit"] = str(to_int(storage) // len(paths))
            volumes.append({"name": name, "emptyDir": empty})
            mounts.append({"name": name, "mountPath": path})

    def _shared_cache(self, w: Wiring, c: Container, size: int, path: str) -> None:
        volumes = extra_list(w.spec, "volumes")
        source = {"medium": "Memory", "sizeLimit": str(size)}
        for v in volumes:
            if v.get("name") == "mars-shared-cache":
                v.pop("emptyDir", None)
                v["emptyDir"] = source
                break
        else:
            volumes.append({"name": "mars-shared-cache", "emptyDir": source})
        mounts = extra_list(c, "volumeMounts")
        if not any(m.get("name") == "mars-shared-cache" and m.get("mountPath") == path for m in mounts):
            mounts.append({"name": "mars-shared-cache", "mountPath": path})

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        return (
            view.all_succeeded(SCHEDULER) if SCHEDULER in job.replica_specs else super().succeeded(job, view)
        )
