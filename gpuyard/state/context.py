"""What every component is built with: store (reads), writer (writes), clock, config, metrics registry, backend.

The runtime makes one :class:`Context` and hands it to each component factory, so components
share nothing by import and tests build a context from plain parts (`Context.for_tests()`).
Components read `store` and write only through `writer`: the backend factory
(`gpuyard.platform.backends`) sets it to the running backend's writer; until then (unit tests
without a backend) it is a :class:`~gpuyard.state.writing.StoreWriter` over the store.
`ctx.for_component(identity)` is the same context whose writer writes as that component
(`gpuyard.state.ownership`): a package's `components(ctx)` hands it to what it builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gpuyard.state.clock import Clock, VirtualClock
from gpuyard.state.config import Settings
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store
from gpuyard.state.writing import StoreWriter, Writer, identified

if TYPE_CHECKING:
    from gpuyard.state.backend import ClusterBackend
    from gpuyard.state.journal import Journal

__all__ = ["Context"]


@dataclass(slots=True)
class Context:
    store: Store
    clock: Clock
    settings: Settings
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    backend: ClusterBackend | None = None
    journal: Journal | None = None  # set when a data dir is configured
    writer: Writer | None = None  # the one write path; default: the store's own (fake semantics)

    def __post_init__(self) -> None:
        if self.writer is None:
            self.writer = StoreWriter(self.store, journal=self.journal)

    def for_component(self, identity: str) -> Context:
        """This context (same store, clock, settings, registry, backend), its writer writing as
        `identity` (`identified`)."""
        assert self.writer is not None  # set in __post_init__
        return replace(self, writer=identified(self.writer, identity))

    @classmethod
    def for_tests(cls, *, settings: Settings | None = None, clock: Clock | None = None) -> Context:
        """An in-memory context on a virtual clock with every kind registered."""
        clock = clock or VirtualClock()
        store = Store(now=clock.utcnow)
        register_kinds(store)
        return cls(
            store=store,
            clock=clock,
            settings=settings or Settings(backend={"data_dir": None, "clock": "virtual"}),
        )
