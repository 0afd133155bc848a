"""A MarsJob's web UI: one Ingress per web-service Service, from `spec.webHost`.

As KubeDL's `controllers/mars/ingress.go` does: for a MarsJob with `webHost`, every Service of
its `WebService` replicas (`<job>-webservice-<i>`) gets an Ingress of the same name, labelled
`job-name`, `group-name` and `replica-type: webservice`, owned by that Service (a controller
reference: the API server's garbage collector takes the Ingress with it), with the annotations
`nginx.ingress.kubernetes.io/rewrite-target: /$1` and `nginx.org/websocket-services`, and two
paths on `webHost`, `/mars/<ns>/<service>/(.*)` and `/mars/<ns>/<service>`, to the Service's
port (the one named `mars-port`, else its first; 11111 without ports). The Mars web UI is then at
`http://<webHost>/mars/<ns>/<service>/`.

Unlike KubeDL (which only creates), an Ingress whose Service is gone or whose job dropped
`webHost` is deleted, on both backends; a changed `webHost` is written to the Ingresses. On the
fake cluster the Ingress is stored and a Warning Event `WebUINotServed` says nothing answers there.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Sequence

from gpuyard.apis.addons import Ingress, covers
from gpuyard.apis.core import Service
from gpuyard.apis.jobkinds import MarsJob
from gpuyard.apis.meta import ObjectMeta, OwnerReference, Resource
from gpuyard.apis.scheduling import LABEL_GROUP_NAME, LABEL_JOB_NAME, LABEL_REPLICA_TYPE
from gpuyard.controllers.addonwriting import AddonWriter, warn_once
from gpuyard.controllers.materializing import group_name
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import identified

__all__ = ["MarsWebReconciler", "build_web_ingress", "web_address"]

WEB_REPLICA_TYPE = "webservice"
DEFAULT_PORT = 11111  # KubeDL's v1alpha1.DefaultPort for Mars
PORT_NAME = "mars-port"
NOT_SERVED = "WebUINotServed"  # the Warning Event on the fake cluster


def _web_key(obj: Resource) -> Iterable[ObjectKey]:
    labels = obj.metadata.labels
    if labels.get(LABEL_REPLICA_TYPE) == WEB_REPLICA_TYPE and (job := labels.get(LABEL_JOB_NAME)):
        return ((obj.metadata.namespace, job),)
    return ()


def _port(svc: Service) -> int:
    ports = svc.spec.ports
    if not ports:
        return DEFAULT_PORT
    return next((p.port for p in ports if p.name == PORT_NAME), ports[0].port)


def web_address(host: str, *, namespace: str, service: str) -> str:
    """Where a person opens the Mars web UI of one web-service Service."""
    return f"http://{host}{posixpath.join('/', 'mars', namespace, service)}/"


def build_web_ingress(job: MarsJob, svc: Service, host: str) -> Ingress:
    """The Ingress of one web-service Service (KubeDL `createNewIngressForWebservice`)."""
    name, ns = svc.metadata.name, svc.metadata.namespace
    backend = {"service": {"name": name, "port": {"number": _port(svc)}}}
    base = posixpath.join("/", "mars", ns, name)
    return Ingress(
        metadata=ObjectMeta(
            name=name,
            namespace=ns,
            labels={
                LABEL_GROUP_NAME: group_name(job),
                LABEL_JOB_NAME: job.metadata.name,
                LABEL_REPLICA_TYPE: WEB_REPLICA_TYPE,
            },
            annotations={
                "nginx.ingress.kubernetes.io/rewrite-target": "/$1",
                "nginx.org/websocket-services": f'"{name}"',
            },
            owner_references=[
                OwnerReference(
                    api_version="v1", kind="Service", name=name, uid=svc.metadata.uid, controller=True
                )
            ],
        ),
        spec={
            "rules": [
                {
                    "host": host,
                    "http": {
                        "paths": [
                            {
                                "path": base + "/(.*)",
                                "pathType": "ImplementationSpecific",
                                "backend": backend,
                            },
                            {"path": base, "pathType": "ImplementationSpecific", "backend": backend},
                        ]
                    },
                }
            ]
        },
    )


def _service_uid(obj: Resource) -> str | None:
    return next((r.uid for r in obj.metadata.owner_references if r.kind == "Service"), None)


def _owned_by(uid: str) -> Callable[[Resource], bool]:
    return lambda obj: _service_uid(obj) == uid


def _same(current: Resource, desired: Resource) -> bool:
    return (
        covers(current.metadata.labels, desired.metadata.labels)
        and covers(current.metadata.annotations, desired.metadata.annotations)
        and covers(getattr(current, "spec", None), getattr(desired, "spec", None))
    )


class MarsWebReconciler:
    """See the module docstring."""

    name = "mars-web"
    needs_leader = True  # creates and deletes Ingresses
    concurrency = 2

    def __init__(self, ctx: Context) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the Mars web reconciler needs a writer (ctx.writer)")
        self.store = ctx.store
        self.out = AddonWriter(store=ctx.store, writer=identified(ctx.writer, OPERATOR))
        self.backend = ctx.backend
        self.events = EventRecorder(
            component=OPERATOR, store=ctx.store, writer=ctx.writer, now=ctx.clock.utcnow
        )
        self.watches: Sequence[Watch] = (
            Watch(MarsJob.KIND),
            Watch("Service", _web_key),
            Watch("Ingress", _web_key),
        )

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        namespace, job_name = key
        selector = {LABEL_JOB_NAME: job_name, LABEL_REPLICA_TYPE: WEB_REPLICA_TYPE}
        job = self.store.get_of(MarsJob, namespace, job_name)
        host = job.spec.web_host if job is not None else None
        services = {
            s.metadata.name: s
            for s in self.store.list_of(Service, namespace=namespace, selector=selector)
            if s.metadata.uid
        }
        if job is not None and host:
            for svc in services.values():
                retry = await self.out.ensure(
                    build_web_ingress(job, svc, host), same=_same, owned=_owned_by(svc.metadata.uid)
                )
                if retry is not None:
                    return retry
            if services and self.backend is not None and self.backend.name == "fake":
                await warn_once(
                    self.events,
                    self.store,
                    job,
                    reason=NOT_SERVED,
                    message=f"the fake cluster stores the web UI's Ingress on {host} but has no ingress "
                    "controller: nothing answers there",
                )
        for ing in self.store.list_of(Ingress, namespace=namespace, selector=selector):
            behind = services.get(ing.metadata.name)
            if job is None or not host or behind is None or _service_uid(ing) != behind.metadata.uid:
                await self.out.remove(
                    "Ingress", namespace, ing.metadata.name, owned=lambda o: _service_uid(o) is not None
                )
        return None
