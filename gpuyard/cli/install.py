"""`gpuyard install`: the CRDs and deploy manifests that run gpuyard on a Kubernetes cluster.

`gpuyard install --print` writes every object as one multi-document YAML stream for
`kubectl apply --server-side -f -`: the CRDs (:mod:`gpuyard.apis.crds`), then the Namespace,
ServiceAccount, least-privilege ClusterRole (:data:`RULES`: exactly the verbs gpuyard uses on each
resource) and its binding, the Role for the leader-election Lease in gpuyard's namespace, the
read-only Role for the nodes' heartbeat Leases in `kube-node-lease` (with their bindings), the
Deployment (two replicas: one leader, one standby), the Service of the HTTP API and metrics, and
with `--service-monitor` a ServiceMonitor for the Prometheus operator (left out by default: a
cluster without that operator's CRD refuses the whole apply). The files under `configs/deploy/` are the same
objects with the default options (`--write-crds DIR`, `--write-manifests DIR`; `make deploy`);
a test regenerates them and validates each against the Kubernetes schemas. `--gang-scheduler`
prints them for delegate mode: the Deployment sets `scheduler.mode: delegate` and the ClusterRole
also grants that gang scheduler's PodGroups (:data:`DELEGATE_RULES`).
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import click

from gpuyard.apis.crds import crds, dump_yaml, write_crds
from gpuyard.apis.gangs import GANG_SCHEDULERS
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.resources import API_RESOURCES
from gpuyard.cli.common import fail
from gpuyard.state.config import NODE_LEASE_NAMESPACE

__all__ = [
    "API_RULES",
    "DEFAULT_IMAGE",
    "DEFAULT_NAMESPACE",
    "DELEGATE_RULES",
    "RULES",
    "install",
    "manifests",
    "write_manifests",
]

DEFAULT_NAMESPACE = "gpuyard-system"
DEFAULT_IMAGE_REPO = "ghcr.io/gpuyard/gpuyard"
NAME = "gpuyard"
PORT = 8080
TOKENS_SECRET = "gpuyard-api-tokens"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": NAME}

WATCH = ("list", "watch")  # what an informer does: LIST, then WATCH from the list's version
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

RULES: dict[str, tuple[str, ...]] = {
    # kind or kind/subresource -> verbs, exactly the calls gpuyard makes (tests/kubernetes/test_rbac.py
    # checks both ways). The informers LIST and WATCH what they cache. A create refused because the
    # name is taken (the cache lags the server) GETs the object holding it (kubecluster/writing.py),
    # so the kinds gpuyard creates through its writer have `get`. Status is a JSON merge PATCH of the
    # status subresource, never a PUT; an object's own PUT is `update`.
    "Node": WATCH,
    "Pod": (*WATCH, "create", "delete"),  # the operator creates and stops pods
    "Pod/binding": ("create",),  # the scheduler binds pods to the node it chose
    "Pod/status": ("patch",),  # the backend fails the pods of a lost node (NodeLost)
    "Pod/log": ("get",),  # the pod log route reads it (gpuyard logs, the dashboard's job page)
    "Service": ("get", *WATCH, "create", "update", "delete"),  # update: written back when it differs
    # the Events about jobs (label job-name) are watched; update bumps a repeat's count, delete goes
    # with the job (or the sweep of a deleted job's Events)
    "Event": ("get", *WATCH, "create", "update", "delete"),
    "ResourceQuota": WATCH,  # its status is the cluster's quota controller's (CLUSTER_OWNED_STATUS)
    "PodDisruptionBudget": WATCH,
    "PriorityClass": WATCH,  # a job's priorityClassName
    # every job kind; delete: ttlSecondsAfterFinished; get: a job that lost a name clash to the other
    # job group's, fetched again once the winner is gone (kubecluster/invalid.py); create: a Cron's runs
    "TrainingJob": ("get", *WATCH, "create", "delete"),
    "TrainingJob/status": ("patch",),
    # KubeDL's Crons (controllers/cronrunning.py): a Cron's runs are created and deleted on schedule;
    # a job with spec.cronPolicy gets a Cron of its name; finalizers: the runs' owner reference
    # (blockOwnerDeletion) to their Cron
    "Cron": ("get", *WATCH, "create", "update"),
    "Cron/status": ("patch",),
    "Cron/finalizers": ("update",),
    # Never called, but checked: with OwnerReferencesPermissionEnforcement (on in most clusters) an
    # ownerReference with blockOwnerDeletion (pods, services and PodGroups name their job so; DRA
    # claims their pod) may only be set by who may update the owner's finalizers.
    "TrainingJob/finalizers": ("update",),
    "Pod/finalizers": ("update",),
    "PodGroup": ("get", *WATCH, "create", "update", "delete"),  # update: release, the job's labels
    "PodGroup/status": ("patch",),
    "Reservation": ("get", *WATCH, "create", "delete"),
    "ResourceClass": ("get", *WATCH, "create"),  # one default class per GPU model
    "NodeTopology": WATCH,
    "Queue": WATCH,
    "Queue/status": ("patch",),
    "ElasticQuota": WATCH,
    "ElasticQuota/status": ("patch",),
    # DRA mode (backend.kubernetes.dra): a placed pod's claim, created and allocated before binding;
    # delete: a claim an earlier pod of the same name left
    "ResourceClaim": ("create", "delete"),
    "ResourceClaim/status": ("patch",),
    "ResourceSlice": ("list",),  # matched to the NodeTopologies
    # beside a job's pods (apis/addons.py): its Tensorboard, its Mars web UI's Ingresses, the
    # HorizontalPodAutoscaler of elasticPolicy.metrics; update: written back when it differs
    "Deployment": ("get", *WATCH, "create", "update", "delete"),
    "Ingress": ("get", *WATCH, "create", "update", "delete"),
    "HorizontalPodAutoscaler": ("get", *WATCH, "create", "update", "delete"),
    # KubeDL's models (controllers/modelversioning.py, imagebuilding.py): a succeeded job's
    # ModelVersion, the Model it names, the kaniko pod and the namespace's Dockerfile of its image
    # build (ConfigMaps are not watched: a create refused as taken reads what holds the name)
    "Model": ("get", *WATCH, "create"),
    "Model/status": ("patch",),
    "ModelVersion": ("get", *WATCH, "create", "update"),
    "ModelVersion/status": ("patch",),
    # the ModelVersion's ownerReference to its Model, the build pod's to its ModelVersion (as above)
    "Model/finalizers": ("update",),
    "ModelVersion/finalizers": ("update",),
    "ConfigMap": ("get", "create"),
    # Fluid's (controllers/datasetcaching.py): a job's cacheBackend, not watched (Fluid may be absent)
    "Dataset": ("get", "create"),
    "AlluxioRuntime": ("get", "create"),
}
"""What gpuyard's ServiceAccount may do, cluster-wide. `TrainingJob` stands for every job kind of
every group in :data:`gpuyard.apis.resources.API_RESOURCES`."""

DELEGATE_RULES: dict[str, tuple[str, ...]] = {
    # delegate mode (`--gang-scheduler`): the gang scheduler's PodGroup of each job, in its group only
    # get: a create refused because the name is taken reads what holds it
    "GangPodGroup": ("get", *WATCH, "create", "update", "delete"),
}

API_RULES: dict[str, tuple[str, ...]] = {
    # The HTTP API's write routes (served by the leader), made with gpuyard's ServiceAccount and gated by
    # gpuyard's own API tokens, roles and tenant namespaces. `get`: the writer reads what holds a name a
    # create found taken (the cache lags the server); the route then answers 409.
    # submit; PATCH (labels, suspend, priority, queue) PUTs the job
    "TrainingJob": ("get", "create", "update"),
    "ElasticQuota": ("get", "create", "update", "delete"),  # PUT/DELETE /quotas/{name}, apply
    "Queue": ("get", "create", "update", "delete"),  # PUT/DELETE /queues/{name}, apply
    "ResourceQuota": ("get", "create", "update", "delete"),  # PUT/DELETE .../resourcequotas/{name}, apply
    "ResourceClass": ("get", "create", "update", "delete"),  # PUT/DELETE /resourceclasses/{name}, apply
    # PUT/DELETE /nodetopologies/{name}, apply: `gpuyard agent --server` (the shipped DaemonSet) writes here
    "NodeTopology": ("get", "create", "update", "delete"),
    # apply only; delete: an apply the cluster refused in part deletes what it created (no route does)
    "PriorityClass": ("get", "create", "update", "delete"),
    "PodDisruptionBudget": ("get", "create", "update", "delete"),  # its status stays the cluster's
    "Cron": ("get", "create", "update", "delete"),  # apply
}
"""What the HTTP API's write routes need on top of :data:`RULES` (the job's delete, `ResourceClass`'s
get and create are there already); :func:`cluster_rules` grants the union."""

LEASE_VERBS = ("get", "create", "update")  # leader election, in gpuyard's own namespace
# built-in kinds gpuyard reads that apis/resources.py may not list
_BUILT_IN = {
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    "PriorityClass": ("scheduling.k8s.io", "priorityclasses"),
    "ResourceClaim": ("resource.k8s.io", "resourceclaims"),
    "ResourceSlice": ("resource.k8s.io", "resourceslices"),
}


def default_image() -> str:
    try:
        tag = version("gpuyard")
    except PackageNotFoundError:
        tag = "latest"
    return f"{DEFAULT_IMAGE_REPO}:{tag}"


DEFAULT_IMAGE = default_image()


def _targets(kind: str, *, gang_scheduler: str | None = None) -> list[tuple[str, str]]:
    """(group, plural) of every resource `kind` in RULES stands for (of a gang scheduler's
    resources, only `gang_scheduler`'s)."""
    if kind == "TrainingJob":
        return [(r.group, r.plural) for r in API_RESOURCES if r.kind in KIND_INFO]
    found = [
        (r.group, r.plural)
        for r in API_RESOURCES
        if r.kind == kind and (not r.gang_scheduler or r.gang_scheduler == gang_scheduler)
    ]
    return found or ([_BUILT_IN[kind]] if kind in _BUILT_IN else [])


_VERB_ORDER = {v: i for i, v in enumerate(("get", "list", "watch", "create", "update", "patch", "delete"))}


def cluster_rules(gang_scheduler: str | None = None, *, read_only_api: bool = False) -> list[dict[str, Any]]:
    """The ClusterRole's rules: one per (group, verbs), resources sorted, so the diff stays small:
    :data:`RULES` and (unless `read_only_api`) :data:`API_RULES`, and with `gang_scheduler`
    (delegate mode) also :data:`DELEGATE_RULES` for that scheduler's group."""
    grouped: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    entries: dict[str, tuple[str, ...]] = {}
    for rules in (RULES, {} if read_only_api else API_RULES, DELEGATE_RULES if gang_scheduler else {}):
        for entry, verbs in rules.items():  # the union, each verb once, in kubectl's order
            union = {*entries.get(entry, ()), *verbs}
            entries[entry] = tuple(sorted(union, key=lambda v: (_VERB_ORDER.get(v, len(_VERB_ORDER)), v)))
    for entry, verbs in entries.items():
        kind, _, sub = entry.partition("/")
        targets = _targets(kind, gang_scheduler=gang_scheduler)
        if not targets:
            raise KeyError(f"RULES: {kind!r} is served by no resource in apis/resources.py")
        for group, plural in targets:
            grouped.setdefault((group, verbs), set()).add(f"{plural}/{sub}" if sub else plural)
    return [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": list(verbs)}
        for (group, verbs), resources in sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1]))
    ]


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = dict(LABELS)
    return meta


def _deployment(
    *, namespace: str, image: str, insecure: bool, gang_scheduler: str | None, read_only_api: bool
) -> dict[str, Any]:
    args = ["serve", "--backend", "kubernetes", "--host", "0.0.0.0", "--port", str(PORT)]
    args += ["--data-dir", "/var/lib/gpuyard"]
    env: list[dict[str, Any]] = [
        {"name": "GPUYARD__LOGGING__FORMAT", "value": "json"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    if read_only_api:  # the API takes no writes: its RBAC (API_RULES) is left out
        env.append({"name": "GPUYARD__SERVER__READ_ONLY", "value": "true"})
    if gang_scheduler:  # delegate mode: the gang scheduler places the pods (docs/kubernetes.md)
        env += [
            {"name": "GPUYARD__SCHEDULER__MODE", "value": "delegate"},
            {"name": "GPUYARD__SCHEDULER__GANG_SCHEDULER", "value": gang_scheduler},
        ]
    if insecure:
        args.append("--insecure")
    else:  # API tokens (server.tokens) as JSON, from a Secret the operator of the cluster creates
        env.append(
            {
                "name": "GPUYARD__SERVER__TOKENS",
                "valueFrom": {"secretKeyRef": {"name": TOKENS_SECRET, "key": "tokens.json"}},
            }
        )
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    container = {
        "name": NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": env,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "livenessProbe": {**probe, "initialDelaySeconds": 5},
        "readinessProbe": {**probe, "httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "resources": {
            "requests": {"cpu": "500m", "memory": "512Mi"},
            "limits": {"cpu": "2", "memory": "2Gi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": "/var/lib/gpuyard"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    selector = {"app.kubernetes.io/name": NAME}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(NAME, namespace),
        "spec": {
            "replicas": 2,  # one leader reconciles and binds; the standby serves reads and takes over
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
            "template": {
                "metadata": {"labels": dict(LABELS)},
                "spec": {
                    "serviceAccountName": NAME,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "labelSelector": {"matchLabels": selector},
                                        "topologyKey": "kubernetes.io/hostname",
                                    },
                                }
                            ]
                        }
                    },
                },
            },
        },
    }


def manifests(
    *,
    namespace: str = DEFAULT_NAMESPACE,
    image: str = DEFAULT_IMAGE,
    insecure: bool = False,
    gang_scheduler: str | None = None,
    read_only_api: bool = False,
    node_lease_namespace: str = NODE_LEASE_NAMESPACE,
    service_monitor: bool = False,
) -> list[dict[str, Any]]:
    """Every object but the CRDs, in the order `kubectl apply` needs them; with `gang_scheduler`,
    for delegate mode (the Deployment's settings and the ClusterRole's rule for its PodGroups);
    with `read_only_api`, an API that takes no writes (`server.read_only`) and no API_RULES.
    The nodes' heartbeat Leases are read through a Role in `node_lease_namespace`, not the
    ClusterRole (least privilege: no other Lease of the cluster is readable)."""
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]
    selector = {"app.kubernetes.io/name": NAME}
    heartbeats = f"{NAME}-node-leases"
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(namespace)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME, namespace)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(NAME),
            "rules": cluster_rules(gang_scheduler, read_only_api=read_only_api),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(NAME),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(f"{NAME}-leader-election", namespace),
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": list(LEASE_VERBS)}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(f"{NAME}-leader-election", namespace),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": f"{NAME}-leader-election",
            },
            "subjects": subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(heartbeats, node_lease_namespace),
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": list(WATCH)}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(heartbeats, node_lease_namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": heartbeats},
            "subjects": subject,
        },
        _deployment(
            namespace=namespace,
            image=image,
            insecure=insecure,
            gang_scheduler=gang_scheduler,
            read_only_api=read_only_api,
        ),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(NAME, namespace),
            "spec": {
                "type": "ClusterIP",
                "selector": selector,
                "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        },
    ]
    if service_monitor:
        objects.append(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "ServiceMonitor",
                "metadata": _meta(NAME, namespace),
                "spec": {
                    "selector": {"matchLabels": selector},
                    "namespaceSelector": {"matchNames": [namespace]},
                    "endpoints": [{"port": "http", "path": "/metrics", "interval": "30s"}],
                },
            }
        )
    return objects


MANIFEST_FILES = {
    "Namespace": "namespace.yaml",
    "ServiceAccount": "rbac.yaml",
    "ClusterRole": "rbac.yaml",
    "ClusterRoleBinding": "rbac.yaml",
    "Role": "rbac.yaml",
    "RoleBinding": "rbac.yaml",
    "Deployment": "deployment.yaml",
    "Service": "service.yaml",
    "ServiceMonitor": "servicemonitor.yaml",
}


def stream(objects: list[dict[str, Any]]) -> str:
    """One multi-document YAML stream."""
    return "---\n".join(dump_yaml(o) for o in objects)


def write_manifests(directory: Path) -> list[Path]:
    """Write the default manifests (not the CRDs) into `directory`, grouped per file."""
    files: dict[str, list[dict[str, Any]]] = {}
    for obj in manifests(image=f"{DEFAULT_IMAGE_REPO}:latest", service_monitor=True):
        files.setdefault(MANIFEST_FILES[obj["kind"]], []).append(obj)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, objects in files.items():
        path = directory / name
        path.write_text(stream(objects))
        paths.append(path)
    return paths


@click.command()
@click.option("--print", "print_", is_flag=True, help="Write every object to stdout as one YAML stream.")
@click.option("--crds-only", is_flag=True, help="Only the CustomResourceDefinitions.")
@click.option("--namespace", default=DEFAULT_NAMESPACE, show_default=True, help="gpuyard's namespace.")
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="gpuyard's container image.")
@click.option(
    "--insecure", is_flag=True, help=f"Serve the API without tokens (else from Secret {TOKENS_SECRET})."
)
@click.option(
    "--gang-scheduler",
    type=click.Choice(GANG_SCHEDULERS),
    help="Delegate mode: hand pods to this gang scheduler (sets scheduler.mode and grants its PodGroups).",
)
@click.option(
    "--read-only-api",
    is_flag=True,
    help="The HTTP API takes no writes (server.read_only); the ClusterRole then grants only what the "
    "controllers use (no API_RULES).",
)
@click.option(
    "--service-monitor",
    is_flag=True,
    help="Also print a ServiceMonitor (needs the Prometheus operator's CRD on the cluster).",
)
@click.option(
    "--write-crds", "crd_dir", type=click.Path(file_okay=False), help="Write one file per CRD here."
)
@click.option(
    "--write-manifests",
    "manifest_dir",
    type=click.Path(file_okay=False),
    help="Write the default deploy manifests (not the CRDs) here.",
)
def install(
    print_: bool,
    crds_only: bool,
    namespace: str,
    image: str,
    insecure: bool,
    gang_scheduler: str | None,
    read_only_api: bool,
    service_monitor: bool,
    crd_dir: str | None,
    manifest_dir: str | None,
) -> None:
    """Print (or write) gpuyard's CRDs and deploy manifests.

    \b
    gpuyard install --print | kubectl apply --server-side -f -
    """
    if not _DNS_LABEL.fullmatch(namespace):
        fail(
            f"--namespace: {namespace!r} is not a valid namespace name; allowed: at most 63 lower-case "
            "letters, digits and '-', starting and ending with a letter or digit"
        )
    if crd_dir is None and manifest_dir is None and not print_:
        fail(
            "nothing to do: pass --print (| kubectl apply --server-side -f -), --write-crds DIR or --write-manifests DIR"
        )
    if crd_dir is not None:
        for path in write_crds(Path(crd_dir)):
            click.echo(f"wrote {path}", err=True)
    if manifest_dir is not None:
        for path in write_manifests(Path(manifest_dir)):
            click.echo(f"wrote {path}", err=True)
    if print_:
        objects = crds()
        if not crds_only:
            objects += manifests(
                namespace=namespace,
                image=image,
                insecure=insecure,
                gang_scheduler=gang_scheduler,
                read_only_api=read_only_api,
                service_monitor=service_monitor,
            )
        sys.stdout.write(stream(objects))
