"""Kubernetes label selectors: `app=web,tier!=db,env in (a,b),!legacy,gpu`.

`parse_selector` turns the string form (or a `matchLabels` dict) into a :class:`Selector`
whose `matches(labels)` is cheap enough to run per object in a list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Requirement", "Selector", "SelectorError", "parse_selector"]


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
