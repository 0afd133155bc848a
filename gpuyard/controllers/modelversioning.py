"""A succeeded job's model: the ModelVersion KubeDL leaves for a job with `spec.modelVersion`.

KubeDL's job controller, once a job succeeds, creates a ModelVersion from the job's
`spec.modelVersion` (`apis/models.py`): named `mv-<job>-<first 5 characters of the job's uid>`,
in the job's namespace, `spec.createdBy` the job's name, and for local storage `nodeName` the node
the job's chief pod ran on (where it wrote the model); the job's `status.modelVersionName` names it
(the `Model-Version` column of `kubectl get tfjobs`). :class:`ModelVersionCreator` does the same
for every job kind, on both backends, and records a `ModelVersionCreated` Event on the job. A job
whose `modelVersion` does not parse gets a Warning Event naming the field (no ModelVersion).

Before that, the job's pods are wired for it as KubeDL wires them (:func:`add_model_output`, called
when the operator renders a pod): `KUBEDL_MODEL_PATH` and the storage mounted at its `mountPath`.

What happens to the ModelVersion next (its Model, its image build) is `imagebuilding.py`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from pydantic import ValidationError

from gpuyard.apis.core import Pod, PodTemplateSpec
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob, find_job
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.models import KUBEDL_MODEL_PATH, ModelVersion, ModelVersionSpec
from gpuyard.apis.scheduling import LABEL_JOB_NAME, LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from gpuyard.controllers.imagebuilding import storage_volume
from gpuyard.controllers.statuses import patch_status_as_read
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.store import AlreadyExists, Store
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import Writer, identified

__all__ = ["ModelVersionCreator", "add_model_output", "model_version_name", "model_version_of", "output_node"]

log = structlog.get_logger(__name__)

FIELD = "modelVersion"
MODEL_VOLUME = "kubedl-model"
# The roles whose pod writes the model, in KubeDL's order of preference (GetNodeForModelOutput).
_OUTPUT_ROLES = ("chief", "master", "launcher", "scheduler", "worker")


def model_version_name(job: TrainingJob) -> str:
    """KubeDL's name of a job's ModelVersion: `mv-<job>-<5 characters of its uid>`."""
    return f"mv-{job.metadata.name}-{job.metadata.uid[:5]}"


def model_version_of(job: TrainingJob) -> ModelVersionSpec | None:
    """The job's `spec.modelVersion`, or None when it has none; ValueError (naming the field)
    when it does not parse."""
    raw = (job.spec.model_extra or {}).get(FIELD)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"spec.{FIELD} must be a mapping (modelName, imageRepo, storage, ...)")
    try:
        return ModelVersionSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"spec.{FIELD}.{where}: {first['msg']}") from None


def add_model_output(template: PodTemplateSpec, job: TrainingJob) -> None:
    """KubeDL's wiring of a job's pods for its `modelVersion`: every container gets
    `KUBEDL_MODEL_PATH` (the storage's `mountPath`, unless the template sets it) and the storage
    mounted there (volume `kubedl-model`: the host path, NFS export or EFS volume), so what the job
    writes there is what the image build reads. Nothing when the job has no `modelVersion`, it does
    not parse, or its storage has no path to mount."""
    try:
        spec = model_version_of(job)
    except ValueError:
        return  # reported once the job succeeds (InvalidModelVersion)
    if spec is None or spec.storage is None or not (path := spec.storage.mount_path()):
        return
    try:
        volume, _ = storage_volume(spec.storage, name=MODEL_VOLUME)
    except ValueError:
        return
    pod_extra = template.spec.__pydantic_extra__
    if pod_extra is None:  # pragma: no cover - K8sModel keeps extra fields
        return
    volumes = pod_extra.setdefault("volumes", [])
    if not any(isinstance(v, dict) and v.get("name") == MODEL_VOLUME for v in volumes):
        volumes.append(volume)
    for container in template.spec.containers:
        if KUBEDL_MODEL_PATH not in container.env_dict():
            container.set_env(KUBEDL_MODEL_PATH, path)
        extra = container.__pydantic_extra__
        if extra is None:  # pragma: no cover
            continue
        mounts = extra.setdefault("volumeMounts", [])
        if not any(isinstance(m, dict) and m.get("mountPath") == path for m in mounts):
            mounts.append({"name": MODEL_VOLUME, "mountPath": path})


def output_node(store: Store, job: TrainingJob) -> str:
    """The node the job's chief (else master, ..., else worker 0) pod ran on; '' when none is known."""
    pods = store.list_of(Pod, namespace=job.metadata.namespace, selector={LABEL_JOB_NAME: job.metadata.name})

    def rank(pod: Pod) -> tuple[int, int]:
        labels = pod.metadata.labels
        role = labels.get(LABEL_REPLICA_TYPE, "").lower()
        order = _OUTPUT_ROLES.index(role) if role in _OUTPUT_ROLES else len(_OUTPUT_ROLES)
        index = labels.get(LABEL_REPLICA_INDEX, "0")
        return order, int(index) if index.isdigit() else 0

    for pod in sorted((p for p in pods if p.spec.node_name), key=rank):
        return pod.spec.node_name or ""
    return ""


class ModelVersionCreator:
    """See the module docstring."""

    name = "model-version-creator"
    needs_leader = True  # creates ModelVersions, writes job status
    concurrency = 2

    def __init__(self, ctx: Context) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the model version creator needs a writer (ctx.writer)")
        self.store = ctx.store
        self.writer: Writer = identified(ctx.writer, OPERATOR)
        self.events = EventRecorder(
            component=OPERATOR, store=ctx.store, writer=ctx.writer, now=ctx.clock.utcnow
        )
        self.watches: Sequence[Watch] = tuple(Watch(kind) for kind in KIND_INFO)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        job = find_job(self.store, *key)
        if job is None or not job.status.is_true("Succeeded"):
            return None
        labels = {LABEL_JOB_NAME: job.metadata.name}
        try:
            spec = model_version_of(job)
        except ValueError as exc:
            await self.events.record(
                job,
                reason="InvalidModelVersion",
                message=f"no ModelVersion: {exc}",
                type="Warning",
                labels=labels,
            )
            return None
        if spec is None:
            return None
        name = model_version_name(job)
        namespace = job.metadata.namespace
        if self.store.get_of(ModelVersion, namespace, name) is None:
            spec = spec.model_copy(deep=True)
            spec.created_by = job.metadata.name
            if spec.storage is not None and spec.storage.local_storage is not None:
                node = output_node(self.store, job)
                if node:
                    spec.storage.local_storage.node_name = node
            mv = ModelVersion(metadata=ObjectMeta(name=name, namespace=namespace), spec=spec)
            try:
                await self.writer.create(mv)
            except AlreadyExists:
                pass  # made meanwhile (another pass, or before a restart)
            else:
                log.info(
                    "model_version.created", job=f"{job.kind} {namespace}/{job.metadata.name}", name=name
                )
                await self.events.record(
                    job,
                    reason="ModelVersionCreated",
                    message=f"created ModelVersion {name} (model {spec.model_name or '-'})",
                    labels=labels,
                )
        if job.status.model_version_name != name:
            await patch_status_as_read(self.writer, job, {"model_version_name": name})
        return None
