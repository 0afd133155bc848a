"""Server-side apply (`PATCH` with `application/apply-patch+yaml`, `?fieldManager=NAME[&force=true]`)
and the `metadata.managedFields` it keeps, as a real API server does for the cases tests meet.

- An apply creates the object when it does not exist (201), else merges the applied configuration
  into it: maps merge key by key, lists and scalars are replaced whole (every list is atomic here;
  a real server merges the associative lists of built-in kinds, such as `containers`, by key).
- Each manager's fields are recorded in `managedFields` (`operation: Apply`, `fieldsType: FieldsV1`,
  `f:`-keyed sets). A field the applier owned before and leaves out now is removed from the object,
  unless another manager owns it too.
- A field the apply sets to another value than the live one, where another manager owns it, is a
  conflict: 409 `Apply failed with N conflict(s)`, one `FieldManagerConflict` cause per field, unless
  `force=true`, which moves the field to the applier.
- Other writes (PUT, merge/JSON/strategic PATCH) of an object that has `managedFields` record the fields
  they change under their manager (`fieldManager`, else the client's User-Agent up to its first `/`,
  `operation: Update`) and take them away from the others, so a later apply of another value conflicts.
  Objects never applied carry no `managedFields` (a real server records every write's manager).
- The main resource's apply never touches `status` of a kind with a status subresource; an apply to
  `/status` changes only `status` (`subresource: status` on its entry).
- `metadata.managedFields` in the applied configuration is a 400, and so is an apply without a
  `fieldManager` or without `apiVersion` and `kind`.
"""

from __future__ import annotations

import copy
from typing import Any

from gpuyard.testing.apiserver.errors import ApiError

__all__ = [
    "APPLY",
    "apply_configuration",
    "decode_fields",
    "encode_fields",
    "manager_from_user_agent",
    "record_update",
]

APPLY = "application/apply-patch+yaml"

FieldPath = tuple[str, ...]

# what no manager owns: the object's identity and what the server writes itself
_UNOWNED_META = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)


def manager_from_user_agent(user_agent: str) -> str:
    """The manager a real server names for a write without `fieldManager`: the User-Agent up to its
    first `/` (`kubectl/v1.32.4 (linux/amd64) ...` -> `kubectl`), at most 128 characters."""
    return (user_agent.split("/", 1)[0].strip() or "unknown")[:128]


def _leaves(value: Any, prefix: FieldPath = ()) -> set[FieldPath]:
    """The paths of the leaves of a JSON value: scalars, lists (atomic) and empty maps."""
    if isinstance(value, dict) and value:
        out: set[FieldPath] = set()
        for key, child in value.items():
            out |= _leaves(child, (*prefix, str(key)))
        return out
    return {prefix}


def _in_scope(path: FieldPath, *, status: bool, has_status: bool) -> bool:
    if not path or path[0] in ("apiVersion", "kind"):
        return False
    if path[0] == "metadata":
        return len(path) > 1 and path[1] not in _UNOWNED_META
    if status:
        return path[0] == "status"
    return not (has_status and path[0] == "status")


def _scoped(paths: set[FieldPath], *, status: bool, has_status: bool) -> set[FieldPath]:
    return {p for p in paths if _in_scope(p, status=status, has_status=has_status)}


def encode_fields(paths: set[FieldPath]) -> dict[str, Any]:
    """A FieldsV1 set: `{"f:spec": {"f:replicas": {}}}`."""
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return root


def decode_fields(fields: Any, prefix: FieldPath = ()) -> set[FieldPath]:
    """The paths of a FieldsV1 set. A field whose set names list items (`k:`, `v:`, `i:` keys, as a
    real server writes for associative lists) counts whole, as this server treats every list."""
    if not isinstance(fields, dict):
        return set()
    children = {k: v for k, v in fields.items() if k != "."}
    if not children:
        return {prefix} if prefix else set()
    if any(not k.startswith("f:") for k in children):
        return {prefix} if prefix else set()
    out: set[FieldPath] = set()
    for key, value in children.items():
        out |= decode_fields(value, (*prefix, key[2:]))
    return out


def _overlap(a: FieldPath, b: FieldPath) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


_MISSING = object()


def _get(obj: Any, path: FieldPath) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _remove(obj: dict[str, Any], path: FieldPath, keep: set[FieldPath]) -> None:
    """Remove `path` from `obj`, then the maps it leaves empty that nobody owns (`keep`)."""
    parents: list[tuple[dict[str, Any], str]] = []
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(key), dict):
            return
        parents.append((node, key))
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for depth in range(len(parents) - 1, -1, -1):
        parent, key = parents[depth]
        owned_here = (*path[:depth], key)
        if parent[key] == {} and not any(_overlap(owned_here, k) for k in keep):
            del parent[key]
        else:
            break


def _merge(live: Any, applied: Any) -> Any:
    if isinstance(live, dict) and isinstance(applied, dict):
        out = dict(live)
        for key, value in applied.items():
            out[key] = _merge(live.get(key), value)
        return out
    return copy.deepcopy(applied)


def _entries(obj: dict[str, Any] | None) -> list[dict[str, Any]]:
    found = ((obj or {}).get("metadata") or {}).get("managedFields") or []
    return [dict(e) for e in found if isinstance(e, dict)]


def _same_manager(entry: dict[str, Any], manager: str, operation: str, subresource: str) -> bool:
    return (
        entry.get("manager") == manager
        and entry.get("operation") == operation
        and (entry.get("subresource") or "") == subresource
    )


def _entry(
    manager: str, operation: str, api_version: str, now: str, subresource: str, paths: set[FieldPath]
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": now,
        "fieldsType": "FieldsV1",
        "fieldsV1": encode_fields(paths),
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def _conflict(conflicts: list[tuple[str, FieldPath]], api_version: str) -> ApiError:
    fields = [(manager, "." + ".".join(path)) for manager, path in conflicts]
    if len(fields) == 1:
        ((manager, field),) = fields
        message = f'Apply failed with 1 conflict: conflict with "{manager}" using {api_version}: {field}'
    else:
        lines = "".join(f'\n- conflict with "{m}" using {api_version}: {f}' for m, f in fields)
        message = f"Apply failed with {len(fields)} conflicts:{lines}"
    causes = [
        {"type": "FieldManagerConflict", "message": f'conflict with "{m}" using {api_version}', "field": f}
        for m, f in fields
    ]
    return ApiError(409, message, reason="Conflict", details={"causes": causes})


def apply_configuration(
    current: dict[str, Any] | None,
    config: Any,
    *,
    manager: str | None,
    force: bool,
    api_version: str,
    has_status: bool,
    status: bool,
    now: str,
) -> dict[str, Any]:
    """The object after `manager` applies `config` to `current` (None: it does not exist yet),
    `managedFields` included. Raises ApiError 400 for a bad request, 409 for conflicts."""
    if not manager:
        raise ApiError.bad_request("fieldManager is required for apply requests")
    if not isinstance(config, dict):
        raise ApiError.bad_request("an apply request's body must be an object (YAML or JSON)")
    if not config.get("apiVersion") or not config.get("kind"):
        raise ApiError.bad_request("apiVersion and kind must be set in an apply request's object")
    meta = config.get("metadata")
    if isinstance(meta, dict) and meta.get("managedFields") is not None:
        raise ApiError.bad_request("metadata.managedFields must be nil")
    subresource = "status" if status else ""
    applied = _scoped(_leaves(config), status=status, has_status=has_status)
    config = copy.deepcopy(config)
    if status:
        config = {k: v for k, v in config.items() if k in ("apiVersion", "kind", "metadata", "status")}
    elif has_status:
        config.pop("status", None)
    mine_new = _entry(manager, "Apply", api_version, now, subresource, applied)
    if current is None:
        new: dict[str, Any] = copy.deepcopy(config)
        new.setdefault("metadata", {})["managedFields"] = [mine_new]
        return new

    entries = _entries(current)
    mine_at = next(
        (i for i, e in enumerate(entries) if _same_manager(e, manager, "Apply", subresource)), None
    )
    previous = decode_fields(entries[mine_at].get("fieldsV1")) if mine_at is not None else set()
    others: list[tuple[int, dict[str, Any], set[FieldPath]]] = [
        (i, e, decode_fields(e.get("fieldsV1"))) for i, e in enumerate(entries) if i != mine_at
    ]
    conflicts: list[tuple[str, FieldPath]] = []
    contested: dict[int, set[FieldPath]] = {}  # per other entry: the applied paths it conflicts on
    for i, entry, owned in others:
        if entry.get("manager") == manager:
            continue  # the applier's own Update entry: no conflict with itself
        for path in sorted(applied):
            if _get(current, path) != _get(config, path) and any(_overlap(path, q) for q in owned):
                conflicts.append((str(entry.get("manager", "")), path))
                contested.setdefault(i, set()).add(path)
    if conflicts and not force:
        raise _conflict(conflicts, api_version)
    # forced: the contested fields move to the applier; a field applied with the live value is shared
    kept_others: list[tuple[int, dict[str, Any], set[FieldPath]]] = []
    for i, entry, owned in others:
        lost = contested.get(i, set())
        left = {q for q in owned if not any(_overlap(q, p) for p in lost)}
        if left == owned:
            kept_others.append((i, entry, owned))
        elif left:
            kept_others.append((i, {**entry, "fieldsV1": encode_fields(left)}, left))
    still_owned = set(applied).union(*(owned for _, _, owned in kept_others))

    obj: dict[str, Any] = copy.deepcopy(current)
    for path in sorted(previous - applied, key=len, reverse=True):
        if not any(_overlap(path, q) for q in still_owned):
            _remove(obj, path, still_owned)
    obj = dict(_merge(obj, {k: v for k, v in config.items() if k != "metadata"}))
    obj["metadata"] = _merge(
        obj.get("metadata") or {},
        {k: v for k, v in (config.get("metadata") or {}).items() if k not in _UNOWNED_META},
    )
    if mine_at is not None and previous == applied:
        mine_new["time"] = entries[mine_at].get("time", now)  # nothing new is owned: no new version
    by_index = {i: e for i, e, _ in kept_others}
    order = sorted([*by_index, *([mine_at] if mine_at is not None else [])])
    out = [mine_new if i == mine_at else by_index[i] for i in order]
    if mine_at is None:
        out.append(mine_new)
    obj["metadata"]["managedFields"] = out
    return obj


def record_update(
    current: dict[str, Any],
    new: dict[str, Any],
    *,
    manager: str | None,
    api_version: str,
    has_status: bool,
    status: bool,
    now: str,
) -> None:
    """Set `new`'s `managedFields` after a write that is not an apply: the request's own list when it
    sent one, else the stored one with the fields this write changed moved to `manager`'s Update
    entry (only for objects that have `managedFields`, and only when the manager is known)."""
    meta = new.setdefault("metadata", {})
    if not isinstance(meta, dict) or ("managedFields" in meta and meta["managedFields"] != _entries(current)):
        return  # the request set managedFields itself ([] clears them, as on a real server)
    entries = _entries(current)
    if not entries:
        meta.pop("managedFields", None)
        return
    meta["managedFields"] = entries
    if not manager:
        return
    both = _scoped(_leaves(current) | _leaves(new), status=status, has_status=has_status)
    differs = {p for p in both if _get(current, p) != _get(new, p)}
    changed = {p for p in differs if _get(new, p) is not _MISSING}  # set: now this manager's
    if not differs:
        return
    subresource = "status" if status else ""
    out: list[dict[str, Any]] = []
    mine: set[FieldPath] = set()
    for entry in entries:
        owned = decode_fields(entry.get("fieldsV1"))
        if _same_manager(entry, manager, "Update", subresource):
            mine = owned
            continue
        left = {q for q in owned if not any(_overlap(q, p) for p in differs)}  # set or removed
        if left:
            out.append(entry if left == owned else {**entry, "fieldsV1": encode_fields(left)})
    mine = {q for q in mine if not any(_overlap(q, p) for p in differs)} | changed
    if mine:
        out.append(_entry(manager, "Update", api_version, now, subresource, mine))
    meta["managedFields"] = out
