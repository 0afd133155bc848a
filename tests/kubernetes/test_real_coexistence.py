"""gpuyard installed over the operators users already run, on the real control plane.

A cluster has training-operator v1.9's CRDs (with mpi-operator v0.8's `kubeflow.org/v2beta1` MPIJob
in place of its v1 one) and KubeDL v0.5's, each with an object in it, made from those projects'
own examples. Then `gpuyard install --print | kubectl apply --server-side --force-conflicts -f -`
must succeed, every object must read back as it was (no field pruned, no version lost), and every
version, subresource and printer column the peers served must still be served.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpuyard.apis.crds import crds
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.testing.controlplane.fixture import require_binaries
from tests.kubernetes.peers import KUBEDL, MPI_OPERATOR, TRAINING_OPERATOR, Peer, usual_install
from tests.kubernetes.realplane import admin_http, install_crds

Json = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A control plane of its own: it starts with the peers' CRDs, not gpuyard's."""
    require_binaries()
    from gpuyard.testing.controlplane.running import ControlPlane

    with ControlPlane(data_dir=tmp_path_factory.mktemp("coexist")) as cp:
        yield cp


def _examples(peer: Peer, kinds: dict[tuple[str, str], str]) -> list[Json]:
    """One example object per (apiVersion, kind) the peer serves, from its own examples folder."""
    found: dict[tuple[str, str], Json] = {}
    for path in sorted((peer.folder / peer.examples).rglob("*.yaml")):
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError:
            continue
        for doc in docs:
            if not isinstance(doc, dict):
                continue
            key = (doc.get("apiVersion", ""), doc.get("kind", ""))
            if key in kinds and key not in found and doc.get("metadata", {}).get("name"):
                doc["metadata"]["namespace"] = "default"
                found[key] = doc
    return list(found.values())


def _served(crd_list: list[Json]) -> dict[tuple[str, str], str]:
    """(apiVersion, kind) -> plural of every served version."""
    out = {}
    for crd in crd_list:
        spec = crd["spec"]
        for version in spec["versions"]:
            if version["served"]:
                out[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = spec["names"]["plural"]
    return out


def _path(api_version: str, plural: str, name: str = "") -> str:
    return f"/apis/{api_version}/namespaces/default/{plural}" + (f"/{name}" if name else "")


def _kubectl_apply(kubeconfig: Path, manifest: str) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    return subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), "apply", "--server-side", "--force-conflicts", "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_gpuyard_installs_over_training_operator_mpi_operator_and_kubedl(plane: Any) -> None:
    peers = usual_install()
    kinds = _served(peers)
    with admin_http(plane) as http:
        install_crds(http, peers)
        objects = []
        for peer in (TRAINING_OPERATOR, MPI_OPERATOR, KUBEDL):
            objects += _examples(peer, kinds)
        assert {(o["apiVersion"], o["kind"]) for o in objects} >= {
            ("kubeflow.org/v1", "TFJob"),
            ("kubeflow.org/v1", "PyTorchJob"),
            ("kubeflow.org/v2beta1", "MPIJob"),
        }
        before = {}
        for obj in objects:
            plural = kinds[(obj["apiVersion"], obj["kind"])]
            answer = http.post(_path(obj["apiVersion"], plural), json=obj)
            assert answer.status_code == 201, answer.text
            before[(obj["apiVersion"], plural, obj["metadata"]["name"])] = answer.json()
        crds_before = {c["metadata"]["name"]: _crd(http, c["metadata"]["name"]) for c in peers}

        printed = subprocess.run(
            [sys.executable, "-m", "gpuyard.cli", "install", "--print"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            cwd=ROOT,
        ).stdout
        applied = _kubectl_apply(plane.admin_kubeconfig, printed)
        assert applied.returncode == 0, applied.stderr

        for (api_version, plural, name), old in before.items():
            got = http.get(_path(api_version, plural, name))
            assert got.status_code == 200, (api_version, plural, name, got.text)
            new = got.json()
            assert _content(new) == _content(old), f"{api_version} {plural}/{name} changed"
        for name, old_crd in crds_before.items():
            _assert_superset(old_crd, _crd(http, name))


def _crd(http: httpx.Client, name: str) -> Json:
    got = http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    assert got.status_code == 200, got.text
    crd: Json = got.json()
    return crd


def _content(obj: Json) -> Json:
    out = copy.deepcopy(obj)
    for key in ("resourceVersion", "managedFields", "generation"):
        out["metadata"].pop(key, None)
    return out


def _assert_superset(old: Json, new: Json) -> None:
    name = old["metadata"]["name"]
    new_versions = {v["name"]: v for v in new["spec"]["versions"]}
    for version in old["spec"]["versions"]:
        assert version["name"] in new_versions, f"{name}: version {version['name']} no longer served"
        mine = new_versions[version["name"]]
        assert mine["served"] == version["served"] and mine["storage"] == version["storage"], (
            name,
            version["name"],
        )
        assert set(version.get("subresources", {})) <= set(mine.get("subresources", {})), (
            name,
            "subresources",
        )
        if "scale" in version.get("subresources", {}):
            assert mine["subresources"]["scale"] == version["subresources"]["scale"], (name, "scale")
        columns = [c["name"] for c in version.get("additionalPrinterColumns", [])]
        mine_columns = [c["name"] for c in mine.get("additionalPrinterColumns", []) if not c.get("priority")]
        # theirs first, in their order (mpi-operator's v2beta1 has none: gpuyard's State and Age stay)
        assert mine_columns[: len(columns)] == columns, (name, version["name"], mine_columns, columns)
    assert set(old["status"]["storedVersions"]) <= set(new["status"]["storedVersions"])
    assert "all" not in new["spec"]["names"].get("categories", []), f"{name}: category all"


def test_gpuyard_ships_every_peer_version_with_the_same_storage_version() -> None:
    """For every kind gpuyard runs, its CRD serves each version the peer's serves, and stores the
    one the peer stores (so either can be installed over the other)."""
    mine = {c["metadata"]["name"]: c for c in crds()}
    for peer_crd in usual_install():
        name = peer_crd["metadata"]["name"]
        if peer_crd["spec"]["names"]["kind"] not in KIND_INFO:
            continue  # KubeDL kinds gpuyard does not run (XDLJob, ElasticDLJob)
        assert name in mine, f"gpuyard ships no CRD for {name}"
        peer_versions = {v["name"]: v["storage"] for v in peer_crd["spec"]["versions"]}
        my_versions = {v["name"]: v["storage"] for v in mine[name]["spec"]["versions"]}
        assert {k: v for k, v in my_versions.items() if k in peer_versions} == peer_versions, name
    assert json.dumps(mine)  # serialisable as printed
