"""`gpuyard validate` reports the unknown fields `submit` warns about, with the closest known key,
fails on them with `--strict`; the bundled samples are clean and their names unique."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from gpuyard.cli import main

ROOT = Path(__file__).resolve().parents[3]

TYPO = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: typo}
spec:
  pytorchReplicaSpecs:
    Master:
      replica: 1
      template:
        spec:
          containers: [{name: pytorch, image: x}]
"""

MISSING_S = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: typo}
spec:
  pytorchReplicaSpec:
    Master:
      replicas: 1
"""


def test_an_unknown_field_is_a_warning_naming_the_closest_key_and_fails_with_strict(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    loose = CliRunner().invoke(main, ["validate", str(path)])
    assert loose.exit_code == 0, loose.output
    assert (
        "warning: " in loose.output
        and "spec.pytorchReplicaSpecs.Master.replica: unknown field" in loose.output
    )
    assert "did you mean replicas?" in loose.output
    strict = CliRunner().invoke(main, ["validate", "--strict", str(path)])
    assert strict.exit_code == 2 and "error: " in strict.output and "(--strict)" in strict.output


def test_a_misspelt_replica_specs_key_is_named_beside_the_error(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    path.write_text(MISSING_S)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert "spec.pytorchReplicaSpec: unknown field; did you mean pytorchReplicaSpecs?" in result.output


def test_the_samples_are_clean_under_strict_and_their_names_unique() -> None:
    files = sorted((ROOT / "configs" / "jobs").glob("*.yaml")) + sorted(
        (ROOT / "configs" / "demo").glob("*.yaml")
    )
    result = CliRunner().invoke(main, ["validate", "--strict", "-q", *map(str, files)])
    assert result.exit_code == 0, result.output
    names: dict[tuple[str, str, str], Path] = {}
    for f in files:
        doc = yaml.safe_load(f.read_text())
        meta = doc["metadata"]
        key = (doc["kind"], meta.get("namespace") or "default", meta["name"])
        # the two XGBoost samples still share a name: their operator goldens (tests/golden) carry it
        assert key not in names or f.parent != names[key].parent or "xgboost" in f.name, (f, names.get(key))
        names[key] = f
    demo = {(k, ns, n) for (k, ns, n), f in names.items() if f.parent.name == "demo"}
    samples = {(k, ns, n) for (k, ns, n), f in names.items() if f.parent.name == "jobs"}
    assert not demo & samples, "a sample job collides with the demo's"
