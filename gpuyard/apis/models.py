"""KubeDL's model kinds (`model.kubedl.io/v1alpha1`): `Model` and `ModelVersion`.

A training job that names `spec.modelVersion` leaves a **ModelVersion** once it succeeds
(`controllers/modelversioning.py`): the job's spec of it, `createdBy` the job, for local storage
the node its chief pod ran on. The ModelVersion controller (`controllers/imagebuilding.py`) then
creates the **Model** it names when it is missing (the ModelVersion's owner), and on Kubernetes the
image-build pod KubeDL creates: a kaniko executor that copies the job's output path (the
ModelVersion's `storage`, mounted at `/workspace/build`) into an image under
:data:`DEFAULT_MODEL_PATH_IN_IMAGE` and pushes it as `<imageRepo>:<tag>`; the ModelVersion's
`status` (`imageBuildPhase`, `image`, `finishTime`, `message`) follows that pod.

Field names, labels, annotations, the image-build pod's name and the ModelVersion's name are
KubeDL's (`apis/model/v1alpha1`, `controllers/model`), so objects written for KubeDL apply as they are.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AliasChoices, Field

from gpuyard.apis.meta import K8sModel, Resource

__all__ = [
    "ANNOTATION_BUILD_POD",
    "API_MODEL",
    "DEFAULT_MODEL_PATH_IN_IMAGE",
    "IMAGE_BUILD_PHASES",
    "KUBEDL_MODEL_PATH",
    "LABEL_MODEL_NAME",
    "MODEL_KINDS",
    "NFS",
    "AWSEfs",
    "ImageBuildPhase",
    "LocalStorage",
    "Model",
    "ModelSpec",
    "ModelStatus",
    "ModelVersion",
    "ModelVersionSpec",
    "ModelVersionStatus",
    "Storage",
    "VersionInfo",
]

API_MODEL = "model.kubedl.io/v1alpha1"
LABEL_MODEL_NAME = "model.kubedl.io/model-name"
"""On a ModelVersion: the Model it belongs to (set when its image build starts)."""
ANNOTATION_BUILD_POD = "model.kubedl.io/img-build-pod-name"
"""On a ModelVersion: the name of its image-build pod."""
KUBEDL_MODEL_PATH = "KUBEDL_MODEL_PATH"
"""The environment variable that tells a job's containers where to write the model."""
DEFAULT_MODEL_PATH_IN_IMAGE = "/kubedl-model"
"""Where the model's files are inside the image the build produces."""

ImageBuildPhase = Literal["ImageBuilding", "ImageBuildFailed", "ImageBuildSucceeded"]
IMAGE_BUILD_PHASES: tuple[str, ...] = ("ImageBuilding", "ImageBuildFailed", "ImageBuildSucceeded")


class LocalStorage(K8sModel):
    """A host path on one node (for a distributed job: the node its chief/master pod ran on)."""

    path: str = Field(default="", description="The host path the model is written to.")
    mount_path: str = Field(default="", description="Where the job's containers see it.")
    node_name: str = Field(default="", description="The node holding the model.")


class NFS(K8sModel):
    """An NFS export (KubeDL: Alibaba Cloud NAS)."""

    server: str = ""
    path: str = Field(default="", description="The path under which the model is stored.")
    mount_path: str = Field(default="", description="Where the job's containers see it.")


class AWSEfs(K8sModel):
    """An AWS Elastic File System volume (`[FileSystemId]:[Subpath]:[AccessPointId]`)."""

    volume_handle: str = ""
    attributes: dict[str, str] = Field(default_factory=dict)


class Storage(K8sModel):
    """Where a model is stored: one of `localStorage`, `nfs`, `AWSEfs`."""

    nfs: NFS | None = None
    local_storage: LocalStorage | None = None
    aws_efs: AWSEfs | None = Field(
        default=None,
        validation_alias=AliasChoices("AWSEfs", "awsEfs", "aws_efs"),
        serialization_alias="AWSEfs",
    )

    def mount_path(self) -> str:
        """Where a job's containers write the model (`KUBEDL_MODEL_PATH`)."""
        if self.local_storage is not None:
            return self.local_storage.mount_path or self.local_storage.path
        if self.nfs is not None:
            return self.nfs.mount_path or self.nfs.path
        return ""


class ModelVersionSpec(K8sModel):
    """One version of a Model: where its files are and where its image goes."""

    model_name: str = Field(default="", description="The Model this version belongs to.")
    created_by: str = Field(default="", description="Who made it: the job's name, or a user's.")
    storage: Storage | None = None
    image_repo: str = Field(
        default="", description='The repository the image is pushed to ("modelhub/mnist").'
    )
    image_tag: str | None = Field(default=None, description="Default: 5 characters of the version's uid.")


class ModelVersionStatus(K8sModel):
    image: str = ""
    image_build_phase: ImageBuildPhase | Literal[""] = ""
    finish_time: datetime | None = None
    message: str = ""


class ModelVersion(Resource):
    """A version of a model; its image is built from the files at `spec.storage`."""

    KIND = "ModelVersion"
    API_VERSION = API_MODEL

    spec: ModelVersionSpec = Field(default_factory=ModelVersionSpec)
    status: ModelVersionStatus = Field(default_factory=ModelVersionStatus)


class ModelSpec(K8sModel):
    storage: Storage | None = None
    image_repo: str = ""


class VersionInfo(K8sModel):
    model_version: str = ""
    image_name: str = ""


class ModelStatus(K8sModel):
    latest_version: VersionInfo | None = None


class Model(Resource):
    """A model: the versions of it (ModelVersions) and the latest one."""

    KIND = "Model"
    API_VERSION = API_MODEL

    spec: ModelSpec = Field(default_factory=ModelSpec)
    status: ModelStatus = Field(default_factory=ModelStatus)


MODEL_KINDS: list[type[Resource]] = [Model, ModelVersion]
