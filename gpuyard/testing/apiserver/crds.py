"""Minimal CustomResourceDefinitions for gpuyard's kinds, generated from `apis/resources.py`.

For tests and development only: their schemas accept anything (`x-kubernetes-preserve-unknown-fields`).
The CRDs gpuyard ships (`configs/deploy/crds/`, structural schemas from the pydantic models) are what a
cluster should get; these register the same group/version/plural/scope/names/status subresource, so a
test can stand up the resources without those files:

    server.install_crds(minimal_crds())  # or `gpuyard fake-apiserver --gpuyard-crds`
    server.install_crds(gang_crds())     # delegate mode's gang schedulers: `--gang-crds`
"""

from __future__ import annotations

from typing import Any

from gpuyard.apis.resources import API_RESOURCES, ApiResource

__all__ = ["gang_crds", "minimal_crd", "minimal_crds"]


def minimal_crd(resource: ApiResource) -> dict[str, Any]:
    """A CRD serving `resource` (its one version as the storage version) with an open schema."""
    version: dict[str, Any] = {
        "name": resource.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }
    if resource.status_subresource:
        version["subresources"] = {"status": {}}
    names = resource.crd_names()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": resource.crd_metadata(),
        "spec": {
            "group": resource.group,
            "scope": "Namespaced" if resource.namespaced else "Cluster",
            "names": names,
            "versions": [version],
        },
    }


def minimal_crds() -> list[dict[str, Any]]:
    """One minimal CRD per custom resource of `API_RESOURCES`."""
    return [minimal_crd(r) for r in API_RESOURCES if r.crd]


def gang_crds() -> list[dict[str, Any]]:
    """Minimal CRDs for the PodGroups of Volcano, scheduler-plugins and Koordinator (delegate mode;
    on a real cluster each comes with its scheduler)."""
    return [minimal_crd(r) for r in API_RESOURCES if r.gang_scheduler]
