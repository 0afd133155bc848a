"""Label and field selectors, as LIST and WATCH take them (`?labelSelector=...&fieldSelector=...`).

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x,y)`, `a` (exists), `!a` (absent),
joined by commas. Field selectors: `path=value`, `path==value`, `path!=value` on the field labels a real
API server supports for the resource (`metadata.name`, `metadata.namespace` everywhere; pods'
`spec.nodeName`, `status.phase`, ...; events' `involvedObject.*`; a CRD's `selectableFields`); a missing
field compares as the empty string, an unsupported one is a 400. A malformed selector is a 400 naming it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpuyard.testing.apiserver.errors import ApiError

__all__ = ["BUILTIN_FIELDS", "Matcher", "field_selector", "label_selector"]

Matcher = Callable[[dict[str, Any]], bool]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_TERM = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")
_EQ_TERM = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|!=|=)\s*(?P<value>{_VALUE})\s*$")
_EXISTS_TERM = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


def _split_terms(text: str) -> list[str]:
    """Split at the commas outside parentheses."""
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _label_holds(op: str, key: str, values: frozenset[str], labels: dict[str, str]) -> bool:
    if op == "in":
        return labels.get(key) in values
    if op == "notin":
        return labels.get(key) not in values
    if op == "!=":
        return labels.get(key) not in values
    if op == "exists":
        return key in labels
    if op == "!":
        return key not in labels
    return labels.get(key) in values  # = and ==


def label_selector(text: str | None) -> Matcher | None:
    """A predicate over objects for a label selector; None for an empty one."""
    if not text or not text.strip():
        return None
    requirements: list[tuple[str, str, frozenset[str]]] = []
    for term in _split_terms(text):
        if m := _SET_TERM.match(term):
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            requirements.append((m["op"], m["key"], values))
        elif m := _EQ_TERM.match(term):
            requirements.append((m["op"], m["key"], frozenset({m["value"]})))
        elif m := _EXISTS_TERM.match(term):
            requirements.append(("!" if m["neg"] else "exists", m["key"], frozenset()))
        else:
            raise ApiError.bad_request(
                f"unable to parse requirement: labelSelector term {term.strip()!r}: expected key, !key, "
                "key=value, key==value, key!=value, key in (v1,v2) or key notin (v1,v2)"
            )

    def match(obj: dict[str, Any]) -> bool:
        labels = _labels(obj)
        return all(_label_holds(op, key, values, labels) for op, key, values in requirements)

    return match


def field_value(obj: dict[str, Any], path: str) -> str:
    """The value at a dotted path as a string ('' when absent)."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


_COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
# the field labels a real API server accepts per built-in resource, (group, plural) -> fields
BUILTIN_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    ("", "events"): frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("", "secrets"): frozenset({"type"}),
    ("", "replicationcontrollers"): frozenset({"status.replicas"}),
    ("apps", "replicasets"): frozenset({"status.replicas"}),
    ("batch", "jobs"): frozenset({"status.successful"}),
    ("resource.k8s.io", "resourceslices"): frozenset({"spec.nodeName", "spec.driver"}),
    ("events.k8s.io", "events"): frozenset(
        {"regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid", "reason", "type"}
    ),
}


def field_selector(text: str | None, *, allowed: frozenset[str] = frozenset()) -> Matcher | None:
    """A predicate over objects for a field selector; None for an empty one. A field other than
    `metadata.name`, `metadata.namespace` and `allowed` is a 400, as on a real server."""
    if not text or not text.strip():
        return None
    requirements: list[tuple[str, bool, str]] = []
    for term in _split_terms(text):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if m is None:
            raise ApiError.bad_request(
                f"invalid fieldSelector term {term.strip()!r}: expected path=value, path==value or path!=value"
            )
        path, op, value = m.groups()
        if path not in _COMMON_FIELDS and path not in allowed:
            raise ApiError.bad_request(
                f"field label not supported: {path} (this resource supports: {', '.join(sorted(_COMMON_FIELDS | allowed))})"
            )
        requirements.append((path, op != "!=", value))

    def match(obj: dict[str, Any]) -> bool:
        return all((field_value(obj, path) == value) is equal for path, equal, value in requirements)

    return match
