"""A job's Tensorboard, from KubeDL's `kubedl.io/tensorboard-config` annotation.

As KubeDL's `pkg/tensorboard/tensorboard.go` does, for a job whose annotation holds a config
(`apis/tensorboards.py`), :class:`TensorboardReconciler` makes, all named `<job>-tensorboard-0`,
labelled `job-name`, `group-name`, `replica-type: tensorboard`, `replica-index: 0` and owned by the
job (a controller reference, so the API server's garbage collector takes them with it):

* a Deployment of one pod (KubeDL creates a bare pod; a Deployment restarts it) from the pod
  template of the job's master role (Chief, Master, Launcher, Scheduler, else Worker, else the
  first role): its default container renamed `tensorboard`, running
  `python -m tensorboard.main --logdir <logDir> --path_prefix /<pathPrefix>/<ns>/<job>` on port
  6006, in the config's `image` when given, without resource requests and with
  `NVIDIA_VISIBLE_DEVICES` empty (it needs no GPU); `restartPolicy: Always`, and no
  `schedulerName` (the cluster's default scheduler places it: it is not part of the gang);
* a headless Service on port 6006 (`tensorboard`) selecting that pod;
* with `ingressSpec.host`, an Ingress routing `http://<host>/<pathPrefix>/<ns>/<job>/` to the
  Service, with the config's `ingressSpec.annotations`.

Each object carries the annotation's text; a changed config is written to them (the Deployment
rolls its pod). Once the job has finished, everything goes `ttlSecondsAfterJobFinished` after its
completion (or after the config's `updateTimestamp`, if later); without the annotation, or when
the job is gone, it goes at once. On the fake cluster the objects are stored like any other (no
pod runs): `describe job` shows the address, and a Warning Event `TensorboardNotServed` says that
nothing answers there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import structlog

from gpuyard.apis.addons import Deployment, Ingress, covers
from gpuyard.apis.core import Service, ServicePort, ServiceSpec
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob, find_job
from gpuyard.apis.meta import ObjectMeta, Resource
from gpuyard.apis.scheduling import LABEL_GROUP_NAME, LABEL_JOB_NAME, LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from gpuyard.apis.tensorboards import (
    ANNOTATION_TENSORBOARD,
    TENSORBOARD_PORT,
    TensorboardConfig,
    parse_tensorboard,
    tensorboard_address,
    tensorboard_name,
    tensorboard_path,
)
from gpuyard.controllers.addonwriting import AddonWriter, warn_once
from gpuyard.controllers.materializing import group_name, owner_reference
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import identified

__all__ = ["REPLICA_TYPE", "TensorboardReconciler", "build_tensorboard", "job_owner_uid_of"]

log = structlog.get_logger(__name__)

REPLICA_TYPE = "tensorboard"
NOT_SERVED = "TensorboardNotServed"  # the Warning Event on the fake cluster
LABEL_REPLICA_NAME = "replica-name"
MASTER_ROLES = ("Chief", "Master", "Launcher", "Scheduler", "Worker")


def _tensorboard_key(obj: Resource) -> Iterable[ObjectKey]:
    labels = obj.metadata.labels
    if labels.get(LABEL_REPLICA_TYPE) == REPLICA_TYPE and (job := labels.get(LABEL_JOB_NAME)):
        return ((obj.metadata.namespace, job),)
    return ()


def master_role(job: TrainingJob) -> str:
    """The role whose pod template the Tensorboard's pod starts from."""
    roles = job.roles()
    return next((r for r in MASTER_ROLES if r in roles), roles[0])


def _labels(job: TrainingJob) -> dict[str, str]:
    return {
        LABEL_GROUP_NAME: group_name(job),
        LABEL_JOB_NAME: job.metadata.name,
        LABEL_REPLICA_TYPE: REPLICA_TYPE,
        LABEL_REPLICA_INDEX: "0",
    }


def _pod_template(job: TrainingJob, config: TensorboardConfig, raw: str) -> dict[str, Any]:
    name = tensorboard_name(job.metadata.name)
    role = master_role(job)
    template = job.replica_specs[role].template.to_dict()
    meta = template.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **_selector(name)}
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_TENSORBOARD: raw}
    spec = template.setdefault("spec", {})
    spec["restartPolicy"] = "Always"
    for field in ("schedulerName", "nodeName"):
        spec.pop(field, None)
    containers = spec.get("containers") or []
    default = job.info.flavor(job.api_version).port.container
    main = next((c for c in containers if c.get("name") == default), containers[0] if containers else None)
    if main is not None:
        path = tensorboard_path(config, namespace=job.metadata.namespace, job_name=job.metadata.name)
        main["name"] = "tensorboard"
        env = [e for e in main.get("env") or [] if e.get("name") != "NVIDIA_VISIBLE_DEVICES"]
        main["env"] = [*env, {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}]
        if config.image:
            main["image"] = config.image
        main["command"] = [
            "/bin/sh",
            "-c",
            f"python -m tensorboard.main --logdir {config.log_dir} --path_prefix {path} --host=`hostname`",
        ]
        main.pop("args", None)
        main["resources"] = {}
        main["ports"] = [{"containerPort": TENSORBOARD_PORT}]
    return template


def _selector(name: str) -> dict[str, str]:
    return {LABEL_REPLICA_TYPE: REPLICA_TYPE, LABEL_REPLICA_NAME: name}


def build_tensorboard(job: TrainingJob, config: TensorboardConfig, raw: str) -> list[Resource]:
    """The Deployment, Service and (with an ingress host) Ingress of the job's Tensorboard."""
    ns, job_name = job.metadata.namespace, job.metadata.name
    name = tensorboard_name(job_name)

    def meta(annotations: dict[str, str] | None = None) -> ObjectMeta:
        return ObjectMeta(
            name=name,
            namespace=ns,
            labels=_labels(job),
            annotations={**(annotations or {}), ANNOTATION_TENSORBOARD: raw},
            owner_references=[owner_reference(job)],
        )

    out: list[Resource] = [
        Deployment(
            metadata=meta(),
            spec={
                "replicas": 1,
                "selector": {"matchLabels": _selector(name)},
                "template": _pod_template(job, config, raw),
            },
        ),
        Service(
            metadata=meta(),
            spec=ServiceSpec(
                selector=_selector(name),
                ports=[ServicePort(name="tensorboard", port=TENSORBOARD_PORT)],
                cluster_ip="None",
            ),
        ),
    ]
    if config.ingress_spec is not None and config.host:
        path = tensorboard_path(config, namespace=ns, job_name=job_name) + "/"
        backend = {"service": {"name": name, "port": {"number": TENSORBOARD_PORT}}}
        out.append(
            Ingress(
                metadata=meta(dict(config.ingress_spec.annotations)),
                spec={
                    "rules": [
                        {
                            "host": config.host,
                            "http": {
                                "paths": [
                                    {"path": path, "pathType": "ImplementationSpecific", "backend": backend}
                                ]
                            },
                        }
                    ]
                },
            )
        )
    return out


def _same(current: Resource, desired: Resource) -> bool:
    if current.metadata.annotations.get(ANNOTATION_TENSORBOARD) != desired.metadata.annotations.get(
        ANNOTATION_TENSORBOARD
    ) or not covers(current.metadata.labels, desired.metadata.labels):
        return False
    if isinstance(current, Service) and isinstance(desired, Service):
        ports = [(p.name, p.port) for p in current.spec.ports]
        return current.spec.selector == desired.spec.selector and ports == [
            (p.name, p.port) for p in desired.spec.ports
        ]
    return covers(getattr(current, "spec", None), getattr(desired, "spec", None))


class TensorboardReconciler:
    """See the module docstring."""

    name = "tensorboard"
    needs_leader = True  # creates and deletes Deployments, Services and Ingresses
    concurrency = 4

    def __init__(self, ctx: Context) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the Tensorboard reconciler needs a writer (ctx.writer)")
        self.store = ctx.store
        self.clock = ctx.clock
        self.out = AddonWriter(store=ctx.store, writer=identified(ctx.writer, OPERATOR))
        self.backend = ctx.backend
        self.events = EventRecorder(
            component=OPERATOR, store=ctx.store, writer=ctx.writer, now=ctx.clock.utcnow
        )
        self.watches: Sequence[Watch] = (
            *(Watch(kind) for kind in KIND_INFO),
            *(Watch(kind, _tensorboard_key) for kind in ("Deployment", "Service", "Ingress")),
        )

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        namespace, job_name = key
        job = find_job(self.store, namespace, job_name)
        raw = job.metadata.annotations.get(ANNOTATION_TENSORBOARD) if job is not None else None
        config: TensorboardConfig | None = None
        if job is not None and raw is not None:
            try:
                config = parse_tensorboard(raw)
            except ValueError as exc:  # refused at submit; a Kubernetes object may still hold one
                log.warning("tensorboard.invalid_config", job=f"{namespace}/{job_name}", error=str(exc))
        if job is None or config is None or raw is None:
            await self._remove(namespace, job_name, keep=())
            return None
        later: Requeue | None = None
        if job.status.finished:
            done = job.status.completion_time or self.clock.utcnow()
            if config.update_timestamp is not None and config.update_timestamp > done:
                done = config.update_timestamp
            due = done + timedelta(seconds=config.ttl_seconds_after_job_finished)
            left = (due - self.clock.utcnow()).total_seconds()
            if left <= 0:
                await self._remove(namespace, job_name, keep=())
                return None
            later = Requeue(after=left)
        uid = job.metadata.uid
        desired = build_tensorboard(job, config, raw)
        for obj in desired:
            retry = await self.out.ensure(obj, same=_same, owned=lambda o: job_owner_uid_of(o) == uid)
            if retry is not None:
                return retry
        await self._remove(namespace, job_name, keep=tuple(o.kind for o in desired))
        if self.backend is not None and self.backend.name == "fake":
            address = tensorboard_address(config, namespace=namespace, job_name=job_name)
            await warn_once(
                self.events,
                self.store,
                job,
                reason=NOT_SERVED,
                message=f"the fake cluster stores the Tensorboard's {', '.join(o.kind for o in desired)} "
                f"{tensorboard_name(job_name)} but runs no Tensorboard: nothing answers at {address}",
            )
        return later

    async def _remove(self, namespace: str, job_name: str, *, keep: tuple[str, ...]) -> None:
        name = tensorboard_name(job_name)
        for kind in ("Ingress", "Service", "Deployment"):
            if kind not in keep:
                await self.out.remove(kind, namespace, name, owned=_is_tensorboard)


def job_owner_uid_of(obj: Resource) -> str | None:
    """The uid of the job owning `obj` (None: no job's)."""
    return next((r.uid for r in obj.metadata.owner_references if r.kind in KIND_INFO), None)


def _is_tensorboard(obj: Resource) -> bool:
    return obj.metadata.labels.get(LABEL_REPLICA_TYPE) == REPLICA_TYPE and job_owner_uid_of(obj) is not None
