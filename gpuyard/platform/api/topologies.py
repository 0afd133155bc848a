"""NodeTopology writes: describe a node's devices by hand, or from `gpuyard agent` on the node.

* `PUT /api/v1/nodetopologies/{name}` — create or replace a node's NodeTopology (201/200; admin);
  a `metadata.resourceVersion` in the body makes the replace conditional (409 when stale);
* `DELETE /api/v1/nodetopologies/{name}` — remove it (admin); the scheduler then falls back to the
  node's preset label or a flat topology from its GPU count;
* :func:`parse_node_topology` — the validation shared with `POST /api/v1/apply`.

Validation is the model's (GPU indices in order and unique, NVLink peers that exist and agree,
declared PCIe switches and NUMA nodes, partitions, link matrices) plus what a hand-written file
gets wrong most: NIC NUMA nodes that are not declared, duplicate NUMA ids, sockets beyond
`spec.sockets`. Problems are 422s whose `details` name the field (`spec.gpus[3].nvlinkPeers`).
Writes go through the writer; the scheduler sees the changed topology as a dirty node in its next
cycle, and the fake cluster fails pods on GPUs the new topology marks Unhealthy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from gpuyard.apis.devices import GPUDevice, NICDevice, NodeTopology
from gpuyard.platform.api.app import CTX, delete_object, stored
from gpuyard.platform.api.auth import authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.manifests import put_response, read_one_document
from gpuyard.platform.api.openapi import operation

__all__ = ["parse_node_topology", "setup", "topology_problems"]

KIND = NodeTopology.KIND
# The field a model-level message starts with: `gpus[3].nvlinkPeers[5] = ...`, `pcieSwitches[sw0].parent`.
_LEADING_FIELD = re.compile(r"^([a-z][A-Za-z]*(?:\[[^\]\s]+\])?(?:\.[a-z][A-Za-z]*(?:\[[^\]\s]+\])?)*)")


def _problem(name: str, field: str, reason: str) -> dict[str, str]:
    return {"object": f"{KIND}/{name}", "field": field, "reason": reason}


def _from_validation(name: str, exc: ValidationError, prefix: str) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        reason = "unknown field" if err["type"] == "extra_forbidden" else str(err["msg"])
        reason = reason.removeprefix("Value error, ")
        field = ".".join(loc)
        if loc == ["spec"]:  # a consistency check of the whole spec: its message names the field
            match = _LEADING_FIELD.match(reason)
            if match:
                field = f"spec.{match.group(1)}"
        out.append(_problem(name, f"{prefix}{field}", reason))
    return out


def topology_problems(topology: NodeTopology, *, prefix: str = "") -> list[dict[str, str]]:
    """What the model accepts but a node cannot have (NUMA ids and sockets)."""
    name = topology.metadata.name
    spec = topology.spec
    out: list[dict[str, str]] = []
    ids = [n.id for n in spec.numa_nodes]
    for pos, node in enumerate(spec.numa_nodes):
        if ids.count(node.id) > 1:
            out.append(
                _problem(name, f"{prefix}spec.numaNodes[{pos}].id", f"NUMA node {node.id} is declared twice")
            )
        if node.socket >= spec.sockets:
            out.append(
                _problem(
                    name,
                    f"{prefix}spec.numaNodes[{pos}].socket",
                    f"socket {node.socket} but spec.sockets is {spec.sockets}; allowed: 0..{spec.sockets - 1}",
                )
            )
    placed: tuple[tuple[str, Sequence[GPUDevice | NICDevice]], ...] = (
        ("gpus", spec.gpus),
        ("nics", spec.nics),
    )
    for kind, devices in placed:
        for pos, dev in enumerate(devices):
            if ids and dev.numa_node != -1 and dev.numa_node not in ids:
                out.append(
                    _problem(
                        name,
                        f"{prefix}spec.{kind}[{pos}].numaNode",
                        f"NUMA node {dev.numa_node} is not declared; allowed: {sorted(set(ids))} or -1 (unknown)",
                    )
                )
            if dev.socket >= spec.sockets:
                out.append(
                    _problem(
                        name,
                        f"{prefix}spec.{kind}[{pos}].socket",
                        f"socket {dev.socket} but spec.sockets is {spec.sockets}; allowed: 0..{spec.sockets - 1} or -1",
                    )
                )
    uuids = [g.uuid for g in spec.gpus if g.uuid]
    for pos, gpu in enumerate(spec.gpus):
        if gpu.uuid and uuids.count(gpu.uuid) > 1:
            out.append(
                _problem(name, f"{prefix}spec.gpus[{pos}].uuid", f"UUID {gpu.uuid} is used by another GPU")
            )
    return out


def parse_node_topology(
    doc: dict[str, Any], *, name: str | None = None, prefix: str = ""
) -> tuple[NodeTopology | None, list[dict[str, str]]]:
    """The NodeTopology a document describes, or the problems (fields prefixed with `prefix`).

    `name` (from a URL) must agree with `metadata.name` when both are given.
    """
    data = {k: v for k, v in doc.items() if k != "status"}
    found = data.get("kind", KIND)
    meta = data.get("metadata") or {}
    doc_name = str(meta.get("name") or "") if isinstance(meta, dict) else ""
    label = name or doc_name or "<unnamed>"
    if found != KIND:
        return None, [_problem(label, f"{prefix}kind", f"must be {KIND}, got {found!r}")]
    if not isinstance(meta, dict):
        return None, [_problem(label, f"{prefix}metadata", "must be a mapping")]
    if name is not None and doc_name not in ("", name):
        return None, [
            _problem(label, f"{prefix}metadata.name", f"is {doc_name!r} but the URL names {name!r}")
        ]
    if not (name or doc_name):
        return None, [_problem(label, f"{prefix}metadata.name", "required: the node's name")]
    data["kind"] = KIND
    data.setdefault("apiVersion", NodeTopology.API_VERSION)
    data["metadata"] = {**meta, "name": name or doc_name}
    data["metadata"].pop("namespace", None)  # cluster-scoped
    try:
        topology = NodeTopology.model_validate(data)
    except ValidationError as exc:
        return None, _from_validation(label, exc, prefix)
    problems = topology_problems(topology, prefix=prefix)
    return (None, problems) if problems else (topology, [])


@operation(
    "Create or replace a node's device topology (201/200; admin); 422 names the field",
    tags=["cluster"],
    body=NodeTopology,
    body_content_types=("application/yaml", "application/json"),
    response=NodeTopology,
    errors=[400, 401, 403, 409, 422],
)
async def put_node_topology(request: web.Request) -> web.Response:
    authorize(request, "admin")
    name = request.match_info["name"]
    ctx = request.app[CTX]
    doc = await read_one_document(request, KIND)
    topology, problems = parse_node_topology(doc, name=name)
    if topology is None:
        raise ApiError(422, f"invalid {KIND} {name}: nothing was stored", details=problems)
    return await put_response(ctx, topology)


@operation("Delete a node's device topology (admin)", tags=["cluster"], errors=[401, 403, 404])
async def delete_node_topology(request: web.Request) -> web.Response:
    authorize(request, "admin")
    name = request.match_info["name"]
    what = f"node topology {name}"
    stored(request, KIND, "", name, what=what)
    await delete_object(request.app[CTX], KIND, "", name, what=what)
    return web.json_response({"deleted": {"kind": KIND, "name": name}})


def setup(app: web.Application) -> None:
    app.router.add_put("/api/v1/nodetopologies/{name}", put_node_topology)
    app.router.add_delete("/api/v1/nodetopologies/{name}", delete_node_topology)
