"""PriorityClass endpoints: `GET /api/v1/priorityclasses` and `GET /api/v1/priorityclasses/{name}`.

The built-in `system-cluster-critical` and `system-node-critical` classes are listed with the
stored ones (they always exist and cannot be changed). Classes are created and changed through
`POST /api/v1/apply` (`gpuyard apply`); the operator resolves job priorities through them
(`apis/priorityclasses.py`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gpuyard.apis.priorityclasses import BUILTIN, PriorityClass
from gpuyard.platform.api.app import CTX
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import operation
from gpuyard.state.store import Store

__all__ = ["all_classes", "setup"]

CLASS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "metadata": {"type": "object"},
        "value": {"type": "integer"},
        "globalDefault": {"type": "boolean"},
        "preemptionPolicy": {"type": "string", "enum": ["PreemptLowerPriority", "Never"]},
        "description": {"type": "string"},
    },
}
LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": CLASS_SCHEMA}},
}


def all_classes(store: Store) -> dict[str, PriorityClass]:
    """Every PriorityClass: the built-in ones and the stored ones, by name."""
    out = dict(BUILTIN)
    if "PriorityClass" in store.kinds():
        out.update({c.metadata.name: c for c in store.list_of(PriorityClass)})
    return out


def _view(obj: PriorityClass) -> dict[str, Any]:
    out = obj.to_dict()
    out.setdefault("apiVersion", PriorityClass.API_VERSION)
    out.setdefault("kind", "PriorityClass")
    out["builtin"] = obj.metadata.name in BUILTIN
    return out


@operation(
    "List PriorityClasses (built-in and applied), highest value first",
    tags=["scheduling"],
    response=LIST_SCHEMA,
)
async def list_classes(request: web.Request) -> web.Response:
    classes = sorted(all_classes(request.app[CTX].store).values(), key=lambda c: (-c.value, c.metadata.name))
    return web.json_response({"items": [_view(c) for c in classes]})


@operation("Get one PriorityClass", tags=["scheduling"], response=CLASS_SCHEMA, errors=[404])
async def get_class(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    found = all_classes(request.app[CTX].store).get(name)
    if found is None:
        raise ApiError(
            404, f"PriorityClass {name} not found", details=[{"field": "name", "reason": "no such class"}]
        )
    return web.json_response(_view(found))


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/priorityclasses", list_classes)
    app.router.add_get("/api/v1/priorityclasses/{name}", get_class)
