"""Reading what a user's test hands the harness: scenarios, node lists, job and policy documents.

Everything a test passes in (a scenario file or dict, `nodes=[("dgx1-v100", 2)]`, job files,
YAML text, quota / queue / resource-class files) goes through the same validators the server
and `gpuyard validate` use. A mistake becomes one :class:`BadInput` whose message names the
source, the document index and the field path; the pytest plugin turns it into a plain test
failure (`pytest.fail(msg, pytrace=False)`), never a traceback from inside gpuyard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobs import JobValidationError, load_documents, parse_job
from gpuyard.apis.meta import Resource
from gpuyard.apis.quota import QuotaValidationError, parse_quota_document
from gpuyard.apis.resourceclasses import ResourceClass, validate_gang_request, validate_resource_class
from gpuyard.devices.presets import PRESETS
from gpuyard.devices.scenarios import Scenario, ScenarioError, load_scenario, parse_scenario
from gpuyard.state.store import Store

__all__ = [
    "BadInput",
    "NodeSpec",
    "Source",
    "documents_of",
    "nodes_scenario",
    "parse_jobs",
    "parse_policies",
    "scenario_of",
]

Source = str | Path | Mapping[str, Any] | Sequence[Mapping[str, Any]]
"""A file path, YAML/JSON text, one decoded document, or a list of them."""
NodeSpec = str | tuple[str, int] | Mapping[str, Any]
"""A preset name, `(preset, count)`, or a raw scenario node group."""


class BadInput(Exception):
    """A scenario, job or policy document the validators reject; the message says where and why."""


def _looks_like_text(value: str) -> bool:
    stripped = value.lstrip()
    return "\n" in value or stripped.startswith(("{", "[", "apiVersion", "kind", "---"))


def documents_of(source: Source, *, what: str) -> tuple[str, list[Any]]:
    """`(label, documents)` of a source; the label names it in messages (the path, or `<what>`)."""
    if isinstance(source, Mapping):
        return f"<{what}>", [dict(source)]
    if isinstance(source, (list, tuple)):
        return f"<{what}>", list(source)
    if isinstance(source, str) and _looks_like_text(source):
        label, text = f"<{what} text>", source
    elif isinstance(source, (str, Path)):
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as exc:
            raise BadInput(f"{path}: cannot read {what} file: {exc.strerror or exc}") from None
        label = str(path)
    else:
        raise BadInput(
            f"{what}: expected a file path, YAML text, a mapping or a list of mappings, "
            f"got {type(source).__name__}"
        )
    try:
        return label, load_documents(text)
    except JobValidationError as exc:
        raise BadInput(f"{label}: {exc.message}") from None


def _prefix(label: str, index: int, count: int) -> str:
    return f"{label}: documents[{index}]" if count > 1 else label


def parse_jobs(source: Source, *, store: Store | None = None) -> list[TrainingJob]:
    """Validate job documents as `POST /api/v1/jobs` does: parsing + resource checks, all or nothing."""
    label, docs = documents_of(source, what="job")
    jobs: list[TrainingJob] = []
    lines: list[str] = []
    for i, doc in enumerate(docs):
        where = _prefix(label, i, len(docs))
        try:
            job = parse_job(doc)
        except JobValidationError as exc:
            lines.extend(f"{where}: {d['field']}: {d['reason']}" for d in exc.details)
            continue
        for problem in validate_gang_request(job, store=store) if store is not None else ():
            lines.append(f"{where}: {problem.field}: {problem.reason}")
        jobs.append(job)
    if lines:
        raise BadInput("invalid job manifest:\n  " + "\n  ".join(lines))
    return jobs


def parse_policies(sources: Iterable[Source], *, what: str) -> list[Resource]:
    """ElasticQuota / ResourceQuota / Queue / ResourceClass documents, validated as the server does.

    ElasticQuotas are checked as one tree, in the order given.
    """
    out: list[Resource] = []
    quotas: list[Any] = []
    lines: list[str] = []
    for source in sources:
        label, docs = documents_of(source, what=what)
        for i, doc in enumerate(docs):
            where = _prefix(label, i, len(docs))
            if isinstance(doc, Mapping) and doc.get("kind") == "ResourceClass":
                problems = validate_resource_class(doc)
                if problems:
                    lines.extend(f"{where}: {p.field}: {p.reason}" for p in problems)
                else:
                    out.append(ResourceClass.model_validate(doc))
                continue
            try:
                obj = parse_quota_document(doc, current_quotas=quotas)
            except QuotaValidationError as exc:
                lines.extend(f"{where}: {d['field']}: {d['reason']}" for d in exc.details)
                continue
            if obj.KIND == "ElasticQuota":
                quotas.append(obj)
            out.append(obj)
    if lines:
        raise BadInput(f"invalid {what}:\n  " + "\n  ".join(lines))
    return out


def _group(item: object, index: int) -> dict[str, Any]:
    """One node group of `nodes=[...]`; `item` is whatever the test passed (a NodeSpec if valid)."""
    if isinstance(item, Mapping):
        return dict(item)
    if isinstance(item, str):
        preset, count = item, 1
    elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        preset, count = item
    else:
        raise BadInput(
            f"nodes[{index}]: expected a preset name, (preset, count) or a node group mapping, got {item!r}"
        )
    if preset not in PRESETS:
        raise BadInput(f"nodes[{index}]: unknown topology preset {preset!r}; allowed: {', '.join(PRESETS)}")
    return {"name": preset, "count": count, "topology": preset}


def nodes_scenario(
    nodes: Sequence[NodeSpec], *, kubelet: Mapping[str, Any] | None = None, block: str | None = "block-a"
) -> dict[str, Any]:
    """A scenario dict from `[("dgx1-v100", 2), "dgx-a100", {...node group...}]`.

    Groups are named after their preset (`dgx1-v100-0`, `dgx1-v100-1`, ...); a preset given twice
    gets a numbered name. Nodes run pods until told otherwise (no default duration).
    """
    if isinstance(nodes, str):
        nodes = [nodes]
    groups: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(nodes):
        group = _group(item, i)
        name = str(group.get("name", f"group{i}"))
        if name in seen:
            seen[name] += 1
            group["name"] = f"{name}-g{seen[name]}"
        else:
            seen[name] = 0
        if block is not None and "block" not in group:
            group["block"] = block
        groups.append(group)
    return {"name": "test", "kubelet": dict(kubelet or {}), "nodeGroups": groups}


def scenario_of(
    scenario: str | Path | Mapping[str, Any] | Scenario | None,
    *,
    nodes: Sequence[NodeSpec] | None = None,
    kubelet: Mapping[str, Any] | None = None,
) -> Scenario:
    """The validated scenario of a test: a file, a dict, a `Scenario`, or inline node presets."""
    if (scenario is None) == (nodes is None):
        raise BadInput("give either a scenario (file or mapping) or nodes=[(preset, count), ...], not both")
    try:
        if nodes is not None:
            return parse_scenario(nodes_scenario(nodes, kubelet=kubelet), source="<nodes>")
        if isinstance(scenario, Scenario):
            return scenario
        if isinstance(scenario, Mapping):
            data = dict(scenario)
            if kubelet:
                data["kubelet"] = {**data.get("kubelet", {}), **kubelet}
            return parse_scenario(data, source="<scenario>")
        if isinstance(scenario, str) and _looks_like_text(scenario):
            return parse_scenario(yaml.safe_load(scenario), source="<scenario text>")
        assert scenario is not None  # exactly one of scenario and nodes is given (checked above)
        loaded = load_scenario(scenario)
        if kubelet:
            loaded.kubelet = loaded.kubelet.model_validate(
                {**loaded.kubelet.model_dump(by_alias=True), **kubelet}
            )
        return loaded
    except ScenarioError as exc:
        raise BadInput(f"invalid scenario: {exc}") from None
    except yaml.YAMLError as exc:
        raise BadInput(f"invalid scenario: not valid YAML: {exc}") from None
    except ValueError as exc:  # a bad kubelet override
        raise BadInput(f"invalid scenario: kubelet: {exc}") from None
