"""The component seam: what a package hands the runtime to run, and whether it needs the lead.

Each package that contributes long-running work (the operator, the scheduler) exposes a
:data:`ComponentFactory`: `components(ctx) -> list[Runnable | Reconciler]`. The runtime
(`gpuyard.platform.runtime`) runs each item as a supervised task:

* a :class:`Runnable` by awaiting its `run()`;
* a :class:`Reconciler` through a :class:`~gpuyard.state.workqueues.ControllerRunner` (list,
  watch, de-duplicated keys, `concurrency` workers calling `reconcile(key)`).

Every item says whether it `needs_leader`: a component that writes to the cluster does (where
several replicas share one store of record, only the leader may write, and the runtime starts
such a component only once this replica leads and the backend has synced); a read-only one does
not, and runs on every replica from the start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeAlias, runtime_checkable

from gpuyard.state import workqueues
from gpuyard.state.context import Context

__all__ = ["ComponentFactory", "Reconciler", "Runnable"]


@runtime_checkable
class Runnable(Protocol):
    """A long-running coroutine: `run()` works until cancelled (a return leaves it stopped)."""

    @property
    def name(self) -> str: ...

    @property
    def needs_leader(self) -> bool:
        """Whether it writes, and so runs only while this replica leads."""
        ...

    async def run(self) -> None: ...


@runtime_checkable
class Reconciler(workqueues.Reconciler, Protocol):
    """A reconciler the runtime runs through a `ControllerRunner` (name, watches, concurrency,
    `reconcile(key)`), saying whether it needs the lead."""

    @property
    def needs_leader(self) -> bool:
        """Whether it writes, and so runs only while this replica leads."""
        ...


ComponentFactory: TypeAlias = Callable[[Context], list[Runnable | Reconciler]]
"""A package's `components(ctx)`."""
