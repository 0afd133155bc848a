"""Bounded decoding of YAML and JSON documents from untrusted input.

Every body the API reads (and every file the CLI reads) goes through these functions:

* nesting deeper than :data:`MAX_DEPTH` is refused (a deep document would otherwise exhaust
  the interpreter's stack: a `RecursionError`, a 500);
* a YAML document whose aliases expand beyond ``max_bytes`` is refused before anything is
  constructed (a kilobyte of nested aliases expands to hundreds of megabytes: the body limit
  applies to the *expanded* document), and so is an alias to itself.

Both raise :class:`DocumentLimitError`, which carries the HTTP status (422 for depth, 413 for
size) and names the limit.
Syntax errors are raised as before (`yaml.YAMLError`, `json.JSONDecodeError`).
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from yaml.events import MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["DEFAULT_MAX_BYTES", "MAX_DEPTH", "DocumentLimitError", "json_loads", "yaml_load", "yaml_load_all"]

MAX_DEPTH = 64
"""The deepest nesting of mappings and lists a document may have."""

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
"""The expanded size a YAML document may have when the caller names no limit (the server's
default `server.max_body_bytes`)."""


class DocumentLimitError(ValueError):
    """A document beyond a decoding limit; `status` is the HTTP answer (413 or 422)."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = [{"field": "<body>", "reason": reason}]


def _too_deep() -> DocumentLimitError:
    return DocumentLimitError(
        422,
        f"the document is nested more than {MAX_DEPTH} levels deep",
        f"nesting depth: at most {MAX_DEPTH} levels of mappings and lists",
    )


def _too_large(max_bytes: int) -> DocumentLimitError:
    return DocumentLimitError(
        413,
        f"the document expands (aliases included) to more than {max_bytes} bytes",
        f"expanded size: at most {max_bytes} bytes (server.max_body_bytes), aliases expanded",
    )


def _measure(root: Node, max_bytes: int) -> None:
    """Refuse a node graph whose expansion is too deep, too large or recursive, without expanding it.

    The size counts a scalar's characters (at least 1) and 1 per mapping or list: never more than
    the text for a document without aliases, so only an expansion can exceed the body limit."""
    memo: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, expanded depth)
    active: set[int] = set()

    def walk(node: Node) -> tuple[int, int]:
        key = id(node)
        known = memo.get(key)
        if known is not None:
            return known
        if key in active:
            raise DocumentLimitError(
                422, "the document has an alias to itself", "aliases: an alias may not refer to itself"
            )
        if isinstance(node, ScalarNode):
            result = (max(len(str(node.value)), 1), 0)
        else:
            active.add(key)
            children: list[Node] = []
            if isinstance(node, SequenceNode):
                children = list(node.value)
            elif isinstance(node, MappingNode):
                children = [n for pair in node.value for n in pair]
            size, depth = 1, 0
            for child in children:
                child_size, child_depth = walk(child)
                size += child_size
                depth = max(depth, child_depth)
                if size > max_bytes:
                    raise _too_large(max_bytes)
            active.discard(key)
            result = (size, depth + 1)
            if result[1] > MAX_DEPTH:
                raise _too_deep()
        memo[key] = result
        return result

    size, _ = walk(root)
    if size > max_bytes:
        raise _too_large(max_bytes)


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader with a nesting limit while composing and an expansion limit per document."""

    max_bytes = DEFAULT_MAX_BYTES

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if not self.check_event(SequenceStartEvent, MappingStartEvent):
            return super().compose_node(parent, index)  # a scalar or an alias: no deeper
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _too_deep()
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if node is not None:
            _measure(node, self.max_bytes)
        return node


def _loader(max_bytes: int) -> type[_BoundedLoader]:
    return type("BoundedLoader", (_BoundedLoader,), {"max_bytes": max_bytes})


def yaml_load_all(text: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Any]:
    """Every document of a YAML stream (None for an empty one), within the limits."""
    return list(yaml.load_all(text, Loader=_loader(max_bytes)))


def yaml_load(text: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """The one document of a YAML stream (None when empty), within the limits."""
    return yaml.load(text, Loader=_loader(max_bytes))


def json_loads(text: str) -> Any:
    """`json.loads` within the nesting limit (JSON has no aliases: its size is the body's)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise _too_deep() from None
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            if depth + 1 > MAX_DEPTH:
                raise _too_deep()
            stack.extend((v, depth + 1) for v in value)
    return data
