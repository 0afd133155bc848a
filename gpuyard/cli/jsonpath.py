"""kubectl's JSONPath templates for `-o jsonpath=...`, the subset people type.

Supported: text outside braces printed as it is; `{.a.b}` fields; `{.items[0]}`, `{.items[*]}`
and `{.items[-1]}` indexes; `{['key.with.dots']}` quoted keys; `{range .items[*]}...{end}`; the
string literals `{"\\n"}` and `{"\\t"}`; `{@}` the current object. Several values of one
expression print separated by spaces (as kubectl does); maps and lists print as JSON.

`render(template, data)` answers the text or raises :class:`JsonPathError` naming what it
could not read.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["JsonPathError", "parse", "render"]

_STEP = re.compile(r"\.([A-Za-z0-9_\-$/]+)|\[(\*|-?\d+)\]|\['([^']*)'\]|\[\"([^\"]*)\"\]")


class JsonPathError(ValueError):
    """A template that is not one kubectl would accept (or that this subset does not read)."""


def _tokens(template: str) -> list[tuple[str, str]]:
    """("text", s) and ("expr", s) pieces of the template."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(template):
        start = template.find("{", i)
        if start < 0:
            out.append(("text", template[i:]))
            break
        if start > i:
            out.append(("text", template[i:start]))
        end = template.find("}", start)
        if end < 0:
            raise JsonPathError(f"unclosed '{{' at character {start + 1} of {template!r}")
        out.append(("expr", template[start + 1 : end].strip()))
        i = end + 1
    return out


def _select(path: str, data: Any) -> list[Any]:
    """Every value `path` (`.a.b[*].c`, `@`) selects in `data`."""
    path = path.strip()
    if path in ("@", "", "."):
        return [data]
    if path.startswith("@"):
        path = path[1:]
    if path.startswith("$"):
        path = path[1:]
    values = [data]
    pos = 0
    while pos < len(path):
        m = _STEP.match(path, pos)
        if m is None:
            raise JsonPathError(f"cannot read {path[pos:]!r} in {{{path}}}")
        pos = m.end()
        key = m.group(1) or m.group(3) or m.group(4)
        index = m.group(2)
        nxt: list[Any] = []
        for v in values:
            if key is not None:
                if isinstance(v, dict) and key in v:
                    nxt.append(v[key])
            elif index == "*":
                nxt.extend(v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else [])
            elif isinstance(v, list):
                n = int(index or 0)
                if -len(v) <= n < len(v):
                    nxt.append(v[n])
        values = nxt
    return values


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def parse(template: str) -> list[tuple[str, str]]:
    """Check a template; answer its pieces (raises :class:`JsonPathError`)."""
    tokens = _tokens(template)
    depth = 0
    for kind, text in tokens:
        if kind == "expr" and text.startswith("range "):
            depth += 1
        elif kind == "expr" and text == "end":
            depth -= 1
            if depth < 0:
                raise JsonPathError(f"{{end}} without {{range}} in {template!r}")
    if depth:
        raise JsonPathError(f"{{range}} without {{end}} in {template!r}")
    return tokens


def _run(tokens: list[tuple[str, str]], data: Any) -> str:
    out: list[str] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "text":
            out.append(text)
        elif text.startswith("range "):
            depth, j = 1, i + 1
            while depth:
                k, t = tokens[j]
                depth += (
                    1 if k == "expr" and t.startswith("range ") else -1 if k == "expr" and t == "end" else 0
                )
                j += 1
            body = tokens[i + 1 : j - 1]
            for item in _select(text[len("range ") :], data):
                out.append(_run(body, item))
            i = j
            continue
        elif len(text) >= 2 and text[0] == text[-1] == '"':
            out.append(text[1:-1].replace("\\n", "\n").replace("\\t", "\t"))
        else:
            out.append(" ".join(_text(v) for v in _select(text, data)))
        i += 1
    return "".join(out)


def render(template: str, data: Any) -> str:
    """The template applied to `data` (kubectl's `-o jsonpath=TEMPLATE`)."""
    return _run(parse(template), data)
