"""The verbs of the test API server on objects: create, get, list, replace, patch, delete, the `status`
subresource, `pods/binding` and `pods/eviction`, with the metadata rules of a real API server.

- `metadata`: `uid`, `creationTimestamp`, `generation` (1 at creation, bumped when anything but
  metadata and status changes), `generateName`, `resourceVersion` (from `storage.py`).
- optimistic concurrency: a write carrying a `metadata.resourceVersion` other than the stored one is a
  409 Conflict; a create carrying one is refused (500, as etcd storage answers); a PUT of a custom
  resource or a CRD without one is a 422 (they allow no unconditional update); a write that changes nothing is answered with the stored object and no new version.
- kinds with a `status` subresource: writes of the main resource keep the stored `.status`; writes of
  `/status` change only `.status` (custom resources and pods are created without the given status).
- delete: by the rules of `deleting.py` (DeleteOptions, finalizers, graceful pod deletion, garbage
  collection); an update removing the last finalizer of a deleted object removes it.
- `CustomResourceDefinition`s register (and, deleted, unregister) their resources in the catalog.
- server-side apply (`apply`, a PATCH of `application/apply-patch+yaml`) and `managedFields`: by the
  rules of `applying.py`.

Everything here is synchronous: one write is one atomic step of the event loop.
"""

from __future__ import annotations

import base64
import bisect
import copy
import json
import re
import secrets
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from gpuyard.testing.apiserver.applying import APPLY, apply_configuration, record_update
from gpuyard.testing.apiserver.catalog import Catalog, Resource
from gpuyard.testing.apiserver.deleting import CRDS, NAMESPACES, PODS, Deletion, now_iso
from gpuyard.testing.apiserver.errors import ApiError
from gpuyard.testing.apiserver.patching import apply_patch
from gpuyard.testing.apiserver.selecting import Matcher
from gpuyard.testing.apiserver.storage import Storage

__all__ = ["ObjectApi"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_FIELDS = (
    "uid",
    "creationTimestamp",
    "generation",
    "resourceVersion",
    "deletionTimestamp",
    "managedFields",
)


def _spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


class ObjectApi:
    """Object semantics over `Storage`, resources from `Catalog`."""

    def __init__(
        self,
        storage: Storage,
        catalog: Catalog,
        *,
        schedule_gc: Callable[[], None],
        graceful_pods: bool = False,
    ) -> None:
        self.storage = storage
        self.catalog = catalog
        self.deletion = Deletion(storage, catalog, schedule_gc=schedule_gc, graceful_pods=graceful_pods)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            ns_res = catalog.get("", "v1", "namespaces")
            self.create(ns_res, {"metadata": {"name": ns}})

    # --- reads ------------------------------------------------------------------------------------

    def get(self, res: Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        obj = self.storage.get(res.key, name, namespace=(namespace or "") if res.namespaced else "")
        if obj is None:
            raise ApiError.not_found(res.plural, name, group=res.group)
        return obj

    def list(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        match: Matcher | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
    ) -> dict[str, Any]:
        """A `<Kind>List` with `metadata.resourceVersion`, paged by `limit` / `continue`: the objects
        now, or as they were at `resource_version` with `resourceVersionMatch=Exact` (and for every
        page after the first, at the first page's version), rebuilt from the history."""
        list_rv = self.storage.rv
        at: int | None = None
        if resource_version_match == "Exact":
            at = _parse_rv(resource_version, "resourceVersion")
            if at is None:
                raise ApiError.bad_request("resourceVersionMatch=Exact needs a resourceVersion")
            if at > self.storage.rv:
                raise ApiError(
                    504, f"Too large resource version: {at}, current: {self.storage.rv}", reason="Timeout"
                )
        elif resource_version_match not in (None, "", "NotOlderThan"):
            raise ApiError.bad_request(
                f"resourceVersionMatch: Unsupported value: {resource_version_match!r}: supported values: Exact, NotOlderThan"
            )
        token = _decode_continue(continue_token) if continue_token else None
        if token is not None:
            if token["rv"] < self.storage.compacted:
                raise ApiError.gone(
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter."
                )
            at = token["rv"]
        scope = namespace if res.namespaced else None
        if at is None:
            found = self.storage.items(res.key, scope)
        else:
            if at < self.storage.compacted:
                raise ApiError.gone(
                    f"The resourceVersion for the provided list is too old: {at} ({self.storage.compacted})"
                )
            found = self.storage.items_at(res.key, at, namespace=scope)
            list_rv = at
        items = found if match is None else [o for o in found if match(o)]
        start = 0
        if token is not None:  # the items are in key order: the page starts after the token's key
            start = bisect.bisect_right(items, tuple(token["after"]), key=_order_key)
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        page = items[start:]
        if limit and limit > 0 and len(page) > limit:
            page = page[:limit]
            meta["continue"] = _encode_continue(list_rv, _order_key(page[-1]))
            meta["remainingItemCount"] = len(items) - start - limit
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": [self.render(res, o) for o in page],
        }

    @staticmethod
    def render(res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """The object as served at `res`'s version (custom resources: no conversion, as with the
        CRD conversion strategy None)."""
        if obj.get("apiVersion") == res.api_version:
            return obj
        return {**obj, "apiVersion": res.api_version}

    # --- create -----------------------------------------------------------------------------------

    def create(
        self,
        res: Resource,
        body: Any,
        *,
        namespace: str | None = None,
        managed_fields: Sequence[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """POST of a new object; `managed_fields` (a server-side apply's) are kept, any other dropped."""
        obj = self._check_body(res, body)
        meta = dict(_meta(obj))
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = meta["generateName"] + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
        if not name:
            raise ApiError.invalid(
                res.kind, "", field="metadata.name", why="Required value: name or generateName is required"
            )
        _check_name(res, name)
        ns = self._namespace_for(res, namespace=namespace, meta=meta, name=name)
        if self.storage.get(res.key, name, namespace=ns) is not None:
            raise ApiError.already_exists(res.plural, name, group=res.group)
        if meta.get("resourceVersion"):
            raise ApiError(
                500, "Internal error occurred: resourceVersion should not be set on objects to be created"
            )
        for f in _SYSTEM_FIELDS:
            meta.pop(f, None)
        meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
        if managed_fields:
            meta["managedFields"] = [dict(e) for e in managed_fields]
        if ns:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        obj = {**obj, "apiVersion": res.api_version, "kind": res.kind, "metadata": meta}
        if res.has_status and (res.crd or res.key == PODS):
            obj.pop("status", None)
        if res.key == PODS:
            obj["status"] = {"phase": "Pending"}
        elif res.key == NAMESPACES:
            obj["status"] = {"phase": "Active"}
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        elif res.key == CRDS:
            obj = self._establish_crd(obj)
        return self.storage.commit(res.key, obj, event_type="ADDED")

    def _check_body(self, res: Resource, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError.bad_request(f"the body of a {res.kind} must be a JSON object")
        kind = body.get("kind")
        if kind and kind != res.kind:
            raise ApiError.bad_request(
                f"kind: {kind!r} does not match the resource {res.qualified()} (kind {res.kind})"
            )
        api_version = body.get("apiVersion")
        if api_version and api_version != res.api_version:
            raise ApiError.bad_request(
                f"apiVersion: {api_version!r} does not match the request's group/version {res.api_version}"
            )
        if "metadata" in body and not isinstance(body["metadata"], dict):
            raise ApiError.bad_request("metadata: must be an object")
        return copy.deepcopy(body)

    def _namespace_for(self, res: Resource, *, namespace: str | None, meta: dict[str, Any], name: str) -> str:
        if not res.namespaced:
            return ""
        given = meta.get("namespace")
        if namespace and given and given != namespace:
            raise ApiError.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        ns = namespace or given or ""
        if not ns:
            raise ApiError.invalid(res.kind, name, field="metadata.namespace", why="Required value")
        return str(ns)

    def _establish_crd(self, crd: dict[str, Any]) -> dict[str, Any]:
        self.catalog.register_crd(crd)
        spec = crd.get("spec") or {}
        when = now_iso()
        status = {
            "acceptedNames": spec.get("names") or {},
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": when}
                for t, r, m in (
                    ("NamesAccepted", "NoConflicts", "no conflicts found"),
                    ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
                )
            ],
        }
        return {**crd, "status": status}

    # --- update -----------------------------------------------------------------------------------

    def replace(
        self,
        res: Resource,
        name: str,
        *,
        body: Any,
        namespace: str | None = None,
        status: bool = False,
        manager: str | None = None,
    ) -> dict[str, Any]:
        """PUT of the object (`status=False`) or of its `status` subresource; `manager` (the
        `fieldManager`) is recorded in `managedFields` where the object has them."""
        current = self.get(res, name, namespace=namespace)
        new = self._check_body(res, body)
        given = _meta(new)
        if given.get("name") and given["name"] != name:
            raise ApiError.bad_request(
                f"the name of the object ({given['name']}) does not match the name on the URL ({name})"
            )
        given_rv = given.get("resourceVersion")
        if given_rv in (None, "") and (res.crd or res.key == CRDS):
            # custom resources and CRDs refuse unconditional updates (AllowUnconditionalUpdate false)
            raise ApiError.invalid(
                res.kind,
                name,
                field="metadata.resourceVersion",
                why="Invalid value: 0x0: must be specified for an update",
            )
        if given_rv not in (None, "") and str(given_rv) != _meta(current).get("resourceVersion"):
            raise ApiError.conflict(res.plural, name, group=res.group)
        return self._write(res, current=current, new=new, status=status, manager=manager)

    def patch(
        self,
        res: Resource,
        name: str,
        *,
        patch: Any,
        content_type: str,
        namespace: str | None = None,
        status: bool = False,
        manager: str | None = None,
        force: bool = False,
    ) -> dict[str, Any]:
        """PATCH of the object or its `status`: merge, JSON or strategic merge patch (`patching.py`),
        or server-side apply (`apply`), which `force`s conflicts when asked."""
        if content_type.split(";")[0].strip().lower() == APPLY:
            return self.apply(
                res, name, config=patch, namespace=namespace, status=status, manager=manager, force=force
            )
        current = self.get(res, name, namespace=namespace)
        patched = apply_patch(current, patch, content_type=content_type, strategic_ok=res.crd is None)
        given_rv = _meta(patched).get("resourceVersion")
        if given_rv not in (None, "") and str(given_rv) != _meta(current).get("resourceVersion"):
            raise ApiError.conflict(res.plural, name, group=res.group)
        return self._write(
            res, current=current, new=self._check_body(res, patched), status=status, manager=manager
        )

    def apply(
        self,
        res: Resource,
        name: str,
        *,
        config: Any,
        namespace: str | None = None,
        status: bool = False,
        manager: str | None,
        force: bool = False,
    ) -> dict[str, Any]:
        """Server-side apply of `config` by `manager` (`applying.py`): creates the object when it
        does not exist (not through `/status`), else merges into it."""
        body = self._check_body(res, config)
        given = _meta(body)
        if given.get("name") and given["name"] != name:
            raise ApiError.bad_request(
                f"the name of the object ({given['name']}) does not match the name on the URL ({name})"
            )
        ns = (namespace or "") if res.namespaced else ""
        current = self.storage.get(res.key, name, namespace=ns)
        if current is None and status:
            raise ApiError.not_found(res.plural, name, group=res.group)
        applied = apply_configuration(
            current,
            body,
            manager=manager,
            force=force,
            api_version=res.api_version,
            has_status=res.has_status,
            status=status,
            now=now_iso(),
        )
        if current is None:
            meta = dict(_meta(applied))
            managed = meta.pop("managedFields", None)
            meta["name"] = name
            return self.create(
                res, {**applied, "metadata": meta}, namespace=namespace, managed_fields=managed
            )
        given_rv = given.get("resourceVersion")
        if given_rv not in (None, "") and str(given_rv) != _meta(current).get("resourceVersion"):
            raise ApiError.conflict(res.plural, name, group=res.group)
        return self._write(res, current=current, new=applied, status=status, applied=True)

    def _write(
        self,
        res: Resource,
        *,
        current: dict[str, Any],
        new: dict[str, Any],
        status: bool,
        manager: str | None = None,
        applied: bool = False,
    ) -> dict[str, Any]:
        if not applied:
            record_update(
                current,
                new,
                manager=manager,
                api_version=res.api_version,
                has_status=res.has_status,
                status=status,
                now=now_iso(),
            )
        cur_meta = _meta(current)
        if status:
            obj = {**current}
            if "status" in new:
                obj["status"] = new["status"]
            else:
                obj.pop("status", None)
            managed = _meta(new).get("managedFields")
            if managed != cur_meta.get("managedFields"):  # the fields this status write took
                obj["metadata"] = {**cur_meta, "managedFields": managed}
                if not managed:
                    obj["metadata"].pop("managedFields")
        else:
            meta = dict(_meta(new))
            for f in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
                "name",
                "generation",
            ):
                if f in cur_meta:
                    meta[f] = cur_meta[f]
                else:
                    meta.pop(f, None)
            obj = {**new, "apiVersion": current.get("apiVersion"), "kind": res.kind, "metadata": meta}
            if res.has_status:
                if "status" in current:
                    obj["status"] = current["status"]
                else:
                    obj.pop("status", None)
            if _spec_of(obj) != _spec_of(current):
                meta["generation"] = int(cur_meta.get("generation") or 0) + 1
            if res.key == PODS:
                _check_pod_update(current, obj)
        meta_now = {**_meta(obj), "resourceVersion": cur_meta.get("resourceVersion")}
        obj["metadata"] = meta_now
        if obj == current:
            return current  # a no-op write: no new version, no event
        if res.key == CRDS and not status:
            obj = {**self._establish_crd(obj)}
        released = cur_meta.get("finalizers") and not meta_now.get("finalizers")
        waiting_for_kubelet = int(meta_now.get("deletionGracePeriodSeconds") or 0) > 0
        if meta_now.get("deletionTimestamp") and released and not waiting_for_kubelet:
            self.deletion.remove(res, obj)
            return obj
        return self.storage.commit(res.key, obj, event_type="MODIFIED")

    # --- subresources -----------------------------------------------------------------------------

    def bind(self, res: Resource, name: str, *, body: Any, namespace: str | None = None) -> dict[str, Any]:
        """`pods/{name}/binding`: set `spec.nodeName`; 409 when the pod is already bound."""
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("target"), dict)
            or not body["target"].get("name")
        ):
            raise ApiError.invalid("Binding", name, field="target.name", why="Required value")
        pod = self.get(res, name, namespace=namespace)
        node = body["target"]["name"]
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            raise ApiError.conflict(res.plural, name, why=f"pod {name} is already assigned to node {bound!r}")
        if _meta(pod).get("deletionTimestamp"):
            raise ApiError.conflict(
                res.plural, name, why=f"pod {name} is being deleted, cannot be assigned to a host"
            )
        status = dict(pod.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_iso()}
        )
        status["conditions"] = conditions
        obj = {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}, "status": status}
        return self.storage.commit(res.key, obj, event_type="MODIFIED")

    def evict(self, res: Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        """`pods/{name}/eviction`: delete the pod (PodDisruptionBudgets are not consulted)."""
        return self.delete(res, name, namespace=namespace)

    # --- delete -----------------------------------------------------------------------------------

    def delete(
        self, res: Resource, name: str, *, namespace: str | None = None, options: Any = None
    ) -> dict[str, Any]:
        """Delete by the rules of `deleting.py`; the object as it was last."""
        return self.deletion.delete(res, self.get(res, name, namespace=namespace), options)

    def collect_garbage(self) -> int:
        return self.deletion.collect_garbage()


def _check_name(res: Resource, name: str) -> None:
    if len(name) > 253 or not _NAME.match(name):
        raise ApiError.invalid(
            res.kind,
            name,
            field="metadata.name",
            why=f"Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
            "characters, '-' or '.', and must start and end with an alphanumeric character",
        )


def _check_pod_update(current: dict[str, Any], new: dict[str, Any]) -> None:
    bound = (current.get("spec") or {}).get("nodeName")
    if bound and (new.get("spec") or {}).get("nodeName") != bound:
        raise ApiError.invalid(
            "Pod",
            _meta(current).get("name", ""),
            field="spec.nodeName",
            why="Forbidden: pod updates may not change the node",
        )


def _parse_rv(value: str | None, field: str) -> int | None:
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ApiError.bad_request(
            f"{field}: invalid value {value!r}: must be a resourceVersion this server returned"
        ) from None


def _order_key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = _meta(obj)
    return (meta.get("namespace") or "", meta.get("name") or "")


def _encode_continue(rv: int, after: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps({"rv": rv, "after": list(after)}).encode()).decode()


def _decode_continue(token: str) -> dict[str, Any]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
    except ValueError:
        data = None
    if (
        isinstance(data, dict)
        and isinstance(data.get("rv"), int)
        and isinstance(data.get("after"), list)
        and len(data["after"]) == 2
    ):
        return data
    raise ApiError.bad_request("continue: invalid value: not a token this server returned")
