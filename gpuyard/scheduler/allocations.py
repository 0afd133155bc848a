"""The snapshot's allocation ledger: what each Reservation takes, and adding/removing it.

:class:`Alloc` is what one pod takes on one node (CPU, memory, extended resources, GPU indices
with their milli and a share's memory, NICs, host ports): the unit that `place()` tries and
undoes and that a Reservation is recorded as. :class:`SnapshotLedger` is the part of
:class:`gpuyard.scheduler.snapshot.Snapshot` that keeps the Reservations (by key, node and
PodGroup), applies and unapplies Allocs to a row's free capacity (`apply`/`unapply`, the hot
path: plain array writes, no validation), hands out host ports round-robin, and counts the live
GPU workload by shape for the packing policies. It is a mixin: the arrays it writes are created
by `Snapshot` (see that module's docstring for their layout).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType

import numpy as np

from gpuyard.apis.core import GPU_RESOURCE
from gpuyard.apis.quantity import to_int, to_milli
from gpuyard.apis.scheduling import Reservation
from gpuyard.scheduler.gang_requests import GPU_MILLI, MIB, SHARE_RESOURCES

__all__ = ["Alloc", "SnapshotLedger"]


@dataclass(slots=True)
class Alloc:
    """What one pod takes on one node: the unit `apply`/`unapply` add and remove."""

    node: str
    cpu: int = 0
    mem: int = 0
    gpus: tuple[int, ...] = ()
    gpu_milli: int = 0
    ext: tuple[tuple[str, int], ...] = ()
    ports: tuple[int, ...] = ()
    row: int = -1  # the row it is applied to, -1 while not applied
    nics: tuple[str, ...] = ()
    gpu_mem: int = 0  # a share's GPU memory in MiB (whole GPUs: all of it, implied)


@dataclass(slots=True)
class _Entry:
    """A Reservation as the snapshot holds it."""

    key: tuple[str, str]
    group: tuple[str, str]
    rv: int
    alloc: Alloc


def _alloc_of(res: Reservation) -> Alloc:
    spec = res.spec
    req = spec.requests
    ext = []
    for name, q in req.items():
        if name in ("cpu", "memory", "pods", GPU_RESOURCE) or name in SHARE_RESOURCES or q <= 0:
            continue
        if (
            "/" not in name
            and not name.startswith("hugepages-")
            and name not in ("ephemeral-storage", "storage")
        ):
            continue  # a ResourceClass request: counted through `gpus`
        ext.append((name, to_milli(q)))
    milli = (spec.gpu_milli or GPU_MILLI) if spec.gpus else 0
    return Alloc(
        node=spec.node,
        gpu_mem=spec.gpu_memory_mib if 0 < milli < GPU_MILLI else 0,
        cpu=to_milli(req.get("cpu", Decimal(0))),
        mem=-(-to_int(req.get("memory", Decimal(0))) // MIB),
        gpus=tuple(spec.gpus),
        gpu_milli=milli,
        ext=tuple(sorted(ext)),
        ports=tuple(spec.host_ports),
        nics=tuple(spec.nics),
    )


class SnapshotLedger:
    """Reservations and their Allocs on a :class:`~gpuyard.scheduler.snapshot.Snapshot`'s rows (a mixin)."""

    # created by Snapshot.__init__ / Snapshot._alloc_arrays; `apply` also calls Snapshot._ext_column
    g: int
    index: dict[str, int]
    port_lo: int
    port_hi: int
    port_count: int
    epoch: int
    version: int
    cpu_free: np.ndarray
    mem_free: np.ndarray
    pods_free: np.ndarray
    ext_free: np.ndarray
    gpu_free_milli: np.ndarray
    gpu_mem_free: np.ndarray
    gpu_mem_mib: np.ndarray
    gpu_healthy: np.ndarray
    gpu_whole_free: np.ndarray
    gpu_kinds: np.ndarray
    row_version: np.ndarray
    ports_used_count: np.ndarray
    port_cursor: np.ndarray
    ports_used: list[dict[int, int]]
    nics_used: list[dict[str, int]]
    _ext_index: dict[str, int]
    _entries: dict[tuple[str, str], _Entry]
    _by_node: dict[str, set[tuple[str, str]]]
    _by_group: dict[tuple[str, str], dict[str, _Entry]]
    _shape_counts: dict[tuple[int, int, int], int]

    # --- reservations ------------------------------------------------------------------------

    def upsert_reservation(self, res: Reservation, *, advance_cursor: bool = True) -> bool:
        """Record a Reservation (idempotent by resourceVersion); True if anything changed."""
        key = (res.metadata.namespace, res.metadata.name)
        rv = res.resource_version
        old = self._entries.get(key)
        if old is not None:
            if old.rv == rv and rv:
                return False
            self.remove_reservation(key)
        entry = _Entry(key, (res.metadata.namespace, res.spec.pod_group), rv, _alloc_of(res))
        self._entries[key] = entry
        self._count_shape(entry.alloc, 1)
        self._by_node.setdefault(entry.alloc.node, set()).add(key)
        self._by_group.setdefault(entry.group, {})[res.metadata.name] = entry
        row = self.index.get(entry.alloc.node)
        if row is not None:
            self.apply(entry.alloc, row=row, advance_cursor=advance_cursor)
        self.version += 1
        return True

    def remove_reservation(self, key: tuple[str, str]) -> _Entry | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._count_shape(entry.alloc, -1)
        if entry.alloc.row >= 0:
            self.unapply(entry.alloc)
        keys = self._by_node.get(entry.alloc.node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_node[entry.alloc.node]
        members = self._by_group.get(entry.group)
        if members is not None:
            members.pop(key[1], None)
            if not members:
                del self._by_group[entry.group]
        self.epoch += 1
        self.version += 1
        return entry

    def placed_pods(self, group: tuple[str, str]) -> dict[str, str]:
        """Pods of a PodGroup that hold a Reservation: pod name -> node."""
        members = self._by_group.get(group)
        if not members:
            return {}
        return {name: e.alloc.node for name, e in members.items()}

    def group_gpus(self, group: tuple[str, str]) -> dict[str, int]:
        """GPUs a PodGroup's Reservations hold, per node (shares count as one GPU)."""
        out: dict[str, int] = {}
        for e in self._by_group.get(group, {}).values():
            if e.alloc.gpus:
                out[e.alloc.node] = out.get(e.alloc.node, 0) + len(e.alloc.gpus)
        return out

    def has_reservation(self, key: tuple[str, str]) -> bool:
        return key in self._entries

    @property
    def reservation_count(self) -> int:
        return len(self._entries)

    # --- apply / unapply (place() and the ledger share them) -----------------------------------

    def apply(self, alloc: Alloc, *, row: int, advance_cursor: bool = True) -> None:
        """Take `alloc` from `row`'s free capacity (may go negative for a stale ledger; never checks)."""
        alloc.row = row
        self.row_version[row] += 1
        self.cpu_free[row] -= alloc.cpu
        self.mem_free[row] -= alloc.mem
        self.pods_free[row] -= 1
        for name, amount in alloc.ext:
            col = self._ext_index.get(name)
            if col is None:
                col = self._ext_column(name)
            self.ext_free[row, col] -= amount
        if alloc.gpus:
            self._gpus_take(row, alloc.gpus, alloc.gpu_milli, alloc.gpu_mem)
            self.gpu_kinds[row, _kind(alloc, self.g)] += 1
        if alloc.nics:
            held = self.nics_used[row]
            for nic in alloc.nics:
                held[nic] = held.get(nic, 0) + 1
        if alloc.ports:
            used = self.ports_used[row]
            lo, hi = self.port_lo, self.port_hi
            for p in alloc.ports:
                n = used.get(p, 0)
                used[p] = n + 1
                if not n and lo <= p <= hi:
                    self.ports_used_count[row] += 1
            if advance_cursor:
                self.port_cursor[row] = alloc.ports[-1]

    def unapply(self, alloc: Alloc) -> None:
        row = alloc.row
        if row < 0:
            return
        alloc.row = -1
        self.row_version[row] += 1
        self.cpu_free[row] += alloc.cpu
        self.mem_free[row] += alloc.mem
        self.pods_free[row] += 1
        for name, amount in alloc.ext:
            self.ext_free[row, self._ext_index[name]] += amount
        if alloc.gpus:
            self._gpus_take(row, alloc.gpus, -alloc.gpu_milli, -alloc.gpu_mem)
            self.gpu_kinds[row, _kind(alloc, self.g)] -= 1
        if alloc.nics:
            held = self.nics_used[row]
            for nic in alloc.nics:
                n = held.get(nic, 0)
                if n > 1:
                    held[nic] = n - 1
                else:
                    held.pop(nic, None)
        if alloc.ports:
            used = self.ports_used[row]
            lo, hi = self.port_lo, self.port_hi
            for p in alloc.ports:
                n = used.get(p, 0)
                if n > 1:
                    used[p] = n - 1
                elif n == 1:
                    del used[p]
                    if lo <= p <= hi:
                        self.ports_used_count[row] -= 1

    def take_ports(self, row: int, count: int) -> tuple[int, ...] | None:
        """`count` free host ports on `row`, round-robin after the last one handed out there."""
        if count <= 0:
            return ()
        if self.port_count - int(self.ports_used_count[row]) < count:
            return None
        used = self.ports_used[row]
        lo, size = self.port_lo, self.port_count
        start = int(self.port_cursor[row]) + 1 - lo
        out: list[int] = []
        for step in range(size):
            p = lo + (start + step) % size
            if p not in used:
                out.append(p)
                if len(out) == count:
                    return tuple(out)
        return None

    def _gpus_take(self, row: int, gpus: tuple[int, ...], milli: int, mem: int = 0) -> None:
        """Take `milli` (and a share's `mem` MiB; a whole GPU: all its memory) of each GPU, give
        back when negative, keeping `gpu_whole_free` exact."""
        free = self.gpu_free_milli
        healthy = self.gpu_healthy
        g = self.g
        delta = 0
        whole = abs(milli) >= GPU_MILLI
        for idx in gpus:
            if idx >= g:
                continue
            if whole:  # a whole GPU takes (or gives back) all of its memory
                total = int(self.gpu_mem_mib[row, idx])
                self.gpu_mem_free[row, idx] -= total if milli > 0 else -total
            elif mem:
                self.gpu_mem_free[row, idx] -= mem
            before = int(free[row, idx])
            after = before - milli
            free[row, idx] = after
            if healthy[row, idx]:
                delta += (after == GPU_MILLI) - (before == GPU_MILLI)
        if delta:
            self.gpu_whole_free[row] += delta

    # --- the live GPU workload by shape (packing policies) -----------------------------------

    def _count_shape(self, alloc: Alloc, delta: int) -> None:
        if not alloc.gpus or not 0 < alloc.gpu_milli <= GPU_MILLI:
            return
        key = (alloc.cpu, len(alloc.gpus), alloc.gpu_milli)
        count = self._shape_counts.get(key, 0) + delta
        if count > 0:
            self._shape_counts[key] = count
        else:
            self._shape_counts.pop(key, None)

    def workload_counts(self) -> Mapping[tuple[int, int, int], int]:
        """(cpu milli, GPUs, milli per GPU) -> how many GPU reservations have that shape: the live
        workload FGD measures fragmentation against (kept current on every reservation change)."""
        return MappingProxyType(self._shape_counts)


def _kind(alloc: Alloc, width: int) -> int:
    """The column of `gpu_kinds` an allocation counts in: 0 for a share, else its GPU count."""
    return 0 if alloc.gpu_milli < GPU_MILLI else min(len(alloc.gpus), width)
