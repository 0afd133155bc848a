"""Label and field selectors, as LIST and WATCH take them (`?labelSelector=...&fieldSelector=...`).

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x,y)`, `a` (exists), `!a` (absent),
joined by commas. Field selectors: `path=value`, `path==value`, `path!=value` on any dotted path of the
object (`metadata.name`, `metadata.namespace`, `spec.nodeName`, `status.phase`, `involvedObject.uid`,
...); a missing field compares as the empty string. A malformed selector is a 400 naming it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpuyard.testing.apiserver.errors import ApiError

__all__ = ["Matcher", "field_selector", "label_selector"]

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


def field_selector(text: str | None) -> Matcher | None:
    """A predicate over objects for a field selector; None for an empty one."""
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
        requirements.append((path, op != "!=", value))

    def match(obj: dict[str, Any]) -> bool:
        return all((field_value(obj, path) == value) is equal for path, equal, value in requirements)

    return match
