"""Kubernetes labels: selectors (`app=web,tier!=db,env in (a,b),!legacy,gpu`) and the syntax of
label and annotation keys and values.

`parse_selector` turns the string form (or a `matchLabels` dict) into a :class:`Selector`
whose `matches(labels)` is cheap enough to run per object in a list. :func:`label_problems` and
:func:`annotation_problems` check labels and annotations as the API server does
(`IsQualifiedName`, `IsValidLabelValue`, 256 KiB of annotations), returning 422 details that
name the field and the rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "MAX_ANNOTATIONS_BYTES",
    "Requirement",
    "Selector",
    "SelectorError",
    "annotation_problems",
    "label_problems",
    "parse_selector",
    "qualified_name_problem",
]


class SelectorError(ValueError):
    """A label selector that does not parse."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.op
        if op == "=":
            return labels.get(self.key) in self.values
        if op == "!=":
            return labels.get(self.key) not in self.values
        if op == "in":
            return labels.get(self.key) in self.values
        if op == "notin":
            return labels.get(self.key) not in self.values
        if op == "exists":
            return self.key in labels
        return self.key not in labels


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...] = field(default_factory=tuple)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def equalities(self) -> dict[str, str]:
        """The `key=value` requirements: the store answers these from its label index."""
        return {r.key: next(iter(r.values)) for r in self.requirements if r.op == "=" and len(r.values) == 1}

    def __bool__(self) -> bool:
        return bool(self.requirements)


_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


def _split(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def parse_selector(selector: str | Mapping[str, str] | Selector | None) -> Selector:
    """Parse a selector string or an equality dict; `None`/empty selects everything."""
    if selector is None:
        return Selector()
    if isinstance(selector, Selector):
        return selector
    if isinstance(selector, Mapping):
        return Selector(tuple(Requirement(k, "=", frozenset([v])) for k, v in selector.items()))
    reqs: list[Requirement] = []
    for part in _split(selector):
        if m := _SET_RE.match(part):
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            reqs.append(Requirement(m["key"], m["op"], values))
        elif m := _EQ_RE.match(part):
            reqs.append(Requirement(m["key"], "!=" if m["op"] == "!=" else "=", frozenset([m["value"]])))
        elif m := _EXISTS_RE.match(part):
            reqs.append(Requirement(m["key"], "!exists" if m["neg"] else "exists"))
        else:
            raise SelectorError(
                f"cannot parse {part.strip()!r}; allowed: key=value, key!=value, key in (a,b), key notin (a,b), key, !key"
            )
    return Selector(tuple(reqs))


# --- label and annotation syntax (k8s.io/apimachinery/pkg/util/validation) ----------------------

MAX_ANNOTATIONS_BYTES = 256 * 1024
"""The most bytes a object's annotations may hold, keys and values together (`TotalAnnotationSizeLimitB`)."""
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_RULE = (
    "an optional DNS subdomain prefix (at most 253 characters) and '/', then a name of at most 63 "
    "characters: letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
)
_VALUE_RULE = (
    "at most 63 characters: empty, or letters, digits, '-', '_' and '.', starting and ending with a "
    "letter or digit"
)


def qualified_name_problem(key: object) -> str | None:
    """Why `key` is not a Kubernetes qualified name (a label or annotation key), or None."""
    if not isinstance(key, str):
        return f"{key!r} is not a string; keys are {_QUALIFIED_RULE}"
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return f"prefix {prefix[:64]!r}: must be a DNS subdomain (lower case, at most 253 characters)"
    if not name or len(name) > 63 or not _NAME_PART.match(name):
        return f"{key[:80]!r}: keys are {_QUALIFIED_RULE}"
    return None


def _value_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return f"{value!r} is not a string (quote it)"
    if value and (len(value) > 63 or not _NAME_PART.match(value)):
        shown = value if len(value) <= 70 else f"{value[:40]}...({len(value)} characters)"
        return f"{shown!r}: values are {_VALUE_RULE}"
    return None


def label_problems(labels: object, *, field: str) -> list[dict[str, str]]:
    """422 details for the labels at `field` (e.g. `metadata.labels`) that Kubernetes refuses."""
    if labels is None:
        return []
    if not isinstance(labels, Mapping):
        return [{"field": field, "reason": "must be a mapping of key to value"}]
    out = []
    for key, value in labels.items():
        problem = qualified_name_problem(key) or _value_problem(value)
        if problem is not None:
            out.append({"field": f"{field}.{key}", "reason": problem})
    return out


def annotation_problems(annotations: object, *, field: str) -> list[dict[str, str]]:
    """422 details for the annotations at `field`: keys are qualified names, values strings, and
    all of them together at most 256 KiB."""
    if annotations is None:
        return []
    if not isinstance(annotations, Mapping):
        return [{"field": field, "reason": "must be a mapping of key to value"}]
    out = []
    total = 0
    for key, value in annotations.items():
        problem = qualified_name_problem(key)
        if problem is None and not isinstance(value, str):
            problem = f"{value!r} is not a string (quote it)"
        if problem is not None:
            out.append({"field": f"{field}.{key}", "reason": problem})
            continue
        total += len(str(key).encode()) + len(value.encode())
    if total > MAX_ANNOTATIONS_BYTES:
        out.append(
            {
                "field": field,
                "reason": f"{total} bytes; annotations may hold at most {MAX_ANNOTATIONS_BYTES} bytes "
                "(256 KiB), keys and values together",
            }
        )
    return out
