"""KubeDL's dataset cache (`spec.cacheBackend` of a job) and the Fluid objects it becomes.

A job's `cacheBackend` (KubeDL's `cache.kubedl.io/v1alpha1` CacheBackendSpec) names the data to cache
(`dataset.dataSources`: a `location` in some file system and the `subDirName` it appears under), the
cache engine (`cacheEngine.fluid.alluxioRuntime`: replicas and tiered storage levels) and where the
job's containers see it (`mountPath`). Through Fluid (`data.fluid.io/v1alpha1`) that is a **Dataset**
(`spec.mounts`: one `mountPoint` per data source) and an **AlluxioRuntime** of the same name (Fluid
binds the two by name and makes a PersistentVolumeClaim of that name, which the job's pods mount).
:func:`fluid_objects` builds both, as KubeDL's Fluid cache factory writes them.

gpuyard watches neither kind (the resources are not `watched`: a cluster without Fluid has no such
API); it creates them and keeps what it wrote.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from gpuyard.apis.meta import K8sModel, ObjectMeta, OwnerReference, Resource

__all__ = [
    "API_FLUID",
    "CACHE_KINDS",
    "CACHE_VOLUME",
    "FLUID_CRDS",
    "AlluxioRuntime",
    "CacheBackendSpec",
    "CacheEngine",
    "DataSource",
    "Dataset",
    "DatasetSpec",
    "FluidDataset",
    "FluidEngine",
    "Level",
    "RuntimeSpec",
    "cache_backend_of",
    "cache_name",
    "fluid_objects",
]

API_FLUID = "data.fluid.io/v1alpha1"
FLUID_CRDS = ("datasets.data.fluid.io", "alluxioruntimes.data.fluid.io")
"""The CustomResourceDefinitions of Fluid that `cacheBackend` needs on a Kubernetes cluster."""
CACHE_VOLUME = "kubedl-cache"
"""The name of the cache's volume in the job's pods."""
FIELD = "cacheBackend"


class DataSource(K8sModel):
    location: str = Field(
        default="", description="The data's path in its file system (e.g. oss://bucket/data)."
    )
    sub_dir_name: str = Field(default="", description="Where the source appears under mountPath.")


class Dataset(K8sModel):
    data_sources: list[DataSource] = Field(default_factory=list)


class Level(K8sModel):
    cache_path: str = ""
    quota: str = ""
    medium_type: str = ""


class RuntimeSpec(K8sModel):
    replicas: int = Field(default=0, ge=0)
    tiered_storage: list[Level] = Field(default_factory=list)


class FluidEngine(K8sModel):
    alluxio_runtime: RuntimeSpec | None = None


class CacheEngine(K8sModel):
    fluid: FluidEngine | None = None


class CacheBackendSpec(K8sModel):
    """KubeDL's `spec.cacheBackend` of a job."""

    name: str = Field(
        default="", description="The cache's name (its Dataset, runtime and claim); default: the job's."
    )
    mount_path: str = Field(default="", description="Where the job's containers see the cached data.")
    dataset: Dataset | None = None
    cache_engine: CacheEngine | None = None


class DatasetSpec(K8sModel):
    mounts: list[dict[str, Any]] = Field(default_factory=list)


class FluidDataset(Resource):
    """Fluid's Dataset (stored as `Dataset`)."""

    KIND = "Dataset"
    API_VERSION = API_FLUID

    spec: DatasetSpec = Field(default_factory=DatasetSpec)


class AlluxioRuntime(Resource):
    """Fluid's AlluxioRuntime: the cache engine of the Dataset of the same name."""

    KIND = "AlluxioRuntime"
    API_VERSION = API_FLUID

    spec: dict[str, Any] = Field(default_factory=dict)


CACHE_KINDS: list[type[Resource]] = [FluidDataset, AlluxioRuntime]


def cache_backend_of(spec_extra: dict[str, Any] | None) -> CacheBackendSpec | None:
    """The job's `spec.cacheBackend` (from the spec's fields gpuyard passes through), None when it
    has none; ValueError naming the field when it does not parse or names no mountPath or data."""
    raw = (spec_extra or {}).get(FIELD)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"spec.{FIELD} must be a mapping (mountPath, dataset, cacheEngine)")
    try:
        spec = CacheBackendSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"spec.{FIELD}.{where}: {first['msg']}") from None
    if not spec.mount_path:
        raise ValueError(f"spec.{FIELD}.mountPath: required (where the job's containers see the data)")
    if spec.dataset is None or not any(s.location for s in spec.dataset.data_sources):
        raise ValueError(
            f"spec.{FIELD}.dataset.dataSources: at least one location is required (gpuyard has no "
            "CacheBackend objects to name: give the data here)"
        )
    return spec


def cache_name(spec: CacheBackendSpec, job_name: str) -> str:
    return spec.name or job_name


def fluid_objects(
    spec: CacheBackendSpec, *, name: str, namespace: str, owner: OwnerReference
) -> tuple[FluidDataset, AlluxioRuntime]:
    """The Dataset and AlluxioRuntime of a job's cache, owned by the job (KubeDL's Fluid factory)."""
    assert spec.dataset is not None  # checked by cache_backend_of
    mounts = [
        {"mountPoint": s.location, "name": s.sub_dir_name or f"{name}-{i}"}
        for i, s in enumerate(spec.dataset.data_sources)
        if s.location
    ]
    engine = (
        spec.cache_engine.fluid.alluxio_runtime if spec.cache_engine and spec.cache_engine.fluid else None
    )
    runtime: dict[str, Any] = {}
    if engine is not None:
        if engine.replicas:
            runtime["replicas"] = engine.replicas
        levels = [
            {
                k: v
                for k, v in (("mediumtype", lv.medium_type), ("path", lv.cache_path), ("quota", lv.quota))
                if v
            }
            for lv in engine.tiered_storage
        ]
        if levels:
            runtime["tieredstore"] = {"levels": levels}

    def meta() -> ObjectMeta:
        return ObjectMeta(name=name, namespace=namespace, owner_references=[owner.model_copy()])

    return FluidDataset(metadata=meta(), spec=DatasetSpec(mounts=mounts)), AlluxioRuntime(
        metadata=meta(), spec=runtime
    )
