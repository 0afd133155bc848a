"""KubeDL's `Cron` kind (`apps.kubedl.io/v1alpha1`): a training job created again and again on a schedule.

A Cron's spec is KubeDL's `CronPolicy` inlined (`schedule`, `concurrencyPolicy`, `suspend`,
`deadline`, `historyLimit`; :mod:`gpuyard.apis.cronschedules`) and a `template`: the job kind
(`apiVersion`, `kind`) and the job itself (`workload`, a job document without its name). Its
status is the cron controller's (`controllers/cronrunning.py`): the running jobs (`active`), the
jobs it created with how they ended (`history`) and when it last started one
(`lastScheduleTime`). The jobs it creates are named `<cron>-<unix time of the schedule>`, carry the
label `kubedl.io/cron-name` and a controller owner reference to the Cron, as KubeDL's do.

A job with `spec.cronPolicy` is wrapped as KubeDL wraps it: a Cron of the job's name whose
template is the job without its `cronPolicy` (:func:`cron_for_job`).

:func:`parse_cron` validates a submitted document: every problem names its field.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import Field, ValidationError

from gpuyard.apis.cronschedules import CronPolicy, cron_policy_problems
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob
from gpuyard.apis.jobs import MAX_NAME, JobValidationError, parse_job
from gpuyard.apis.meta import K8sModel, ObjectMeta, Resource, dns_label_problem, metadata_problems

__all__ = [
    "API_VERSION",
    "CRON_KINDS",
    "LABEL_CRON_NAME",
    "MAX_CRON_NAME",
    "Cron",
    "CronHistory",
    "CronObjectReference",
    "CronSpec",
    "CronStatus",
    "CronTemplateSpec",
    "cron_for_job",
    "cron_job_name",
    "parse_cron",
    "workload_of",
]

API_VERSION = "apps.kubedl.io/v1alpha1"
LABEL_CRON_NAME = "kubedl.io/cron-name"
"""KubeDL's label on the jobs a Cron creates (`LabelCronName`)."""
MAX_CRON_NAME = MAX_NAME - 11
"""A Cron's name leaves room for `-<10-digit unix time>` within a job name."""


class CronTemplateSpec(K8sModel):
    """Which job kind to create (`apiVersion`, `kind`) and the job itself (`workload`)."""

    api_version: str = ""
    kind: str = ""
    workload: dict[str, Any] | None = Field(
        default=None,
        description="The job to create: a job document (metadata and spec) of the template's kind.",
    )


class CronSpec(CronPolicy):
    """KubeDL's CronSpec: the CronPolicy inlined, and the template of the job to create."""

    template: CronTemplateSpec = Field(default_factory=CronTemplateSpec)


class CronObjectReference(K8sModel):
    """A running job of the Cron (Kubernetes' ObjectReference)."""

    api_version: str = ""
    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""


class CronHistoryObject(K8sModel):
    """Kubernetes' TypedLocalObjectReference (KubeDL writes the template's apiVersion as apiGroup)."""

    api_group: str | None = None
    kind: str = ""
    name: str = ""


class CronHistory(K8sModel):
    """A job the Cron created: its last condition (`status`), when it was created and finished."""

    object: CronHistoryObject = Field(default_factory=CronHistoryObject)
    status: str = ""
    created: datetime | None = None
    finished: datetime | None = None


class CronStatus(K8sModel):
    active: list[CronObjectReference] = Field(default_factory=list)
    history: list[CronHistory] = Field(default_factory=list)
    last_schedule_time: datetime | None = None


class Cron(Resource):
    """A training job created on a schedule (KubeDL's Cron)."""

    KIND = "Cron"
    API_VERSION = API_VERSION

    spec: CronSpec
    status: CronStatus = Field(default_factory=CronStatus)


CRON_KINDS: list[type[Resource]] = [Cron]


def cron_job_name(cron: str, scheduled: datetime) -> str:
    """KubeDL's name of a scheduled job: `<cron>-<unix seconds of the schedule time>`."""
    return f"{cron}-{int(scheduled.timestamp())}"


def workload_of(cron: Cron) -> dict[str, Any]:
    """The job document the template describes (apiVersion and kind from the template)."""
    template = cron.spec.template
    doc = dict(template.workload or {})
    doc["apiVersion"] = template.api_version
    doc["kind"] = template.kind
    spec = doc.get("spec")
    if isinstance(spec, Mapping) and "cronPolicy" in spec:  # KubeDL clears it: no Cron of Crons
        doc["spec"] = {k: v for k, v in spec.items() if k != "cronPolicy"}
    doc.pop("status", None)
    return doc


def parse_cron(doc: Any, *, prefix: str = "") -> tuple[Cron | None, list[dict[str, str]]]:
    """A submitted Cron document: (the Cron, []) or (None, 422 details naming each field)."""
    if not isinstance(doc, Mapping):
        return None, [{"field": prefix.rstrip(".") or "<root>", "reason": "expected a mapping"}]
    problems: list[dict[str, str]] = []
    meta = doc.get("metadata")
    problems += metadata_problems(meta, field=f"{prefix}metadata", name_rule="label")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not name:
        problems.append({"field": f"{prefix}metadata.name", "reason": "required"})
    elif isinstance(name, str) and len(name) > MAX_CRON_NAME and not dns_label_problem(name):
        problems.append(
            {
                "field": f"{prefix}metadata.name",
                "reason": f"at most {MAX_CRON_NAME} characters (the jobs are named <cron>-<unix time>, "
                f"at most {MAX_NAME})",
            }
        )
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        problems.append(
            {"field": f"{prefix}spec", "reason": "required: an object with schedule and template"}
        )
        return None, problems
    policy = {k: v for k, v in spec.items() if k != "template"}
    problems += cron_policy_problems(policy, field=f"{prefix}spec")
    problems += _template_problems(spec.get("template"), field=f"{prefix}spec.template", name=name)
    if problems:
        return None, problems
    data = {k: v for k, v in doc.items() if k != "status"}
    try:
        cron = Cron.model_validate(data)
    except ValidationError as exc:
        return None, [
            {"field": prefix + ".".join(str(p) for p in e["loc"]), "reason": e["msg"]} for e in exc.errors()
        ]
    cron.metadata.namespace = cron.metadata.namespace or "default"
    return cron, []


def _template_problems(template: Any, *, field: str, name: Any) -> list[dict[str, str]]:
    if not isinstance(template, Mapping):
        return [{"field": field, "reason": "required: apiVersion, kind and workload of the job to create"}]
    kind, api_version = template.get("kind"), template.get("apiVersion")
    info = KIND_INFO.get(kind) if isinstance(kind, str) else None
    if info is None:
        return [
            {
                "field": f"{field}.kind",
                "reason": f"{kind!r} is not a job kind; allowed: {', '.join(sorted(KIND_INFO))}",
            }
        ]
    if api_version not in info.flavors:
        return [
            {
                "field": f"{field}.apiVersion",
                "reason": f"{api_version!r} is not an apiVersion of {kind}; allowed: {', '.join(sorted(info.flavors))}",
            }
        ]
    workload = template.get("workload")
    if not isinstance(workload, Mapping):
        return [
            {"field": f"{field}.workload", "reason": f"required: the {kind} to create (metadata and spec)"}
        ]
    doc = dict(workload)
    meta = dict(doc.get("metadata") or {}) if isinstance(doc.get("metadata"), Mapping) else {}
    meta.setdefault("name", f"{name or 'cron'}-1700000000")  # a scheduled job's name, to check the rest
    doc.update(metadata=meta, apiVersion=api_version, kind=kind)
    try:
        parse_job(doc)
    except JobValidationError as exc:
        return [{"field": f"{field}.workload.{d['field']}", "reason": d["reason"]} for d in exc.details]
    return []


def cron_for_job(job: TrainingJob) -> Cron | None:
    """KubeDL's Cron for a job with `spec.cronPolicy` (`createCronInstance`): named as the job,
    its template the job without name, namespace, version, uid, creation time, status and
    cronPolicy; None when the job has no (valid) cronPolicy."""
    raw = (job.spec.model_extra or {}).get("cronPolicy")
    if not isinstance(raw, Mapping) or cron_policy_problems(dict(raw), field="spec.cronPolicy"):
        return None
    doc = job.to_dict()
    doc.pop("status", None)
    meta = {
        k: v
        for k, v in doc.get("metadata", {}).items()
        if k not in ("name", "namespace", "resourceVersion", "uid", "generation", "creationTimestamp")
    }
    meta = {k: v for k, v in meta.items() if v not in ({}, [], "", 0)}
    doc["metadata"] = meta
    doc["spec"] = {k: v for k, v in doc.get("spec", {}).items() if k != "cronPolicy"}
    workload = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
    spec = CronSpec.model_validate(
        {**dict(raw), "template": {"apiVersion": job.api_version, "kind": job.kind, "workload": workload}}
    )
    return Cron(metadata=ObjectMeta(name=job.metadata.name, namespace=job.metadata.namespace), spec=spec)
