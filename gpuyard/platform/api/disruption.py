"""PodDisruptionBudget endpoints: list and read (`policy/v1`, namespaced).

* `GET /api/v1/poddisruptionbudgets` (`?namespace=`): the budgets in the namespaces you may see;
* `GET /api/v1/namespaces/{ns}/poddisruptionbudgets/{name}`: one.

Budgets are created and changed with `gpuyard apply` / `POST /api/v1/apply` (`applying`), like
the other policy objects; the preemption engine reads them when it chooses victims.
"""

from __future__ import annotations

from aiohttp import web

from gpuyard.apis.disruption import PodDisruptionBudget
from gpuyard.platform.api.app import stored
from gpuyard.platform.api.auth import authorize
from gpuyard.platform.api.manifests import PAGING, list_schema, visible_list_response
from gpuyard.platform.api.openapi import Param, operation

__all__ = ["setup"]


@operation(
    "List pod disruption budgets in the namespaces you may see",
    tags=["quotas"],
    params=[Param("namespace", description="Only this namespace."), *PAGING],
    response=list_schema("PodDisruptionBudget"),
    errors=[401, 403, 422],
)
async def list_budgets(request: web.Request) -> web.Response:
    return visible_list_response(request, "PodDisruptionBudget")


@operation(
    "Get one pod disruption budget", tags=["quotas"], response=PodDisruptionBudget, errors=[401, 403, 404]
)
async def get_budget(request: web.Request) -> web.Response:
    ns, name = request.match_info["ns"], request.match_info["name"]
    authorize(request, "read", ns)
    what = f"pod disruption budget {ns}/{name}"
    return web.json_response(stored(request, "PodDisruptionBudget", ns, name, what=what).to_dict())


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/poddisruptionbudgets", list_budgets)
    app.router.add_get("/api/v1/namespaces/{ns}/poddisruptionbudgets/{name}", get_budget)
