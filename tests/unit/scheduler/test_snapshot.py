"""The snapshot: free capacity as arrays, kept current one row at a time, equal to a rebuild."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.apis.core import Taint
from gpuyard.apis.resourceclasses import ResourceClass, default_class
from gpuyard.apis.scheduling import Reservation
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import Constraints
from gpuyard.scheduler.placement.packing.plugins import PackingScore
from tests.unit.scheduler.helpers import make_node

FIELDS = (
    "alive", "ready", "schedulable", "cpu_alloc", "cpu_free", "mem_alloc", "mem_free", "pods_free",
    "gpu_count", "gpu_whole_free", "gpu_healthy_count", "ports_used_count", "tainted",
)  # fmt: skip


def rows_by_name(s: Snapshot) -> dict[str, dict[str, object]]:
    out = {}
    for name, row in s.index.items():
        g = int(s.gpu_count[row])
        out[name] = {f: getattr(s, f)[row].item() for f in FIELDS} | {
            "gpu_free": s.gpu_free_milli[row, :g].tolist(),
            "healthy": s.gpu_healthy[row, :g].tolist(),
            "ports": sorted(s.ports_used[row].items()),
            "model": s.model_names[s.gpu_model[row]] if s.gpu_model[row] >= 0 else "",
            "ext": {n: int(s.ext_free[row, s.ext_col(n)]) for n in s.ext_names},
        }
    return out


def reservation(
    name: str, node: str, *, gpus=(), cpu="1", memory="1Gi", ports=(), rv: int = 1, milli: int = 1000
) -> Reservation:
    return Reservation.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv)},
            "spec": {
                "podGroup": name.rsplit("-", 2)[0],
                "role": "Worker",
                "index": 0,
                "node": node,
                "gpus": list(gpus),
                "gpuMilli": milli if gpus else 0,
                "hostPorts": list(ports),
                "requests": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": len(gpus)},
            },
        }
    )


def test_free_is_allocatable_minus_reservations():
    s = Snapshot.build(
        nodes=[
            make_node("a", gpus=8, cpu="64", memory="512Gi"),
            make_node("b", gpus=0, cpu="16", memory="64Gi"),
        ],
        reservations=[
            reservation("j-worker-0", "a", gpus=(0, 1), cpu="2500m", memory="10Gi", ports=(20005,))
        ],
    )
    a = s.index["a"]
    assert s.cpu_free[a] == 64000 - 2500 and s.mem_free[a] == 512 * 1024 - 10 * 1024
    assert s.gpu_free_milli[a].tolist() == [0, 0] + [1000] * 6 and s.gpu_whole_free[a] == 6
    assert s.ports_used[a] == {20005: 1} and s.ports_used_count[a] == 1 and s.port_cursor[a] == 20005
    assert s.gpu_count[s.index["b"]] == 0 and s.gpu_model[s.index["b"]] == -1
    assert s.placed_pods(("default", "j")) == {"j-worker-0": "a"}


def test_upsert_is_idempotent_and_remove_gives_back():
    s = Snapshot.build(nodes=[make_node("a", gpus=4)])
    res = reservation("j-worker-0", "a", gpus=(1,), rv=7)
    epoch = s.epoch
    assert s.upsert_reservation(res) is True
    assert s.upsert_reservation(res) is False  # the watch echo of our own assume
    assert s.epoch == epoch  # taking capacity never re-activates parked jobs
    assert s.gpu_whole_free[0] == 3
    s.remove_reservation(("default", "j-worker-0"))
    assert s.gpu_whole_free[0] == 4 and s.cpu_free[0] == 64000 and s.epoch > epoch
    assert s.placed_pods(("default", "j")) == {}


def test_reservation_on_unknown_node_counts_once_the_node_appears_and_node_removal_frees_the_row():
    s = Snapshot(rows=1)
    s.upsert_reservation(reservation("j-worker-0", "late", gpus=(0,)))
    s.refresh_node(make_node("early", gpus=2))
    row = s.refresh_node(make_node("late", gpus=2))
    assert s.n >= 2 and s.gpu_whole_free[row] == 1
    s.remove_node("late")
    assert not s.alive[row] and "late" not in s.index
    again = s.refresh_node(make_node("other", gpus=2))
    assert again == row and s.gpu_whole_free[row] == 2  # the row is reused, nothing left over


def test_unhealthy_gpus_are_not_free_and_a_wider_node_grows_the_arrays():
    node = make_node("a", gpus=4)
    node.metadata.annotations["gpuyard.io/unhealthy-gpus"] = "2"
    s = Snapshot(rows=1, gpu_width=4)
    row = s.refresh_node(node)
    assert s.gpu_whole_free[row] == 3 and s.gpu_healthy_count[row] == 3
    wide = s.refresh_node(make_node("b", gpus=16))
    assert s.g == 16 and s.gpu_whole_free[wide] == 16 and s.gpu_whole_free[row] == 3


def test_masks_are_cached_and_patched_when_a_node_changes():
    s = Snapshot.build(
        nodes=[make_node(f"n{i}", gpus=0, labels={"zone": "a" if i % 2 else "b"}) for i in range(4)]
    )
    c = Constraints(node_selector=(("zone", "a"),))
    assert s.selector_mask(c).tolist() == [False, True, False, True]
    assert s.selector_mask(c) is s.selector_mask(c)
    s.refresh_node(make_node("n0", gpus=0, labels={"zone": "a"}))
    assert s.selector_mask(c).tolist() == [True, True, False, True]
    tainted = make_node("n1", gpus=0, taints=[Taint(key="gpu", value="yes", effect="NoSchedule")])
    s.refresh_node(tainted)
    tol = Constraints(tolerations=(("gpu", "Equal", "yes", "NoSchedule"),))
    assert s.taint_mask(Constraints()).tolist() == [True, False, True, True]
    assert s.taint_mask(tol).tolist() == [True, True, True, True]


def test_class_masks_follow_class_changes():
    s = Snapshot.build(
        nodes=[make_node("v", gpus=2, model="v100"), make_node("k", gpus=2, model="k80")],
        classes=[default_class("v100")],
    )
    cm = s.class_mask("nvidia.v100")
    assert cm.count.tolist() == [2, 0]
    assert s.class_mask("nvidia.k80") is None
    k80 = default_class("k80")
    k80.metadata.resource_version = "5"
    assert s.set_classes([default_class("v100"), k80])
    assert s.class_mask("nvidia.k80").count.tolist() == [0, 2]
    changed = ResourceClass.model_validate(
        {
            "metadata": {"name": "nvidia.k80", "resourceVersion": "6"},
            "spec": {"selector": {"matchLabels": {"model": "v100"}}},
        }
    )
    s.set_classes([default_class("v100"), changed])
    assert s.class_mask("nvidia.k80").count.tolist() == [2, 0]


def test_host_ports_round_robin_skip_used_and_wrap():
    s = Snapshot.build(nodes=[make_node("a", gpus=0)], port_range=(100, 104))
    assert s.take_ports(0, 2) == (100, 101)
    s.upsert_reservation(reservation("x-worker-0", "a", ports=(100, 101)))
    assert s.port_cursor[0] == 101
    s.upsert_reservation(reservation("y-worker-0", "a", ports=(103,)))
    assert s.port_cursor[0] == 103
    assert s.take_ports(0, 2) == (104, 102)  # after the last handed out, skipping used, wrapping
    s.port_cursor[0] = 101
    assert s.take_ports(0, 1) == (102,)
    assert s.take_ports(0, 3) is None  # only 102 and 104 are free


def test_the_packing_mirror_reads_the_same_arrays():
    s = Snapshot.build(
        nodes=[make_node("a", gpus=4), make_node("b", gpus=0)],
        reservations=[reservation("j-worker-0", "a", gpus=(0,), milli=500)],
    )
    cs = PackingScore().mirror(s)
    assert cs.node_names == ["a", "b"]
    assert cs.gpu_free[0].tolist()[:4] == [500, 1000, 1000, 1000]
    assert cs.cpu_free.tolist() == [63000, 64000]


# --- incremental == rebuilt -------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("node"),
            st.integers(0, 5),
            st.integers(0, 8),
            st.booleans(),
            st.sampled_from(["", "1", "0,3"]),
        ),
        st.tuples(st.just("drop-node"), st.integers(0, 5)),
        st.tuples(
            st.just("res"),
            st.integers(0, 9),
            st.integers(0, 5),
            st.lists(st.integers(0, 7), max_size=3, unique=True),
            st.integers(0, 3),
        ),
        st.tuples(st.just("drop-res"), st.integers(0, 9)),
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_incremental_updates_equal_a_rebuild(operations):
    live_nodes: dict[str, object] = {}
    live_res: dict[str, Reservation] = {}
    s = Snapshot(rows=2, gpu_width=2, port_range=(20000, 20010))
    rv = 0
    for op in operations:
        rv += 1
        if op[0] == "node":
            _, i, gpus, ready, broken = op
            node = make_node(
                f"n{i}", gpus=gpus, ready=ready, labels={"topology.gpuyard.io/block": f"b{i % 2}"}
            )
            if broken:
                node.metadata.annotations["gpuyard.io/unhealthy-gpus"] = broken
            node.metadata.resource_version = str(rv)
            live_nodes[f"n{i}"] = node
            s.refresh_node(node)
        elif op[0] == "drop-node":
            live_nodes.pop(f"n{op[1]}", None)
            s.remove_node(f"n{op[1]}")
        elif op[0] == "res":
            _, j, i, gpus, port = op
            res = reservation(
                f"j{j}-worker-0", f"n{i}", gpus=gpus, ports=(20000 + port,) if port else (), rv=rv
            )
            live_res[res.metadata.name] = res
            s.upsert_reservation(res)
        else:
            live_res.pop(f"j{op[1]}-worker-0", None)
            s.remove_reservation(("default", f"j{op[1]}-worker-0"))
    rebuilt = Snapshot.build(
        nodes=list(live_nodes.values()), reservations=list(live_res.values()), port_range=(20000, 20010)
    )
    mine, want = rows_by_name(s), rows_by_name(rebuilt)
    for row in mine.values():  # a rebuilt snapshot only knows extended resources some node offers
        row["ext"] = {k: v for k, v in row["ext"].items() if k in rebuilt.ext_names}
    assert mine == want
    assert int(s.alive.sum()) == len(live_nodes)
    assert np.all(s.gpu_whole_free[~s.alive] >= 0)
