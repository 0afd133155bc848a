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
    """Every job of `configs/jobs/` and `configs/demo/` passes `validate --strict` (no unknown
    field), and no two share a `metadata.name`, whatever their kind, group or namespace: any of
    them can be submitted beside any other, and beside the demo's."""
    files = sorted((ROOT / "configs" / "jobs").glob("*.yaml")) + sorted(
        (ROOT / "configs" / "demo").glob("*.yaml")
    )
    assert len(files) >= 18
    result = CliRunner().invoke(main, ["validate", "--strict", "-q", *map(str, files)])
    assert result.exit_code == 0, result.output
    owners: dict[str, list[str]] = {}
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                owners.setdefault(doc["metadata"]["name"], []).append(f"{f.parent.name}/{f.name}")
    shared = {name: where for name, where in owners.items() if len(where) > 1}
    assert shared == {}, f"sample job names used twice: {shared}"
