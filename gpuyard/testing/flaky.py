"""Backend write failures on demand: every Nth call of each writer method fails.

:class:`FlakyWrites` wraps the methods of the one writer every component shares (the backend's:
the operator, the scheduler, the fake kubelet and device health all hold that same object), so
the failures reach every call site the components use, as a flaky API server would:

* `500` — :class:`~gpuyard.state.backend.BackendError`, nothing written;
* `409` — :class:`~gpuyard.state.store.Conflict`, nothing written;
* `timeout` — the write lands, then the caller gets a `TimeoutError` (the answer was lost on the
  way back: the caller cannot tell whether its write happened).

Used by the fault suite (`tests/faults/`) and the chaos soak (`bench/soak.py`) through
`Cluster.fail_writes(...)`; `remove()` puts the writer back as it was.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Literal

from gpuyard.apis.meta import Resource
from gpuyard.state.backend import BackendError
from gpuyard.state.store import Conflict
from gpuyard.state.writing import Writer

__all__ = ["METHODS", "MODES", "FlakyWrites"]

Mode = Literal["500", "409", "timeout"]
MODES: tuple[Mode, ...] = ("500", "409", "timeout")
METHODS = ("create", "update", "patch_status", "delete")


class FlakyWrites:
    """Fails call N, 2N, 3N, ... of each writer method (per method); see the module docstring."""

    def __init__(
        self,
        writer: Writer,
        *,
        every: int,
        mode: Mode = "500",
        kinds: Collection[str] | None = None,
        methods: Collection[str] = METHODS,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1, not {every}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        unknown = set(methods) - set(METHODS)
        if unknown:
            raise ValueError(f"unknown writer methods {sorted(unknown)}; allowed: {', '.join(METHODS)}")
        self.writer = writer
        self.every = every
        self.mode = mode
        self.kinds = None if kinds is None else frozenset(kinds)
        self.calls: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self._methods = tuple(methods)
        for name in self._methods:
            setattr(writer, name, self._wrap(name, getattr(writer, name)))

    def remove(self) -> None:
        """Put the writer's own methods back."""
        for name in self._methods:
            if name in vars(self.writer):
                delattr(self.writer, name)

    @property
    def total_failed(self) -> int:
        return sum(self.failed.values())

    def _wrap(self, name: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def flaky(*args: Any, **kwargs: Any) -> Any:
            kind = args[0].kind if args and isinstance(args[0], Resource) else str(args[0]) if args else ""
            if self.kinds is not None and kind not in self.kinds:
                return await method(*args, **kwargs)
            self.calls[name] += 1
            if self.calls[name] % self.every:
                return await method(*args, **kwargs)
            self.failed[name] += 1
            what = f"{name} {kind}"
            if self.mode == "500":
                raise BackendError(f"injected 500 Internal Server Error on {what}")
            if self.mode == "409":
                raise Conflict(f"injected 409 Conflict on {what}")
            await method(*args, **kwargs)
            raise TimeoutError(f"injected timeout on {what} (the write landed)")

        return flaky
