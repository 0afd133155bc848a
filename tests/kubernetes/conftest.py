"""Fixtures of the test API server's tests: the server (`fake_apiserver`, from gpuyard's pytest plugin)
and kubernetes-asyncio clients configured from the kubeconfig it writes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpuyard.testing.apiserver.fixture import RunningApiServer, fake_apiserver

kubernetes_asyncio = pytest.importorskip("kubernetes_asyncio")

__all__ = ["clean_plane", "crd_manifest", "fake_apiserver", "kube", "plane_stack", "real_plane"]


_PLANE_FIXTURES = frozenset({"kube_control_plane", "real_plane", "clean_plane", "plane_stack", "plane"})
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs the suite in several processes (pytest-xdist, `--dist loadgroup`); the tests
    on a real control plane all go to one of them, so one plane runs at a time (as in one process)
    and its timings are not squeezed by a second plane beside it."""
    for item in items:
        if _HERE not in item.path.parents:
            continue
        callspec = getattr(item, "callspec", None)
        served = callspec.params.get("served") if callspec is not None else None
        fixtures = set(getattr(item, "fixturenames", ()))
        if served == "real" or _PLANE_FIXTURES & fixtures or item.path.name.startswith("test_real_"):
            item.add_marker(pytest.mark.xdist_group("control-plane"))


@pytest_asyncio.fixture
async def kube(fake_apiserver: RunningApiServer) -> AsyncIterator[Any]:
    """A kubernetes-asyncio ApiClient for the server, loaded from its kubeconfig."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(fake_apiserver.kubeconfig), client_configuration=configuration
    )
    async with client.ApiClient(configuration) as api:
        yield api


def crd_manifest(
    *,
    group: str = "kubeflow.org",
    kind: str = "TFJob",
    plural: str = "tfjobs",
    short: tuple[str, ...] = ("tfj",),
    scope: str = "Namespaced",
    status: bool = True,
) -> dict[str, Any]:
    """A minimal CustomResourceDefinition (schema: anything goes) with a printer column."""
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        "additionalPrinterColumns": [
            {"name": "State", "type": "string", "jsonPath": ".status.conditions[-1:].type"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    }
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "shortNames": list(short),
                "categories": ["all", "gpuyard"],
            },
            "versions": [version],
        },
    }


@pytest.fixture(scope="session")
def real_plane(kube_control_plane: Any) -> Any:
    """The session's real control plane with gpuyard's shipped CRDs applied (once)."""
    from tests.kubernetes.realplane import (
        GPUYARD_NAMESPACE,
        admin_http,
        ensure_namespace,
        gpuyard_crds,
        install_crds,
    )

    with admin_http(kube_control_plane) as http:
        install_crds(http, gpuyard_crds())
        ensure_namespace(http, GPUYARD_NAMESPACE)
    return kube_control_plane


@pytest.fixture
def clean_plane(real_plane: Any) -> Iterator[Any]:
    """The session's real control plane, wiped back to a fresh state first."""
    from tests.kubernetes.realplane import ControlPlaneView, admin_http

    with admin_http(real_plane) as http:
        ControlPlaneView(real_plane, http).wipe()
        yield real_plane


@pytest.fixture
def plane_stack(tmp_path: Path, clean_plane: Any) -> Iterator[Any]:
    """Processes (`gpuyard fake-nodes`, `gpuyard serve`, kubectl) against `clean_plane`, as its
    admin; stopped after the test (their logs printed when it fails)."""
    from tests.kubernetes.test_walkthrough import Stack

    s = Stack(tmp_path)
    s.kubeconfig = clean_plane.admin_kubeconfig
    try:
        yield s
    except BaseException:
        print(s.logs())
        raise
    finally:
        s.stop()
