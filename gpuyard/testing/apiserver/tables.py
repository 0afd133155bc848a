"""Server-side printing (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), what `kubectl get`
asks for: a `meta.k8s.io/v1 Table` whose columns are NAME, the CRD's `additionalPrinterColumns` (or a
few built-in ones: for pods READY, STATUS, RESTARTS, AGE and, with `-o wide`, IP and NODE; for nodes
STATUS, ROLES, AGE, VERSION, as kubectl prints them) and AGE. Printer-column JSONPaths support the forms CRDs use:
`.a.b`, `.a[0].b`, `.a[-1:].b`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from gpuyard.testing.apiserver.catalog import Resource

__all__ = ["human_age", "jsonpath", "table", "wants_table"]


def _node_status(obj: dict[str, Any]) -> str:
    """kubectl's node STATUS: the Ready condition, plus `SchedulingDisabled` when cordoned."""
    conds = (obj.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conds if isinstance(c, dict) and c.get("type") == "Ready"), None)
    text = {"True": "Ready", "False": "NotReady"}.get(str(ready), "Unknown")
    if (obj.get("spec") or {}).get("unschedulable"):
        text += ",SchedulingDisabled"
    return text


def _node_roles(obj: dict[str, Any]) -> str:
    """kubectl's node ROLES: `node-role.kubernetes.io/<role>` labels (and `kubernetes.io/role`)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    roles = {
        k.removeprefix("node-role.kubernetes.io/") for k in labels if k.startswith("node-role.kubernetes.io/")
    }
    if labels.get("kubernetes.io/role"):
        roles.add(str(labels["kubernetes.io/role"]))
    roles.discard("")
    return ",".join(sorted(roles)) or "<none>"


def _pod_ready(obj: dict[str, Any]) -> str:
    """kubectl's pod READY: ready containers / containers."""
    total = len((obj.get("spec") or {}).get("containers") or [])
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    ready = sum(1 for c in statuses if isinstance(c, dict) and c.get("ready"))
    return f"{ready}/{total}"


def _pod_status(obj: dict[str, Any]) -> str:
    """kubectl's pod STATUS: Terminating, a container's waiting/terminated reason, the pod's
    reason, else its phase."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    status = obj.get("status") or {}
    text = str(status.get("reason") or status.get("phase") or "Pending")
    for c in status.get("containerStatuses") or []:
        state = (c.get("state") or {}) if isinstance(c, dict) else {}
        for key in ("waiting", "terminated"):
            reason = (state.get(key) or {}).get("reason")
            if reason:
                text = str(reason)
    return text


def _pod_restarts(obj: dict[str, Any]) -> int:
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    return sum(int(c.get("restartCount") or 0) for c in statuses if isinstance(c, dict))


_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
# kubectl's own columns for built-in kinds (`compute`: a cell no JSONPath can express); priority 1
# columns are shown by `kubectl get -o wide` only.
_BUILTIN_COLUMNS: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("", "pods"): [
        {"name": "Ready", "type": "string", "compute": _pod_ready},
        {"name": "Status", "type": "string", "compute": _pod_status},
        {"name": "Restarts", "type": "integer", "compute": _pod_restarts},
        _AGE,
        {"name": "IP", "type": "string", "jsonPath": ".status.podIP", "priority": 1},
        {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName", "priority": 1},
    ],
    ("", "nodes"): [
        {"name": "Status", "type": "string", "compute": _node_status},
        {"name": "Roles", "type": "string", "compute": _node_roles},
        _AGE,
        {"name": "Version", "type": "string", "jsonPath": ".status.nodeInfo.kubeletVersion"},
    ],
    ("", "namespaces"): [{"name": "Status", "type": "string", "jsonPath": ".status.phase"}],
    ("", "events"): [
        {"name": "Type", "type": "string", "jsonPath": ".type"},
        {"name": "Reason", "type": "string", "jsonPath": ".reason"},
        {"name": "Object", "type": "string", "jsonPath": ".involvedObject.name"},
        {"name": "Message", "type": "string", "jsonPath": ".message"},
    ],
    ("coordination.k8s.io", "leases"): [
        {"name": "Holder", "type": "string", "jsonPath": ".spec.holderIdentity"}
    ],
}
_STEP = re.compile(r"\.([A-Za-z0-9_\-]+)|\[(-?\d+)(:?)\]")


def wants_table(accept: str) -> bool:
    first = accept.split(",")[0].replace(" ", "")
    return "as=Table" in first


def jsonpath(obj: Any, path: str) -> Any:
    """The value at a simple JSONPath (None when absent)."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    cur = obj
    pos = 0
    while pos < len(text) and cur is not None:
        m = _STEP.match(text, pos)
        if m is None:
            return None
        pos = m.end()
        if m.group(1) is not None:
            cur = cur.get(m.group(1)) if isinstance(cur, dict) else None
        elif isinstance(cur, list) and cur:
            index = int(m.group(2))
            try:
                cur = cur[index]
            except IndexError:
                return None
        else:
            return None
    return cur


def human_age(timestamp: str | None, now: datetime | None = None) -> str:
    """Kubernetes' short age: 45s, 3m20s, 5h, 2d..."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    secs = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    if secs < 120:
        return f"{secs}s"
    mins = secs // 60
    if mins < 10:
        return f"{mins}m{secs % 60}s" if secs % 60 else f"{mins}m"
    if mins < 180:
        return f"{mins}m"
    hours = mins // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def _cell(column: dict[str, Any], obj: dict[str, Any]) -> Any:
    compute = column.get("compute")
    if compute is not None:
        return compute(obj)
    value = jsonpath(obj, column.get("jsonPath", ""))
    if column.get("type") == "date":
        return human_age(value) if isinstance(value, str) else "<unknown>"
    if value is None:
        return "<none>" if column.get("name") in ("Node", "Holder", "IP") else ""
    return value if isinstance(value, (int, float, str, bool)) else str(value)


def table(
    res: Resource,
    objs: list[dict[str, Any]],
    *,
    metadata: dict[str, Any] | None = None,
    include_object: str = "Metadata",
) -> dict[str, Any]:
    """A Table of `objs` with `res`'s columns."""
    extra = list(res.printer_columns) or _BUILTIN_COLUMNS.get(res.key, [])
    columns = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": "Name of the object",
            "priority": 0,
        }
    ]
    columns += [
        {
            "name": c.get("name", ""),
            "type": "string" if c.get("type") == "date" else c.get("type", "string"),
            "format": "",
            "description": c.get("description", ""),
            "priority": int(c.get("priority", 0)),
        }
        for c in extra
    ]
    has_age = any(c.get("jsonPath") == ".metadata.creationTimestamp" for c in extra)
    if not has_age:
        columns.append({"name": "Age", "type": "string", "format": "", "description": "", "priority": 0})
    rows = []
    for obj in objs:
        meta = obj.get("metadata") or {}
        cells = [meta.get("name", ""), *(_cell(c, obj) for c in extra)]
        if not has_age:
            cells.append(human_age(meta.get("creationTimestamp")))
        row: dict[str, Any] = {"cells": cells}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": meta,
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata or {},
        "columnDefinitions": columns,
        "rows": rows,
    }
