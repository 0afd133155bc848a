"""The snapshot's derived masks: which nodes and GPU slots a pod may use, as cached arrays.

:class:`SnapshotMasks` is the part of :class:`gpuyard.scheduler.snapshot.Snapshot` that answers
the filters and the GPU chooser with vectorised arrays: per distinct nodeSelector + required
affinity, per preferred-affinity term and per toleration set a bool[N] node mask; per
ResourceClass a :class:`ClassMask` (matching GPU slots). Each is computed once over all nodes,
kept in a bounded LRU cache (node masks) or until the class changes (class masks), and patched
row by row when a node changes (`_patch_masks`), so no filter loops over nodes per pod. The
per-shape helpers built on them say how many whole GPUs or shares (by milli and GPU memory) of a
class are free per node. It is a mixin: the arrays it reads are created by `Snapshot`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from gpuyard.apis.devicematching import DeviceInfo
from gpuyard.apis.resourceclasses import Matcher, ResourceClass
from gpuyard.scheduler.gang_requests import (
    GPU_MILLI,
    Constraints,
    PodShape,
    Term,
    affinity_ok,
    selector_ok,
    taints_ok,
)

__all__ = ["ClassMask", "SnapshotMasks"]

_MASK_CACHE_SIZE = 1024


@dataclass(slots=True)
class ClassMask:
    """Which GPU slots a ResourceClass matches: `gpu[N, G]`, and per node whether any does."""

    gpu: np.ndarray
    node_any: np.ndarray
    count: np.ndarray  # matching GPUs per node (healthy or not)


class SnapshotMasks:
    """Cached node masks, ResourceClass masks and per-shape GPU availability (a mixin of `Snapshot`)."""

    # created by Snapshot.__init__ / Snapshot._alloc_arrays
    n: int
    g: int
    names: list[str | None]
    labels: list[Mapping[str, str]]
    taints: list[tuple[tuple[str, str | None, str], ...]]
    devices: list[list[DeviceInfo]]
    epoch: int
    version: int
    static_version: int
    alive: np.ndarray
    ready: np.ndarray
    schedulable: np.ndarray
    tainted: np.ndarray
    gpu_healthy: np.ndarray
    gpu_free_milli: np.ndarray
    gpu_mem_mib: np.ndarray
    gpu_mem_free: np.ndarray
    gpu_whole_free: np.ndarray
    _matchers: dict[str, tuple[int, Matcher]]
    _class_masks: dict[str, ClassMask]
    _selector_masks: OrderedDict[tuple, np.ndarray]
    _taint_masks: OrderedDict[tuple, np.ndarray]

    # --- masks -------------------------------------------------------------------------------

    @property
    def usable(self) -> np.ndarray:
        """bool[N]: nodes that exist, are Ready and not cordoned."""
        return self.alive & self.ready & self.schedulable

    def selector_mask(self, constraints: Constraints) -> np.ndarray | None:
        """bool[N] for nodeSelector + required affinity (cached); None when the pod selects nothing."""
        if not constraints.selects:
            return None
        key = (constraints.node_selector, constraints.affinity)
        return self._cached(self._selector_masks, key, lambda row: self._selects(key, row))

    def term_mask(self, term: Term) -> np.ndarray:
        """bool[N] for one node-selector term (preferred affinity scoring)."""
        key = ((), (term,))
        return self._cached(self._selector_masks, key, lambda row: self._selects(key, row))

    def taint_mask(self, constraints: Constraints) -> np.ndarray:
        """bool[N]: nodes whose NoSchedule/NoExecute taints the pod tolerates (cached)."""
        key = constraints.tolerations
        if not key:
            return ~self.tainted
        return self._cached(self._taint_masks, key, lambda row: taints_ok(self.taints[row], key))

    def _selects(self, key: tuple, row: int) -> bool:
        node_selector, affinity = key
        labels = self.labels[row]
        if node_selector and not selector_ok(node_selector, labels):
            return False
        return not affinity or affinity_ok(affinity, labels, self.names[row] or "")

    def _cached(self, cache: OrderedDict, key: tuple, test) -> np.ndarray:  # type: ignore[no-untyped-def]
        mask = cache.get(key)
        if mask is not None:
            cache.move_to_end(key)
            return mask
        mask = np.zeros(self.n, dtype=bool)
        for row, name in enumerate(self.names):
            if name is not None:
                mask[row] = test(row)
        cache[key] = mask
        if len(cache) > _MASK_CACHE_SIZE:
            cache.popitem(last=False)
        return mask

    def _patch_masks(self, row: int) -> None:
        for key, mask in self._selector_masks.items():
            mask[row] = self._selects(key, row)
        for key, mask in self._taint_masks.items():
            mask[row] = taints_ok(self.taints[row], key)
        for name, cm in self._class_masks.items():
            self._class_row(cm, self._matchers[name][1], row)

    # --- resource classes --------------------------------------------------------------------

    def set_classes(self, classes: Iterable[ResourceClass]) -> bool:
        """Install the current ResourceClasses; masks of changed classes are recomputed lazily."""
        fresh = {c.metadata.name: c for c in classes}
        changed = False
        for name in list(self._matchers):
            if name not in fresh:
                del self._matchers[name]
                self._class_masks.pop(name, None)
                changed = True
        for name, c in fresh.items():
            known = self._matchers.get(name)
            if known is None or known[0] != c.resource_version or not c.resource_version:
                self._matchers[name] = (c.resource_version, c.matcher())
                self._class_masks.pop(name, None)
                changed = True
        if changed:
            self.epoch += 1
            self.version += 1
            self.static_version += 1
        return changed

    @property
    def class_names(self) -> Mapping[str, object]:
        return self._matchers

    def class_mask(self, name: str) -> ClassMask | None:
        """Which GPUs class `name` matches (None: no such class)."""
        cm = self._class_masks.get(name)
        if cm is not None:
            return cm
        known = self._matchers.get(name)
        if known is None:
            return None
        cm = ClassMask(
            np.zeros((self.n, self.g), dtype=bool),
            np.zeros(self.n, dtype=bool),
            np.zeros(self.n, dtype=np.int32),
        )
        for row, node in enumerate(self.names):
            if node is not None:
                self._class_row(cm, known[1], row)
        self._class_masks[name] = cm
        return cm

    def _class_row(self, cm: ClassMask, matcher: Matcher, row: int) -> None:
        cm.gpu[row, :] = False
        devices = self.devices[row] if self.names[row] is not None else []
        if devices:
            if matcher.per_device:
                for d in devices:
                    cm.gpu[row, d.index] = matcher.matches(d.properties())
            else:
                verdicts: dict[int, bool] = {}
                for d in devices:
                    ok = verdicts.get(id(d.shared))
                    if ok is None:
                        ok = verdicts[id(d.shared)] = matcher.matches(d.shared)
                    cm.gpu[row, d.index] = ok
        cm.count[row] = int(cm.gpu[row].sum())
        cm.node_any[row] = cm.count[row] > 0

    # --- per-shape helpers used by filters and the GPU chooser --------------------------------

    def gpu_usable(self, gpu_class: str | None) -> np.ndarray:
        """bool[N, G]: healthy GPU slots of the class (any GPU for None)."""
        if gpu_class is None:
            return self.gpu_healthy
        cm = self.class_mask(gpu_class)
        return self.gpu_healthy & cm.gpu if cm is not None else np.zeros_like(self.gpu_healthy)

    def gpu_available(self, gpu_class: str | None, gpu_milli: int) -> np.ndarray:
        """int[N]: for whole GPUs, how many idle GPUs of the class; for a share (`gpu_milli` < 1000),
        how many such shares fit, summed over the GPUs of the class."""
        if gpu_class is None and gpu_milli >= GPU_MILLI:
            return self.gpu_whole_free
        usable = self.gpu_usable(gpu_class)
        if gpu_milli >= GPU_MILLI:
            return ((self.gpu_free_milli == GPU_MILLI) & usable).sum(axis=1)
        return np.where(usable, np.maximum(self.gpu_free_milli, 0) // gpu_milli, 0).sum(axis=1)

    def share_memory(self, row: int, shape: PodShape) -> np.ndarray:
        """int64[G]: MiB a share of `shape` needs on each GPU of `row` (0 where the GPU's memory is unknown)."""
        if shape.gpu_mem_mib:
            return np.where(self.gpu_mem_mib[row] > 0, shape.gpu_mem_mib, 0).astype(np.int64)
        total = self.gpu_mem_mib[row].astype(np.int64)
        return -(-total * shape.gpu_mem_permille // GPU_MILLI)

    def share_available(self, shape: PodShape) -> np.ndarray:
        """int[N]: how many shares of `shape` fit on each node, by milli AND memory (vectorised;
        `gpu_available` counts by milli only)."""
        usable = self.gpu_usable(shape.gpu_class)
        total = self.gpu_mem_mib.astype(np.int64)
        if shape.gpu_mem_mib:
            need = np.where(total > 0, shape.gpu_mem_mib, 0)
        else:
            need = -(-total * shape.gpu_mem_permille // GPU_MILLI)
        by_milli = np.maximum(self.gpu_free_milli, 0) // shape.gpu_milli
        by_mem = np.where(need > 0, np.maximum(self.gpu_mem_free, 0) // np.maximum(need, 1), by_milli)
        return np.where(usable, np.minimum(by_milli, by_mem), 0).sum(axis=1)

    def share_fits(self, row: int, shape: PodShape) -> np.ndarray:
        """bool[G]: GPUs of `row` a share of `shape` fits on (healthy, of its class, milli and memory free)."""
        usable = self.gpu_usable(shape.gpu_class)[row]
        return (
            usable
            & (self.gpu_free_milli[row] >= shape.gpu_milli)
            & (self.gpu_mem_free[row] >= self.share_memory(row, shape))
        )
