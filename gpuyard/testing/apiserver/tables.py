"""Server-side printing (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), what `kubectl get`
asks for: a `meta.k8s.io/v1 Table` whose columns are NAME, the CRD's `additionalPrinterColumns` (or a
few built-in ones for pods and nodes) and AGE. Printer-column JSONPaths support the forms CRDs use:
`.a.b`, `.a[0].b`, `.a[-1:].b`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from gpuyard.testing.apiserver.catalog import Resource

__all__ = ["human_age", "jsonpath", "table", "wants_table"]

_BUILTIN_COLUMNS: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("", "pods"): [
        {"name": "Status", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName"},
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
    value = jsonpath(obj, column.get("jsonPath", ""))
    if column.get("type") == "date":
        return human_age(value) if isinstance(value, str) else "<unknown>"
    if value is None:
        return "<none>" if column.get("name") in ("Node", "Holder") else ""
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
