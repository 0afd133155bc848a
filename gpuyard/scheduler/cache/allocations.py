"""The snapshot's allocation ledger: what each Reservation takes, and adding/removing it.

:class:`Alloc` is what one pod takes on one node (CPU, memory, extended resources, GPU indices
with their milli and a share's memory, NICs, host ports): the unit that `place()` tries and
undoes and that a Reservation is recorded as (`alloc_of`). :class:`Ledger` keeps the
snapshot's Reservations (by key, node and PodGroup), applies and unapplies Allocs to a row's
free capacity in the :class:`~gpuyard.scheduler.cache.nodearrays.NodeArrays` it is given
(`apply`/`unapply`, the hot path: plain array writes, no validation), recomputes a row's free
capacity when its node is reloaded, hands out host ports round-robin, and counts the live GPU
workload by shape for the packing policies. The snapshot tells it which row a node has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType

import numpy as np

from gpuyard.apis.core import GPU_RESOURCE
from gpuyard.apis.podplacement import ANNOTATION_ANTI_AFFINITY, AffinityTerm, anti_terms_from_json
from gpuyard.apis.quantity import to_int, to_milli
from gpuyard.apis.scheduling import Reservation
from gpuyard.scheduler.cache.nodearrays import NodeArrays
from gpuyard.scheduler.gangs.requests import GPU_MILLI, MIB, SHARE_RESOURCES

__all__ = ["Alloc", "Entry", "Ledger", "alloc_of"]


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
class Entry:
    """A Reservation as the snapshot holds it."""

    key: tuple[str, str]
    group: tuple[str, str]
    rv: int
    alloc: Alloc
    labels: Mapping[str, str] = field(default_factory=dict)
    """The labels of the pod it holds room for (the Reservation's), for inter-pod affinity."""
    anti: tuple[AffinityTerm, ...] = ()
    """That pod's required anti-affinity terms (Reservation annotation `gpuyard.io/pod-anti-affinity`)."""


def alloc_of(res: Reservation) -> Alloc:
    """What a Reservation takes (its node's row is not known here)."""
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


class Ledger:
    """The snapshot's Reservations and the Allocs they take from the rows (see the module docstring)."""

    def __init__(self, *, arrays: NodeArrays, port_range: tuple[int, int]) -> None:
        lo, hi = port_range
        if lo > hi:
            raise ValueError(f"host port range {lo}-{hi} is empty")
        self.port_lo, self.port_hi = lo, hi
        self.port_count = hi - lo + 1
        self._arrays = arrays
        self._entries: dict[tuple[str, str], Entry] = {}
        self._anti: set[tuple[str, str]] = set()  # entries whose pod has required anti-affinity
        self._by_node: dict[str, set[tuple[str, str]]] = {}
        self._by_group: dict[tuple[str, str], dict[str, Entry]] = {}
        self._shape_counts: dict[tuple[int, int, int], int] = {}  # GPU reservations per (cpu, GPUs, milli)

    # --- reservations ------------------------------------------------------------------------

    def upsert(self, res: Reservation, *, row: int | None, advance_cursor: bool = True) -> bool:
        """Record a Reservation (idempotent by resourceVersion) and take it from `row` (its node's
        row; None while the node is unknown); True if anything changed."""
        key = (res.metadata.namespace, res.metadata.name)
        rv = res.resource_version
        old = self._entries.get(key)
        if old is not None:
            if old.rv == rv and rv:
                return False
            self.remove(key)
        anti_json = res.metadata.annotations.get(ANNOTATION_ANTI_AFFINITY)
        anti = anti_terms_from_json(anti_json) if anti_json else ()
        entry = Entry(
            key, (res.metadata.namespace, res.spec.pod_group), rv, alloc_of(res), res.metadata.labels, anti
        )
        self._entries[key] = entry
        if anti:
            self._anti.add(key)
        self._count_shape(entry.alloc, 1)
        self._by_node.setdefault(entry.alloc.node, set()).add(key)
        self._by_group.setdefault(entry.group, {})[res.metadata.name] = entry
        if row is not None:
            self.apply(entry.alloc, row=row, advance_cursor=advance_cursor)
        return True

    def remove(self, key: tuple[str, str]) -> Entry | None:
        """Forget a Reservation and give its capacity back; the entry removed, if there was one."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._anti.discard(key)
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
        return entry

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> Iterable[Entry]:
        """Every Reservation held (inter-pod affinity and topology spread count the pods they hold)."""
        return self._entries.values()

    def anti_entries(self) -> list[Entry]:
        """The Reservations of pods with required anti-affinity terms (usually none)."""
        return [self._entries[k] for k in self._anti]

    def placed_pods(self, group: tuple[str, str]) -> dict[str, str]:
        """Pods of a PodGroup that hold a Reservation: pod name -> node."""
        members = self._by_group.get(group)
        if not members:
            return {}
        return {name: e.alloc.node for name, e in members.items()}

    def pod_alloc(self, group: tuple[str, str], pod: str) -> Alloc | None:
        """What one pod of a PodGroup takes (None: it holds no Reservation)."""
        entry = self._by_group.get(group, {}).get(pod)
        return entry.alloc if entry is not None else None

    def group_allocs(self, group: tuple[str, str]) -> list[Alloc]:
        """What a PodGroup's Reservations take (applied or not)."""
        return [e.alloc for e in self._by_group.get(group, {}).values()]

    def groups(self) -> list[tuple[str, str]]:
        """Every PodGroup holding at least one Reservation."""
        return list(self._by_group)

    def group_gpus(self, group: tuple[str, str]) -> dict[str, int]:
        """GPUs a PodGroup's Reservations hold, per node (shares count as one GPU)."""
        out: dict[str, int] = {}
        for e in self._by_group.get(group, {}).values():
            if e.alloc.gpus:
                out[e.alloc.node] = out.get(e.alloc.node, 0) + len(e.alloc.gpus)
        return out

    # --- rows ---------------------------------------------------------------------------------

    def reset_row(self, row: int, node: str) -> None:
        """Free = allocatable on `row` (node `node`, just loaded), then every Reservation on the
        node taken again."""
        a = self._arrays
        a.cpu_free[row] = a.cpu_alloc[row]
        a.mem_free[row] = a.mem_alloc[row]
        a.pods_free[row] = a.pods_alloc[row]
        a.ext_free[row, :] = a.ext_alloc[row, :]
        a.gpu_free_milli[row, :] = np.where(a.gpu_exists[row], GPU_MILLI, 0)
        a.gpu_mem_free[row, :] = a.gpu_mem_mib[row, :]
        a.ports_used[row] = {}
        a.ports_used_count[row] = 0
        a.nics_used[row] = {}
        a.gpu_kinds[row, :] = 0
        a.row_version[row] += 1
        for key in self._by_node.get(node, ()):
            entry = self._entries[key]
            entry.alloc.row = -1
            self.apply(entry.alloc, row=row, advance_cursor=False)
        a.gpu_whole_free[row] = int(((a.gpu_free_milli[row] == GPU_MILLI) & a.gpu_healthy[row]).sum())

    def detach(self, node: str) -> None:
        """Node `node` lost its row: its Reservations stay recorded but apply to no row."""
        for key in self._by_node.get(node, ()):
            self._entries[key].alloc.row = -1

    def restart_ports(self, row: int) -> None:
        """A new node on `row`: host ports are handed out from the start of the range."""
        self._arrays.port_cursor[row] = self.port_lo - 1

    def resume_ports(self) -> None:
        """After a rebuild: each row hands out host ports after the highest one in use."""
        a = self._arrays
        for row, used in enumerate(a.ports_used):
            if used:
                a.port_cursor[row] = max(used)

    # --- apply / unapply (place() and the ledger share them) -----------------------------------

    def apply(self, alloc: Alloc, *, row: int, advance_cursor: bool = True) -> None:
        """Take `alloc` from `row`'s free capacity (may go negative for a stale ledger; never checks)."""
        a = self._arrays
        alloc.row = row
        a.row_version[row] += 1
        a.cpu_free[row] -= alloc.cpu
        a.mem_free[row] -= alloc.mem
        a.pods_free[row] -= 1
        for name, amount in alloc.ext:
            col = a.ext_column(name)  # first: a new column replaces `ext_free`
            a.ext_free[row, col] -= amount
        if alloc.gpus:
            self._gpus_take(row, alloc.gpus, alloc.gpu_milli, alloc.gpu_mem)
            a.gpu_kinds[row, _kind(alloc, a.g)] += 1
        if alloc.nics:
            held = a.nics_used[row]
            for nic in alloc.nics:
                held[nic] = held.get(nic, 0) + 1
        if alloc.ports:
            used = a.ports_used[row]
            lo, hi = self.port_lo, self.port_hi
            for p in alloc.ports:
                n = used.get(p, 0)
                used[p] = n + 1
                if not n and lo <= p <= hi:
                    a.ports_used_count[row] += 1
            if advance_cursor:
                a.port_cursor[row] = alloc.ports[-1]

    def unapply(self, alloc: Alloc) -> None:
        """Give back what `apply` took (nothing if `alloc` is not applied)."""
        row = alloc.row
        if row < 0:
            return
        a = self._arrays
        alloc.row = -1
        a.row_version[row] += 1
        a.cpu_free[row] += alloc.cpu
        a.mem_free[row] += alloc.mem
        a.pods_free[row] += 1
        for name, amount in alloc.ext:
            col = a.ext_column(name)  # first: a new column replaces `ext_free`
            a.ext_free[row, col] += amount
        if alloc.gpus:
            self._gpus_take(row, alloc.gpus, -alloc.gpu_milli, -alloc.gpu_mem)
            a.gpu_kinds[row, _kind(alloc, a.g)] -= 1
        if alloc.nics:
            held = a.nics_used[row]
            for nic in alloc.nics:
                n = held.get(nic, 0)
                if n > 1:
                    held[nic] = n - 1
                else:
                    held.pop(nic, None)
        if alloc.ports:
            used = a.ports_used[row]
            lo, hi = self.port_lo, self.port_hi
            for p in alloc.ports:
                n = used.get(p, 0)
                if n > 1:
                    used[p] = n - 1
                elif n == 1:
                    del used[p]
                    if lo <= p <= hi:
                        a.ports_used_count[row] -= 1

    def take_ports(self, row: int, count: int) -> tuple[int, ...] | None:
        """`count` free host ports on `row`, round-robin after the last one handed out there."""
        if count <= 0:
            return ()
        a = self._arrays
        if self.port_count - int(a.ports_used_count[row]) < count:
            return None
        used = a.ports_used[row]
        lo, size = self.port_lo, self.port_count
        start = int(a.port_cursor[row]) + 1 - lo
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
        a = self._arrays
        free = a.gpu_free_milli
        healthy = a.gpu_healthy
        mem_free = a.gpu_mem_free
        g = a.g
        delta = 0
        whole = abs(milli) >= GPU_MILLI
        for idx in gpus:
            if idx >= g:
                continue
            if whole:  # a whole GPU takes (or gives back) all of its memory
                total = int(a.gpu_mem_mib[row, idx])
                mem_free[row, idx] -= total if milli > 0 else -total
            elif mem:
                mem_free[row, idx] -= mem
            before = int(free[row, idx])
            after = before - milli
            free[row, idx] = after
            if healthy[row, idx]:
                delta += (after == GPU_MILLI) - (before == GPU_MILLI)
        if delta:
            a.gpu_whole_free[row] += delta

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
