"""``gpuyard simulate openb``: a run on a slice of the real trace, and one-line errors with exit code 2."""

from __future__ import annotations

import builtins
import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuyard.sim.openb_cli import openb, parse_policies, parse_seeds, summary_notes
from gpuyard.sim.traces import load_openb_nodes, load_openb_pods

DATA = Path(__file__).resolve().parents[2] / "data" / "openb"
NODES = DATA / "nodes_small.csv"
PODS = DATA / "pods_small.csv"


def invoke(*args: str):
    return CliRunner().invoke(openb, list(args), catch_exceptions=False)


def test_parse_seeds_and_policies():
    assert parse_seeds("42-51") == list(range(42, 52))
    assert parse_seeds("3, 1-2,3") == [3, 1, 2]
    for bad in ("", "x", "5-2", "1-2-3"):
        with pytest.raises(ValueError):
            parse_seeds(bad)
    assert parse_policies("fgd, best-fit") == ["fgd", "best-fit"]
    assert "gpuyard" in parse_policies("all")
    with pytest.raises(ValueError, match="unknown policy 'tetris'"):
        parse_policies("fgd,tetris")


def test_runs_a_slice_of_the_real_trace_and_writes_its_files(tmp_path):
    lines = (DATA / "openb_node_list_gpu_node.csv").read_text().splitlines()
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("\n".join(lines[:31]) + "\n")
    out = tmp_path / "out"
    result = invoke(
        "--nodes", str(nodes), "--pods", str(DATA / "openb_pod_list_default.csv"),
        "--policy", "fgd,gpuyard,random", "--seeds", "42-43", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "fgd" in result.stdout and "gpuyard" in result.stdout
    assert "matplotlib" in result.stdout or (out / "openb_alloc.png").exists()
    with (out / "openb_alloc.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["sc_policy"], r["seed"]) for r in rows] == [
        ("fgd", "42"), ("fgd", "43"), ("gpuyard", "42"), ("gpuyard", "43"), ("random", "42"), ("random", "43"),
    ]  # fmt: skip
    assert rows[0]["workload"] == "openb_pod_list_default" and rows[0]["tune"] == "1.3"
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"fgd", "gpuyard", "random"}
    assert summary["seeds"] == [42, 43]
    assert "published_alloc_pct_mean" not in summary["policies"]["fgd"]  # not the default trace


@pytest.mark.parametrize(
    ("pods_text", "expected"),
    [
        ("name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n", ":1: column 'gpu_milli': missing column"),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,0\nq,1,x,0,0\n",
            ":3: column 'memory_mib': not a whole number",
        ),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,1,1000,H100\n",
            ":2: column 'gpu_spec': unknown GPU model 'H100'",
        ),
    ],
)
def test_bad_trace_gives_one_line_and_exit_code_2(tmp_path, pods_text, expected):
    pods = tmp_path / "pods.csv"
    pods.write_text(pods_text)
    result = invoke("--nodes", str(NODES), "--pods", str(pods), "--seeds", "1", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {pods}")
    assert expected in result.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--policy", "fgd,tetris"), "error: --policy: unknown policy 'tetris'; known: random, first-fit"),
        (("--seeds", "9-1"), "error: --seeds: bad seed range '9-1'"),
        (("--load", "0"), "error: --load: must be positive"),
    ],
)
def test_bad_options_give_one_line_and_exit_code_2(tmp_path, args, expected):
    result = invoke("--nodes", str(NODES), "--pods", str(PODS), "--out", str(tmp_path / "o"), *args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(expected)


def test_missing_node_file_is_reported(tmp_path):
    result = invoke("--nodes", str(tmp_path / "none.csv"), "--pods", str(PODS))
    assert result.exit_code == 2
    assert "none.csv: cannot read" in result.stderr


def test_both_engines_give_the_same_figures_and_the_profile_is_recorded(tmp_path):
    figures = {}
    for engine in ("scheduler", "packing"):
        out = tmp_path / engine
        result = invoke(
            "--nodes", str(NODES), "--pods", str(PODS), "--policy", "fgd,best-fit", "--seeds", "1-2",
            "--engine", engine, "--out", str(out),
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())
        figures[engine] = {p: summary["policies"][p]["alloc_pct_mean"] for p in ("fgd", "best-fit")}
        assert summary["engine"] == engine
    assert figures["scheduler"] == figures["packing"]
    out = tmp_path / "live"
    result = invoke(
        "--nodes", str(NODES), "--pods", str(PODS), "--policy", "gpuyard", "--seeds", "1",
        "--profile", "default", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["profile"] == "default"


def test_an_unknown_profile_is_named_with_exit_code_2(tmp_path):
    result = invoke(
        "--nodes", str(NODES), "--pods", str(PODS), "--profile", "fastest", "--out", str(tmp_path)
    )
    assert result.exit_code == 2
    assert "--profile: unknown scheduler profile 'fastest'; known:" in result.output


def without_matplotlib(monkeypatch) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)


def test_the_small_sample_says_why_its_figures_differ(tmp_path, monkeypatch):
    """On the bundled 5-node sample the table is followed by notes: its size against the paper's
    trace, how coarse 15 GPUs make the figures, and what a '-' cell means; without matplotlib it
    says how to get the plot instead of claiming a file."""
    without_matplotlib(monkeypatch)
    out = tmp_path / "out"
    result = invoke("--nodes", str(NODES), "--pods", str(PODS), "--seeds", "42", "--out", str(out))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    table = lines[: next(i for i, line in enumerate(lines) if line.startswith("note:"))]
    assert [row.split()[0] for row in table] == ["policy", "fgd", "gpuyard"]
    assert any("-" in row.split()[1:5] for row in table[1:])  # the sample leaves load points empty
    text = " ".join(result.stdout.split())  # the notes are wrapped
    assert (
        "note: pods_small.csv on nodes_small.csv is 5 nodes, 15 GPUs, 40 pods, not the paper's openb "
        "trace (1213 nodes, 6212 GPUs, 8152 pods)" in text
    )
    assert "the policies need not rank as on the full trace, where gpuyard allocates more than fgd" in text
    assert "note: one pod asks for up to 27 % of this cluster's GPUs" in text
    assert "note: '-' = in no seed did the arrived GPU request come within 1 % of that load" in text
    # the figures are those summary.json holds: the notes explain them, they change nothing
    summary = json.loads((out / "summary.json").read_text())
    for row in table[1:]:
        policy, *cells = row.split()
        mean = summary["policies"][policy]["alloc_pct_mean"]
        assert cells[:4] == [
            ("-" if mean[p] is None else f"{mean[p]:.2f}") for p in ("80", "90", "100", "130")
        ]
    assert "no openb_alloc.png: matplotlib is not installed" in result.stdout
    assert "pip install 'gpuyard[plot]'; in a gpuyard checkout: make plot" in result.stdout
    assert "openb_alloc.png" not in "".join(line for line in lines if line.startswith("wrote "))
    assert not (out / "openb_alloc.png").exists()


def test_no_notes_for_the_paper_trace_with_every_point_measured():
    nodes = load_openb_nodes(DATA / "openb_node_list_gpu_node.csv")
    pods = load_openb_pods(DATA / "openb_pod_list_default.csv", models=nodes.model_names)
    full = {"fgd": {"alloc_pct_mean": {"80": 80.0, "90": 90.0, "100": 95.2, "130": 95.4}}}
    assert summary_notes(nodes, pods, full, published=True) == []
    gap = {"fgd": {"alloc_pct_mean": {"80": 80.0, "90": None, "100": 95.2, "130": 95.4}}}
    assert [n.split(" = ")[0] for n in summary_notes(nodes, pods, gap, published=True)] == ["note: '-'"]


def test_help_promises_the_plot_only_with_matplotlib():
    text = " ".join(CliRunner().invoke(openb, ["--help"]).output.split())
    assert (
        "Directory for openb_alloc.csv and summary.json; also openb_alloc.png where matplotlib is installed"
        in text
    )
    assert "pip install 'gpuyard[plot]'" in text
