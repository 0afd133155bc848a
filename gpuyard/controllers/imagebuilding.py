"""A ModelVersion's Model and image build, as KubeDL's ModelVersion controller does them.

For each ModelVersion whose image is not built yet (`status.imageBuildPhase` neither
`ImageBuildSucceeded` nor `ImageBuildFailed`), :class:`ModelVersionReconciler`

1. creates the Model it names (`spec.modelName`) when it is missing, its `status.latestVersion`
   this version, and makes the Model the ModelVersion's owner (an ownerReference: deleting the
   Model deletes its versions) and labels it `model.kubedl.io/model-name`;
2. on **Kubernetes** writes KubeDL's Dockerfile (ConfigMap `dockerfile` of the namespace:
   `FROM busybox` + `COPY build/ /kubedl-model`) and creates the image-build pod
   (:func:`build_pod`, `image-build-<model>-<tag>`, owned by the ModelVersion): a kaniko executor
   (`--dockerfile=/workspace/dockerfile --context=dir:///workspace/ --destination=<image>`) with
   the Dockerfile at `/workspace/`, the job's output path (the ModelVersion's `storage`: a host path
   on the node that holds it, an NFS export or an EFS volume) at `/workspace/build`, and the
   registry credentials (Secret `regcred`) at `/kaniko/.docker`. The image is
   `<imageRepo>:<imageTag>` (default tag: the first 5 characters of the ModelVersion's uid); the
   status turns `ImageBuilding` ("Image building started."), the annotation
   `model.kubedl.io/img-build-pod-name` names the pod, and the Model's `latestVersion` names the
   version and its image. The status then follows the pod: `ImageBuildSucceeded` or
   `ImageBuildFailed` (with `finishTime`, and the pod's reason when it failed);
3. on the **fake cluster** builds nothing (it runs no containers): the status' `message` says so
   and why, and a Warning Event `ImageBuildUnavailable` on the job that created it (or on the
   ModelVersion) says so too (`gpuyard describe job` lists it).

A ModelVersion without `spec.modelName` or `spec.storage` has nothing to build: its message says
which field is missing (Warning Event `ImageBuildUnavailable`). All writes are the operator's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import structlog

from gpuyard.apis.core import ConfigMap, Pod
from gpuyard.apis.jobkinds import find_job
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.models import (
    ANNOTATION_BUILD_POD,
    DEFAULT_MODEL_PATH_IN_IMAGE,
    LABEL_MODEL_NAME,
    Model,
    ModelStatus,
    ModelVersion,
    Storage,
    VersionInfo,
)
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.controllers.statuses import patch_status_as_read
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.store import AlreadyExists, Conflict, NotFound
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import Writer, identified

__all__ = [
    "DEFAULT_BUILDER_IMAGE",
    "DOCKERFILE",
    "DOCKERFILE_CONFIGMAP",
    "ModelVersionReconciler",
    "build_pod",
    "build_pod_name",
    "image_tag",
    "storage_volume",
]

log = structlog.get_logger(__name__)

DEFAULT_BUILDER_IMAGE = "gcr.io/kaniko-project/executor:latest"
"""KubeDL's default `--model-image-builder`."""
DOCKERFILE_CONFIGMAP = "dockerfile"
DOCKERFILE = f"FROM busybox\nCOPY build/ {DEFAULT_MODEL_PATH_IN_IMAGE}\n"
REGISTRY_SECRET = "regcred"
NO_BUILD_ON_FAKE = (
    "no image build: the fake cluster runs no containers, so no kaniko pod builds {image}; the model "
    "stays where the job wrote it ({where}). On Kubernetes the image is built and pushed."
)
_DONE = ("ImageBuildSucceeded", "ImageBuildFailed")
_EFS_DRIVER = "efs.csi.aws.com"


def image_tag(mv: ModelVersion) -> str:
    """`spec.imageTag`, else the first 5 characters of the ModelVersion's uid (KubeDL's version id)."""
    return mv.spec.image_tag or mv.metadata.uid[:5]


def build_pod_name(model: str, tag: str) -> str:
    return f"image-build-{model}-{tag}"


def describe_storage(storage: Storage) -> str:
    if storage.local_storage is not None:
        return f"host path {storage.local_storage.path} on node {storage.local_storage.node_name or '-'}"
    if storage.nfs is not None:
        return f"NFS {storage.nfs.server}:{storage.nfs.path}"
    if storage.aws_efs is not None:
        return f"EFS {storage.aws_efs.volume_handle}"
    return "no storage"


def storage_volume(storage: Storage, *, name: str = "build-source") -> tuple[dict[str, Any], dict[str, str]]:
    """The volume `name` over the model's storage, and the node selector it needs (a host path is
    on one node). ValueError when the storage names none of localStorage, nfs, AWSEfs."""
    if storage.local_storage is not None:
        local = storage.local_storage
        selector = {"kubernetes.io/hostname": local.node_name} if local.node_name else {}
        return {"name": name, "hostPath": {"path": local.path}}, selector
    if storage.nfs is not None:
        return {"name": name, "nfs": {"server": storage.nfs.server, "path": storage.nfs.path}}, {}
    if storage.aws_efs is not None:
        csi: dict[str, Any] = {"driver": _EFS_DRIVER, "volumeHandle": storage.aws_efs.volume_handle}
        if storage.aws_efs.attributes:
            csi["volumeAttributes"] = dict(storage.aws_efs.attributes)
        return {"name": name, "csi": csi}, {}
    raise ValueError("spec.storage names none of localStorage, nfs, AWSEfs")


def build_pod(mv: ModelVersion, *, name: str, image: str, builder: str = DEFAULT_BUILDER_IMAGE) -> Pod:
    """KubeDL's image-build pod of `mv` (see the module docstring); scheduled by the cluster's own
    scheduler (it asks for no GPU)."""
    assert mv.spec.storage is not None  # checked by the caller
    source, selector = storage_volume(mv.spec.storage)
    spec: dict[str, Any] = {
        "schedulerName": "default-scheduler",
        "restartPolicy": "Never",
        "containers": [
            {
                "name": name,
                "image": builder,
                "args": [
                    "--dockerfile=/workspace/dockerfile",
                    "--context=dir:///workspace/",
                    f"--destination={image}",
                ],
                "volumeMounts": [
                    {"name": "kaniko-secret", "mountPath": "/kaniko/.docker"},
                    {"name": "build-source", "mountPath": "/workspace/build"},
                    {"name": "dockerfile", "mountPath": "/workspace/"},
                ],
            }
        ],
        "volumes": [
            {
                "name": "kaniko-secret",
                "secret": {
                    "secretName": REGISTRY_SECRET,
                    "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                },
            },
            source,
            {"name": "dockerfile", "configMap": {"name": DOCKERFILE_CONFIGMAP}},
        ],
    }
    if selector:
        spec["nodeSelector"] = selector
    pod = Pod.model_validate({"metadata": {"name": name, "namespace": mv.metadata.namespace}, "spec": spec})
    pod.metadata.labels = {LABEL_MODEL_NAME: mv.spec.model_name}
    pod.metadata.owner_references = [mv.controller_reference()]
    return pod


def _build_pod_key(obj: Pod) -> Iterable[ObjectKey]:
    for ref in obj.metadata.owner_references:
        if ref.kind == ModelVersion.KIND:
            return ((obj.metadata.namespace, ref.name),)
    return ()


class ModelVersionReconciler:
    """See the module docstring."""

    name = "model-version"
    needs_leader = True  # creates Models, ConfigMaps and pods
    concurrency = 2

    def __init__(self, ctx: Context, *, builder: str = DEFAULT_BUILDER_IMAGE) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the model version controller needs a writer (ctx.writer)")
        self.store = ctx.store
        self.clock = ctx.clock
        self.ctx = ctx
        self.builder = builder
        self.writer: Writer = identified(ctx.writer, OPERATOR)
        self.events = EventRecorder(
            component=OPERATOR, store=ctx.store, writer=ctx.writer, now=ctx.clock.utcnow
        )
        self.watches: Sequence[Watch] = (Watch(ModelVersion.KIND), Watch("Pod", _build_pod_key))

    @property
    def builds_images(self) -> bool:
        """Whether the backend runs containers (Kubernetes), so an image can be built."""
        backend = self.ctx.backend
        return backend is not None and backend.name == "kubernetes"

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        mv = self.store.get_of(ModelVersion, *key)
        if mv is None or mv.status.image_build_phase in _DONE:
            return None
        if not mv.spec.model_name or mv.spec.storage is None:
            missing = "spec.modelName" if not mv.spec.model_name else "spec.storage"
            await self._unbuilt(mv, f"no image build: {missing} is not set (nothing to build from)")
            return None
        storage = mv.spec.storage
        try:
            storage_volume(storage)
        except ValueError as exc:
            await self._unbuilt(mv, f"no image build: {exc}")
            return None
        model = await self._model(mv)
        mv = await self._owned_by(mv, model)
        if not self.builds_images:
            image = f"{mv.spec.image_repo}:{image_tag(mv)}" if mv.spec.image_repo else "an image"
            why = NO_BUILD_ON_FAKE.format(image=image, where=describe_storage(storage))
            await self._unbuilt(mv, why)
            return None
        return await self._build(mv, model)

    # --- the Model ----------------------------------------------------------------------------

    async def _model(self, mv: ModelVersion) -> Model:
        ns, name = mv.metadata.namespace, mv.spec.model_name
        model = self.store.get_of(Model, ns, name)
        if model is not None:
            return model
        new = Model(
            metadata=ObjectMeta(name=name, namespace=ns),
            status=ModelStatus(latest_version=VersionInfo(model_version=mv.metadata.name)),
        )
        try:
            model = await self.writer.create(new)
        except AlreadyExists:
            model = self.store.get_of(Model, ns, name)
            if model is None:
                raise Conflict(f"Model {ns}/{name}: taken, not yet seen", key=("Model", ns, name)) from None
            return model
        log.info("model.created", name=f"{ns}/{name}", version=mv.metadata.name)
        return model

    async def _owned_by(self, mv: ModelVersion, model: Model) -> ModelVersion:
        """The ModelVersion owned by its Model and labelled with its name (an update when not yet)."""
        meta = mv.metadata
        owned = any(r.kind == Model.KIND and r.uid == model.metadata.uid for r in meta.owner_references)
        if owned and meta.labels.get(LABEL_MODEL_NAME) == model.metadata.name:
            return mv
        new = mv.clone()
        if not owned:
            ref = model.controller_reference()
            ref.controller = None  # KubeDL's reference: the Model owns, no controller claim
            new.metadata.owner_references.append(ref)
        new.metadata.labels[LABEL_MODEL_NAME] = model.metadata.name
        return await self.writer.update(new)  # a Conflict: the runner retries the key

    async def _latest(self, model: Model, version: VersionInfo) -> None:
        if model.status.latest_version == version:
            return
        try:
            await self.writer.patch_status(
                Model.KIND, model.metadata.namespace, model.metadata.name, {"latest_version": version}
            )
        except NotFound:
            pass

    # --- the build ----------------------------------------------------------------------------

    async def _build(self, mv: ModelVersion, model: Model) -> Requeue | None:
        ns = mv.metadata.namespace
        tag = image_tag(mv)
        pod_name = build_pod_name(model.metadata.name, tag)
        image = f"{mv.spec.image_repo}:{tag}"
        pod = self.store.get_of(Pod, ns, pod_name)
        if pod is None:
            await self._dockerfile(ns)
            try:
                await self.writer.create(build_pod(mv, name=pod_name, image=image, builder=self.builder))
            except AlreadyExists:
                pass  # ours from an earlier pass: its phase comes through the watch
            if mv.metadata.annotations.get(ANNOTATION_BUILD_POD) != pod_name:
                new = mv.clone()
                new.metadata.annotations[ANNOTATION_BUILD_POD] = pod_name
                mv = await self.writer.update(new)
            await self._status(
                mv,
                {"image": image, "image_build_phase": "ImageBuilding", "message": "Image building started."},
            )
            await self._latest(model, VersionInfo(model_version=mv.metadata.name, image_name=image))
            log.info(
                "model_version.build_started", name=f"{ns}/{mv.metadata.name}", pod=pod_name, image=image
            )
            return None
        phase = pod.status.phase
        if phase not in ("Succeeded", "Failed"):
            if mv.status.image_build_phase != "ImageBuilding":
                await self._status(
                    mv,
                    {
                        "image": image,
                        "image_build_phase": "ImageBuilding",
                        "message": "Image building started.",
                    },
                )
            return None
        changes: dict[str, Any] = {"image": image, "finish_time": self.clock.utcnow()}
        if phase == "Succeeded":
            changes |= {"image_build_phase": "ImageBuildSucceeded", "message": "Image build succeeded."}
        else:
            why = pod.status.message or pod.status.reason or ""
            message = "Image build failed." + (f" {why}" if why else "")
            changes |= {"image_build_phase": "ImageBuildFailed", "message": message}
            await self._warn(mv, "ImageBuildFailed", f"ModelVersion {mv.metadata.name}: {message}")
        await self._status(mv, changes)
        log.info(
            "model_version.build_finished",
            name=f"{ns}/{mv.metadata.name}",
            phase=changes["image_build_phase"],
        )
        return None

    async def _dockerfile(self, namespace: str) -> None:
        if self.store.get_of(ConfigMap, namespace, DOCKERFILE_CONFIGMAP) is not None:
            return
        cm = ConfigMap(
            metadata=ObjectMeta(name=DOCKERFILE_CONFIGMAP, namespace=namespace),
            data={"dockerfile": DOCKERFILE},
        )
        try:
            await self.writer.create(cm)
        except AlreadyExists:
            pass  # the namespace's Dockerfile is there (written before, or by KubeDL)

    # --- status -------------------------------------------------------------------------------

    async def _status(self, mv: ModelVersion, changes: dict[str, Any]) -> None:
        current = mv.status.model_dump()
        if all(current.get(k) == v for k, v in changes.items()):
            return
        await patch_status_as_read(self.writer, mv, changes)

    async def _unbuilt(self, mv: ModelVersion, why: str) -> None:
        """No build: the status' message and a Warning Event say why (once)."""
        if mv.status.message == why:
            return
        await self._warn(mv, "ImageBuildUnavailable", f"ModelVersion {mv.metadata.name}: {why}")
        await self._status(mv, {"message": why})

    async def _warn(self, mv: ModelVersion, reason: str, message: str) -> None:
        """A Warning Event on the job that created `mv` (so `describe job` shows it), else on `mv`."""
        job = find_job(self.store, mv.metadata.namespace, mv.spec.created_by) if mv.spec.created_by else None
        if job is not None:
            await self.events.record(
                job,
                reason=reason,
                message=message,
                type="Warning",
                labels={LABEL_JOB_NAME: job.metadata.name},
            )
        else:
            await self.events.record(mv, reason=reason, message=message, type="Warning")
