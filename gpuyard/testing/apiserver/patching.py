"""The PATCH flavours the test API server accepts: JSON merge patch (RFC 7386), JSON patch (RFC 6902)
and strategic merge patch, treated as a merge patch whose lists replace the stored ones (the
`$`-directives kubectl adds, such as `$setElementOrder/containers`, are dropped); custom resources
refuse strategic merge patches with a 415, as on a real server. Server-side apply
(`application/apply-patch+yaml`) is not a patch of the stored object: `applying.py` answers it.
"""

from __future__ import annotations

import copy
from typing import Any

from gpuyard.testing.apiserver.errors import ApiError

__all__ = ["JSON_PATCH", "MERGE", "STRATEGIC", "apply_patch"]

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def merge_patch(target: Any, patch: Any, *, strategic: bool = False) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if strategic and key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value, strategic=strategic)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError.bad_request(f"json patch: path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    cur = doc
    for part in parts[:-1]:
        try:
            cur = cur[int(part)] if isinstance(cur, list) else cur[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, f"json patch: path {path!r} does not exist", reason="Invalid") from None
    if not parts:
        raise ApiError(422, "json patch: the document root cannot be changed", reason="Invalid")
    return cur, parts[-1]


def _get(doc: Any, path: str) -> Any:
    cur = doc
    for part in _pointer(path):
        try:
            cur = cur[int(part)] if isinstance(cur, list) else cur[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, f"json patch: path {path!r} does not exist", reason="Invalid") from None
    return cur


def _remove(doc: Any, path: str) -> Any:
    parent, last = _parent(doc, _pointer(path), path)
    try:
        return parent.pop(int(last)) if isinstance(parent, list) else parent.pop(last)
    except (KeyError, IndexError, ValueError):
        raise ApiError(422, f"json patch: path {path!r} does not exist", reason="Invalid") from None


def _add(doc: Any, path: str, value: Any, *, replace: bool = False) -> None:
    parent, last = _parent(doc, _pointer(path), path)
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
            return
        try:
            index = int(last)
        except ValueError:
            raise ApiError(
                422, f"json patch: {path!r}: {last!r} is not a list index", reason="Invalid"
            ) from None
        if replace:
            if not 0 <= index < len(parent):
                raise ApiError(422, f"json patch: path {path!r} does not exist", reason="Invalid")
            parent[index] = value
        elif 0 <= index <= len(parent):
            parent.insert(index, value)
        else:
            raise ApiError(422, f"json patch: index of {path!r} is out of range", reason="Invalid")
    elif isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, f"json patch: path {path!r} does not exist", reason="Invalid")
        parent[last] = value
    else:
        raise ApiError(
            422, f"json patch: the parent of {path!r} is not an object or a list", reason="Invalid"
        )


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise ApiError.bad_request("json patch: the body must be a JSON list of operations")
    doc = copy.deepcopy(target)
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError.bad_request(f"json patch: operation {i} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind == "add":
            _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "replace":
            _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "move":
            _add(doc, path, _remove(doc, op.get("from", "")))
        elif kind == "copy":
            _add(doc, path, copy.deepcopy(_get(doc, op.get("from", ""))))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(422, f"json patch: test of {path!r} failed", reason="Invalid")
        else:
            raise ApiError.bad_request(
                f"json patch: operation {i}: op {kind!r} is not one of add, remove, replace, move, copy, test"
            )
    return doc


def apply_patch(
    target: dict[str, Any], patch: Any, *, content_type: str, strategic_ok: bool = True
) -> dict[str, Any]:
    """The object after the patch; 415 for a content type other than the three above, and for a
    strategic merge patch where it is not `strategic_ok` (custom resources, as on a real server)."""
    media = content_type.split(";")[0].strip().lower()
    if media == STRATEGIC and not strategic_ok:
        raise ApiError(
            415,
            "the body of the request was in an unknown format - accepted media types include: "
            f"{JSON_PATCH}, {MERGE} (strategic merge patch is not supported for custom resources)",
            reason="UnsupportedMediaType",
        )
    if media == MERGE:
        out = merge_patch(target, patch)
    elif media == STRATEGIC:
        out = merge_patch(target, patch, strategic=True)
    elif media == JSON_PATCH:
        out = json_patch(target, patch)
    else:
        raise ApiError(
            415,
            "the body of the request was in an unknown format - accepted media types include: "
            f"{JSON_PATCH}, {MERGE}, {STRATEGIC}, application/apply-patch+yaml",
            reason="UnsupportedMediaType",
        )
    if not isinstance(out, dict):
        raise ApiError(422, "the patched object is not a JSON object", reason="Invalid")
    return out
