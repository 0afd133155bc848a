"""The Kubernetes backend's write path: :class:`KubeWriter` implements `state.writing.Writer`
over the API server.

* `create(obj)` -> POST (409: `AlreadyExists`, and the object holding the name is read and
  mirrored, so a caller that re-reads the store finds it). A Pod arrives from the operator already carrying the node the scheduler
  chose: it is created *without* `spec.nodeName`, with gpuyard's `schedulerName` (`scheduler.name`,
  so no other scheduler touches it), then bound through `pods/binding`, as kube-scheduler binds
  (a pod with another `schedulerName` and no node, delegate mode, is created as it is); if the
  binding fails the pod is deleted again and the create fails with `BackendError` (the caller
  un-assumes the placement). In DRA mode (`dra.py`) the pod references a ResourceClaim instead of
  requesting `nvidia.com/gpu`, and the claim, allocated to the chosen GPUs, is written between the
  create and the binding. A status given at create is written with a status PATCH after it
  (the API server drops it from a create), except for pods, whose status is the kubelet's, the
  kinds of `CLUSTER_OWNED_STATUS`, and a status that is only its model's defaults (a new PodGroup's
  `phase: Pending`, a new job's empty conditions): the object reads back the same without it, and
  the status stays the subresource of the one component that owns it (`state.ownership`).
* `update(obj)` -> PUT with the object's resourceVersion: 409 -> `Conflict` (the caller's
  `retry_on_conflict` re-reads the cache and decides again). Status is a subresource: a PUT of
  the object never changes it, as in the store's own writer.
* `patch_status(kind, ns, name, changes)` -> a JSON merge PATCH of `/status` (of the object for
  kinds without a status subresource) that turns the cached status into the changed one; with
  `resource_version` it carries `metadata.resourceVersion`, which the API server treats as a
  precondition (409). A ResourceQuota's status is left to the cluster (`CLUSTER_OWNED_STATUS`).
* `delete(kind, ns, name)` -> DELETE (404 -> `NotFound`, as the protocol says: already gone).

Every write answers only after the API server's 2xx, and the object the server returns is
mirrored into the store at once (read-your-writes; the watch event that repeats it later carries
the same resourceVersion and changes nothing). While this replica does not lead (another
does, or its own lease is past its renew deadline: `leading.py`), every write is refused with
`BackendError` (a fenced replica never binds); the check is made before each request of a
write, so a lead that lapses between a pod's create and its binding stops the binding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from gpuyard.apis.core import GPU_RESOURCE, Pod
from gpuyard.apis.meta import Resource
from gpuyard.apis.resourceclasses import SHARE_RESOURCES
from gpuyard.apis.resources import ApiResource, resource_for
from gpuyard.apis.scheduling import pod_devices
from gpuyard.devices.agent.allocating import ANNOTATION_BIND_TIME, RESOURCE_GPU_SHARE
from gpuyard.kubecluster.client import ApiError, Json, KubeClient
from gpuyard.kubecluster.dra import DraAllocator
from gpuyard.state.backend import BackendError
from gpuyard.state.store import AlreadyExists, Conflict, NotFound, Store
from gpuyard.state.writing import patchable_status

__all__ = [
    "ANNOTATION_ASSIGNED_NODE",
    "CLUSTER_OWNED_STATUS",
    "SCHEDULER_NAME",
    "KubeWriter",
    "merge_diff",
    "to_json",
]

R = TypeVar("R", bound=Resource)

SCHEDULER_NAME = "gpuyard"  # the default of `scheduler.name`
ANNOTATION_ASSIGNED_NODE = "gpuyard.io/assigned-node"  # the node a pod is created for (bound next)
# Kinds whose status the cluster's own controllers write: a ResourceQuota's is kube-controller-manager's
# (the API server's quota admission charges pods against it), a PodDisruptionBudget's the disruption
# controller's. gpuyard's accounting of them stays in the scheduler: a patch of their status answers the
# cached object, and a create (`gpuyard apply`) leaves the status out, writing nothing (nor asking RBAC for it).
CLUSTER_OWNED_STATUS = frozenset({"ResourceQuota", "PodDisruptionBudget"})


def to_json(obj: BaseModel) -> Json:
    """A model as the API server takes it (camelCase, no nulls, JSON types)."""
    return obj.model_dump(by_alias=True, exclude_none=True, mode="json")


def merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: changed keys, nested maps
    diffed, keys that went away as null."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif old[k] != v:
            out[k] = merge_diff(old[k], v)
    return out


class KubeWriter:
    """`Writer` over the API server; see the module docstring."""

    def __init__(
        self,
        *,
        client: KubeClient | None,
        store: Store,
        may_write: Callable[[], str | None] = lambda: None,
        scheduler_name: str = SCHEDULER_NAME,
        gpu_resource: str = GPU_RESOURCE,
    ) -> None:
        """`may_write()` returns why this replica must not write now (None: it may); `client`
        may be set later (before that, every write fails with `BackendError`)."""
        self.client = client
        self.store = store
        self.may_write = may_write
        self.scheduler_name = scheduler_name
        self.gpu_resource = gpu_resource  # device-plugin mode: gpuyard.io/gpu (agent --device-plugin)
        self.pods_bound = 0
        self.in_flight: set[tuple[str, str]] = set()  # pods between create and bind
        self.dra: DraAllocator | None = None  # DRA mode (`dra.py`): set with the client when enabled

    def _resource(self, kind: str, api_version: str | None = None) -> ApiResource:
        try:
            return resource_for(kind, api_version or None)
        except KeyError:
            return resource_for(kind)

    def _api(self) -> KubeClient:
        if self.client is None:
            raise BackendError("the Kubernetes backend is not connected yet")
        return self.client

    def _check(self, what: str) -> None:
        why = self.may_write()
        if why is not None:
            raise BackendError(f"{what}: {why}")

    def _mirror(self, cls: type[R], raw: Json) -> R:
        if cls.KIND:
            raw["kind"] = cls.KIND  # the store's kind (GangPodGroup is a `PodGroup` on the wire)
        obj = cls.model_validate(raw)
        self.store.observe(obj)
        return obj

    async def create(self, obj: R) -> R:
        self._check(f"create {obj.kind} {obj.metadata.name}")
        res = self._resource(obj.kind, obj.api_version)
        cls = type(obj)
        body = to_json(obj)
        body["apiVersion"], body["kind"] = res.api_version, res.wire_kind
        meta = body.setdefault("metadata", {})
        for server_owned in ("resourceVersion", "uid", "creationTimestamp", "generation"):
            meta.pop(server_owned, None)
        if not res.namespaced:
            meta.pop("namespace", None)
        elif not meta.get("namespace"):
            meta["namespace"] = "default"
        status = body.pop("status", None)
        if status and status == _default_status(obj):
            status = None  # nothing to write: the object reads back with these defaults
        if isinstance(obj, Pod):
            return cast(R, await self._create_pod(obj, body))
        try:
            raw = await self._api().create(res, body)
        except AlreadyExists:
            await self._mirror_existing(cls, res, meta.get("namespace", ""), meta.get("name", ""))
            raise
        if status and res.status_subresource and obj.kind not in CLUSTER_OWNED_STATUS:
            self._check(f"patch {obj.kind} {obj.metadata.name} status")
            raw = await self._api().patch(
                res,
                raw["metadata"].get("namespace", ""),
                raw["metadata"]["name"],
                {"status": status},
                sub="status",
            )
        return self._mirror(cls, raw)

    async def _mirror_existing(self, cls: type[R], res: ApiResource, namespace: str, name: str) -> None:
        """A create refused because the name is taken: mirror what holds it (the cache may not
        watch the kind, e.g. Events), so the caller's re-read finds it."""
        if not name:
            return
        try:
            self._mirror(cls, await self._api().get(res, namespace, name))
        except (ApiError, NotFound):
            pass

    async def _create_pod(self, pod: Pod, body: Json) -> Pod:
        where = f"pod {pod.metadata.namespace or 'default'}/{pod.metadata.name}"
        node = pod.spec.node_name
        if not node:
            if (pod.spec.scheduler_name or self.scheduler_name) == self.scheduler_name:
                raise BackendError(
                    f"{where}: spec.nodeName is required (the scheduler places pods before they are created)"
                )
            return await self._create_unbound(pod, body)  # delegate mode: another scheduler binds it
        spec = body.setdefault("spec", {})
        spec.pop("nodeName", None)
        spec["schedulerName"] = self.scheduler_name
        annotations = body["metadata"].setdefault("annotations", {})
        annotations[ANNOTATION_ASSIGNED_NODE] = node
        annotations[ANNOTATION_BIND_TIME] = str(time.time_ns())  # the device plugin's order (allocating.py)
        res = self._resource("Pod")
        shared = 0 < int(pod_devices(pod).get("gpuMilli") or 0) < 1000
        claim = await self.dra.prepare(pod, body, node) if self.dra is not None and not shared else None
        if shared:
            share_requests(body)
        elif claim is None and self.gpu_resource != GPU_RESOURCE:
            rename_gpu_requests(body, to=self.gpu_resource)
        key = (body["metadata"]["namespace"], pod.metadata.name)
        self.in_flight.add(key)
        try:
            try:
                raw = await self._api().create(res, body)
            except AlreadyExists as exc:
                raise BackendError(str(exc)) from None
            meta = raw.get("metadata") or {}
            ns, name = meta.get("namespace", ""), meta.get("name", pod.metadata.name)
            # asked again after every await: the lead may have lapsed while the create was in
            # flight (left unbound, the next leader's orphan sweep deletes it)
            self._check(f"bind {where}")
            try:
                if claim is not None:  # the claim exists, allocated, before the pod is bound
                    await claim.write(str(meta.get("uid") or ""))
                await self._api().bind(ns, name, node, uid=meta.get("uid"))
            except (ApiError, NotFound, AlreadyExists, Conflict) as exc:
                try:
                    await self._api().delete(res, ns, name)
                except (ApiError, NotFound):
                    pass  # left unbound: the leader's orphan sweep deletes it
                raise BackendError(f"{where}: binding to node {node} failed: {exc}") from None
        finally:
            self.in_flight.discard(key)
        self.pods_bound += 1
        raw.setdefault("spec", {})["nodeName"] = node  # the binding's own event follows
        return self._mirror(Pod, raw)

    async def _create_unbound(self, pod: Pod, body: Json) -> Pod:
        try:
            raw = await self._api().create(self._resource("Pod"), body)
        except AlreadyExists as exc:
            raise BackendError(str(exc)) from None
        return self._mirror(Pod, raw)

    async def bind(self, pod: Pod, node: str) -> None:
        """Bind an existing unbound pod (one a previous leader created) to `node`."""
        self._check(f"bind pod {pod.metadata.name}")
        await self._api().bind(pod.metadata.namespace, pod.metadata.name, node, uid=pod.metadata.uid)
        self.pods_bound += 1

    async def update(self, obj: R) -> R:
        self._check(f"update {obj.kind} {obj.metadata.name}")
        res = self._resource(obj.kind, obj.api_version)
        body = to_json(obj)
        body["apiVersion"], body["kind"] = res.api_version, res.wire_kind
        if not res.namespaced:
            body.get("metadata", {}).pop("namespace", None)
        if res.status_subresource:
            body.pop("status", None)
        raw = await self._api().replace(res, body)
        return self._mirror(type(obj), raw)

    async def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        changes: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> Resource:
        self._check(f"patch {kind} {name} status")
        current = self.store.must_get(kind, namespace, name)
        if kind in CLUSTER_OWNED_STATUS:
            return current
        cls = type(current)
        status = patchable_status(current, changes)
        fields = type(status).model_fields
        aliases = {k: fields[k].alias or k for k in changes}
        old = to_json(status)
        new = to_json(status.model_copy(update=dict(changes)))
        patch = {aliases[k]: merge_diff(old.get(aliases[k]), new.get(aliases[k])) for k in changes}
        body: Json = {"status": patch}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        res = self._resource(kind, current.api_version)
        raw = await self._api().patch(
            res, namespace, name, body, sub="status" if res.status_subresource else None
        )
        return self._mirror(cls, raw)

    async def delete(
        self,
        kind: str,
        namespace: str,
        name: str,
        *,
        resource_version: str | None = None,
        uid: str | None = None,
        grace_period: int | None = None,
    ) -> None:
        """Delete one object (`resource_version`, `uid`: preconditions). `grace_period=0` deletes a
        pod at once, as its kubelet's final delete would: only for a pod whose kubelet is gone
        (`nodes.py`)."""
        self._check(f"delete {kind} {name}")
        held = self.store.get(kind, namespace, name)
        res = self._resource(kind, held.api_version if held is not None else None)
        try:
            raw = await self._api().delete(
                res, namespace, name, resource_version=resource_version, uid=uid, grace_period=grace_period
            )
        except NotFound:
            self.store.forget(kind, namespace, name)
            raise
        if raw.get("kind") == res.kind and (raw.get("metadata") or {}).get("deletionTimestamp"):
            self._mirror(self.store.kind_class(kind), raw)  # terminating: the kubelet finishes it
        else:
            self.store.forget(kind, namespace, name)


def _default_status(obj: Resource) -> Json | None:
    """The JSON of a new object's status of that kind (None: its status has no defaults)."""
    status = getattr(obj, "status", None)
    if not isinstance(status, BaseModel):
        return None
    try:
        return to_json(type(status)())
    except ValueError:  # a status model with required fields
        return None


def rename_gpu_requests(body: Json, *, to: str) -> None:
    """Device-plugin mode: every container's `nvidia.com/gpu` request and limit becomes `to`
    (`gpuyard.io/gpu`), so the kubelet asks `gpuyard agent --device-plugin`, which hands over exactly
    the devices of the pod's `gpuyard.io/devices` annotation, not the stock plugin's own pick."""
    for container in (body.get("spec") or {}).get("containers") or []:
        for part in ("requests", "limits"):
            values = (container.get("resources") or {}).get(part)
            if isinstance(values, dict) and GPU_RESOURCE in values:
                values[to] = values.pop(GPU_RESOURCE)


def share_requests(body: Json) -> None:
    """A GPU share asks the kubelet for one `gpuyard.io/gpu-share` slot (the agent's device plugin, which
    hands over the GPU with its MPS limits) instead of the share resources (`gpuyard.io/gpu-milli`,
    `koordinator.sh/gpu-core`, ...) no kubelet advertises, or a whole `nvidia.com/gpu`."""
    containers = (body.get("spec") or {}).get("containers") or []
    holders = []
    for container in containers:
        resources = container.get("resources") or {}
        found = False
        for part in ("requests", "limits"):
            values = resources.get(part)
            if not isinstance(values, dict):
                continue
            for name in [n for n in values if n in SHARE_RESOURCES or n == GPU_RESOURCE]:
                del values[name]
                found = True
        if found:
            holders.append(container)
    for container in holders[:1] or containers[:1]:
        resources = container.setdefault("resources", {})
        for part in ("requests", "limits"):
            resources.setdefault(part, {})[RESOURCE_GPU_SHARE] = "1"
