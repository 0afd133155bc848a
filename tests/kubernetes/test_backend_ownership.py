"""One writer per object and field on Kubernetes, on the development API server and on a real
control plane: gpuyard runs a job's life (placed, bound, Running, its Events, deleted with its
children) with leader election, and every write it made names its component as `fieldManager`,
the one the ownership table (`gpuyard.state.ownership`) lets write that part of that kind. On a
real control plane the objects' `managedFields` say the same (the development server keeps
`managedFields` only for objects made by server-side apply).

The writes are read from the server's audit: the development server's `AuditRecord.manager`, the
real one's audit log (`requestURI`). A DELETE names no field manager, so deletes are left to
`test_rbac.py` (by gpuyard's token) and the fake backend's `tests/integration/test_ownership.py`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpuyard.apis.resources import API_RESOURCES
from gpuyard.kubecluster.dra import RESOURCE_CLAIMS
from gpuyard.kubecluster.writing import to_json
from gpuyard.state.ownership import BACKEND, IDENTITIES, OPERATOR, SCHEDULER, Part, allowed
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_events import leads, run_a_job
from tests.kubernetes.test_backend_platform import NODES, TFJOBS, connect, eventually, platform, settings

__all__ = ["served"]

KINDS = {(r.group, r.plural): r.kind for r in (*API_RESOURCES, RESOURCE_CLAIMS)}
Write = tuple[str, str, Part, str, str]  # (manager, kind, part, namespace/name, what)


def _part(verb: str, sub: str) -> Part | None:
    if verb == "create" and sub in ("", "binding"):
        return "create"
    if verb in ("update", "patch"):
        return "status" if sub == "status" else "update" if not sub else None
    return None


Call = tuple[str, str, str, str, str, str, str, int]  # manager group plural sub verb ns name code


def calls_of(server: Any) -> list[Call]:
    """Every request the server audited, as (manager, group, plural, subresource, verb, namespace,
    name, response code)."""
    calls: list[Call] = []
    if isinstance(server, FakeApiServerView):
        for r in server.server.audit or []:
            calls.append((r.manager, r.group, r.resource, r.subresource, r.verb, r.namespace, r.name, r.code))
    else:
        for e in server.audit():
            ref = e["objectRef"]
            query = parse_qs(urlsplit(e.get("requestURI", "")).query)
            calls.append(
                (
                    (query.get("fieldManager") or [""])[0],
                    ref.get("apiGroup", ""),
                    ref.get("resource", ""),
                    ref.get("subresource", ""),
                    e["verb"],
                    ref.get("namespace", ""),
                    ref.get("name", ""),
                    e.get("responseStatus", {}).get("code", 0),
                )
            )
    return calls


def writes(server: Any) -> list[Write]:
    """The successful creates, updates and patches that named a gpuyard field manager."""
    out: list[Write] = []
    for manager, group, plural, sub, verb, ns, name, code in calls_of(server):
        part = _part(verb, sub)
        if manager in IDENTITIES and part is not None and 200 <= code < 300:
            what = f"{verb} {group}/{plural}{'/' + sub if sub else ''}"
            out.append((manager, KINDS[(group, plural)], part, f"{ns}/{name}", what))
    return out


def managed_fields(server: Any, plurals: list[str]) -> list[Write]:
    """Every `managedFields` entry of a gpuyard manager on the objects of `plurals`."""
    out: list[Write] = []
    for plural in plurals:
        for obj in server.list(plural):
            api_version = obj.get("apiVersion", "v1")
            kind = KINDS[(api_version.split("/")[0] if "/" in api_version else "", plural)]
            meta = obj["metadata"]
            for entry in meta.get("managedFields") or []:
                if entry.get("manager") in IDENTITIES:
                    sub = entry.get("subresource", "")
                    part: Part = "status" if sub == "status" else "create" if sub == "binding" else "update"
                    where = f"{meta.get('namespace', '')}/{meta['name']}"
                    out.append((entry["manager"], kind, part, where, f"managedFields {sub}"))
    return out


def disallowed(found: list[Write]) -> list[Write]:
    """What the table gives to another writer (`update` in managedFields stands for create too)."""
    return [
        w
        for w in found
        if not allowed(w[0], w[1], w[2], backend="kubernetes")
        and not (w[2] == "update" and allowed(w[0], w[1], "create", backend="kubernetes"))
    ]


async def test_every_write_names_the_component_the_table_gives_it_to(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(served.kubeconfig, identity="replica-a")) as p:
            await eventually(lambda: leads(p), what="replica-a leads")
            await run_a_job(client, served, p, "owned")
            plurals = ["tfjobs", "podgroups", "reservations", "pods", "services", "events", "leases"]
            fields = managed_fields(served, plurals)
            await client.delete(TFJOBS, "default", "owned")
            await eventually(
                lambda: not [e for e in served.list("events") if e["involvedObject"].get("name") == "owned"],
                what="owned's Events deleted",
            )
    finally:
        await client.close()
    found = writes(served)
    assert {OPERATOR, SCHEDULER, BACKEND} <= {w[0] for w in found}, sorted({w[0] for w in found})
    invalid = [c for c in calls_of(served) if c[0] in IDENTITIES and c[7] in (400, 415, 422)]
    assert not invalid, f"writes the API server refused as invalid: {invalid}"  # its validation passes
    wrong = disallowed(found)
    assert not wrong, "writes the ownership table gives to another writer:\n" + "\n".join(map(str, wrong))
    if served.real:  # the server's own record of who owns which field
        assert {OPERATOR, SCHEDULER} <= {w[0] for w in fields}, fields
        wrong = disallowed(fields)
        assert not wrong, "managedFields the table gives to another writer:\n" + "\n".join(map(str, wrong))
