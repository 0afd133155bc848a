"""The CRDs (and sample objects) of the operators users already run beside gpuyard, read from those
projects' own Go modules, downloaded through the Go module proxy (`go mod download -json`), the way
Kueue's Makefile gets them for its integration tests. Nothing of theirs is committed; the Go module
cache keeps what was downloaded.

The usual install today: training-operator v1.9 for TF, PyTorch, XGBoost, Paddle and JAX jobs, with
mpi-operator v0.8's MPIJob CRD (`kubeflow.org/v2beta1`) in place of training-operator's v1 MPIJob;
KubeDL v0.5 for `training.kubedl.io`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuyard.testing.controlplane.fixture import REQUIRE

__all__ = ["KUBEDL", "MPI_OPERATOR", "TRAINING_OPERATOR", "Peer", "usual_install"]

Json = dict[str, Any]


@dataclass(frozen=True)
class Peer:
    module: str
    version: str
    crds: str  # glob inside the module
    examples: str = ""

    @functools.cached_property
    def folder(self) -> Path:
        return _download(self.module, self.version)

    def crd_docs(self) -> list[Json]:
        docs = []
        for path in sorted(self.folder.glob(self.crds)):
            doc = yaml.safe_load(path.read_text())
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                docs.append(doc)
        assert docs, f"no CRDs at {self.module}@{self.version}/{self.crds}"
        return docs


TRAINING_OPERATOR = Peer(
    "github.com/kubeflow/training-operator", "v1.9.0", "manifests/base/crds/*.yaml", "examples"
)
MPI_OPERATOR = Peer(
    "github.com/kubeflow/mpi-operator",
    "v0.8.0",
    "manifests/base/kubeflow.org_mpijobs.yaml",
    "examples/v2beta1",
)
KUBEDL = Peer("github.com/alibaba/kubedl", "v0.5.0", "config/crd/bases/training.kubedl.io_*.yaml", "example")


def usual_install() -> list[Json]:
    """training-operator's CRDs with mpi-operator's MPIJob in place of its own, and KubeDL's."""
    kubeflow = [c for c in TRAINING_OPERATOR.crd_docs() if c["spec"]["names"]["kind"] != "MPIJob"]
    return kubeflow + MPI_OPERATOR.crd_docs() + KUBEDL.crd_docs()


@functools.cache
def _download(module: str, version: str) -> Path:
    go = shutil.which("go")
    if go is None:
        _unavailable("no Go toolchain on PATH to download the peers' modules")
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    try:
        out = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        _unavailable(f"go mod download {module}@{version} timed out")
    info = json.loads(out.stdout or "{}")
    if out.returncode != 0 or "Dir" not in info:
        _unavailable(f"go mod download {module}@{version}: {info.get('Error') or out.stderr.strip()}")
    return Path(info["Dir"])


def _unavailable(why: str) -> None:
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 but {why}", pytrace=False)
    pytest.skip(why)
