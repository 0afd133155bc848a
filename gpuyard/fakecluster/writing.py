"""The fake cluster's API server: the one write path (:class:`~gpuyard.state.writing.Writer`) over
the in-memory store, with the checks a Kubernetes API server and kubelet admission make.

Pods are created already bound (`spec.nodeName`, the scheduler placed them); a pod for no node or
an unknown node is refused with :class:`~gpuyard.state.backend.BackendError`, as is the next
create after `fail_next_creates(n)` (fault injection: tests of the un-assume path). A created pod
starts `Pending`; only the fake kubelet moves it on.
"""

from __future__ import annotations

from typing import TypeVar

from gpuyard.apis.core import Node, Pod, PodStatus
from gpuyard.apis.meta import Resource
from gpuyard.state.backend import BackendError
from gpuyard.state.store import AlreadyExists, Store
from gpuyard.state.writing import Durability, StoreWriter

__all__ = ["FakeWriter"]

R = TypeVar("R", bound=Resource)


class FakeWriter(StoreWriter):
    """StoreWriter plus pod admission and injected create failures."""

    def __init__(self, store: Store, *, journal: Durability | None = None) -> None:
        super().__init__(store, journal=journal)
        self.fail_creates = 0
        self.pods_created = 0

    async def create(self, obj: R) -> R:
        if not isinstance(obj, Pod):
            return await super().create(obj)
        where = f"pod {obj.metadata.namespace}/{obj.metadata.name}"
        if not obj.spec.node_name:
            raise BackendError(f"{where}: spec.nodeName is required (pods are created bound)")
        if self.store.get_of(Node, "", obj.spec.node_name) is None:
            raise BackendError(f"{where}: node {obj.spec.node_name} does not exist")
        if self.fail_creates > 0:
            self.fail_creates -= 1
            raise BackendError(f"{where}: injected create failure")
        try:
            stored = await super().create(obj.model_copy(update={"status": PodStatus(phase="Pending")}))
        except AlreadyExists as exc:
            raise BackendError(str(exc)) from None
        self.pods_created += 1
        return stored
