"""Where each kind lives on a Kubernetes API server: group, version, plural, scope, subresources.

One table, read by everything that speaks the Kubernetes REST protocol: the Kubernetes backend
(its informers and its writer build URLs from it), the CRD generator (`configs/deploy/crds/`), the
deploy manifests' ClusterRole, and the test API server. A job kind has one entry per API group
that defines it (KubeDL's `training.kubedl.io` and Kubeflow's `kubeflow.org`); which of those
groups gpuyard reconciles is a setting, so it can run beside KubeDL or the training-operator.

Kinds of the core group (`Pod`, `Node`, ...) are built into every API server; the others are
custom resources gpuyard ships CRDs for (`crd=True`), except `ElasticQuota`, whose CRD is shipped
for clusters that lack Koordinator's or the scheduler-plugins' own. The PodGroup kinds of
Volcano, scheduler-plugins and Koordinator (delegate mode, `apis/gangs.py`) are stored as
`GangPodGroup` and called `PodGroup` on the wire (`wire_kind`); their CRDs come with those
schedulers, and gpuyard watches and writes only the one of the configured `gang_scheduler`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuyard.apis.gangs import GANG_API_VERSIONS, GANG_KIND
from gpuyard.apis.jobkinds import KIND_INFO

__all__ = [
    "API_APPROVAL",
    "API_RESOURCES",
    "ApiResource",
    "is_protected_group",
    "resource_for",
    "resources_of_kind",
]


API_APPROVAL = "api-approved.kubernetes.io"
"""The annotation an API server requires on a CRD of a protected group (`*.k8s.io`,
`*.kubernetes.io`): a link to the API review that approved it."""
# scheduler-plugins' own value on its ElasticQuota and PodGroup CRDs
SCHEDULER_PLUGINS_APPROVAL = "https://github.com/kubernetes-sigs/scheduler-plugins/pull/52"


def is_protected_group(group: str) -> bool:
    """A group Kubernetes reserves for APIs it reviewed (KEP-1111)."""
    return any(group == d or group.endswith("." + d) for d in ("k8s.io", "kubernetes.io"))


@dataclass(frozen=True, slots=True)
class ApiResource:
    """One REST resource: `/{prefix}/{group_version}[/namespaces/{ns}]/{plural}[/{name}[/{sub}]]`."""

    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    status_subresource: bool = True
    crd: bool = False  # gpuyard ships a CustomResourceDefinition for it
    categories: tuple[str, ...] = ()
    rest_kind: str = ""  # the kind on the API server when the store's differs (GangPodGroup)
    gang_scheduler: str = ""  # served by this gang scheduler's CRDs (delegate mode only)
    watched: bool = True  # False: the Kubernetes backend has no informer of it (only what gpuyard writes)

    @property
    def wire_kind(self) -> str:
        """The kind the API server calls objects of this resource."""
        return self.rest_kind or self.kind

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.wire_kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"

    def crd_metadata(self) -> dict[str, Any]:
        """`metadata` of a CustomResourceDefinition serving this resource (name, and the API-review
        annotation a protected group needs)."""
        meta: dict[str, Any] = {"name": self.crd_name}
        if is_protected_group(self.group):
            meta["annotations"] = {API_APPROVAL: SCHEDULER_PLUGINS_APPROVAL}
        return meta

    def crd_names(self) -> dict[str, Any]:
        """The `spec.names` of a CustomResourceDefinition serving this resource."""
        names: dict[str, Any] = {
            "kind": self.wire_kind,
            "listKind": self.wire_kind + "List",
            "plural": self.plural,
            "singular": self.singular,
        }
        if self.short_names:
            names["shortNames"] = list(self.short_names)
        if self.categories:
            names["categories"] = list(self.categories)
        return names

    def path(self, *, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        """The REST path of the collection, or of one object (and one of its subresources)."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [root]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
            if sub:
                parts.append(sub)
        return "/".join(parts)


def _job_resources() -> list[ApiResource]:
    out = []
    for kind, info in KIND_INFO.items():
        for api_version in info.flavors:
            group, version = api_version.split("/")
            out.append(
                ApiResource(
                    kind=kind,
                    group=group,
                    version=version,
                    plural=kind.lower() + "s",
                    crd=True,
                    categories=("gpuyard", "trainingjobs"),  # not `all`: as the peers' CRDs
                )
            )
    return out


def _gang_resources() -> list[ApiResource]:
    out = []
    for gang, api_version in GANG_API_VERSIONS.items():
        group, version = api_version.split("/")
        out.append(
            ApiResource(
                kind=GANG_KIND,
                group=group,
                version=version,
                plural="podgroups",
                rest_kind="PodGroup",
                gang_scheduler=gang,
            )
        )
    return out


API_RESOURCES: tuple[ApiResource, ...] = (
    ApiResource("Pod", "", "v1", "pods", short_names=("po",)),
    ApiResource("Node", "", "v1", "nodes", namespaced=False, short_names=("no",)),
    ApiResource("Service", "", "v1", "services", short_names=("svc",)),
    ApiResource("Event", "", "v1", "events", short_names=("ev",), status_subresource=False),
    ApiResource(
        "ConfigMap", "", "v1", "configmaps", short_names=("cm",), status_subresource=False, watched=False
    ),
    ApiResource("ResourceQuota", "", "v1", "resourcequotas", short_names=("quota",)),
    ApiResource("Lease", "coordination.k8s.io", "v1", "leases", status_subresource=False),
    ApiResource("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", short_names=("pdb",)),
    ApiResource(
        "PriorityClass",
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        namespaced=False,
        short_names=("pc",),
        status_subresource=False,
    ),
    # what the operator creates beside a job's pods (apis/addons.py): Tensorboard, Mars web UI, HPA
    ApiResource("Deployment", "apps", "v1", "deployments", short_names=("deploy",)),
    ApiResource("Ingress", "networking.k8s.io", "v1", "ingresses", short_names=("ing",)),
    ApiResource(
        "HorizontalPodAutoscaler", "autoscaling", "v2", "horizontalpodautoscalers", short_names=("hpa",)
    ),
    *_job_resources(),
    ApiResource(
        "PodGroup",
        "scheduling.gpuyard.io",
        "v1alpha1",
        "podgroups",
        short_names=("pg",),
        crd=True,
        categories=("gpuyard",),
    ),
    ApiResource(
        "Reservation",
        "scheduling.gpuyard.io",
        "v1alpha1",
        "reservations",
        short_names=("rsv",),
        crd=True,
        categories=("gpuyard",),
    ),
    ApiResource(
        "ResourceClass",
        "gpuyard.io",
        "v1alpha1",
        "resourceclasses",
        namespaced=False,
        short_names=("rc",),
        crd=True,
        categories=("gpuyard",),
    ),
    ApiResource(
        "NodeTopology",
        "gpuyard.io",
        "v1alpha1",
        "nodetopologies",
        namespaced=False,
        short_names=("ntp",),
        crd=True,
        categories=("gpuyard",),
    ),
    ApiResource(
        "Queue", "gpuyard.io", "v1alpha1", "queues", namespaced=False, crd=True, categories=("gpuyard",)
    ),
    ApiResource(
        "ElasticQuota",
        "scheduling.sigs.k8s.io",
        "v1alpha1",
        "elasticquotas",
        short_names=("eq", "eqs"),
        crd=True,
    ),
    # KubeDL's Cron (apis/crons.py)
    ApiResource("Cron", "apps.kubedl.io", "v1alpha1", "crons", crd=True, categories=("gpuyard",)),
    *_gang_resources(),
    # KubeDL's model kinds (apis/models.py)
    ApiResource("Model", "model.kubedl.io", "v1alpha1", "models", short_names=("mo",), crd=True),
    ApiResource(
        "ModelVersion", "model.kubedl.io", "v1alpha1", "modelversions", short_names=("mv",), crd=True
    ),
    # Fluid's, for a job's cacheBackend (apis/caches.py): created, never watched (Fluid may be absent)
    ApiResource("Dataset", "data.fluid.io", "v1alpha1", "datasets", watched=False),
    ApiResource("AlluxioRuntime", "data.fluid.io", "v1alpha1", "alluxioruntimes", watched=False),
)


def resources_of_kind(kind: str) -> list[ApiResource]:
    """Every resource serving `kind` (a job kind has one per API group that defines it)."""
    return [r for r in API_RESOURCES if r.kind == kind]


def resource_for(kind: str, api_version: str | None = None) -> ApiResource:
    """The resource of `kind` (in `api_version`'s group when given); KeyError when none serves it."""
    for r in API_RESOURCES:
        if r.kind == kind and (api_version is None or r.api_version == api_version):
            return r
    raise KeyError(f"no API resource serves kind {kind!r}" + (f" in {api_version}" if api_version else ""))
