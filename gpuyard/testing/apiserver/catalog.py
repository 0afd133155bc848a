"""Which resources the test API server serves, and the discovery documents that say so.

The built-in resources (core/v1, apps/v1, coordination.k8s.io/v1, policy/v1, scheduling.k8s.io/v1,
...) come from `kmock`'s bundled discovery data (taken from a real cluster), plus `resource.k8s.io/v1`
(DRA), which that data lacks. Custom resources appear when a `CustomResourceDefinition` is stored and
disappear when it is deleted (`storage.py` calls `register_crd` / `unregister_crd`).

Discovery is served in both forms clients ask for: the legacy documents (`/api`, `/apis`, `/api/v1`,
`/apis/{group}[/{version}]`) and the aggregated `apidiscovery.k8s.io` v2 / v2beta1 lists (kubectl 1.27+
asks for those first and falls back to the legacy ones).
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuyard.apis.resources import API_APPROVAL, is_protected_group
from gpuyard.testing.apiserver.errors import ApiError
from gpuyard.testing.apiserver.selecting import BUILTIN_FIELDS

__all__ = ["Catalog", "Resource", "version_priority"]

_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
_SKIPPED_GROUPS = {"metrics.k8s.io", "gateway.networking.k8s.io"}  # aggregated / add-ons in kmock's data
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """One served REST resource (one group/version/plural)."""

    group: str
    version: str
    plural: str
    kind: str
    singular: str
    namespaced: bool
    verbs: tuple[str, ...] = _ALL_VERBS
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    crd: str | None = None  # the name of the CustomResourceDefinition serving it
    printer_columns: tuple[dict[str, Any], ...] = ()
    selectable_fields: frozenset[str] = frozenset()  # field labels beyond metadata.name/namespace
    # a custom resource's `openAPIV3Schema` (its CRD version's), for the OpenAPI documents
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the stored objects: (group, plural), the same for every version."""
        return (self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes' version order (v1 > v1beta2 > v1beta1 > v1alpha1 > other), as a sort key."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (0 if stage == 0 else stage, -int(m.group(1)), -int(m.group(3) or 0), "")


def _extra_builtins() -> list[Resource]:
    """Built-in resources the bundled discovery data lacks: `resource.k8s.io/v1` (DRA)."""

    def dra(plural: str, kind: str, *, namespaced: bool, status: bool = False) -> Resource:
        return Resource(
            group="resource.k8s.io",
            version="v1",
            plural=plural,
            kind=kind,
            singular=kind.lower(),
            namespaced=namespaced,
            subresources=frozenset({"status"} if status else ()),
            selectable_fields=BUILTIN_FIELDS.get(("resource.k8s.io", plural), frozenset()),
        )

    return [
        dra("resourceslices", "ResourceSlice", namespaced=False),
        dra("resourceclaims", "ResourceClaim", namespaced=True, status=True),
        dra("resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True),
        dra("deviceclasses", "DeviceClass", namespaced=False),
    ]


@functools.cache
def _bundled() -> tuple[Resource, ...]:
    import kmock  # here, so that the pytest plugin loads where the `kubernetes` extra is not installed

    array = kmock.ResourcesArray()
    with warnings.catch_warnings():  # kmock 0.8 reads its data with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        array.load_bundled()
    out = []
    for ref in array:
        info = array[ref]
        group, version, plural = ref.group or "", ref.version or "", ref.plural or ""
        if group in _SKIPPED_GROUPS or not plural or not version:
            continue
        out.append(
            Resource(
                group=group,
                version=version,
                plural=plural,
                kind=info.kind or plural.capitalize(),
                singular=info.singular or plural,
                namespaced=bool(info.namespaced),
                verbs=tuple(sorted(info.verbs)),
                short_names=tuple(sorted(info.shortnames)),
                categories=tuple(sorted(info.categories)),
                subresources=frozenset(info.subresources),
                selectable_fields=BUILTIN_FIELDS.get((group, plural), frozenset()),
            )
        )
    return tuple(out)


@dataclass
class Catalog:
    """The served resources, keyed by (group, version, plural)."""

    resources: dict[tuple[str, str, str], Resource] = field(default_factory=dict)

    @classmethod
    def builtin(cls) -> Catalog:
        catalog = cls()
        for res in [*_bundled(), *_extra_builtins()]:
            catalog.resources[(res.group, res.version, res.plural)] = res
        return catalog

    def get(self, group: str, version: str, plural: str) -> Resource:
        """The resource; a 404 like the real server's for one nobody serves."""
        res = self.resources.get((group, version, plural))
        if res is None:
            raise ApiError(404, "the server could not find the requested resource", reason="NotFound")
        return res

    def find(self, group: str, version: str, plural: str) -> Resource | None:
        return self.resources.get((group, version, plural))

    def for_kind(self, api_version: str, kind: str) -> Resource | None:
        group, _, version = api_version.rpartition("/")
        for res in self.resources.values():
            if res.group == group and res.version == version and res.kind == kind:
                return res
        return None

    def versions_of(self, group: str) -> list[str]:
        found = {v for (g, v, _) in self.resources if g == group}
        return sorted(found, key=version_priority)

    def groups(self) -> list[str]:
        """Every group but the core one: the built-ins in registration order, then the groups of
        custom resources as kube-apiserver's aggregator lists them (their APIServices all have one
        priority, so by APIService name, `<version>.<group>`). The order matters: kubectl resolves
        a name two groups serve (`tfjob`: kubeflow.org and training.kubedl.io) to the first."""
        builtin: dict[str, None] = {}
        custom: dict[str, str] = {}  # group -> its first APIService name
        for (g, v, _), r in self.resources.items():
            if not g:
                continue
            if r.crd:
                name = f"{v}.{g}"
                custom[g] = min(custom.get(g, name), name)
            else:
                builtin.setdefault(g)
        return [*builtin, *sorted((g for g in custom if g not in builtin), key=lambda g: custom[g])]

    def of(self, group: str, version: str) -> list[Resource]:
        return [r for (g, v, _), r in self.resources.items() if g == group and v == version]

    # --- custom resources ------------------------------------------------------------------------

    def register_crd(self, crd: dict[str, Any]) -> list[Resource]:
        """Serve the resources a CustomResourceDefinition defines (replacing its previous ones)."""
        spec = crd.get("spec") or {}
        name = (crd.get("metadata") or {}).get("name", "")
        group = spec.get("group") or ""
        names = spec.get("names") or {}
        plural = names.get("plural") or ""
        kind = names.get("kind") or ""
        scope = spec.get("scope") or ""
        versions = spec.get("versions") or []

        def bad(field_path: str, why: str) -> ApiError:
            return ApiError.invalid("CustomResourceDefinition", name, field=field_path, why=why)

        if not group or "." not in group:
            raise bad("spec.group", "should be a domain with at least one dot")
        if not plural or not _DNS_LABEL.match(plural):
            raise bad("spec.names.plural", "should be a lowercase DNS-1035 label")
        if not kind:
            raise bad("spec.names.kind", "Required value")
        if name != f"{plural}.{group}":
            raise bad("metadata.name", f'must be spec.names.plural+"."+spec.group ({plural}.{group})')
        annotations = (crd.get("metadata") or {}).get("annotations") or {}
        if is_protected_group(group) and not annotations.get(API_APPROVAL):
            raise bad(
                f"metadata.annotations[{API_APPROVAL}]",
                f'Required value: protected groups must have approval annotation "{API_APPROVAL}"',
            )
        if scope not in ("Namespaced", "Cluster"):
            raise bad("spec.scope", 'Unsupported value: supported values: "Cluster", "Namespaced"')
        if not versions:
            raise bad("spec.versions", "must have exactly one version marked as storage version")
        if sum(1 for v in versions if v.get("storage")) != 1:
            raise bad("spec.versions", "must have exactly one version marked as storage version")
        for i, v in enumerate(versions):
            if not re.fullmatch(
                r"v\d+((alpha|beta)\d+)?|[a-z0-9]([-a-z0-9]*[a-z0-9])?", str(v.get("name") or "")
            ):
                raise bad(f"spec.versions[{i}].name", "Required value: a lowercase DNS-1035 label such as v1")
        self.unregister_crd(name)
        out = []
        for v in versions:
            if not v.get("served", True):
                continue
            subs = v.get("subresources") or {}
            res = Resource(
                group=group,
                version=v.get("name", ""),
                plural=plural,
                kind=kind,
                singular=names.get("singular") or kind.lower(),
                namespaced=scope == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=frozenset({"status"} if "status" in subs else ()),
                crd=name,
                printer_columns=tuple(v.get("additionalPrinterColumns") or ()),
                selectable_fields=frozenset(
                    str(f.get("jsonPath", "")).lstrip(".") for f in v.get("selectableFields") or ()
                ),
                schema=(v.get("schema") or {}).get("openAPIV3Schema"),
            )
            self.resources[(res.group, res.version, res.plural)] = res
            out.append(res)
        return out

    def unregister_crd(self, name: str) -> None:
        for key in [k for k, r in self.resources.items() if r.crd == name]:
            del self.resources[key]

    # --- discovery ---------------------------------------------------------------------------------

    def api_versions(self, server_address: str) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }

    def api_group(self, group: str) -> dict[str, Any]:
        versions = self.versions_of(group)
        if not versions:
            raise ApiError(404, "the server could not find the requested resource", reason="NotFound")
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": gvs,
            "preferredVersion": gvs[0],
        }

    def api_group_list(self) -> dict[str, Any]:
        groups = []
        for g in self.groups():
            doc = self.api_group(g)
            doc.pop("kind")
            doc.pop("apiVersion")
            groups.append(doc)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def resource_list(self, group: str, version: str) -> dict[str, Any]:
        served = self.of(group, version)
        if not served and group:
            raise ApiError(404, "the server could not find the requested resource", reason="NotFound")
        entries: list[dict[str, Any]] = []
        for r in sorted(served, key=lambda r: r.plural):
            entry: dict[str, Any] = {
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
            }
            if r.short_names:
                entry["shortNames"] = list(r.short_names)
            if r.categories:
                entry["categories"] = list(r.categories)
            entries.append(entry)
            for sub in sorted(r.subresources):
                kind, verbs = _subresource_shape(r, sub)
                entries.append(
                    {
                        "name": f"{r.plural}/{sub}",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": kind,
                        "verbs": verbs,
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }

    def aggregated(self, *, core: bool, version: str) -> dict[str, Any]:
        """`APIGroupDiscoveryList` (apidiscovery.k8s.io `version`) of the core group or the others."""
        groups = [""] if core else self.groups()
        items = []
        for g in groups:
            versions = []
            for v in self.versions_of(g):
                resources = []
                for r in sorted(self.of(g, v), key=lambda r: r.plural):
                    doc: dict[str, Any] = {
                        "resource": r.plural,
                        "responseKind": {"group": g, "version": v, "kind": r.kind},
                        "scope": "Namespaced" if r.namespaced else "Cluster",
                        "singularResource": r.singular,
                        "verbs": list(r.verbs),
                    }
                    if r.short_names:
                        doc["shortNames"] = list(r.short_names)
                    if r.categories:
                        doc["categories"] = list(r.categories)
                    if r.subresources:
                        doc["subresources"] = [
                            {
                                "subresource": sub,
                                "responseKind": {
                                    "group": g,
                                    "version": v,
                                    "kind": _subresource_shape(r, sub)[0],
                                },
                                "verbs": _subresource_shape(r, sub)[1],
                            }
                            for sub in sorted(r.subresources)
                        ]
                    resources.append(doc)
                versions.append({"version": v, "resources": resources, "freshness": "Current"})
            items.append({"metadata": {"name": g, "creationTimestamp": None}, "versions": versions})
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": f"apidiscovery.k8s.io/{version}",
            "metadata": {},
            "items": items,
        }

    def resolve_names(self, names: Iterable[str]) -> list[Resource]:
        """Resources matching any of `names` (plural, singular, short name or kind), for tests."""
        wanted = {n.lower() for n in names}
        return [
            r
            for r in self.resources.values()
            if wanted & {r.plural, r.singular, r.kind.lower(), *r.short_names}
        ]


_SUB_SHAPES = {
    "status": (None, ["get", "patch", "update"]),
    "scale": ("Scale", ["get", "patch", "update"]),
    "binding": ("Binding", ["create"]),
    "eviction": ("Eviction", ["create"]),
}


def _subresource_shape(res: Resource, sub: str) -> tuple[str, list[str]]:
    kind, verbs = _SUB_SHAPES.get(sub, (None, ["get"]))
    return kind or res.kind, list(verbs)
