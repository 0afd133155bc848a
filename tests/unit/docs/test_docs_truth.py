"""The docs list what the code has: every metric, every setting, every API route."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_METRIC = re.compile(r"""(?:Histogram|Gauge|Counter|GaugeMetricFamily)\(\s*["'](gpuyard_\w+)["']""")


def _metric_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "gpuyard").rglob("*.py"):
        names.update(_METRIC.findall(path.read_text()))
    return names


def test_every_metric_is_in_operations_doc() -> None:
    names = _metric_names()
    assert "gpuyard_queue_pending_jobs" in names  # the pattern finds scrape-time families too
    doc = (ROOT / "docs" / "operations.md").read_text()
    missing = sorted(n for n in names if f"`{n}" not in doc)
    assert not missing, f"metrics missing from docs/operations.md: {missing}"
    assert "come with the quota engine" not in doc


def test_bench_and_simulation_doc_read_the_trace_a_clone_has() -> None:
    """`make bench` in a plain clone: the openb defaults are files the repository ships."""
    import importlib.util

    for name in ("openb_packing", "packing_variants"):
        spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "bench" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for csv in ("openb_node_list_gpu_node.csv", "openb_pod_list_default.csv"):
            assert (module.DATA / csv).is_file(), (name, module.DATA / csv)
    for path in [*(ROOT / "bench").glob("*.py"), ROOT / "docs" / "simulation.md"]:
        assert "shared/data" not in path.read_text(), path
    assert "before it is mounted" not in (ROOT / "docs" / "simulation.md").read_text()


def test_config_file_lists_every_setting_at_its_default() -> None:
    import yaml
    from pydantic import BaseModel

    from gpuyard.state.config import Settings, TokenConfig, load_settings

    path = ROOT / "configs" / "gpuyard.yaml"
    data = yaml.safe_load(path.read_text())
    assert set(data) == set(Settings.model_fields)
    for section, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        missing = set(model.model_fields) - set(data[section])
        assert not missing, f"configs/gpuyard.yaml: {section}: missing {sorted(missing)}"
    text = path.read_text()
    for name in TokenConfig.model_fields:  # a token's keys are shown in a commented example
        assert f"{name}:" in text, name
    assert load_settings(path) == Settings()


def _documented_routes() -> set[tuple[str, str]]:
    """(METHOD, path) of each row of docs/api.md's route table: `GET/PUT /api/v1/x?query=`."""
    row = re.compile(r"^\| `([A-Z/]+) (/api/v1/[^`?]*)(?:\?[^`]*)?` \|", re.M)
    text = (ROOT / "docs" / "api.md").read_text()
    table = text[text.index("## Routes") :]
    table = table[: table.index("\n### ")]  # the route table only, not the per-route sections after it
    return {(m, path) for methods, path in row.findall(table) for m in methods.split("/")}


def test_every_api_route_is_in_the_api_doc_table() -> None:
    from gpuyard.platform.api.app import make_app
    from gpuyard.platform.api.openapi import _path_of
    from gpuyard.state.context import Context

    app = make_app(Context.for_tests())
    routed = {
        (r.method, _path_of(r.resource))
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None and _path_of(r.resource).startswith("/api/v1")
    }
    assert ("POST", "/api/v1/apply") in routed
    documented = _documented_routes()
    assert sorted(routed - documented) == [], "routes missing from docs/api.md"
    assert sorted(documented - routed) == [], "docs/api.md lists routes the server does not have"
