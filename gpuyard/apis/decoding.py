"""Bounded decoding of YAML and JSON documents from untrusted input.

Every body the API reads (and every file the CLI reads) goes through these functions. YAML is
read with libyaml's C loader where PyYAML has it (the pure-Python loader otherwise), after one
cheap pass over the parse events (:func:`_check_events`) that refuses, before anything is
composed or constructed:

* nesting deeper than :data:`MAX_DEPTH` (a deep document would otherwise exhaust the
  interpreter's stack: a `RecursionError`, a 500), aliases included;
* more than :data:`MAX_NODES` nodes (scalars, mappings, lists, aliases) in the whole body: a
  flat mapping of 350,000 keys is refused after its first 25,000 keys, in a fraction of a second;
* more than :data:`MAX_MERGE_KEYS` merge keys (`<<`), whose flattening is quadratic;
* a document whose aliases expand beyond ``max_bytes`` (a kilobyte of nested aliases expands
  to hundreds of megabytes: the body limit applies to the *expanded* document), and an alias
  to a node that contains it;
* an integer outside int64 (what Kubernetes reads), including one too long for Python to
  convert (more than 4,300 digits), naming the field that holds it;
* a pass taking longer than ``deadline_s`` seconds.

JSON is parsed by the C parser, then walked once for the same depth, node and integer limits;
a body that may hold more values than :data:`MAX_NODES` is counted first with a scan that
stops at the limit (the C parser holds the interpreter's lock until it is done).
All of these raise :class:`DocumentLimitError`, which carries the HTTP status (422, or 413 for
size) and names the limit. Syntax errors are raised as before (`yaml.YAMLError`,
`json.JSONDecodeError`). The functions are synchronous and hold no state: the API calls them
off the event loop (`platform.api.bodies`), in a worker process for a body over 256 KiB
(`platform.api.decoders`: a parse there never holds the server's interpreter lock) and in a
thread for a smaller one.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingStartEvent,
    ScalarEvent,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_DEPTH",
    "MAX_MERGE_KEYS",
    "MAX_NODES",
    "DocumentLimitError",
    "json_loads",
    "yaml_load",
    "yaml_load_all",
]

MAX_DEPTH = 64
"""The deepest nesting of mappings and lists a document may have."""

MAX_NODES = 50_000
"""The most nodes (scalars, mappings, lists, aliases) a body may have, all documents together."""

MAX_MERGE_KEYS = 1_000
"""The most merge keys (`<<: *anchor`) a body may have."""

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
"""The expanded size a YAML document may have when the caller names no limit (the server's
default `server.max_body_bytes`)."""

DEFAULT_DEADLINE_S = 10.0
"""How long one decoding may take before it is given up."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_INT_RULE = f"integers: {INT64_MIN}..{INT64_MAX} (int64, as Kubernetes reads them)"

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT_TAG = "tag:yaml.org,2002:int"
# YAML 1.1's int (as PyYAML resolves a plain scalar), and the merge key.
_YAML_INT = re.compile(
    r"""^(?:[-+]?0b[0-1_]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+
    |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$""",
    re.X,
)
_LONGEST_INT_TEXT = 100  # longer (underscores and signs aside) is never an int64


class DocumentLimitError(ValueError):
    """A document beyond a decoding limit; `status` is the HTTP answer (413 or 422)."""

    def __init__(self, status: int, message: str, reason: str, *, field: str = "<body>") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = [{"field": field, "reason": reason}]


def _too_deep() -> DocumentLimitError:
    return DocumentLimitError(
        422,
        f"the document is nested more than {MAX_DEPTH} levels deep",
        f"nesting depth: at most {MAX_DEPTH} levels of mappings and lists",
    )


def _too_large(max_bytes: int, limit_name: str) -> DocumentLimitError:
    return DocumentLimitError(
        413,
        f"the document expands (aliases included) to more than {max_bytes} bytes",
        f"expanded size: at most {max_bytes} bytes ({limit_name}), aliases expanded",
    )


def _too_many_nodes() -> DocumentLimitError:
    return DocumentLimitError(
        422,
        f"the body has more than {MAX_NODES} nodes",
        f"node count: at most {MAX_NODES} scalars, mappings, lists and aliases in a body",
    )


def _too_many_merges() -> DocumentLimitError:
    return DocumentLimitError(
        422,
        f"the body has more than {MAX_MERGE_KEYS} merge keys",
        f"merge keys: at most {MAX_MERGE_KEYS} '<<' keys in a body",
    )


def _too_slow(deadline_s: float) -> DocumentLimitError:
    return DocumentLimitError(
        422,
        f"decoding the body took more than {deadline_s:g} s",
        f"decoding time: at most {deadline_s:g} s",
    )


def _bad_int(field: str, text: str) -> DocumentLimitError:
    shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"
    return DocumentLimitError(
        422, f"{field or '<root>'}: the integer {shown} is out of range", _INT_RULE, field=field or "<root>"
    )


def _yaml_int(text: str) -> int | None:
    """The value of a YAML 1.1 int literal, or None when it is not an int64 (or too long to read)."""
    digits = text.replace("_", "")
    if len(digits) > _LONGEST_INT_TEXT:
        return None
    sign = -1 if digits.startswith("-") else 1
    digits = digits.lstrip("+-")
    if ":" in digits:
        value = 0
        for part in digits.split(":"):
            value = value * 60 + int(part)
    elif digits.startswith("0b"):
        value = int(digits[2:], 2)
    elif digits.startswith("0x"):
        value = int(digits[2:], 16)
    elif len(digits) > 1 and digits.startswith("0"):
        value = int(digits, 8)
    else:
        value = int(digits)
    value *= sign
    return value if INT64_MIN <= value <= INT64_MAX else None


class _Frame:
    """An open mapping or list while walking the events."""

    __slots__ = ("anchor", "depth", "index", "key", "mapping", "size", "want_key")

    def __init__(self, *, mapping: bool, anchor: str | None) -> None:
        self.mapping = mapping
        self.anchor = anchor
        self.size = 1
        self.depth = 0  # the deepest nesting below this node, aliases expanded
        self.index = 0  # the next item's index in a list
        self.key = "?"  # the current key's text in a mapping
        self.want_key = True


def _path(stack: list[_Frame], prefix: str) -> str:
    parts = [f.key if f.mapping else str(f.index) for f in stack]
    return prefix + ".".join(parts)


def _check_events(text: str, *, max_bytes: int, deadline_s: float, limit_name: str) -> int:
    """Walk the parse events of a YAML stream and enforce every limit; the number of documents."""
    try:
        return _walk_events(text, max_bytes=max_bytes, deadline_s=deadline_s, limit_name=limit_name)
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(getattr(exc, "problem", "")):  # libyaml's own guard (1000)
            raise _too_deep() from None
        raise


def _walk_events(text: str, *, max_bytes: int, deadline_s: float, limit_name: str) -> int:
    started = time.monotonic()
    nodes = merges = documents = 0
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (expanded size, depth)
    stack: list[_Frame] = []
    doc_size = 0
    prefix = ""
    for count, event in enumerate(yaml.parse(text, Loader=_Loader)):
        if count & 0xFFF == 0 and time.monotonic() - started > deadline_s:
            raise _too_slow(deadline_s)
        if isinstance(event, DocumentStartEvent):
            documents += 1
            prefix = f"documents[{documents - 1}]." if documents > 1 else ""
            doc_size = 0
            anchors.clear()  # anchors are per document
            continue
        if isinstance(event, DocumentEndEvent):
            continue
        size = depth = 0
        done = False
        if isinstance(event, CollectionStartEvent):
            nodes += 1
            if len(stack) >= MAX_DEPTH:
                raise _too_deep()
            if stack and stack[-1].mapping and stack[-1].want_key:
                stack[-1].key = "?"  # a complex key
            stack.append(_Frame(mapping=isinstance(event, MappingStartEvent), anchor=event.anchor))
            continue
        if isinstance(event, CollectionEndEvent):
            frame = stack.pop()
            size, depth = frame.size, frame.depth + 1
            if frame.anchor is not None:
                anchors[frame.anchor] = (size, depth)
            done = True
        elif isinstance(event, ScalarEvent):
            nodes += 1
            value = event.value
            size = max(len(value), 1)
            parent = stack[-1] if stack else None
            plain = event.implicit[0] and not event.style  # libyaml says '' for plain, PyYAML None
            if parent is not None and parent.mapping and parent.want_key:
                parent.key = value
                if plain and value == "<<":
                    merges += 1
                    if merges > MAX_MERGE_KEYS:
                        raise _too_many_merges()
            elif (plain or event.tag == _INT_TAG) and _YAML_INT.match(value) and _yaml_int(value) is None:
                raise _bad_int(_path(stack, prefix), value)
            if event.anchor is not None:
                anchors[event.anchor] = (size, 0)
            done = True
        elif isinstance(event, AliasEvent):
            nodes += 1
            found = anchors.get(event.anchor or "")
            if found is None:
                if any(f.anchor == event.anchor for f in stack):
                    raise DocumentLimitError(
                        422,
                        "the document has an alias to itself",
                        "aliases: an alias may not refer to a node that contains it",
                    )
                continue  # an unknown anchor: the loader reports it as a syntax error
            size, depth = found
            if len(stack) + depth > MAX_DEPTH:
                raise _too_deep()
            done = True
        if nodes > MAX_NODES:
            raise _too_many_nodes()
        if not done:
            continue
        if stack:
            parent = stack[-1]
            parent.size += size
            parent.depth = max(parent.depth, depth)
            if parent.mapping:
                parent.want_key = not parent.want_key
            else:
                parent.index += 1
            if parent.size > max_bytes:
                raise _too_large(max_bytes, limit_name)
        else:
            doc_size += size
            if doc_size > max_bytes:
                raise _too_large(max_bytes, limit_name)
    return documents


def _construct(text: str, *, single: bool) -> Any:
    try:
        if single:
            return yaml.load(text, Loader=_Loader)
        return list(yaml.load_all(text, Loader=_Loader))
    except (ValueError, OverflowError) as exc:  # a value the constructor cannot build
        raise DocumentLimitError(422, f"a value cannot be read: {exc}", f"values: {exc}") from None


def yaml_load_all(
    text: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    deadline_s: float = DEFAULT_DEADLINE_S,
    limit_name: str = "server.max_body_bytes",
) -> list[Any]:
    """Every document of a YAML stream (None for an empty one), within the limits."""
    _check_events(text, max_bytes=max_bytes, deadline_s=deadline_s, limit_name=limit_name)
    result: list[Any] = _construct(text, single=False)
    return result


def yaml_load(
    text: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    deadline_s: float = DEFAULT_DEADLINE_S,
    limit_name: str = "server.max_body_bytes",
) -> Any:
    """The one document of a YAML stream (None when empty), within the limits."""
    _check_events(text, max_bytes=max_bytes, deadline_s=deadline_s, limit_name=limit_name)
    return _construct(text, single=True)


class _BigInt:
    """A JSON integer outside int64, kept as its text until the walk names its field."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _json_int(text: str) -> int | _BigInt:
    if len(text) > _LONGEST_INT_TEXT:
        return _BigInt(text)
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else _BigInt(text)


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[,\[\]{}]')


def _json_values_within_limit(text: str) -> None:
    """Refuse a JSON text of more than MAX_NODES values, or nested too deep, before the C parser
    builds it."""
    if text.count(",") + text.count("[") + text.count("{") < MAX_NODES:
        return  # every value but the first follows a comma or opens a container
    values, depth = 1, 0
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()[0]
        if token == '"':
            continue
        if token in "]}":
            depth -= 1
            continue
        if token != ",":
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep()
        values += 1
        if values > MAX_NODES:
            raise _too_many_nodes()


def json_loads(text: str) -> Any:
    """`json.loads` within the nesting, node and integer limits (JSON has no aliases: its size is
    the body's)."""
    _json_values_within_limit(text)
    try:
        data = json.loads(text, parse_int=_json_int)
    except RecursionError:
        raise _too_deep() from None
    nodes = 0
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    while stack:
        value, depth, path = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise _too_many_nodes()
        if isinstance(value, _BigInt):
            raise _bad_int(path, value.text)
        if isinstance(value, dict):
            if depth + 1 > MAX_DEPTH:
                raise _too_deep()
            stack.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in value.items())
        elif isinstance(value, list):
            if depth + 1 > MAX_DEPTH:
                raise _too_deep()
            stack.extend((v, depth + 1, f"{path}.{i}" if path else str(i)) for i, v in enumerate(value))
    return data
