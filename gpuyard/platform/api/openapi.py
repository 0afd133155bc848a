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

__all__ = ["Param", "SchemaSource", "build_document", "openapi30", "operation", "register_model", "setup"]

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


SchemaSource = type[BaseModel] | dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
"""A model, a literal schema, or a function of the components that returns one (and may register more)."""


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    where: str = "query"  # query | path | header
    description: str = ""
    type: str = "string"
    required: bool = False
    minimum: int | None = None
    maximum: int | None = None
    default: int | str | None = None
    enum: tuple[str, ...] | None = None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.enum is not None:
            out["enum"] = list(self.enum)
        for key in ("minimum", "maximum", "default"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(slots=True)
class Operation:
    summary: str
    tags: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    body: SchemaSource | None = None
    body_content_types: tuple[str, ...] = ("application/json",)
    response: type[BaseModel] | dict[str, Any] | None = None
    response_content_type: str = "application/json"
    errors: tuple[int, ...] = ()
    created: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def operation(
    summary: str,
    *,
    tags: Sequence[str] = (),
    params: Sequence[Param] = (),
    body: SchemaSource | None = None,
    body_content_types: Sequence[str] = ("application/json",),
    response: type[BaseModel] | dict[str, Any] | None = None,
    response_content_type: str = "application/json",
    errors: Sequence[int] = (),
    created: bool = False,
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
            created=created,
        )
        return handler

    return attach


_VAR = re.compile(r"\{(\w+)(?::[^}]*)?\}")


def _path_of(resource: web.AbstractResource) -> str:
    """`/api/v1/nodes/{name}` from a resource, dropping regex constraints."""
    return _VAR.sub(lambda m: "{" + m.group(1) + "}", resource.canonical)


def openapi30(schema: Any) -> Any:
    """A JSON Schema (draft 2020-12, as pydantic writes it) in OpenAPI 3.0's dialect.

    3.0 reads `exclusiveMinimum`/`exclusiveMaximum` as booleans next to `minimum`/`maximum`,
    has no `null` type (`nullable: true` instead) and no `const`; a generator or validator that
    reads the document as 3.0 cannot use the 2020-12 spellings.
    """
    if isinstance(schema, list):
        return [openapi30(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: openapi30(v) for k, v in schema.items()}
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = out.get(bound)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[flag], out[bound] = value, True
    if "const" in out:
        out["enum"] = [out.pop("const")]
    for combinator in ("anyOf", "oneOf"):
        options = out.get(combinator)
        if isinstance(options, list) and {"nullable": True} in options:  # was {"type": "null"}
            rest = [o for o in options if o != {"nullable": True}]
            del out[combinator]
            if len(rest) == 1 and isinstance(rest[0], dict) and "$ref" not in rest[0]:
                out.update(rest[0])
            else:
                out[combinator] = rest
            out["nullable"] = True
    if out.get("type") == "null":
        out.pop("type")
        out["nullable"] = True
    return out


def _schema(model: SchemaSource, components: dict[str, Any]) -> dict[str, Any]:
    if isinstance(model, dict):
        return model
    if isinstance(model, type):
        return register_model(model, components)
    return model(components)


def register_model(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    """Put `model`'s schema (and its sub-models') in `components`; its `$ref`."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, openapi30(sub))
    components.setdefault(model.__name__, openapi30(schema))
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _parameters(path: str, op: Operation) -> list[dict[str, Any]]:
    """Path parameters from the route, then the operation's own (which win over a same-named one)."""
    declared = {(p.name, p.where) for p in op.params}
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _VAR.findall(path)
        if (name, "path") not in declared
    ]
    params += [
        {
            "name": p.name,
            "in": p.where,
            "required": p.required or p.where == "path",
            "description": p.description,
            "schema": p.schema(),
        }
        for p in op.params
    ]
    return params


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
        params = _parameters(path, op)
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
        if route.method == "PUT":  # create or replace: 201 when it created the object
            responses["201"] = {**ok, "description": "Created"}
        if op.created:
            responses = {"201": {**ok, "description": "Created"}}
        errors = {*op.errors, 401, 403, 429}
        if any(p.name == "continue" for p in op.params):
            errors.add(400)  # a continue token that is not one this server gave out
        if any(p.name == "limit" for p in op.params):
            errors.add(422)  # a limit out of range
        for code in sorted(errors):
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
