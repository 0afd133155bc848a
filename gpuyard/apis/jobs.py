"""Training job kinds: KubeDL (`training.kubedl.io/v1alpha1`) and Kubeflow (`kubeflow.org/v1`).

Job files written for those projects are accepted as written: the models follow their field
names (`tfReplicaSpecs`, `runPolicy`, inline KubeDL run policy, `elasticPolicy`, ...) and keep
every field gpuyard does not interpret. One store kind per `kind` (TFJob exists in both API
groups; the object's `apiVersion` says which project's conventions apply).

This module is the edge of the data flow (`submit -> validate -> store`): `parse_job` turns a
decoded document into a defaulted, validated job or raises :class:`JobValidationError` listing
every offending field path with the allowed values; `load_documents` decodes a YAML/JSON body.
The spec
and status models live in :mod:`gpuyard.apis.jobspecs`, the kinds and the per-kind *API facts*
(replica types, default container/port/restart policy, :data:`KIND_INFO`) in
:mod:`gpuyard.apis.jobkinds`. The job operator (`gpuyard.controllers`) reads these objects; the
per-kind *behaviour* (env wiring, start order, success rule) lives in its workload plugins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from gpuyard.apis.core import ContainerPort
from gpuyard.apis.cronschedules import cron_policy_problems
from gpuyard.apis.decoding import DEFAULT_MAX_BYTES, yaml_load_all
from gpuyard.apis.durations import duration_annotation_problems
from gpuyard.apis.elasticmetrics import metric_problems
from gpuyard.apis.jobkinds import (
    ANNOTATION_GIT_SYNC,
    KIND_INFO,
    Flavor,
    JobKindInfo,
    PortDefault,
    PyTorchJob,
    TrainingJob,
    XDLJob,
)
from gpuyard.apis.jobspecs import (
    ReplicaSpec,
)
from gpuyard.apis.labels import label_problems
from gpuyard.apis.managers import managed_by_problems
from gpuyard.apis.meta import dns_label_problem, metadata_problems
from gpuyard.apis.podvalidation import template_problems
from gpuyard.apis.quotakinds import ANNOTATION_EXPECTED_DURATION
from gpuyard.apis.tensorboards import tensorboard_problems
from gpuyard.apis.topologypolicy import topology_policy_problems

__all__ = [
    "INVALID_SPEC",
    "JobValidationError",
    "load_documents",
    "parse_job",
]

INVALID_SPEC = "InvalidSpec"
"""The reason of the `Failed` condition and the Warning Event of a job object stored on a Kubernetes
API server that gpuyard cannot accept (the Kubernetes backend keeps it out of the store)."""

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 52  # leaves room for "-<role>-<index>" within a 63-character DNS label
XDL_DEFAULT_BACKOFF_LIMIT = 20  # KubeDL's XDLJobDefaultBackoffLimit
XDL_DEFAULT_MIN_FINISH_WORK_RATE = 90  # KubeDL's XDLJobDefaultMinFinishWorkRate (percent)


# --- parsing, validation, defaulting ------------------------------------------------------------


class JobValidationError(ValueError):
    """A job document that cannot be accepted; `details` lists `{"field", "reason"}` per problem."""

    def __init__(self, message: str, details: Iterable[dict[str, str]]) -> None:
        super().__init__(message)
        self.message = message
        self.details = list(details)


def _fmt_loc(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc)


def _pydantic_details(exc: ValidationError) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        loc = list(err["loc"])
        # pydantic reports the field by its alias already; keep the path as the user wrote it
        path = _fmt_loc(loc)
        reason = (
            "unknown field" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        )
        out.append({"field": path or "<root>", "reason": reason})
    return out


def _canonical_roles(
    info: JobKindInfo, flavor: Flavor, raw: Mapping[str, Any], *, kind: str, api_version: str
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Map replica type keys case-insensitively to canonical names (as KubeDL/Kubeflow default them)."""
    allowed = {r.lower(): r for r in flavor.roles}
    out: dict[str, Any] = {}
    errors = []
    for key, value in raw.items():
        canonical = allowed.get(str(key).lower())
        if canonical is None:
            errors.append(
                {
                    "field": f"spec.{info.replica_field}.{key}",
                    "reason": f"unknown replica type {key!r} for {kind} ({api_version}); allowed: {', '.join(sorted(flavor.roles))}",
                }
            )
            continue
        if canonical in out:
            errors.append(
                {
                    "field": f"spec.{info.replica_field}.{key}",
                    "reason": f"replica type {canonical} is given twice",
                }
            )
            continue
        out[canonical] = value
    return out, errors


def parse_job(doc: Any) -> TrainingJob:
    """Validate and default one decoded job document; raise :class:`JobValidationError`."""
    if not isinstance(doc, Mapping):
        raise JobValidationError(
            "a job document must be a mapping",
            [{"field": "<root>", "reason": f"expected an object, got {type(doc).__name__}"}],
        )
    kind = doc.get("kind")
    api_version = doc.get("apiVersion")
    if not isinstance(kind, str) or (info := KIND_INFO.get(kind)) is None:
        raise JobValidationError(
            f"unknown kind {kind!r}",
            [{"field": "kind", "reason": f"unknown kind {kind!r}; allowed: {', '.join(sorted(KIND_INFO))}"}],
        )
    if not isinstance(api_version, str) or api_version not in info.flavors:
        raise JobValidationError(
            f"unknown apiVersion {api_version!r} for {kind}",
            [
                {
                    "field": "apiVersion",
                    "reason": f"{api_version!r} is not an apiVersion of {kind}; allowed: {', '.join(sorted(info.flavors))}",
                }
            ],
        )
    flavor = info.flavor(api_version)
    errors: list[dict[str, str]] = _name_errors(doc.get("metadata"))
    errors += _template_errors(doc, info.replica_field)
    data = dict(doc)
    data.pop("status", None)  # status is the operator's
    spec = doc.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise JobValidationError(
            "spec must be an object",
            [{"field": "spec", "reason": f"expected an object, got {type(spec).__name__}"}],
        )
    spec = dict(spec)
    errors += managed_by_problems(spec)
    raw_roles = spec.get(info.replica_field)
    if raw_roles is None or (isinstance(raw_roles, Mapping) and not raw_roles):
        errors.append(
            {
                "field": f"spec.{info.replica_field}",
                "reason": f"at least one replica type is required; allowed: {', '.join(sorted(flavor.roles))}",
            }
        )
    elif not isinstance(raw_roles, Mapping):
        errors.append(
            {
                "field": f"spec.{info.replica_field}",
                "reason": f"expected a map of replica type to replica spec, got {type(raw_roles).__name__}",
            }
        )
    else:
        roles, role_errors = _canonical_roles(info, flavor, raw_roles, kind=kind, api_version=api_version)
        errors.extend(role_errors)
        spec[info.replica_field] = roles
    data["spec"] = spec
    pod_errors = template_problems(spec, info.replica_field)  # what the API server requires of a pod
    errors += pod_errors
    try:
        job = info.cls.model_validate(data)
    except ValidationError as exc:
        named = {d["field"] for d in pod_errors}
        errors.extend(d for d in _pydantic_details(exc) if _bracketed(d["field"]) not in named)
        raise JobValidationError(f"invalid {kind}", errors) from None
    errors.extend(_semantic_errors(job, flavor))
    if errors:
        raise JobValidationError(f"invalid {kind} {job.metadata.name or '<unnamed>'}", errors)
    if not job.metadata.namespace:
        job.metadata.namespace = "default"
    apply_defaults(job)
    return job


def _bracketed(path: str) -> str:
    """pydantic's `containers.0.name` as `containers[0].name` (the pod checks' form)."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", path)


def _name_errors(metadata: Any) -> list[dict[str, str]]:
    if not isinstance(metadata, Mapping):
        return [{"field": "metadata", "reason": "required: an object with at least a name"}]
    name = metadata.get("name")
    if not name:
        return [{"field": "metadata.name", "reason": "required"}]
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME:
        return [
            {
                "field": "metadata.name",
                "reason": f"{name!r} must be lower-case letters, digits and '-', start and end alphanumeric, at most {MAX_NAME} characters",
            }
        ]
    namespace = metadata.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str) or (namespace and dns_label_problem(namespace))
    ):
        return [{"field": "metadata.namespace", "reason": str(dns_label_problem(namespace))}]
    # labels and annotations as the API server checks them (the name's rule is the one above)
    return metadata_problems({k: v for k, v in metadata.items() if k in ("labels", "annotations")})


def _template_errors(doc: Mapping[str, Any], replica_field: str) -> list[dict[str, str]]:
    """Labels and annotations of each role's pod template, as the API server checks a pod's."""
    spec = doc.get("spec")
    roles = spec.get(replica_field) if isinstance(spec, Mapping) else None
    if not isinstance(roles, Mapping):
        return []
    out: list[dict[str, str]] = []
    for role, replica in roles.items():
        template = replica.get("template") if isinstance(replica, Mapping) else None
        meta = template.get("metadata") if isinstance(template, Mapping) else None
        if isinstance(meta, Mapping):
            out += metadata_problems(
                {k: v for k, v in meta.items() if k in ("labels", "annotations")},
                field=f"spec.{replica_field}.{role}.template.metadata",
            )
    return out


def _spot_errors(spec: ReplicaSpec, field: str) -> list[dict[str, str]]:
    """KubeDL's spotReplicaSpec: at most `replicas` spot replicas, labels a pod may carry."""
    spot = spec.spot_replica_spec
    if spot is None:
        return []
    out = label_problems(spot.labels, field=f"{field}.labels")
    if spot.spot_replica_number > spec.count:
        out.append(
            {
                "field": f"{field}.spotReplicaNumber",
                "reason": f"{spot.spot_replica_number} is more than the role's {spec.count} replica(s); "
                f"allowed: 0..{spec.count}",
            }
        )
    return out


def _semantic_errors(job: TrainingJob, flavor: Flavor) -> list[dict[str, str]]:
    errors: list[dict[str, str]] = []
    info = job.info
    specs = job.replica_specs
    git_sync = job.metadata.annotations.get(ANNOTATION_GIT_SYNC)
    if git_sync is not None:
        try:
            opts = json.loads(git_sync)
        except ValueError as exc:
            opts = None
            reason = f"not valid JSON: {exc}"
        else:
            reason = 'an object with at least "source" (the git repository) is required'
        if not isinstance(opts, dict) or not opts.get("source"):
            errors.append({"field": f"metadata.annotations.{ANNOTATION_GIT_SYNC}", "reason": reason})
    errors.extend(
        duration_annotation_problems(job.metadata.annotations, "metadata", (ANNOTATION_EXPECTED_DURATION,))
    )
    errors.extend(tensorboard_problems(job.metadata.annotations))
    if isinstance(job, PyTorchJob) and (ep := job.spec.elastic_policy) is not None:
        errors.extend(
            metric_problems(ep.metrics, field="spec.elasticPolicy.metrics", kubeflow=job.flavor == "kubeflow")
        )
    errors.extend(topology_policy_problems(job.metadata.annotations, "metadata"))
    for role, spec in specs.items():
        base = f"spec.{info.replica_field}.{role}"
        annotations = spec.template.metadata.get("annotations")
        if isinstance(annotations, Mapping):
            errors.extend(duration_annotation_problems(annotations, f"{base}.template.metadata"))
            errors.extend(topology_policy_problems(annotations, f"{base}.template.metadata"))
        if not spec.template.spec.containers:
            errors.append(
                {"field": f"{base}.template.spec.containers", "reason": "at least one container is required"}
            )
        errors.extend(_spot_errors(spec, f"{base}.spotReplicaSpec"))
        for i, dep in enumerate(spec.depends_on or []):
            up = {r.lower(): r for r in specs}.get(dep.upstream.lower())
            if up is None:
                errors.append(
                    {
                        "field": f"{base}.dependsOn.{i}.upstream",
                        "reason": f"unknown replica type {dep.upstream!r}; allowed: {', '.join(sorted(specs))}",
                    }
                )
            elif up == role:
                errors.append(
                    {
                        "field": f"{base}.dependsOn.{i}.upstream",
                        "reason": "a replica type cannot depend on itself",
                    }
                )
    errors += cron_policy_problems((job.spec.model_extra or {}).get("cronPolicy"), field="spec.cronPolicy")
    cycle = _dependency_cycle(specs)
    if cycle:
        errors.append(
            {
                "field": f"spec.{info.replica_field}",
                "reason": f"dependsOn forms a cycle: {' -> '.join(cycle)}",
            }
        )
    if job.KIND == "PyTorchJob" and "Master" in specs and specs["Master"].count > 1:
        errors.append(
            {
                "field": f"spec.{info.replica_field}.Master.replicas",
                "reason": "a PyTorchJob has at most one Master; allowed: 0 or 1",
            }
        )
    if job.KIND == "MPIJob" and "Launcher" in specs and specs["Launcher"].count != 1:
        errors.append(
            {
                "field": f"spec.{info.replica_field}.Launcher.replicas",
                "reason": "an MPIJob has exactly one Launcher; allowed: 1",
            }
        )
    policy = job.run_policy
    if policy.scheduling_policy is not None and policy.scheduling_policy.min_available is not None:
        total = sum(s.count for s in specs.values())
        if policy.scheduling_policy.min_available > total:
            errors.append(
                {
                    "field": "spec.schedulingPolicy.minAvailable"
                    if job.spec.run_policy is None
                    else "spec.runPolicy.schedulingPolicy.minAvailable",
                    "reason": f"{policy.scheduling_policy.min_available} is more than the job's {total} replicas; allowed: 0..{total}",
                }
            )
    return errors


def _dependency_cycle(specs: Mapping[str, ReplicaSpec]) -> list[str]:
    lower = {r.lower(): r for r in specs}
    edges = {
        r: [lower[d.upstream.lower()] for d in (s.depends_on or []) if d.upstream.lower() in lower]
        for r, s in specs.items()
    }
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for up in edges.get(node, []):
            if state.get(up) == 1:
                return [*path[path.index(up) :], up]
            if state.get(up) is None:
                found = visit(up)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return []

    for r in specs:
        if state.get(r) is None:
            found = visit(r)
            if found:
                return found
    return []


def apply_defaults(job: TrainingJob) -> None:
    """Fill in what KubeDL/Kubeflow default at admission: replicas, restart policy, ports.

    gpuyard deliberately defaults `cleanPodPolicy` to `Running` for every kind (both projects
    default some kinds to `None`, which leaves pods running after the job ended).
    """
    flavor = job.info.flavor(job.api_version)
    for role, spec in job.replica_specs.items():
        if spec.replicas is None:
            spec.replicas = flavor.replicas.get(role, 1)
        if spec.restart_policy is None:
            spec.restart_policy = flavor.restart.get(role, flavor.restart.get("*", "Never"))
        if flavor.port.port is not None and (flavor.port_roles is None or role in flavor.port_roles):
            _default_port(spec, flavor.port)
    target = job.spec.run_policy if job.spec.run_policy is not None else job.spec
    if job.run_policy.clean_pod_policy is None:
        target.clean_pod_policy = "Running"
    if isinstance(job, PyTorchJob) and job.flavor == "kubeflow":
        _default_pytorch_kubeflow(job)
    if isinstance(job, XDLJob):
        _default_xdl(job)


def _default_port(spec: ReplicaSpec, port: PortDefault) -> None:
    containers = spec.template.spec.containers
    if not containers:
        return
    container = next((c for c in containers if c.name == port.container), containers[0])
    if any(p.name == port.name for p in container.ports):
        return
    container.ports.append(ContainerPort(name=port.name, container_port=port.port))


def _default_xdl(job: XDLJob) -> None:
    """KubeDL's setDefaults_XDLJobSpec: backoffLimit 20, and minFinishWorkRate 90 when neither it
    nor minFinishWorkNum is given."""
    spec = job.spec
    if job.run_policy.backoff_limit is None:
        spec.backoff_limit = XDL_DEFAULT_BACKOFF_LIMIT
    if spec.min_finish_work_num is None and spec.min_finish_work_rate is None:
        spec.min_finish_work_rate = XDL_DEFAULT_MIN_FINISH_WORK_RATE


def _default_pytorch_kubeflow(job: PyTorchJob) -> None:
    """Kubeflow's `setElasticPolicy` and `setDefaultNprocPerNode`."""
    spec = job.spec
    ep = spec.elastic_policy
    if ep is not None:
        if ep.max_replicas is not None and ep.min_replicas is None:
            ep.min_replicas = ep.max_replicas
        elif ep.min_replicas is not None and ep.max_replicas is None:
            ep.max_replicas = ep.min_replicas
        elif ep.min_replicas is None and ep.max_replicas is None and "Worker" in spec.pytorch_replica_specs:
            workers = spec.pytorch_replica_specs["Worker"].count
            ep.min_replicas = ep.max_replicas = workers
    if (ep is None or ep.n_proc_per_node is None) and spec.nproc_per_node is None:
        spec.nproc_per_node = "auto"


def load_documents(
    text: str, *, max_bytes: int = DEFAULT_MAX_BYTES, limit_name: str = "server.max_body_bytes"
) -> list[Any]:
    """Decode a YAML or JSON body into documents: multi-document YAML, a JSON array, or a `List`.

    Raises :class:`JobValidationError` naming the line and column of a syntax error, and
    :class:`DocumentLimitError` for a document nested too deep or expanding (aliases included)
    beyond `max_bytes`.
    """
    try:
        docs = [d for d in yaml_load_all(text, max_bytes=max_bytes, limit_name=limit_name) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else "<unknown>"
        problem = getattr(exc, "problem", None) or str(exc)
        raise JobValidationError(
            f"not valid YAML or JSON: {problem} at {where}",
            [{"field": "<body>", "reason": f"{problem} at {where}"}],
        ) from None
    out: list[Any] = []
    for doc in docs:
        if isinstance(doc, list):
            out.extend(doc)
        elif isinstance(doc, Mapping) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out.extend(doc["items"])
        else:
            out.append(doc)
    if not out:
        raise JobValidationError(
            "no job documents in the body",
            [{"field": "<body>", "reason": "empty: expected one or more job documents"}],
        )
    return out
