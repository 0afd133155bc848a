"""Fields gpuyard accepts but does not act on (`apis/ignoredfields.py`): named by `submit
--validate=strict` (a 422 with the reason) and `gpuyard validate --strict` (exit 2), warned about
by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner

from gpuyard.apis.ignoredfields import IGNORED_FIELDS, ignored_fields
from gpuyard.cli import main
from gpuyard.platform.api.app import make_app
from gpuyard.state.context import Context

JOB = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: gated, namespace: team-a}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          schedulingGates: [{name: example.com/wait}]
          containers: [{name: pytorch, image: x, resources: {limits: {cpu: 1}}}]
"""
FIELD = "spec.pytorchReplicaSpecs.Worker.template.spec.schedulingGates"
YAML = {"Content-Type": "application/yaml"}


async def test_strict_refuses_a_field_gpuyard_does_not_act_on_naming_it_and_why(aiohttp_client: Any) -> None:
    ctx = Context.for_tests()
    http = await aiohttp_client(make_app(ctx))
    r = await http.post("/api/v1/jobs?fieldValidation=Strict", data=JOB, headers=YAML)
    assert r.status == 422
    (detail,) = (await r.json())["error"]["details"]
    assert detail["field"] == FIELD
    assert (
        detail["reason"].startswith("accepted but not acted on: ") and "scheduling gates" in detail["reason"]
    )
    assert ctx.store.get("PyTorchJob", "team-a", "gated") is None
    r = await http.post("/api/v1/jobs", data=JOB, headers=YAML)  # Warn, the default
    assert r.status == 201
    (warning,) = r.headers.getall("Warning")
    assert FIELD in warning and "accepted but not acted on" in warning


def test_gpuyard_validate_names_it_and_fails_with_strict(tmp_path: Path) -> None:
    path = tmp_path / "gated.yaml"
    path.write_text(JOB)
    loose = CliRunner().invoke(main, ["validate", str(path)])
    assert loose.exit_code == 0, loose.output
    assert f"warning: {path}: documents[0]: {FIELD}: accepted but not acted on:" in loose.output
    strict = CliRunner().invoke(main, ["validate", "--strict", str(path)])
    assert strict.exit_code == 2 and f"error: {path}: documents[0]: {FIELD}" in strict.output


def test_job_level_entries_apply_to_their_kind_only() -> None:
    mpi = {"kind": "MPIJob", "spec": {"mpiImplementation": "OpenMPI", "mpiReplicaSpecs": {}}}
    assert [p for p, _ in ignored_fields(mpi, replica_field="mpiReplicaSpecs")] == ["spec.mpiImplementation"]
    other = {"kind": "PyTorchJob", "spec": {"mpiImplementation": "OpenMPI"}}
    assert ignored_fields(other, replica_field="pytorchReplicaSpecs") == []


def test_every_entry_says_why_and_none_is_being_implemented_elsewhere() -> None:
    elsewhere = {"spotReplicaSpec", "affinity", "topologySpreadConstraints", "metrics", "cronPolicy"}
    elsewhere |= {"modelVersion", "cacheBackend", "webHost"}
    for entry in IGNORED_FIELDS:
        assert len(entry.reason) > 20, entry
        assert entry.path.rsplit(".", 1)[-1] not in elsewhere, entry
