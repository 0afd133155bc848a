"""The snapshot's derived masks: which nodes and GPU slots a pod may use, as cached arrays.

:class:`Masks` answers the filters and the GPU chooser with vectorised arrays read from the
snapshot's :class:`~gpuyard.scheduler.cache.nodearrays.NodeArrays` and
:class:`~gpuyard.scheduler.cache.noderows.NodeRows`: per distinct nodeSelector + required affinity, per
preferred-affinity term and per toleration set a bool[N] node mask; per ResourceClass a
:class:`ClassMask` (matching GPU slots). Each is computed once over all nodes, kept in a bounded
LRU cache (node masks) or until the class changes (class masks), and patched row by row when the
snapshot reloads a node (`patch_row`), so no filter loops over nodes per pod. The per-shape
helpers built on them say how many whole GPUs or shares (by milli and GPU memory) of a class are
free per node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from cachetools import Cache, LRUCache

from gpuyard.apis.devicematching import Matcher
from gpuyard.apis.resourceclasses import ResourceClass
from gpuyard.scheduler.cache.nodearrays import NodeArrays
from gpuyard.scheduler.cache.noderows import NodeRows
from gpuyard.scheduler.gangs.requests import (
    GPU_MILLI,
    Constraints,
    PodShape,
    Term,
    Toleration,
    affinity_ok,
    selector_ok,
    taints_ok,
)

__all__ = ["ClassMask", "Masks"]

_MASK_CACHE_SIZE = 1024

SelectorKey = tuple[tuple[tuple[str, str], ...], tuple[Term, ...]]
"""A node-selector mask's key: (nodeSelector, required affinity terms)."""
TaintKey = tuple[Toleration, ...]
K = TypeVar("K")  # a mask cache's key type


@dataclass(slots=True)
class ClassMask:
    """Which GPU slots a ResourceClass matches: `gpu[N, G]`, and how many per node."""

    gpu: np.ndarray
    count: np.ndarray  # matching GPUs per node (healthy or not)


class Masks:
    """Cached node masks, ResourceClass masks and per-shape GPU availability (see the module docstring)."""

    def __init__(self, *, arrays: NodeArrays, rows: NodeRows) -> None:
        self._arrays = arrays
        self._rows = rows
        self._selector_masks: LRUCache[SelectorKey, np.ndarray] = LRUCache(maxsize=_MASK_CACHE_SIZE)
        self._taint_masks: LRUCache[TaintKey, np.ndarray] = LRUCache(maxsize=_MASK_CACHE_SIZE)
        self._matchers: dict[str, tuple[int, Matcher]] = {}  # class name -> (resourceVersion, matcher)
        self._class_masks: dict[str, ClassMask] = {}

    # --- node masks --------------------------------------------------------------------------

    def selector_mask(self, constraints: Constraints) -> np.ndarray | None:
        """bool[N] for nodeSelector + required affinity (cached); None when the pod selects nothing."""
        if not constraints.selects:
            return None
        key: SelectorKey = (constraints.node_selector, constraints.affinity)
        return self._cached(self._selector_masks, key, lambda row: self._selects(key, row))

    def term_mask(self, term: Term) -> np.ndarray:
        """bool[N] for one node-selector term (preferred affinity scoring)."""
        key: SelectorKey = ((), (term,))
        return self._cached(self._selector_masks, key, lambda row: self._selects(key, row))

    def taint_mask(self, constraints: Constraints) -> np.ndarray:
        """bool[N]: nodes whose NoSchedule/NoExecute taints the pod tolerates (cached)."""
        key = constraints.tolerations
        if not key:
            return ~self._arrays.tainted
        taints = self._rows.taints
        return self._cached(self._taint_masks, key, lambda row: taints_ok(taints[row], key))

    def _selects(self, key: SelectorKey, row: int) -> bool:
        node_selector, affinity = key
        labels = self._rows.labels[row]
        if node_selector and not selector_ok(node_selector, labels):
            return False
        return not affinity or affinity_ok(affinity, labels, self._rows.names[row] or "")

    def _cached(self, cache: LRUCache[K, np.ndarray], key: K, test: Callable[[int], bool]) -> np.ndarray:
        mask: np.ndarray | None = cache.get(key)
        if mask is None:
            mask = np.zeros(self._arrays.n, dtype=bool)
            for row, name in enumerate(self._rows.names):
                if name is not None:
                    mask[row] = test(row)
            cache[key] = mask  # evicts the least recently used beyond the cache size
        return mask

    def patch_row(self, row: int) -> None:
        """`row`'s node changed: recompute its entry in every cached mask."""
        for key in self._selector_masks:
            _peek(self._selector_masks, key)[row] = self._selects(key, row)
        taints = self._rows.taints[row]
        for tolerations in self._taint_masks:
            _peek(self._taint_masks, tolerations)[row] = taints_ok(taints, tolerations)
        for name, cm in self._class_masks.items():
            self._class_row(cm, self._matchers[name][1], row)

    def forget(self) -> None:
        """The arrays were resized: drop every cached mask (recomputed at the new size when asked)."""
        self._selector_masks.clear()
        self._taint_masks.clear()
        self._class_masks.clear()

    # --- resource classes --------------------------------------------------------------------

    def set_classes(self, classes: Iterable[ResourceClass]) -> bool:
        """Install the current ResourceClasses (True if any changed); masks of changed classes
        are recomputed lazily."""
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
        return changed

    @property
    def class_names(self) -> Mapping[str, object]:
        """The installed ResourceClasses by name."""
        return self._matchers

    def class_mask(self, name: str) -> ClassMask | None:
        """Which GPUs class `name` matches (None: no such class)."""
        cm = self._class_masks.get(name)
        if cm is not None:
            return cm
        known = self._matchers.get(name)
        if known is None:
            return None
        n, g = self._arrays.n, self._arrays.g
        cm = ClassMask(np.zeros((n, g), dtype=bool), np.zeros(n, dtype=np.int32))
        for row, node in enumerate(self._rows.names):
            if node is not None:
                self._class_row(cm, known[1], row)
        self._class_masks[name] = cm
        return cm

    def _class_row(self, cm: ClassMask, matcher: Matcher, row: int) -> None:
        cm.gpu[row, :] = False
        devices = self._rows.devices[row] if self._rows.names[row] is not None else []
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

    # --- per-shape helpers used by filters and the GPU chooser --------------------------------

    def gpu_usable(self, gpu_class: str | None) -> np.ndarray:
        """bool[N, G]: healthy GPU slots of the class (any GPU for None)."""
        healthy = self._arrays.gpu_healthy
        if gpu_class is None:
            return healthy
        cm = self.class_mask(gpu_class)
        return healthy & cm.gpu if cm is not None else np.zeros_like(healthy)

    def gpu_available(self, gpu_class: str | None, gpu_milli: int) -> np.ndarray:
        """int[N]: for whole GPUs, how many idle GPUs of the class; for a share (`gpu_milli` < 1000),
        how many such shares fit, summed over the GPUs of the class."""
        a = self._arrays
        if gpu_class is None and gpu_milli >= GPU_MILLI:
            return a.gpu_whole_free
        usable = self.gpu_usable(gpu_class)
        if gpu_milli >= GPU_MILLI:
            whole: np.ndarray = ((a.gpu_free_milli == GPU_MILLI) & usable).sum(axis=1)
            return whole
        result: np.ndarray = np.where(usable, np.maximum(a.gpu_free_milli, 0) // gpu_milli, 0).sum(axis=1)
        return result

    def share_memory(self, row: int, shape: PodShape) -> np.ndarray:
        """int64[G]: MiB a share of `shape` needs on each GPU of `row` (0 where the GPU's memory is unknown)."""
        mib = self._arrays.gpu_mem_mib[row]
        if shape.gpu_mem_mib:
            return np.where(mib > 0, shape.gpu_mem_mib, 0).astype(np.int64)
        result: np.ndarray = -(-mib.astype(np.int64) * shape.gpu_mem_permille // GPU_MILLI)
        return result

    def share_available(self, shape: PodShape) -> np.ndarray:
        """int[N]: how many shares of `shape` fit on each node, by milli AND memory (vectorised;
        `gpu_available` counts by milli only)."""
        a = self._arrays
        usable = self.gpu_usable(shape.gpu_class)
        total = a.gpu_mem_mib.astype(np.int64)
        if shape.gpu_mem_mib:
            need = np.where(total > 0, shape.gpu_mem_mib, 0)
        else:
            need = -(-total * shape.gpu_mem_permille // GPU_MILLI)
        by_milli = np.maximum(a.gpu_free_milli, 0) // shape.gpu_milli
        by_mem = np.where(need > 0, np.maximum(a.gpu_mem_free, 0) // np.maximum(need, 1), by_milli)
        result: np.ndarray = np.where(usable, np.minimum(by_milli, by_mem), 0).sum(axis=1)
        return result

    def share_fits(self, row: int, shape: PodShape) -> np.ndarray:
        """bool[G]: GPUs of `row` a share of `shape` fits on (healthy, of its class, milli and memory free)."""
        a = self._arrays
        usable = self.gpu_usable(shape.gpu_class)[row]
        result: np.ndarray = (
            usable
            & (a.gpu_free_milli[row] >= shape.gpu_milli)
            & (a.gpu_mem_free[row] >= self.share_memory(row, shape))
        )
        return result


_peek = Cache.__getitem__
"""A cached mask without marking it recently used (`LRUCache.__getitem__` would): patching every
mask must not reorder the cache."""
