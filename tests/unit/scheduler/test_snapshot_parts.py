"""The snapshot's parts: node arrays growing, the ledger's extended resources, the masks' LRU cache."""

from __future__ import annotations

import pytest

from gpuyard.apis.resourceclasses import default_class
from gpuyard.apis.scheduling import Reservation
from gpuyard.scheduler.cache import masks
from gpuyard.scheduler.cache.nodearrays import NodeArrays
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import Constraints
from tests.unit.scheduler.helpers import make_node


def test_growing_the_node_arrays_keeps_every_value_and_fills_new_rows_with_defaults():
    a = NodeArrays(rows=2, gpu_width=2, port_lo=100)
    col = a.ext_column("rdma/hca")
    a.ext_free[1, col] = 7
    a.gpu_free_milli[1] = [300, 1000]
    a.gpu_kinds[1] = [1, 0, 2]
    a.port_cursor[1] = 104
    a.gpu_model[1] = 3
    a.ports_used[1][104] = 1
    a.grow(5, 4)
    assert (a.n, a.g) == (5, 4)
    assert a.ext_col("rdma/hca") == col and a.ext_free[1, col] == 7 and a.ext_free.shape == (5, 1)
    assert a.gpu_free_milli[1].tolist() == [300, 1000, 0, 0]
    assert a.gpu_kinds[1].tolist() == [1, 0, 2, 0, 0]
    assert a.port_cursor.tolist() == [99, 104, 99, 99, 99]
    assert a.gpu_model.tolist() == [-1, 3, -1, -1, -1]
    assert a.ports_used == [{}, {104: 1}, {}, {}, {}] and len(a.nics_used) == 5
    a.grow(3, 2)  # never shrinks
    assert (a.n, a.g) == (5, 4)


def test_an_empty_port_range_is_refused():
    with pytest.raises(ValueError, match="empty"):
        Snapshot(port_range=(30000, 20000))


def _taking(name: str, node: str, requests: dict[str, object]) -> Reservation:
    return Reservation.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"},
            "spec": {"podGroup": "j", "role": "Worker", "index": 0, "node": node, "requests": requests},
        }
    )


def test_extended_resources_are_taken_and_given_back_even_when_no_node_offers_them():
    s = Snapshot.build(nodes=[make_node("a", gpus=0)])
    storage = s.ext_col("ephemeral-storage")
    assert storage is not None and s.ext_col("example.com/foo") is None
    before = int(s.ext_free[0, storage])
    s.upsert_reservation(_taking("j-worker-0", "a", {"ephemeral-storage": "1", "example.com/foo": 2}))
    foo = s.ext_col("example.com/foo")
    assert foo is not None  # the column was added by the reservation (a stale ledger goes negative)
    assert int(s.ext_free[0, storage]) == before - 1000 and int(s.ext_free[0, foo]) == -2000
    s.remove_reservation(("default", "j-worker-0"))
    assert int(s.ext_free[0, storage]) == before and int(s.ext_free[0, foo]) == 0


def test_the_mask_cache_is_bounded_and_patching_a_node_keeps_the_recency(monkeypatch):
    monkeypatch.setattr(masks, "_MASK_CACHE_SIZE", 2)
    s = Snapshot.build(nodes=[make_node(f"n{i}", gpus=0, labels={"zone": f"z{i}"}) for i in range(3)])
    zone = [Constraints(node_selector=(("zone", f"z{i}"),)) for i in range(3)]
    first = s.selector_mask(zone[0])
    second = s.selector_mask(zone[1])
    assert s.selector_mask(zone[0]) is first  # zone[0] is now the most recently used
    s.refresh_node(make_node("n1", gpus=0, labels={"zone": "z0"}))
    assert first.tolist() == [True, True, False] and second.tolist() == [False, False, False]
    s.selector_mask(zone[2])  # evicts the least recently used: zone[1], not zone[0]
    assert s.selector_mask(zone[0]) is first
    assert s.selector_mask(zone[1]) is not second


def test_growing_the_snapshot_recomputes_the_cached_masks_at_the_new_size():
    s = Snapshot(rows=1, gpu_width=2)
    s.set_classes([default_class("v100")])
    s.refresh_node(make_node("n0", gpus=2, labels={"zone": "a"}))
    zone = Constraints(node_selector=(("zone", "a"),))
    assert s.selector_mask(zone).tolist() == [True]
    assert s.class_mask("nvidia.v100").count.tolist() == [2]
    s.refresh_node(make_node("n1", gpus=4, labels={"zone": "a"}))  # a new row and wider GPUs
    assert s.n >= 2 and s.g == 4
    assert s.selector_mask(zone).tolist()[:2] == [True, True]
    cm = s.class_mask("nvidia.v100")
    assert cm.gpu.shape == (s.n, 4) and cm.count.tolist()[:2] == [2, 4]
