"""Deletion in the test API server: DeleteOptions, finalizers, graceful pod deletion, namespaces and
CRDs taking their contents with them, and the garbage collector (ownerReferences).

- `preconditions` (`uid`, `resourceVersion`) that do not hold: 409.
- `propagationPolicy`: Background (default: the owner goes now, the collector takes its dependents
  right after), Foreground (the dependents go first, then the owner), Orphan (the owner's reference is
  removed from the dependents, which stay).
- `finalizers` hold an object: it gets a `deletionTimestamp` and stays until an update removes the
  last finalizer (`objects.py` then removes it).
- with `graceful_pods` on, a pod bound to a node and not finished is only marked (`deletionTimestamp`,
  `deletionGracePeriodSeconds` from `gracePeriodSeconds`, else its `terminationGracePeriodSeconds`,
  else 30), for its kubelet to delete it with `gracePeriodSeconds: 0`, as on a real cluster; off (the
  default), pods go at once like everything else.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuyard.testing.apiserver.catalog import Catalog, Resource
from gpuyard.testing.apiserver.errors import ApiError
from gpuyard.testing.apiserver.storage import ResourceKey, Storage

__all__ = ["Deletion", "now_iso"]

CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACES = ("", "namespaces")
PODS = ("", "pods")
_POLICIES = ("Background", "Foreground", "Orphan")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _grace_seconds(opts: dict[str, Any]) -> int | None:
    value = opts.get("gracePeriodSeconds")
    if value is None or value == "":
        return None
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        raise ApiError.bad_request(
            f"gracePeriodSeconds: invalid value {value!r}: must be a whole number"
        ) from None
    if seconds < 0:
        raise ApiError.bad_request(f"gracePeriodSeconds: invalid value {seconds}: must be >= 0")
    return seconds


class Deletion:
    """Deletes objects of `Storage` by Kubernetes' rules (see the module docstring)."""

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
        self.schedule_gc = schedule_gc
        self.graceful_pods = graceful_pods

    def delete(self, res: Resource, current: dict[str, Any], options: Any = None) -> dict[str, Any]:
        """Delete (or mark) `current`; the object as it was last (marked, or as deleted)."""
        opts = options if isinstance(options, dict) else {}
        self._check_preconditions(res, current, opts.get("preconditions") or {})
        policy = opts.get("propagationPolicy") or ("Orphan" if opts.get("orphanDependents") else "Background")
        if policy not in _POLICIES:
            raise ApiError.bad_request(
                f"propagationPolicy: Unsupported value: {policy!r}: supported values: {', '.join(_POLICIES)}"
            )
        grace = _grace_seconds(opts)
        meta = _meta(current)
        if policy == "Orphan":
            self._orphan(meta.get("uid"))
        elif policy == "Foreground":
            self.collect_garbage(gone={meta.get("uid")})
        pod_grace = self._pod_grace(res, current, grace)
        if meta.get("finalizers") or pod_grace:
            if meta.get("deletionTimestamp") and (
                pod_grace is None or pod_grace >= int(meta.get("deletionGracePeriodSeconds") or 0)
            ):
                return current
            marked = {
                **meta,
                "deletionTimestamp": meta.get("deletionTimestamp") or now_iso(),
                "deletionGracePeriodSeconds": pod_grace or 0,
            }
            return self.storage.commit(res.key, {**current, "metadata": marked}, event_type="MODIFIED")
        self.remove(res, current)
        return current

    def _check_preconditions(self, res: Resource, current: dict[str, Any], pre: dict[str, Any]) -> None:
        meta = _meta(current)
        for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            if pre.get(field) and pre[field] != meta.get(field):
                raise ApiError.conflict(
                    res.plural,
                    meta.get("name", ""),
                    group=res.group,
                    why=f"Precondition failed: {label} in precondition: {pre[field]}, {label} in object meta: {meta.get(field)}",
                )

    def _pod_grace(self, res: Resource, pod: dict[str, Any], grace: int | None) -> int | None:
        """Seconds a pod's deletion waits for its kubelet, or None when it goes at once."""
        if not self.graceful_pods or res.key != PODS or grace == 0:
            return None
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return None
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds") or 30)
        return grace or None

    def remove(self, res: Resource, obj: dict[str, Any]) -> None:
        """Delete `obj` now (with what a namespace or a CRD holds), then let the collector run."""
        meta = _meta(obj)
        if res.key == NAMESPACES:
            for key in {r.key for r in self.catalog.resources.values() if r.namespaced}:
                self.storage.drop_resource(key, meta.get("name"))
        elif res.key == CRDS:
            for key in {r.key for r in self.catalog.resources.values() if r.crd == meta.get("name")}:
                self.storage.drop_resource(key)
            self.catalog.unregister_crd(meta.get("name") or "")
        self.storage.commit(res.key, obj, event_type="DELETED")
        self.schedule_gc()

    def _orphan(self, uid: str | None) -> None:
        for key, obj in list(self.storage.all_objects()):
            refs = _meta(obj).get("ownerReferences") or []
            kept = [r for r in refs if r.get("uid") != uid]
            if len(kept) != len(refs):
                meta = {**_meta(obj), "ownerReferences": kept}
                if not kept:
                    meta.pop("ownerReferences")
                self.storage.commit(key, {**obj, "metadata": meta}, event_type="MODIFIED")

    def _resource(self, key: ResourceKey) -> Resource | None:
        return next((r for r in self.catalog.resources.values() if r.key == key), None)

    def collect_garbage(self, *, gone: set[str | None] | None = None) -> int:
        """Delete the objects none of whose owners exist any more (and, with `gone`, the dependents of
        those uids); the number of deletions started. Repeats until nothing more is orphaned."""
        started = 0
        handled: set[str | None] = set()
        while True:
            alive = {_meta(o).get("uid") for _, o in self.storage.all_objects()} - (gone or set())
            victims = [
                (key, obj)
                for key, obj in self.storage.all_objects()
                if _meta(obj).get("uid") not in handled
                and (refs := _meta(obj).get("ownerReferences") or [])
                and not any(r.get("uid") in alive for r in refs)
            ]
            if not victims:
                return started
            for key, obj in victims:
                handled.add(_meta(obj).get("uid"))
                res = self._resource(key)
                if res is not None:
                    self.delete(res, obj, {"propagationPolicy": "Background"})
                    started += 1
