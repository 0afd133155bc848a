"""`gpuyard validate FILE... [--cluster SCENARIO]`: check job and policy files offline, for CI.

Every document of every file is checked with the validators the server runs on submit:

* jobs (KubeDL / Kubeflow kinds): `gpuyard.apis.jobs.parse_job`, then
  `gpuyard.apis.resourceclasses.validate_gang_request` against the resource classes known
  offline (the classes in the given files plus the default `nvidia.<model>` class of every GPU
  model gpuyard knows, or of the scenario's models with `--cluster`);
* ElasticQuota / ResourceQuota / Queue: `gpuyard.apis.quota.parse_quota_document` (the
  ElasticQuotas of all files are checked as one tree, in the order given);
* ResourceClass: `validate_resource_class`;
* PriorityClass: `class_problems` (value range, reserved names, preemption policy);
* Cron (KubeDL's `apps.kubedl.io`): `gpuyard.apis.crons.parse_cron` (schedule, policy, and the
  template's workload checked as a job).

With `--cluster SCENARIO` jobs are also checked against that cluster's nodes: a pod larger than
any node, and a gang that could never be placed even on the empty cluster (the scheduler's own
`place()` on a snapshot of the scenario, with its reason).

Unknown fields are reported exactly as `submit` warns about them (the server's
`gpuyard.platform.api.fields.unknown_fields`), each with the closest known key where one is
close (`spec.pytorchReplicaSpec: unknown field; did you mean pytorchReplicaSpecs?`), and so are
the fields gpuyard accepts but does not act on (`gpuyard.apis.ignoredfields`, with the reason).

Output: one line per problem, `FILE: documents[I]: FIELD: REASON`, then one per warning
(`warning: FILE: documents[I]: FIELD: unknown field ...`); exit 0 when every document is valid,
2 otherwise (also for an unreadable file or a bad scenario); with `--strict` a warning fails too.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import click
from pydantic import BaseModel

from gpuyard.apis.crons import parse_cron
from gpuyard.apis.decoding import DocumentLimitError
from gpuyard.apis.ignoredfields import ignored_fields
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob
from gpuyard.apis.jobs import JobValidationError, load_documents, parse_job
from gpuyard.apis.priorityclasses import class_problems
from gpuyard.apis.quota import QuotaValidationError, parse_quota_document
from gpuyard.apis.quotakinds import QUOTA_KINDS
from gpuyard.apis.resourceclasses import (
    ResourceClass,
    default_class,
    validate_gang_request,
    validate_resource_class,
)
from gpuyard.devices.presets import GPU_MODELS
from gpuyard.devices.scenarios import Scenario, ScenarioError, load_scenario

__all__ = ["Checked", "validate_command", "validate_documents", "validate_files"]

_POLICY_KINDS = tuple(cls.KIND for cls, _ in QUOTA_KINDS)
_ALLOWED_KINDS = sorted([*KIND_INFO, *_POLICY_KINDS, "ResourceClass", "PriorityClass", "Cron"])


@dataclass(slots=True)
class Checked:
    """The outcome of a validation run: problem lines and what was checked, by kind."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """Unknown fields and fields gpuyard does not act on: what `submit` would warn about
    (`--strict` fails on them)."""
    kinds: dict[str, int] = field(default_factory=dict)
    files: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        what = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds.items())) or "no documents"
        return f"{self.files} file(s), {sum(self.kinds.values())} document(s): {what}"


@dataclass(slots=True)
class _Doc:
    where: str  # "FILE: documents[I]"
    data: Any
    kind: str


class _Offline:
    """What the server would know: resource classes, and with a scenario its nodes and topologies."""

    def __init__(self, classes: list[ResourceClass], scenario: Scenario | None) -> None:
        self.scenario = scenario
        given = {c.metadata.name for c in classes}
        if scenario is not None:
            models = sorted({m for g in scenario.node_groups for m in g.gpu_models()})
        else:
            models = sorted(GPU_MODELS)
        defaults = [default_class(m) for m in models]
        self.classes = classes + [c for c in defaults if c.metadata.name not in given]
        self.nodes = scenario.nodes() if scenario is not None else []
        self.topologies = scenario.topologies() if scenario is not None else []
        self._snapshot: Any = None

    def job_problems(self, job: TrainingJob) -> list[tuple[str, str]]:
        problems = validate_gang_request(job, self.classes, self.nodes or None, topologies=self.topologies)
        out = [(p.field, p.reason) for p in problems]
        if not out and self.scenario is not None:
            out.extend(self._never_placed(job))
        return out

    def _never_placed(self, job: TrainingJob) -> list[tuple[str, str]]:
        """Run the scheduler's `place()` for the whole gang on the empty scenario cluster."""
        from gpuyard.controllers.podgroups import build_pod_group
        from gpuyard.controllers.workloads.registry import plugin_for
        from gpuyard.scheduler import Unschedulable, build_gang, build_profile, place
        from gpuyard.scheduler.cache.snapshot import Snapshot

        if self._snapshot is None:
            self._snapshot = Snapshot.build(
                nodes=self.nodes,
                topologies={t.metadata.name: t for t in self.topologies},
                classes=self.classes,
            )
        pg = build_pod_group(job, plugin_for(job.kind))
        try:
            gang = build_gang([pg], placed={}, classes=self._snapshot.class_names)
            result = place(self._snapshot, gang, build_profile("default"))
        except ValueError as exc:  # RequestError: a request no class can satisfy
            return [(f"spec.{job.info.replica_field}", str(exc))]
        if isinstance(result, Unschedulable):
            assert self.scenario is not None
            return [
                (
                    f"spec.{job.info.replica_field}",
                    f"could never be placed on cluster {self.scenario.name!r}, even empty: {result.full_message()}",
                )
            ]
        return []


def _read(path: Path) -> tuple[list[Any] | None, str | None]:
    try:
        text = path.read_text()
    except OSError as exc:
        return None, f"{path}: cannot read: {exc.strerror or exc}"
    except UnicodeDecodeError:
        return None, f"{path}: not UTF-8 text"
    try:
        return load_documents(text), None
    except (JobValidationError, DocumentLimitError) as exc:
        return None, f"{path}: {exc.message}"


def validate_documents(
    sources: Iterable[tuple[str, list[Any]]], *, scenario: Scenario | None = None
) -> Checked:
    """Check decoded documents `[(file label, documents)]`; see the module docstring."""
    out = Checked()
    docs: list[_Doc] = []
    for label, items in sources:
        out.files += 1
        for i, data in enumerate(items):
            kind = data.get("kind") if isinstance(data, Mapping) else None
            docs.append(_Doc(f"{label}: documents[{i}]", data, kind if isinstance(kind, str) else ""))
    classes: list[ResourceClass] = []
    quotas: list[Any] = []
    found: list[tuple[int, str]] = []  # (document number, line): printed in file order
    warned: list[tuple[int, str]] = []
    for n, doc in enumerate(docs):  # policies first: jobs are checked against the classes given
        if doc.kind == "ResourceClass":
            problems = validate_resource_class(doc.data)
            found.extend((n, f"{doc.where}: {p.field}: {p.reason}") for p in problems)
            if not problems:
                classes.append(ResourceClass.model_validate(doc.data))
        elif doc.kind == "PriorityClass":
            found.extend((n, f"{doc.where}: {f}: {r}") for f, r in class_problems(doc.data)[1])
        elif doc.kind == "Cron":
            found.extend((n, f"{doc.where}: {d['field']}: {d['reason']}") for d in parse_cron(doc.data)[1])
        elif doc.kind in _POLICY_KINDS:
            try:
                obj = parse_quota_document(doc.data, current_quotas=quotas)
            except QuotaValidationError as exc:
                found.extend((n, f"{doc.where}: {d['field']}: {d['reason']}") for d in exc.details)
            else:
                if obj.KIND == "ElasticQuota":
                    quotas.append(obj)
    offline = _Offline(classes, scenario)
    for n, doc in enumerate(docs):
        out.kinds[doc.kind or "?"] = out.kinds.get(doc.kind or "?", 0) + 1
        if doc.kind in _POLICY_KINDS or doc.kind in ("ResourceClass", "PriorityClass", "Cron"):
            continue
        if doc.kind not in KIND_INFO:
            shown = repr(doc.kind) if doc.kind else "missing"
            found.append((n, f"{doc.where}: kind: {shown}; allowed: {', '.join(_ALLOWED_KINDS)}"))
            continue
        warned.extend((n, f"{doc.where}: {w}") for w in unknown_field_warnings(doc.kind, doc.data))
        for path, reason in ignored_fields(doc.data, replica_field=KIND_INFO[doc.kind].replica_field):
            warned.append((n, f"{doc.where}: {path}: accepted but not acted on: {reason}"))
        try:
            job = parse_job(doc.data)
        except JobValidationError as exc:
            found.extend((n, f"{doc.where}: {d['field']}: {d['reason']}") for d in exc.details)
            continue
        found.extend((n, f"{doc.where}: {f}: {r}") for f, r in offline.job_problems(job))
    out.problems = [line for _, line in sorted(found, key=lambda item: item[0])]
    out.warnings = [line for _, line in sorted(warned, key=lambda item: item[0])]
    return out


def _model_keys(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[str]:
    """Every key (by alias and by name) of `model` and the models below it."""
    if model in seen:
        return set()
    seen.add(model)
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        keys.add(name)
        if info.alias:
            keys.add(info.alias)
        stack = [info.annotation]
        while stack:
            annotation = stack.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                keys |= _model_keys(annotation, seen)
            else:
                stack.extend(get_args(annotation))
    return keys


_KEYS: dict[str, list[str]] = {}


def closest_key(kind: str, key: str) -> str | None:
    """The known key of `kind`'s documents closest to a misspelt `key` (difflib), if one is close."""
    if kind not in _KEYS:
        _KEYS[kind] = sorted(_model_keys(KIND_INFO[kind].cls, set()))
    match = difflib.get_close_matches(key, _KEYS[kind], n=1, cutoff=0.75)
    return match[0] if match else None


def unknown_field_warnings(kind: str, data: Any) -> list[str]:
    """`FIELD: unknown field[; did you mean KEY?]` for each field `submit` would warn about."""
    from gpuyard.platform.api.fields import unknown_fields

    out = []
    for path in unknown_fields(KIND_INFO[kind].cls, data):
        key = path.rsplit(".", 1)[-1].split("[", 1)[0]
        near = closest_key(kind, key)
        out.append(f"{path}: unknown field" + (f"; did you mean {near}?" if near and near != key else ""))
    return out


def validate_files(paths: Iterable[str | Path], *, scenario: Scenario | None = None) -> Checked:
    """Read and check files; an unreadable or unparsable file is one problem line."""
    sources: list[tuple[str, list[Any]]] = []
    unreadable: list[str] = []
    for raw in paths:
        docs, problem = _read(Path(raw))
        if problem is not None:
            unreadable.append(problem)
        else:
            sources.append((str(raw), docs or []))
    checked = validate_documents(sources, scenario=scenario)
    checked.files += len(unreadable)
    checked.problems = unreadable + checked.problems
    return checked


@click.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--cluster",
    "cluster",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A fake-cluster scenario: also report jobs that could never be placed on it, and why.",
)
@click.option("-q", "--quiet", is_flag=True, help="Print only problems.")
@click.option(
    "--strict",
    is_flag=True,
    help="Fail (exit 2) on unknown fields and on fields gpuyard does not act on too, as submit "
    "--validate strict does.",
)
def validate_command(files: tuple[Path, ...], cluster: Path | None, quiet: bool, strict: bool) -> None:
    """Check job, quota, queue and resource-class FILES offline, with the server's validators.

    Exit 0 when every document is valid, 2 otherwise; one line per problem:
    FILE: documents[I]: FIELD: REASON.
    """
    scenario = None
    if cluster is not None:
        try:
            scenario = load_scenario(cluster)
        except ScenarioError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
    checked = validate_files(files, scenario=scenario)
    for line in checked.problems:
        click.echo(line)
    for line in checked.warnings:
        click.echo(f"{'error' if strict else 'warning'}: {line}")
    ok = checked.ok and not (strict and checked.warnings)
    if not quiet:
        verdict = "ok" if checked.ok else f"{len(checked.problems)} problem(s)"
        if checked.warnings:
            verdict += (
                f", {len(checked.warnings)} unknown or unused field(s){' (--strict)' if strict else ''}"
            )
        on = f" against cluster {scenario.name!r}" if scenario is not None else ""
        click.echo(f"{verdict}: {checked.summary()}{on}", err=not ok)
    sys.exit(0 if ok else 2)
