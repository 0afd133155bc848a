"""DRA mode of the Kubernetes backend: placed pods get a ResourceClaim instead of `nvidia.com/gpu`.

Setting `backend.kubernetes.dra`: `off` (pods request `nvidia.com/gpu` as the device plugin wants),
`on` (every placed GPU pod gets a claim; a node without a published slice fails the write), `auto`
(on for a node when the API server serves `resource.k8s.io/v1` and a `gpu.nvidia.com`
ResourceSlice exists for it; off otherwise).

Data flow: :class:`KubeWriter` (`writing.py`) asks :meth:`DraAllocator.prepare` for every pod it
creates for a node. When DRA applies, `prepare` rewrites the pod body (`spec.resourceClaims` names
the claim `<pod>-gpus`, each GPU container's `resources.claims` names it, `nvidia.com/gpu` leaves
its requests and limits) and returns a :class:`PendingClaim`; after the pod is created (and before
it is bound) the writer calls :meth:`PendingClaim.write`, which creates the ResourceClaim
(`devices.dra.resource_claim`: allocated to exactly the GPUs of the pod's `gpuyard.io/devices`
annotation, reserved for the pod, owned by it so the garbage collector deletes it with the pod) and
writes its `status` through the status subresource.

Slices are read with a LIST, not watched (the group may not be served, and a watch of a missing
resource would keep `/readyz` down): at the first pod, again when a pod goes to a node with no
slice yet (a node that just joined may have published one since; in `auto` mode a pod placed
there without a claim would ask the device plugin instead), and again at the next pod once the
last LIST is older than `max_age` seconds (a driver that republished its devices is seen within
that). They are read as NVIDIA's DRA driver publishes them (`devices.dra.node_pools`): a node's pool
may span several slices, only its newest generation counts, and a pool is used only once all
`resourceSliceCount` slices of it are listed (until then the node counts as publishing none). A
pool's devices are matched to the node's NodeTopology by UUID / PCI bus id
(`devices.dra.match_slice_devices`), and the claim names the published pool and device names; a
published device that matches no GPU is reported once as a Warning Event on the node (reason
`UnmatchedDevices`, through the backend's Event recorder) and never allocated.

Claims and Events are the backend's writes (`BACKEND`, `state.ownership`), although a claim is
written while the operator's pod create is under way.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gpuyard.apis.core import GPU_RESOURCE, Pod
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.resources import ApiResource
from gpuyard.apis.scheduling import pod_gpus
from gpuyard.devices.dra import (
    DRIVER,
    UNMATCHED,
    PublishedPool,
    SliceMatch,
    match_slice_devices,
    node_pools,
    resource_claim,
    unmatched_message,
    unmatched_reference,
)
from gpuyard.kubecluster.client import ApiError, Json, KubeClient
from gpuyard.state.backend import BackendError
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import BACKEND
from gpuyard.state.store import AlreadyExists, NotFound, Store
from gpuyard.state.writing import acting_as

__all__ = [
    "CLAIM_REQUEST",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "DraAllocator",
    "PendingClaim",
]

log = structlog.get_logger(__name__)

RESOURCE_SLICES = ApiResource(
    kind="ResourceSlice",
    group="resource.k8s.io",
    version="v1",
    plural="resourceslices",
    namespaced=False,
    status_subresource=False,
)
RESOURCE_CLAIMS = ApiResource(
    kind="ResourceClaim", group="resource.k8s.io", version="v1", plural="resourceclaims"
)
CLAIM_REQUEST = "gpus"  # the claim's one request, and the pod's name for the claim
GROUP_PATH = "/apis/resource.k8s.io/v1"


def _strip_gpu(resources: dict[str, Any]) -> bool:
    """Drop `nvidia.com/gpu` from a container's requests and limits; True when it was there."""
    found = False
    for part in ("requests", "limits"):
        values = resources.get(part)
        if isinstance(values, dict) and GPU_RESOURCE in values:
            del values[GPU_RESOURCE]
            found = True
            if not values:
                del resources[part]
    return found


def _slices_named(pool: PublishedPool) -> str:
    """The slice of a one-slice pool by name, else the pool and its slices."""
    if len(pool.slices) == 1:
        return pool.slices[0]
    return f"pool {pool.name} ({', '.join(pool.slices)})"


@dataclass
class PendingClaim:
    """A claim to write once its pod exists (its uid is the claim's owner and reservation)."""

    allocator: DraAllocator
    body: Json  # the claim, its reservation's and owner's uid still to fill in
    namespace: str
    pod: str

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    async def write(self, pod_uid: str) -> None:
        """Create the claim owned by and reserved for the pod `pod_uid`, then write its status."""
        body = copy.deepcopy(self.body)
        body["status"]["reservedFor"][0]["uid"] = pod_uid
        body["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": self.pod,
                "uid": pod_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        status = body.pop("status")
        api = self.allocator.client
        with acting_as(BACKEND):
            try:
                await api.create(RESOURCE_CLAIMS, body)
            except AlreadyExists:  # a claim left by an earlier pod of the same name: replace it
                await api.delete(RESOURCE_CLAIMS, self.namespace, self.name)
                await api.create(RESOURCE_CLAIMS, body)
            await api.patch(RESOURCE_CLAIMS, self.namespace, self.name, {"status": status}, sub="status")
        self.allocator.claims_written += 1


class DraAllocator:
    """Decides per node whether DRA applies, and prepares the pods and claims; see the module docstring."""

    def __init__(
        self,
        *,
        client: KubeClient,
        store: Store,
        mode: str,
        events: EventRecorder | None = None,
        now: Callable[[], float] = time.monotonic,
        max_age: float = 60.0,
    ) -> None:
        """`events`: the backend's Event recorder (None: unmatched devices are only logged)."""
        self.client = client
        self.events = events
        self.store = store
        self.mode = mode
        self.now = now
        self.max_age = max_age  # seconds after which the slices are LISTed again
        self.listed_at: float | None = None
        self.lists = 0
        self.served: bool | None = None  # resource.k8s.io/v1 served (None: not asked yet)
        self.pools: dict[str, PublishedPool] = {}  # node -> its complete gpu.nvidia.com pool
        self.incomplete: list[str] = []  # pools of the last LIST not all of whose slices were seen
        self.matched: dict[str, SliceMatch] = {}  # node -> its pool matched to its NodeTopology
        self.reported: set[tuple[str, tuple[str, ...]]] = set()
        self.claims_written = 0

    async def _serves(self) -> bool:
        if self.served is None:
            try:
                await self.client.request("GET", GROUP_PATH)
                self.served = True
            except NotFound:
                self.served = False
            except ApiError as exc:
                if not 400 <= exc.status < 500:
                    raise  # no answer or a server error: ask again at the next pod
                self.served = False
        return self.served

    async def refresh(self) -> None:
        """LIST the `gpu.nvidia.com` slices and keep each node's complete pool."""
        items, _ = await self.client.list(RESOURCE_SLICES)
        self.listed_at = self.now()
        self.lists += 1
        self.pools, incomplete = node_pools(items)
        if incomplete and incomplete != self.incomplete:
            log.info("kube.dra.incomplete_pools", pools=incomplete)
        self.incomplete = incomplete
        self.matched.clear()

    async def _pool_for(self, node: str) -> PublishedPool | None:
        if self.mode == "off" or not await self._serves():
            return None
        age = None if self.listed_at is None else self.now() - self.listed_at
        if age is None or age >= self.max_age or node not in self.pools:
            await self.refresh()
        return self.pools.get(node)

    async def _match(self, node: str, topology: NodeTopology, pool: PublishedPool) -> SliceMatch:
        if node in self.matched:
            return self.matched[node]
        match = match_slice_devices(topology, pool)
        self.matched[node] = match
        key = (node, tuple(match.unmatched))
        if match.unmatched and key not in self.reported:
            self.reported.add(key)
            log.warning("kube.dra.unmatched_devices", node=node, devices=match.unmatched)
            if self.events is not None:
                try:
                    await self.events.record(
                        unmatched_reference(node),
                        reason=UNMATCHED,
                        message=unmatched_message(node, _slices_named(pool), match.unmatched),
                        type="Warning",
                    )
                except (ApiError, BackendError) as exc:  # a report: never fails the pod's create
                    log.warning("kube.dra.unmatched_event_failed", node=node, error=str(exc))
        return match

    async def prepare(self, pod: Pod, body: Json, node: str) -> PendingClaim | None:
        """Rewrite `body` (the pod as it will be created) for DRA when DRA applies to `node`; the
        claim to write after the create, or None (the pod is left as it is)."""
        gpus = pod_gpus(pod)
        if not gpus or self.mode == "off":
            return None
        where = f"pod {pod.metadata.namespace or 'default'}/{pod.metadata.name}"
        pool = await self._pool_for(node)
        if pool is None:
            if self.mode == "on":
                raise BackendError(
                    f"{where}: backend.kubernetes.dra is on but node {node} publishes no {DRIVER} "
                    "ResourceSlice on resource.k8s.io/v1; set it to auto or off"
                )
            return None
        topology = self.store.get_of(NodeTopology, "", node)
        if topology is None:
            raise BackendError(f"{where}: node {node} has no NodeTopology to match its ResourceSlice to")
        match = await self._match(node, topology, pool)
        missing = [g for g in gpus if g not in match.by_index]
        if missing:
            raise BackendError(
                f"{where}: GPUs {missing} of node {node} are not published in its ResourceSlice"
            )
        namespace = body["metadata"].get("namespace") or "default"
        try:
            claim = resource_claim(
                topology,
                gpus,
                pod=pod.metadata.name,
                pod_uid="",
                namespace=namespace,
                request=CLAIM_REQUEST,
                published=match,
            )
        except ValueError as exc:
            raise BackendError(f"{where}: {exc}") from None
        spec = body.setdefault("spec", {})
        spec["resourceClaims"] = [{"name": CLAIM_REQUEST, "resourceClaimName": claim["metadata"]["name"]}]
        containers = spec.get("containers") or []
        holders = [c for c in containers if _strip_gpu(c.setdefault("resources", {}))] or containers[:1]
        for container in holders:
            container.setdefault("resources", {})["claims"] = [{"name": CLAIM_REQUEST}]
        return PendingClaim(allocator=self, body=claim, namespace=namespace, pod=pod.metadata.name)
