"""The openb saturation experiment: runs, curves, placers, and the files it writes."""

from __future__ import annotations

import builtins
import csv
import json
from pathlib import Path

import numpy as np
import pytest

from gpuyard.scheduler.placement.packing import OvercommitError, PodRequest
from gpuyard.sim.openb import (
    CURVE_POINTS,
    PUBLISHED_MEANS,
    PackingPlacer,
    discretize,
    is_default_trace,
    packing_placer,
    run_many,
    run_openb,
    simulator_node_names,
    summarize,
    write_alloc_csv,
    write_plot,
    write_summary_json,
)
from gpuyard.sim.traces import NodeTrace, PodTrace, load_openb_nodes, load_openb_pods

DATA = Path(__file__).resolve().parents[2] / "data" / "openb"


@pytest.fixture(scope="module")
def small() -> tuple[NodeTrace, PodTrace]:
    nodes = load_openb_nodes(DATA / "nodes_small.csv")
    return nodes, load_openb_pods(DATA / "pods_small.csv", models=nodes.model_names)


@pytest.fixture(scope="module")
def openb_slice(tmp_path_factory) -> tuple[NodeTrace, PodTrace]:
    """The first 40 nodes of the real trace with its full pod list (tuned down to 1.3x those nodes)."""
    lines = (DATA / "openb_node_list_gpu_node.csv").read_text().splitlines()
    path = tmp_path_factory.mktemp("slice") / "openb_node_list_gpu_node.csv"
    path.write_text("\n".join(lines[:41]) + "\n")
    nodes = load_openb_nodes(path)
    return nodes, load_openb_pods(DATA / "openb_pod_list_default.csv", models=nodes.model_names)


def monotone(curve: np.ndarray) -> bool:
    values = curve[~np.isnan(curve)]
    return bool((np.diff(values) >= -1e-9).all())


@pytest.mark.parametrize("policy", ["random", "first-fit", "best-fit", "fgd", "gpuyard"])
def test_runs_are_deterministic_and_curves_monotone(small, policy):
    nodes, pods = small
    a = run_openb(nodes, pods, policy=policy, seed=3)
    b = run_openb(nodes, pods, policy=policy, seed=3)
    assert np.array_equal(a.alloc, b.alloc, equal_nan=True) and a.failed == b.failed
    assert a.alloc.shape == (CURVE_POINTS,) and a.frag_rate.shape == (CURVE_POINTS,)
    assert monotone(a.alloc)
    assert a.placed + a.failed == a.pods
    assert 0 < a.final_alloc <= 100
    assert np.nanmax(a.alloc) <= 100


def test_a_real_slice_saturates_and_fgd_packs_better_than_random(openb_slice):
    nodes, pods = openb_slice
    results = {p: run_openb(nodes, pods, policy=p, seed=42) for p in ("random", "fgd", "gpuyard")}
    for r in results.values():
        assert monotone(r.alloc)
        assert r.alloc[50] == pytest.approx(50, abs=3)  # below saturation everything fits
        assert r.failed > 0  # 130% cannot fit
    assert results["fgd"].alloc_at(130) > results["random"].alloc_at(130)


def test_arrived_load_counts_failed_pods_and_allocation_never_exceeds_arrival(small):
    nodes, pods = small
    r = run_openb(nodes, pods, policy="fgd", seed=0, load=2.0)
    arrived, alloc, frag = r.steps.T
    assert len(arrived) == r.pods
    assert (np.diff(arrived) >= 0).all() and (np.diff(alloc) >= 0).all()
    assert (alloc <= arrived + 1e-9).all()
    assert arrived[-1] == pytest.approx(200, abs=30) and alloc[-1] < 100
    assert ((0 <= frag) & (frag <= 100)).all()
    assert r.failed > 0


def test_discretize_follows_the_papers_binning():
    arrived = np.array([0.2, 0.4, 0.6, 1.4, 2.5, 3.5, 6.0])
    alloc = np.array([0.111, 0.333, 0.6, 1.4, 2.5, 3.5, 5.0])
    out = discretize(arrived, alloc, points=10)
    assert out[0] == pytest.approx(round((0.11 + 0.33) / 2, 2))  # 0.2 and 0.4 round to 0
    assert out[1] == pytest.approx(1.0)  # 0.6 and 1.4 round to 1
    assert out[2] == pytest.approx(2.5)  # 2.5 rounds half to even -> 2
    assert out[4] == pytest.approx(3.5)  # 3.5 -> 4
    assert out[3] == pytest.approx(3.0)  # empty: the mean over 2..4
    assert out[5] == pytest.approx(4.25)  # empty: 4..6
    assert out[7] == pytest.approx(5.0)  # empty: 6..8 holds the pod at 6
    assert np.isnan(out[8]) and np.isnan(out[9])


class Greedy:
    """A placer that ignores capacity, to show the run's ledger catches it."""

    def __init__(self) -> None:
        self.calls = 0

    def place(self, pod: PodRequest):
        self.calls += 1
        return (3, (0,) * pod.num_gpu) if pod.num_gpu <= 1 else None


def test_the_ledger_catches_a_placer_that_overcommits(small):
    nodes, pods = small
    with pytest.raises(OvercommitError):
        run_openb(nodes, pods, policy="fgd", seed=1, placer_factory=lambda **_: Greedy())


def test_a_custom_placer_factory_gets_the_state_workload_policy_and_seed(small):
    nodes, pods = small
    seen = {}

    def factory(*, state, workload, policy, seed):
        seen.update(nodes=state.n_nodes, pods=len(workload), policy=policy, seed=seed)
        return packing_placer(state=state, workload=workload, policy="best-fit", seed=seed)

    r = run_openb(nodes, pods, policy="mine", seed=9, placer_factory=factory)
    assert seen == {"nodes": 5, "pods": 40, "policy": "mine", "seed": 9}
    assert r.policy == "mine"
    ref = run_openb(nodes, pods, policy="best-fit", seed=9)
    assert np.array_equal(r.alloc, ref.alloc, equal_nan=True)
    assert isinstance(
        packing_placer(state=nodes.to_state(), workload=[], policy="random", seed=0), PackingPlacer
    )


def test_writers_use_the_papers_layout_and_summaries(small, tmp_path):
    nodes, pods = small
    results = run_many(nodes, pods, policies=["fgd", "best-fit"], seeds=[1, 2])
    assert [(r.policy, r.seed) for r in results] == [("fgd", 1), ("fgd", 2), ("best-fit", 1), ("best-fit", 2)]
    path = write_alloc_csv(results, tmp_path / "alloc.csv", workload="pods_small")
    with path.open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["workload", "sc_policy", "tune", "seed", "total_gpus", *map(str, range(131))]
    assert rows[1][:5] == ["pods_small", "fgd", "1.3", "1", "15"]
    with write_alloc_csv(results, tmp_path / "p.csv", workload="w", paper_names=True).open() as f:
        assert [row[1] for row in csv.reader(f)][1:] == ["06-FGD", "06-FGD", "05-BestFit", "05-BestFit"]
    doc = json.loads(write_summary_json(results, tmp_path / "s.json", published=False).read_text())
    assert set(doc["policies"]) == {"fgd", "best-fit"}
    assert doc["policies"]["fgd"]["seeds"] == [1, 2]
    assert "published_alloc_pct_mean" not in doc["policies"]["fgd"]
    assert len(doc["runs"]) == 4
    with_published = summarize(results, published=True)
    assert with_published["fgd"]["published_alloc_pct_mean"]["130"] == PUBLISHED_MEANS["fgd"][130] == 95.39
    assert "delta_vs_published" in with_published["best-fit"]


def test_default_trace_is_recognised(small):
    nodes = load_openb_nodes(DATA / "openb_node_list_gpu_node.csv")
    pods = load_openb_pods(DATA / "openb_pod_list_default.csv", models=nodes.model_names)
    assert is_default_trace(nodes, pods)
    assert not is_default_trace(*small)


def test_plot_is_skipped_without_matplotlib(small, tmp_path, monkeypatch):
    nodes, pods = small
    results = run_many(nodes, pods, policies=["first-fit"], seeds=[1])
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert write_plot(results, tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()


def test_simulator_node_names_are_a_seeded_permutation_prefix(small):
    nodes, _ = small
    a = simulator_node_names(nodes, seed=42)
    assert a.names == simulator_node_names(nodes, seed=42).names
    assert a.names != simulator_node_names(nodes, seed=43).names
    prefixes = sorted(int(n.split("-", 1)[0]) for n in a.names)
    assert prefixes == list(range(len(nodes)))
    assert [n.split("-", 1)[1] for n in a.names] == nodes.names
    assert a.gpus is nodes.gpus and a.models == nodes.models


def test_node_order_choices(small):
    nodes, pods = small
    trace = run_openb(nodes, pods, policy="first-fit", seed=4, node_order="trace")
    sim = run_openb(nodes, pods, policy="first-fit", seed=4)
    assert trace.pods == sim.pods
    with pytest.raises(ValueError, match="node_order"):
        run_openb(nodes, pods, policy="first-fit", seed=4, node_order="random")


def test_published_curves_are_the_papers_means():
    from gpuyard.sim.openb import PUBLISHED_MEANS, published_curves

    curves = published_curves()
    assert set(curves) == {"random", "dot-product", "gpu-clustering", "gpu-packing", "best-fit", "fgd"}
    for policy, curve in curves.items():
        assert curve.shape == (131,)
        assert abs(curve[100] - PUBLISHED_MEANS[policy][100]) < 0.06, policy
        assert abs(curve[130] - PUBLISHED_MEANS[policy][130]) < 0.06, policy


def test_published_figures_for_the_seeds_run():
    from gpuyard.sim.openb import PUBLISHED_MEANS, published_at

    # seed 42's own published curve, not the 10-seed mean (95.23 / 95.39)
    assert published_at("fgd", [42], (100, 130)) == {100: 95.14, 130: 95.29}
    assert published_at("fgd", range(42, 52), (80, 90, 100, 130)) == PUBLISHED_MEANS["fgd"]
    assert published_at("fgd", [7], (100,)) is None  # the paper has no seed 7
    assert published_at("gpuyard", [42], (100,)) is None


def test_small_benchmark_compares_with_the_published_figure_of_its_seed():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_bench_openb", DATA.parents[2] / "bench" / "openb_packing.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.published_comparison("gpuyard", [42], {"alloc_100_mean": 95.93, "alloc_130_mean": 96.04})
    assert out["published_fgd_seeds"] == [42]
    assert (out["published_fgd_100"], out["published_fgd_130"]) == (95.14, 95.29)
    assert (out["delta_100_vs_published_fgd"], out["delta_130_vs_published_fgd"]) == (0.79, 0.75)
    assert out["published_fgd_100_range_all_seeds"] == [95.06, 95.38]
    assert bench.published_comparison("first-fit", [42], {}) == {}


def test_plot_title_names_the_trace_and_the_seeds(small):
    from gpuyard.sim.openb import plot_title, seeds_text

    nodes, pods = small
    results = run_many(nodes, pods, policies=["fgd"], seeds=[42, 43, 44, 50])
    title = plot_title(results, trace="openb_pod_list_default")
    assert title == "openb_pod_list_default: GPU allocation, mean of 4 seeds (42-44, 50), load 1.3"
    assert seeds_text([42]) == "42"


def test_plot_is_written_with_its_title(small, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    titles = []
    real = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(
        matplotlib.figure.Figure, "suptitle", lambda self, t, **kw: titles.append(t) or real(self, t, **kw)
    )
    nodes, pods = small
    results = run_many(nodes, pods, policies=["fgd"], seeds=[42])
    assert write_plot(results, tmp_path / "x.png", trace="pods_small") == tmp_path / "x.png"
    assert titles == ["pods_small: GPU allocation, mean of 1 seed (42), load 1.3"]
