"""Job updates: a JSON merge patch (RFC 7386) on a stored job, limited to the fields that may change.

A job's spec is the user's, but most of it is fixed once the operator has built the job's gang
from it (roles, replicas, templates). What may change after submit:

* `metadata.labels`, `metadata.annotations`;
* suspension: `spec.suspend` (KubeDL's inline run policy), `spec.runPolicy.suspend` (Kubeflow);
* priority: `schedulingPolicy.priority`, `.priorityClass`, `.priorityClassName`;
* queue: `schedulingPolicy.queue`;

where `schedulingPolicy` is `spec.schedulingPolicy` or `spec.runPolicy.schedulingPolicy`. Any
other field that the patch would change is refused, naming the field
("spec.tfReplicaSpecs.Worker.replicas is immutable"); a patch that writes a field's current value
is no change. `metadata.resourceVersion` in the patch is a precondition, not a change.

:func:`merge_patch` is RFC 7386 (null removes a key, objects merge, anything else replaces);
:func:`patch_problems` compares the job before and after and names every refused change. The HTTP
route (`platform/api/jobs.py`) parses the result as a job again (so the new values are validated
like a submitted job's) and writes it with the stored resourceVersion.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["MUTABLE_FIELDS", "changed_paths", "merge_patch", "patch_problems"]

_POLICY_FIELDS = ("priority", "priorityClass", "priorityClassName", "queue")
MUTABLE_FIELDS: tuple[str, ...] = (
    "spec.suspend",
    "spec.runPolicy.suspend",
    *(f"spec.schedulingPolicy.{f}" for f in _POLICY_FIELDS),
    *(f"spec.runPolicy.schedulingPolicy.{f}" for f in _POLICY_FIELDS),
)
"""Spec fields a patch may change (labels and annotations too, under `metadata`)."""
_MUTABLE_META = ("metadata.labels", "metadata.annotations")
# Server-set metadata a patch may repeat but not change.
_READ_ONLY = ("metadata.resourceVersion",)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: `patch` applied to `target` (neither is changed)."""
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def changed_paths(before: Any, after: Any, prefix: str = "") -> Iterator[str]:
    """The dotted paths of every leaf (or subtree added or removed) that differs."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in sorted(set(before) | set(after), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in before or key not in after:
                yield path
            else:
                yield from changed_paths(before[key], after[key], path)
    elif before != after:
        yield prefix or "<root>"


def _leaves(obj: Any, prefix: str) -> Iterator[str]:
    if isinstance(obj, Mapping) and obj:
        for key, value in obj.items():
            yield from _leaves(value, f"{prefix}.{key}")
    else:
        yield prefix


def _allowed(path: str) -> bool:
    if any(path == m or path.startswith(m + ".") for m in _MUTABLE_META):
        return True
    return any(path == m or path.startswith(m + ".") for m in MUTABLE_FIELDS) or any(
        m.startswith(path + ".")
        for m in MUTABLE_FIELDS  # a whole schedulingPolicy/runPolicy added or removed
    )


def _added_or_removed_ok(path: str, before: Any, after: Any) -> list[str]:
    """For a subtree added or removed as a whole: the leaves in it that may not change."""
    node_b, node_a = before, after
    for part in path.split("."):
        node_b = node_b.get(part) if isinstance(node_b, Mapping) else None
        node_a = node_a.get(part) if isinstance(node_a, Mapping) else None
    side = node_a if node_a is not None else node_b
    if not isinstance(side, Mapping):
        return [] if _allowed(path) and any(path == m for m in MUTABLE_FIELDS) else [path]
    bad = []
    for leaf in _leaves(side, path):
        if not any(leaf == m or leaf.startswith(m + ".") for m in (*MUTABLE_FIELDS, *_MUTABLE_META)):
            bad.append(leaf)
    return bad


def patch_problems(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every change from `before` to `after` (job documents without status) that is not allowed."""
    problems: list[dict[str, str]] = []
    for path in changed_paths(before, after):
        if path in _READ_ONLY:
            continue
        if path.startswith("status"):
            problems.append({"field": path, "reason": "status is written by the operator, not by a patch"})
            continue
        if path in ("apiVersion", "kind") or (path.startswith("metadata.") and not _allowed(path)):
            problems.append({"field": path, "reason": f"{path} cannot be changed"})
            continue
        if not _allowed(path):
            problems.append({"field": path, "reason": f"{path} is immutable"})
            continue
        if not any(path == m or path.startswith(m + ".") for m in (*MUTABLE_FIELDS, *_MUTABLE_META)):
            problems += [
                {"field": leaf, "reason": f"{leaf} is immutable"}
                for leaf in _added_or_removed_ok(path, before, after)
            ]
    return problems
