"""The OpenAPI 3 document of the HTTP API, built from the routes themselves.

Each handler carries its documentation (`@operation(...)`); `build_document(app)` walks the
router, so the document lists exactly the routes that exist. A test checks that every
`/api/v1` route is documented and every documented path is routed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel

__all__ = ["Param", "build_document", "operation", "setup"]

H = TypeVar("H", bound=Callable[..., Any])

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "details"],
            "properties": {
                "code": {"type": "integer"},
                "message": {"type": "string"},
                "details": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"field": {"type": "string"}, "reason": {"type": "string"}},
                    },
                },
            },
        }
    },
}


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    where: str = "query"  # query | path | header
    description: str = ""
    type: str = "string"
    required: bool = False


@dataclass(slots=True)
class Operation:
    summary: str
    tags: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    body: type[BaseModel] | dict[str, Any] | None = None
    body_content_types: tuple[str, ...] = ("application/json",)
    response: type[BaseModel] | dict[str, Any] | None = None
    response_content_type: str = "application/json"
    errors: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def operation(
    summary: str,
    *,
    tags: Sequence[str] = (),
    params: Sequence[Param] = (),
    body: type[BaseModel] | dict[str, Any] | None = None,
    body_content_types: Sequence[str] = ("application/json",),
    response: type[BaseModel] | dict[str, Any] | None = None,
    response_content_type: str = "application/json",
    errors: Sequence[int] = (),
) -> Callable[[H], H]:
    """Attach OpenAPI documentation to a handler (as its `__openapi__` attribute)."""

    def attach(handler: H) -> H:
        vars(handler)["__openapi__"] = Operation(
            summary=summary,
            tags=tuple(tags),
            params=tuple(params),
            body=body,
            body_content_types=tuple(body_content_types),
            response=response,
            response_content_type=response_content_type,
            errors=tuple(errors),
        )
        return handler

    return attach


_VAR = re.compile(r"\{(\w+)(?::[^}]*)?\}")


def _path_of(resource: web.AbstractResource) -> str:
    """`/api/v1/nodes/{name}` from a resource, dropping regex constraints."""
    return _VAR.sub(lambda m: "{" + m.group(1) + "}", resource.canonical)


def _schema(model: type[BaseModel] | dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    if isinstance(model, dict):
        return model
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components.setdefault(model.__name__, schema)
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def build_document(app: web.Application, *, version: str = "0.1.0") -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    components: dict[str, Any] = {"Error": ERROR_SCHEMA}
    for route in app.router.routes():
        if route.method == "HEAD" or route.resource is None:
            continue
        path = _path_of(route.resource)
        if not path.startswith("/api/"):
            continue
        op = getattr(route.handler, "__openapi__", None)
        if not isinstance(op, Operation):
            continue
        entry: dict[str, Any] = {
            "summary": op.summary,
            "operationId": route.handler.__name__,
            "tags": list(op.tags),
        }
        params = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _VAR.findall(path)
        ]
        params += [
            {
                "name": p.name,
                "in": p.where,
                "required": p.required,
                "description": p.description,
                "schema": {"type": p.type},
            }
            for p in op.params
        ]
        if params:
            entry["parameters"] = params
        if op.body is not None:
            schema = _schema(op.body, components)
            entry["requestBody"] = {
                "required": True,
                "content": {ct: {"schema": schema} for ct in op.body_content_types},
            }
        ok: dict[str, Any] = {"description": "OK"}
        if op.response is not None:
            ok["content"] = {op.response_content_type: {"schema": _schema(op.response, components)}}
        responses: dict[str, Any] = {"200": ok}
        for code in sorted({*op.errors, 401, 403}):
            responses[str(code)] = {
                "description": "error",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            }
        entry["responses"] = responses
        paths.setdefault(path, {})[route.method.lower()] = entry
    return {
        "openapi": "3.0.3",
        "info": {"title": "gpuyard API", "version": version},
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


async def serve_document(request: web.Request) -> web.Response:
    return web.json_response(build_document(request.app))


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/openapi.json", serve_document)
