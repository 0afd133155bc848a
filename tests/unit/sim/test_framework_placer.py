"""The openb experiment through the live scheduler gives the packing engine's placements exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuyard.scheduler.placement.packing import PodRequest
from gpuyard.sim.framework_placer import FrameworkPlacer, framework_placer, node_objects, pod_spec
from gpuyard.sim.openb import packing_placer, run_openb, simulator_node_names
from gpuyard.sim.traces import NodeTrace, PodTrace, load_openb_nodes, load_openb_pods, tune_workload

DATA = Path(__file__).resolve().parents[2] / "data" / "openb"
DETERMINISTIC = ["first-fit", "dot-product", "gpu-clustering", "gpu-packing", "best-fit", "fgd", "gpuyard"]


@pytest.fixture(scope="module")
def openb_slice(tmp_path_factory) -> tuple[NodeTrace, PodTrace]:
    """The first 60 nodes of the real trace with its full pod list (tuned down to 1.3x those nodes)."""
    lines = (DATA / "openb_node_list_gpu_node.csv").read_text().splitlines()
    path = tmp_path_factory.mktemp("slice") / "openb_node_list_gpu_node.csv"
    path.write_text("\n".join(lines[:61]) + "\n")
    nodes = load_openb_nodes(path)
    return nodes, load_openb_pods(DATA / "openb_pod_list_default.csv", models=nodes.model_names)


@pytest.mark.parametrize("policy", DETERMINISTIC)
def test_every_pod_lands_where_the_packing_engine_puts_it(openb_slice, policy: str) -> None:
    nodes, pods = openb_slice
    nodes = simulator_node_names(nodes, seed=7)
    ledger = nodes.to_state()
    requests = pods.requests(ledger)
    order = tune_workload(pods, cluster_gpu_milli=ledger.total_gpu_milli, load=1.3, seed=7)
    engine = packing_placer(state=ledger.copy(), workload=requests, policy=policy, seed=7)
    scheduler = framework_placer(state=ledger.copy(), workload=requests, policy=policy, seed=7)
    placed = 0
    for i in order:
        expected = engine.place(requests[i])
        assert scheduler.place(requests[i]) == expected, f"pod {requests[i]} under {policy}"
        placed += expected is not None
    assert 0 < placed < len(order)  # the run saturates the slice: some pods fail


def test_random_policy_runs_reproducibly_and_never_overcommits(openb_slice) -> None:
    nodes, pods = openb_slice
    a = run_openb(nodes, pods, policy="random", seed=5, placer_factory=framework_placer)
    b = run_openb(nodes, pods, policy="random", seed=5, placer_factory=framework_placer)
    assert np.array_equal(a.alloc, b.alloc, equal_nan=True) and a.failed == b.failed > 0


def test_curves_match_the_packing_engine(openb_slice) -> None:
    nodes, pods = openb_slice
    a = run_openb(nodes, pods, policy="fgd", seed=3, placer_factory=framework_placer)
    b = run_openb(nodes, pods, policy="fgd", seed=3, placer_factory=packing_placer)
    assert np.array_equal(a.alloc, b.alloc, equal_nan=True)
    assert (a.placed, a.failed) == (b.placed, b.failed)


def test_gpu_spec_becomes_a_required_model_affinity(openb_slice) -> None:
    nodes, _ = openb_slice
    ledger = nodes.to_state()
    models = ledger.model_names
    want = models.index("V100M32") if "V100M32" in models else 0
    pod = PodRequest(
        name="p", cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=1000, allowed_models=(want,)
    )
    spec = pod_spec(pod, models)
    term = (
        spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[0]
    )
    assert (term.match_expressions[0].key, term.match_expressions[0].values) == (
        "gpuyard.io/gpu-model",
        [models[want]],
    )
    placer = FrameworkPlacer(state=ledger.copy(), workload=[pod], policy="best-fit", seed=0)
    node, gpus = placer.place(pod)  # type: ignore[misc]
    assert ledger.gpu_model[node] == want and len(gpus) == 1


def test_node_objects_carry_capacity_and_model() -> None:
    nodes = load_openb_nodes(DATA / "nodes_small.csv")
    state = nodes.to_state()
    objs = node_objects(state, range(state.n_nodes))
    for i, node in enumerate(objs):
        assert node.ready and node.metadata.name == state.node_names[i]
        assert int(node.status.allocatable["cpu"] * 1000) == state.cpu_capacity[i]
        gpus = int(node.status.allocatable.get("nvidia.com/gpu", 0))
        assert gpus == state.gpu_count[i]
        if gpus:
            assert node.metadata.labels["gpuyard.io/gpu-model"] == state.model_names[state.gpu_model[i]]
