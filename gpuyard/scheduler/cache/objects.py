"""The scheduler core's own view of the objects it watches, built only from applied changes.

:class:`ObjectCache` answers the few reads the core needs (`get`, `list`, `kinds`) from what
was given to :meth:`~gpuyard.scheduler.core.SchedulerState.apply` or `load`, so the core never
reads the store: it is testable with plain objects and no event loop. It holds references to
the objects it was given (no copies).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from typing import TypeVar, cast

from gpuyard.apis.meta import Resource

__all__ = ["ObjectCache"]

Key = tuple[str, str]
R = TypeVar("R", bound=Resource)


class ObjectCache:
    """Objects by kind and (namespace, name); `kinds` are those the watch follows."""

    def __init__(self, kinds: Iterable[str] = ()) -> None:
        self._by_kind: dict[str, dict[Key, Resource]] = {k: {} for k in kinds}

    def kinds(self) -> list[str]:
        return list(self._by_kind)

    def reset(self, kinds: Iterable[str]) -> None:
        self._by_kind = {k: {} for k in kinds}

    def put(self, obj: Resource) -> Resource | None:
        """Store `obj`; return the object it replaced (None when new)."""
        table = self._by_kind.setdefault(obj.kind, {})
        key = (obj.metadata.namespace, obj.metadata.name)
        old = table.get(key)
        table[key] = obj
        return old

    def pop(self, kind: str, key: Key) -> Resource | None:
        table = self._by_kind.get(kind)
        return table.pop(key, None) if table is not None else None

    def get(self, kind: str, namespace: str, name: str) -> Resource | None:
        table = self._by_kind.get(kind)
        return table.get((namespace, name)) if table is not None else None

    def list(self, kind: str, *, namespace: str | None = None) -> list[Resource]:
        """Objects of a kind (optionally of one namespace), ordered by (namespace, name)."""
        table = self._by_kind.get(kind, {})
        keys = sorted(k for k in table if namespace is None or k[0] == namespace)
        return [table[k] for k in keys]

    # Typed reads: the kind comes from the model class, and the result has that type. Objects are
    # filed under their own `kind`, and a kind has one model class (its `KIND`), so no check is
    # made per object.

    def get_of(self, cls: type[R], namespace: str, name: str) -> R | None:
        """`get(cls.KIND, ...)` typed as `cls`."""
        table = self._by_kind.get(cls.KIND)
        return cast("R | None", table.get((namespace, name)) if table is not None else None)

    def list_of(self, cls: type[R], *, namespace: str | None = None) -> builtins.list[R]:
        """`list(cls.KIND, ...)` typed as `cls`."""
        return cast("builtins.list[R]", self.list(cls.KIND, namespace=namespace))

    def count(self, kind: str) -> int:
        return len(self._by_kind.get(kind, ()))
