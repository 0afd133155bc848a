"""openb trace loading (with precise errors) and workload tuning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuyard.sim.traces import TraceError, load_openb_nodes, load_openb_pods, tune_workload

DATA = Path(__file__).resolve().parents[2] / "data" / "openb"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_small_trace_loads():
    nodes = load_openb_nodes(DATA / "nodes_small.csv")
    assert nodes.names[0] == "small-node-0" and len(nodes) == 5
    assert nodes.gpus.tolist() == [4, 2, 8, 1, 0]
    assert nodes.models == ["V100M16", "T4", "G2", "P100", ""]
    assert nodes.model_names == ["G2", "P100", "T4", "V100M16"]
    assert nodes.total_gpu_milli == 15000
    pods = load_openb_pods(DATA / "pods_small.csv", models=nodes.model_names)
    assert len(pods) == 40
    assert set(pods.gpu_spec) == {"", "V100M16|T4", "G2"}  # "nan" reads as any model
    assert pods.extra["qos"][0] == "LS" and "creation_time" in pods.extra
    state = nodes.to_state()
    reqs = pods.requests(state)
    constrained = [r for r in reqs if r.allowed_models]
    assert constrained and all(isinstance(m, int) for r in constrained for m in r.allowed_models)
    assert int(pods.total_gpu_milli.sum()) == sum(r.total_gpu_milli for r in reqs)


def test_default_trace_loads_with_its_published_shape():
    nodes = load_openb_nodes(DATA / "openb_node_list_gpu_node.csv")
    pods = load_openb_pods(DATA / "openb_pod_list_default.csv", models=nodes.model_names)
    assert (len(nodes), int(nodes.gpus.sum()), len(pods)) == (1213, 6212, 8152)


def test_five_column_pod_lists_are_accepted(tmp_path):
    path = write(
        tmp_path, "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,100,1,500\np1,2000,100,0,0\n"
    )
    pods = load_openb_pods(path, models=["T4"])
    assert pods.gpu_spec == ["", ""] and pods.num_gpu.tolist() == [1, 0]


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n", 1, "gpu_milli", "missing column"),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,0\nq,lots,1,0,0\n",
            3,
            "cpu_milli",
            "not a whole number",
        ),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1.5,0,0\n", 2, "memory_mib", "not a whole number"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,,0,0\n", 2, "memory_mib", "not a whole number"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,-5,1,0,0\n", 2, "cpu_milli", "must be >= 0"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n", 2, "num_gpu", "needs num_gpu=1"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1500\n", 2, "gpu_milli", "<= 1000"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,300\n", 2, "gpu_milli", "num_gpu=0"),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,1,1000,T4\nq,1,1,1,1000,A100|T4\n",
            3,
            "gpu_spec",
            "unknown GPU model 'A100' (the nodes have: T4)",
        ),
    ],
)
def test_bad_pod_lists_name_file_line_and_column(tmp_path, text, line, column, message):
    path = write(tmp_path, "pods.csv", text)
    with pytest.raises(TraceError) as info:
        load_openb_pods(path, models=["T4"])
    err = info.value
    assert (err.path, err.line, err.column) == (str(path), line, column)
    assert message in str(err)
    assert str(err).startswith(f"{path}:{line}: column {column!r}: ")


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("sn,cpu_milli,memory_mib,model\nn,1,1,T4\n", 1, "gpu", "missing column"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,two,T4\n", 2, "gpu", "not a whole number"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,\n", 2, "model", "needs a GPU model"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,T4\nn,1,1,2,T4\n", 3, "sn", "repeats line 2"),
        ("sn,cpu_milli,memory_mib,gpu,model\n", 2, None, "no nodes"),
    ],
)
def test_bad_node_lists_name_file_line_and_column(tmp_path, text, line, column, message):
    path = write(tmp_path, "nodes.csv", text)
    with pytest.raises(TraceError) as info:
        load_openb_nodes(path)
    assert (info.value.line, info.value.column) == (line, column)
    assert message in str(info.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_openb_nodes(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="empty file"):
        load_openb_pods(write(tmp_path, "empty.csv", ""))


def pods_with(tmp_path: Path, milli: list[int]) -> object:
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli"]
    rows += [f"p{i},1000,100,{1 if m else 0},{m}" for i, m in enumerate(milli)]
    return load_openb_pods(write(tmp_path, "pods.csv", "\n".join(rows) + "\n"))


def test_tuning_up_appends_random_copies_up_to_the_target(tmp_path):
    pods = pods_with(tmp_path, [1000, 500, 300, 0, 1000])  # 2800 milli
    order = tune_workload(pods, cluster_gpu_milli=10_000, load=1.3, seed=42)
    total = int(pods.total_gpu_milli[order].sum())
    assert total <= 13_000
    assert 13_000 - total < 1000  # stopped at the first copy that would overshoot
    assert sorted(set(order.tolist())) == [0, 1, 2, 3, 4]
    counts = np.bincount(order, minlength=5)
    assert (counts >= 1).all()  # every original stays


def test_tuning_down_removes_random_pods(tmp_path):
    pods = pods_with(tmp_path, [1000] * 20)
    order = tune_workload(pods, cluster_gpu_milli=10_000, load=1.0, seed=1)
    assert int(pods.total_gpu_milli[order].sum()) == 10_000
    assert len(set(order.tolist())) == 10


def test_tuning_and_shuffling_are_deterministic_per_seed(tmp_path):
    pods = pods_with(tmp_path, [1000, 500, 300, 0, 810, 470, 1000, 230])
    a = tune_workload(pods, cluster_gpu_milli=20_000, load=1.3, seed=42)
    b = tune_workload(pods, cluster_gpu_milli=20_000, load=1.3, seed=42)
    c = tune_workload(pods, cluster_gpu_milli=20_000, load=1.3, seed=43)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    exact = tune_workload(pods, cluster_gpu_milli=4310, load=1.0, seed=5)
    assert sorted(exact.tolist()) == list(range(8))  # already on target: only shuffled


def test_tuning_a_workload_without_gpu_pods_terminates(tmp_path):
    pods = pods_with(tmp_path, [0, 0, 0])
    assert sorted(tune_workload(pods, cluster_gpu_milli=1000, seed=1).tolist()) == [0, 1, 2]
    with pytest.raises(ValueError, match="load"):
        tune_workload(pods, cluster_gpu_milli=1000, load=0, seed=1)
