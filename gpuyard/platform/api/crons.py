"""Cron endpoints: list and read KubeDL's Crons (`apps.kubedl.io/v1alpha1`, namespaced).

* `GET /api/v1/crons` (`?namespace=`): the Crons in the namespaces you may see;
* `GET /api/v1/namespaces/{ns}/crons/{name}`: one, with its status (active runs, history, last
  schedule time);
* `GET /api/v1/namespaces/{ns}/crons/{name}/events`: the Events about it that this replica holds
  (on the fake cluster all of them; on Kubernetes `kubectl describe cron` shows them).

Crons are created and changed with `gpuyard apply` / `POST /api/v1/apply` (`applying`); the cron
controller (`controllers/cronrunning.py`) creates their jobs.
"""

from __future__ import annotations

from aiohttp import web

from gpuyard.apis.core import Event
from gpuyard.apis.crons import Cron
from gpuyard.platform.api.app import CTX, stored
from gpuyard.platform.api.auth import authorize
from gpuyard.platform.api.manifests import PAGING, list_schema, visible_list_response
from gpuyard.platform.api.openapi import Param, operation

__all__ = ["setup"]


@operation(
    "List Crons (KubeDL's apps.kubedl.io) in the namespaces you may see",
    tags=["jobs"],
    params=[Param("namespace", description="Only this namespace."), *PAGING],
    response=list_schema("Cron"),
    errors=[401, 403, 422],
)
async def list_crons(request: web.Request) -> web.Response:
    return visible_list_response(request, Cron.KIND)


@operation("Get one Cron", tags=["jobs"], response=Cron, errors=[401, 403, 404])
async def get_cron(request: web.Request) -> web.Response:
    ns, name = request.match_info["ns"], request.match_info["name"]
    authorize(request, "read", ns)
    return web.json_response(stored(request, Cron.KIND, ns, name, what=f"cron {ns}/{name}").to_dict())


@operation("Events about one Cron", tags=["jobs"], errors=[401, 403, 404])
async def cron_events(request: web.Request) -> web.Response:
    ns, name = request.match_info["ns"], request.match_info["name"]
    authorize(request, "read", ns)
    stored(request, Cron.KIND, ns, name, what=f"cron {ns}/{name}")
    events = [
        e.to_dict()
        for e in request.app[CTX].store.list_of(Event, namespace=ns)
        if e.involved_object.get("kind") == Cron.KIND and e.involved_object.get("name") == name
    ]
    events.sort(key=lambda e: str(e.get("lastTimestamp") or ""))
    return web.json_response({"items": events})


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/crons", list_crons)
    app.router.add_get("/api/v1/namespaces/{ns}/crons/{name}", get_cron)
    app.router.add_get("/api/v1/namespaces/{ns}/crons/{name}/events", cron_events)
