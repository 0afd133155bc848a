"""The snapshot's flat per-node arrays: capacity, free capacity and numeric node facts.

One row per node, one column per GPU slot (`G` = the most GPUs any node has; missing GPUs are
padding that behaves as fully used). The layout follows the packing policies'
(`gpuyard.scheduler.placement.packing.state`): `cpu_free[N]` milli-CPU, `mem_free[N]` MiB,
`gpu_free_milli[N, G]` free thousandths of each GPU (1000 = idle), `gpu_mem_free[N, G]` free
GPU memory in MiB (whole-GPU pods take all of it, shares their memory), `gpu_model[N]`.

GPU sharing: a GPU serves one whole-GPU pod or several shares, never both — a whole-GPU pod
needs `gpu_free_milli == 1000` (so no share on it) and takes all 1000; a share takes its milli
and memory, so the GPU is no longer idle for whole-GPU pods until every share has left.

:class:`NodeArrays` only holds the arrays and makes room for more rows, GPU slots or extended
resources; it decides nothing. Its writers are :class:`~gpuyard.scheduler.cache.noderows.NodeRows`
(a node's static columns: allocatable, GPUs, health, model, block, ...) and
:class:`~gpuyard.scheduler.cache.allocations.Ledger` (the free columns, ports and NICs in use); the
filters, scores and GPU choosers read it through the snapshot.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NodeArrays"]


class NodeArrays:
    """Per-node arrays, `n` rows by `g` GPU slots (see the module docstring)."""

    def __init__(self, *, rows: int, gpu_width: int, port_lo: int) -> None:
        self.port_lo = port_lo
        """First host port of the range: a fresh row's `port_cursor` points just before it."""
        self.ext_names: list[str] = []
        """Extended resources (RDMA, hugepages, ...), one column each of `ext_alloc`/`ext_free`."""
        self._ext_index: dict[str, int] = {}
        self.ports_used: list[dict[int, int]] = []  # per row: host port -> reservations using it
        self.nics_used: list[dict[str, int]] = []  # per row: NIC name -> reservations holding it
        self._allocate(max(rows, 1), max(gpu_width, 1))

    def _allocate(self, n: int, g: int) -> None:
        """Fresh arrays for `n` rows and `g` GPU slots (every ndarray attribute is a per-row array);
        the per-row lists are extended to `n`."""
        e = len(self.ext_names)
        self.n, self.g = n, g
        self.alive = np.zeros(n, dtype=bool)
        self.ready = np.zeros(n, dtype=bool)
        self.schedulable = np.zeros(n, dtype=bool)
        self.tainted = np.zeros(n, dtype=bool)
        self.cpu_alloc = np.zeros(n, dtype=np.int64)
        self.cpu_free = np.zeros(n, dtype=np.int64)
        self.mem_alloc = np.zeros(n, dtype=np.int64)
        self.mem_free = np.zeros(n, dtype=np.int64)
        self.pods_alloc = np.zeros(n, dtype=np.int64)
        self.pods_free = np.zeros(n, dtype=np.int64)
        self.ext_alloc = np.zeros((n, e), dtype=np.int64)
        self.ext_free = np.zeros((n, e), dtype=np.int64)
        self.gpu_count = np.zeros(n, dtype=np.int16)
        self.gpu_exists = np.zeros((n, g), dtype=bool)
        self.gpu_healthy = np.zeros((n, g), dtype=bool)
        self.gpu_free_milli = np.zeros((n, g), dtype=np.int32)
        self.gpu_mem_mib = np.zeros((n, g), dtype=np.int32)
        self.gpu_mem_free = np.zeros((n, g), dtype=np.int64)
        self.gpu_whole_free = np.zeros(n, dtype=np.int32)
        self.gpu_healthy_count = np.zeros(n, dtype=np.int32)
        self.gpu_healthy_inv = np.zeros(n, dtype=np.float64)  # 1 / healthy GPUs (0 without): binpack scores
        self.gpu_model = np.full(n, -1, dtype=np.int16)
        self.gpu_kinds = np.zeros((n, g + 1), dtype=np.int32)  # GPU pods: column 0 shares, k pods of k GPUs
        self.row_version = np.zeros(n, dtype=np.int64)  # bumped whenever a row's free capacity changes
        self.block = np.full(n, -1, dtype=np.int32)
        self.spine = np.full(n, -1, dtype=np.int32)
        self.table_id = np.full(n, -1, dtype=np.int32)
        self.ports_used_count = np.zeros(n, dtype=np.int32)  # distinct ports of the range in use
        self.port_cursor = np.full(n, self.port_lo - 1, dtype=np.int64)  # last host port handed out
        for per_row in (self.ports_used, self.nics_used):
            per_row.extend({} for _ in range(n - len(per_row)))

    def grow(self, n: int, g: int) -> None:
        """Make room for `n` rows and `g` GPU slots (never shrinks), keeping every value."""
        old = {name: value for name, value in vars(self).items() if isinstance(value, np.ndarray)}
        self._allocate(max(n, self.n), max(g, self.g))
        for name, arr in old.items():
            getattr(self, name)[tuple(slice(0, size) for size in arr.shape)] = arr

    def ext_col(self, name: str) -> int | None:
        """The column of extended resource `name` in `ext_alloc`/`ext_free`, None if no node or
        reservation has mentioned it."""
        return self._ext_index.get(name)

    def ext_column(self, name: str) -> int:
        """The column of extended resource `name`, added (zero everywhere) if new."""
        col = self._ext_index.get(name)
        if col is None:
            col = self._ext_index[name] = len(self.ext_names)
            self.ext_names.append(name)
            self.ext_alloc = np.concatenate([self.ext_alloc, np.zeros((self.n, 1), np.int64)], axis=1)
            self.ext_free = np.concatenate([self.ext_free, np.zeros((self.n, 1), np.int64)], axis=1)
        return col
