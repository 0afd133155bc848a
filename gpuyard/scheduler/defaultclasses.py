"""The default ResourceClasses: one `nvidia.<model>` class per GPU model found in the cluster.

A reconciler on Node (and NodeTopology) objects: each GPU model a node reports (label
`gpuyard.io/gpu-model`, the product name, or the NodeTopology's GPUs) maps to the key of the
class `nvidia.<model>`; reconciling a key creates the class if it does not exist, selecting
`model In [<model>]` (through the context's writer). Classes are never changed or deleted here: an administrator may edit a
default class, and a class some job asks for must not vanish when the last such node goes.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from gpuyard.apis.core import Node
from gpuyard.apis.devicematching import gpu_devices
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.resourceclasses import default_class, default_class_name
from gpuyard.state.context import Context
from gpuyard.state.store import AlreadyExists
from gpuyard.state.workqueues import Requeue, Watch

__all__ = ["DefaultClassReconciler"]

log = structlog.get_logger(__name__)


class DefaultClassReconciler:
    name = "default-resource-classes"
    needs_leader = True  # creates ResourceClasses
    concurrency = 8  # the classes of a new cluster share one journal commit

    def __init__(self, ctx: Context) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the default-class reconciler needs a writer (ctx.writer)")
        self.store = store = ctx.store
        self.writer = ctx.writer
        self._models: dict[str, str] = {}  # class name -> model
        watches = [Watch("Node", self._node_keys)]
        if "NodeTopology" in store.kinds():
            watches.append(Watch("NodeTopology", self._topology_keys))
        self.watches = watches

    def _keys(self, models: Iterable[str]) -> list[tuple[str, str]]:
        out = []
        for model in sorted(set(models)):
            if not model:
                continue
            name = default_class_name(model)
            self._models[name] = model
            out.append(("", name))
        return out

    def _node_keys(self, node: Node) -> list[tuple[str, str]]:
        topology = None
        if "NodeTopology" in self.store.kinds():  # a node's GPUs may differ in model: ask its topology
            topology = self.store.get_of(NodeTopology, "", node.metadata.name)
        return self._keys(d.model for d in gpu_devices(node, topology))

    def _topology_keys(self, topology: NodeTopology) -> list[tuple[str, str]]:
        node = self.store.get_of(Node, "", topology.metadata.name)
        if node is None:
            return []
        return self._keys(d.model for d in gpu_devices(node, topology))

    async def reconcile(self, key: tuple[str, str]) -> Requeue | None:
        name = key[1]
        model = self._models.get(name)
        if model is None or self.store.get("ResourceClass", "", name) is not None:
            return None
        try:
            await self.writer.create(default_class(model))
        except AlreadyExists:
            return None
        log.info("resourceclass.created", name=name, model=model)
        return None
