"""A job's dataset cache (`spec.cacheBackend`) through Fluid, as KubeDL's cache backend does it.

For a job with `spec.cacheBackend` that has not finished, :class:`CacheReconciler`

* on **Kubernetes** creates Fluid's Dataset (one mount per data source) and AlluxioRuntime of the
  cache's name (`cacheBackend.name`, else the job's), both owned by the job (`apis/caches.py`). When
  the cluster has no Fluid (the create answers 404: `datasets.data.fluid.io` or
  `alluxioruntimes.data.fluid.io` is not installed) the job fails, reason `CacheBackendUnavailable`,
  the message naming both CRDs;
* on the **fake cluster** creates nothing (no Fluid runs there) and records a Warning Event
  `CacheBackendSimulated` on the job: the pods get the volume, nothing fills it.

Either way the job's `status.cacheBackendName` names the cache, and every pod of the job mounts the
PersistentVolumeClaim Fluid makes of that name at `mountPath` (:func:`add_cache_volume`, called
when the operator renders a pod; on Kubernetes the kubelet starts a pod once its claim is bound). A
`cacheBackend` that does not parse fails the job, the message naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from gpuyard.apis.caches import (
    CACHE_VOLUME,
    FLUID_CRDS,
    cache_backend_of,
    cache_name,
    fluid_objects,
)
from gpuyard.apis.core import Event, PodTemplateSpec
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob, find_job
from gpuyard.apis.jobspecs import JobCondition
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.controllers.statuses import patch_status_as_read
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.store import AlreadyExists, NotFound
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import Writer, identified

__all__ = ["CACHE_UNAVAILABLE", "CacheReconciler", "add_cache_volume"]

log = structlog.get_logger(__name__)

CACHE_UNAVAILABLE = "CacheBackendUnavailable"
INVALID_CACHE = "InvalidCacheBackend"


def add_cache_volume(template: PodTemplateSpec, job: TrainingJob) -> None:
    """KubeDL's wiring of a job's pods for its `cacheBackend`: the claim of the cache's name as
    volume `kubedl-cache`, mounted at `mountPath` in every container. Nothing without a (valid) one."""
    try:
        spec = cache_backend_of(job.spec.model_extra)
    except ValueError:
        return  # the job fails (CacheReconciler)
    if spec is None:
        return
    pod_extra = template.spec.__pydantic_extra__
    if pod_extra is None:  # pragma: no cover - K8sModel keeps extra fields
        return
    volumes = pod_extra.setdefault("volumes", [])
    if not any(isinstance(v, dict) and v.get("name") == CACHE_VOLUME for v in volumes):
        claim = cache_name(spec, job.metadata.name)
        volumes.append({"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    for container in template.spec.containers:
        extra = container.__pydantic_extra__
        if extra is None:  # pragma: no cover
            continue
        mounts = extra.setdefault("volumeMounts", [])
        if not any(isinstance(m, dict) and m.get("mountPath") == spec.mount_path for m in mounts):
            mounts.append({"name": CACHE_VOLUME, "mountPath": spec.mount_path})


class CacheReconciler:
    """See the module docstring."""

    name = "dataset-cache"
    needs_leader = True  # creates Fluid objects, writes job status
    concurrency = 2

    def __init__(self, ctx: Context) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the dataset cache controller needs a writer (ctx.writer)")
        self.ctx = ctx
        self.store = ctx.store
        self.clock = ctx.clock
        self.writer: Writer = identified(ctx.writer, OPERATOR)
        self.events = EventRecorder(
            component=OPERATOR, store=ctx.store, writer=ctx.writer, now=ctx.clock.utcnow
        )
        self.watches: Sequence[Watch] = tuple(Watch(kind) for kind in KIND_INFO)

    @property
    def on_kubernetes(self) -> bool:
        backend = self.ctx.backend
        return backend is not None and backend.name == "kubernetes"

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        job = find_job(self.store, *key)
        if job is None or job.status.finished or job.metadata.deletion_timestamp is not None:
            return None
        try:
            spec = cache_backend_of(job.spec.model_extra)
        except ValueError as exc:
            await self._fail(job, INVALID_CACHE, str(exc))
            return None
        if spec is None:
            return None
        name = cache_name(spec, job.metadata.name)
        ns = job.metadata.namespace
        if self.on_kubernetes:
            owner = job.controller_reference()
            for obj in fluid_objects(spec, name=name, namespace=ns, owner=owner):
                if self.store.get(obj.kind, ns, name) is not None:
                    continue
                try:
                    await self.writer.create(obj)
                except AlreadyExists:
                    continue  # the cache of this name is there (an earlier pass, or another job's)
                except NotFound:
                    crds = " and ".join(FLUID_CRDS)
                    await self._fail(
                        job,
                        CACHE_UNAVAILABLE,
                        f"spec.cacheBackend needs Fluid: {crds} are not installed on this cluster "
                        "(install Fluid, github.com/fluid-cloudnative/fluid)",
                    )
                    return None
                log.info(
                    "cache.created", job=f"{job.kind} {ns}/{job.metadata.name}", kind=obj.kind, name=name
                )
        elif not any(
            e.reason == "CacheBackendSimulated"
            for e in self.store.list_of(Event, namespace=ns, selector={LABEL_JOB_NAME: job.metadata.name})
            if e.involved_object.get("uid") == job.metadata.uid
        ):
            sources = ", ".join(s.location for s in spec.dataset.data_sources) if spec.dataset else ""
            await self.events.record(
                job,
                reason="CacheBackendSimulated",
                message=f"cacheBackend {name}: no Fluid on the fake cluster; the pods mount claim {name} at "
                f"{spec.mount_path} but nothing caches {sources}",
                type="Warning",
                labels={LABEL_JOB_NAME: job.metadata.name},
            )
        if job.status.cache_backend_name != name:
            await patch_status_as_read(self.writer, job, {"cache_backend_name": name})
        return None

    async def _fail(self, job: TrainingJob, reason: str, message: str) -> None:
        now = self.clock.utcnow()
        failed = JobCondition(
            type="Failed", reason=reason, message=message, last_update_time=now, last_transition_time=now
        )
        conditions = [c for c in job.status.conditions if c.type != "Failed"] + [failed]
        await patch_status_as_read(
            self.writer, job, {"conditions": conditions, "phase": "Failed", "completion_time": now}
        )
        await self.events.record(
            job, reason=reason, message=message, type="Warning", labels={LABEL_JOB_NAME: job.metadata.name}
        )
        log.info(
            "cache.failed_job", job=f"{job.kind} {job.metadata.namespace}/{job.metadata.name}", why=message
        )
