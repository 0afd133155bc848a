"""Client commands for quotas and queues: `apply -f FILE...`, `get quotas`, `get queues`.

* `gpuyard apply -f configs/quotas/demo-teams.yaml [-f more.yaml | -f -]` sends every document of
  every file (ElasticQuota, ResourceQuota, Queue, ResourceClass) in one `POST /api/v1/apply`: the
  server validates all of them (the quotas as one tree) and stores all or nothing. A rejected
  document is named by its file and index (`teams.yaml: documents[2]: spec.min...: ...`).
* `gpuyard get quotas` prints the ElasticQuota tree, children indented under their parent, one
  row per resource the quota sets (min or max), uses or is asked for, with min / max / runtime (what the quota
  may use now) / used; `-o wide` shows every resource of the spec and status and adds the
  request (pending + running demand), namespace and covered namespaces. A limit the quota does not
  set is `-`, as kubectl shows an unset field: no `min` is no guarantee, no `max` no ceiling.
* `gpuyard get queues` prints NAME, WEIGHT, STRATEGY, PENDING, RUNNING, SHARE, SOURCE (`defined`
  by a Queue object, or `implicit`: named by jobs, default settings, no share).

Every command takes `--server` / `--token` (see `gpuyard.cli.client`). Errors are one line on
stderr; exit code 2 for bad input (a 4xx answer, an unreadable file), 1 for server or network.
`register(root)` mounts them, merging into an existing `get` group.
"""

from __future__ import annotations

import json
import re
from typing import Any

import click

from gpuyard.apis.quantity import QuantityError, parse_quantity
from gpuyard.cli.client import ApiClient, ClientError
from gpuyard.cli.common import (
    call,
    client_options,
    fail,
    mount,
    print_warnings,
    read_yaml_files,
    validate_option,
)
from gpuyard.cli.lazy import LazyGroup
from gpuyard.cli.output import emit as _emit
from gpuyard.cli.output import table as _print_table

__all__ = ["apply", "get", "quota_rows", "register"]

PARENT_LABEL = "quota.scheduling.koordinator.sh/parent"
NAMESPACES_ANNOTATION = "quota.scheduling.koordinator.sh/namespaces"
ROOT_QUOTA = "koordinator-root-quota"
_DOC_RE = re.compile(r"documents\[(\d+)\]\.?")


def _list_all(client: ApiClient, path: str) -> list[dict[str, Any]]:
    """Every item of a paged list, following `metadata.continue`."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = call(client.request, "GET", path, query={"continue": token, "limit": "5000"}) or {}
        items += page.get("items", [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


def _table(headers: list[str], rows: list[list[Any]]) -> None:
    _print_table(headers, rows, keep_blank=True)  # blank cells are the quota tree's continuation rows


# --- apply --------------------------------------------------------------------------------------


def _read_documents(files: tuple[str, ...]) -> tuple[list[Any], list[tuple[str, int]]]:
    """All documents of all files, and for each its (file, index in that file)."""
    docs: list[Any] = []
    origin: list[tuple[str, int]] = []
    for name, _, found in read_yaml_files(files):
        if len(found) == 1 and isinstance(found[0], dict) and found[0].get("kind") == "List":
            found = list(found[0].get("items") or [])
        if len(found) == 1 and isinstance(found[0], list):  # a JSON array
            found = found[0]
        for i, doc in enumerate(found):
            docs.append(doc)
            origin.append((name, i))
    return docs, origin


@click.command("apply")
@click.option(
    "-f",
    "--filename",
    "files",
    multiple=True,
    required=True,
    metavar="FILE",
    help="YAML/JSON file of ElasticQuota, ResourceQuota, Queue, ResourceClass, PriorityClass (`-` for stdin); repeatable.",
)
@client_options
@validate_option
def apply(files: tuple[str, ...], output: str, server: str | None, token: str | None, validate: str) -> None:
    """Create or replace quotas, resource quotas, queues, resource and priority classes, PDBs, all or nothing."""
    docs, origin = _read_documents(files)
    if not docs:
        fail(f"no documents in {', '.join(files)}", 2)
    client = ApiClient(server, token=token)
    try:
        result = client.request(
            "POST",
            "/api/v1/apply",
            body=json.dumps(docs, default=str).encode(),
            content_type="application/json",
            query={"fieldValidation": validate.capitalize()},
        )
    except ClientError as exc:

        def where(m: re.Match[str]) -> str:
            i = int(m.group(1))
            if i >= len(origin):
                return m.group(0)
            f, j = origin[i]
            return f"{f}: documents[{j}]: "

        fail(_DOC_RE.sub(where, exc.message), exc.exit_code)
    print_warnings(client)
    applied = (result or {}).get("applied", [])
    if output in ("json", "yaml"):
        _emit(applied, output, lambda wide: None)
        return
    for a in applied:
        ns = f" -n {a['namespace']}" if a.get("namespace") and a["kind"] == "ResourceQuota" else ""
        click.echo(f"{a['kind'].lower()}/{a['name']}{ns} {a['action']}")


# --- get ----------------------------------------------------------------------------------------


@click.group(cls=LazyGroup)
def get() -> None:
    """List objects."""


def _ordered(quotas: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """The quotas depth-first (children under their parent, by name; an implicit one after the
    stored ones), with their depth."""
    by_name = {q["metadata"]["name"]: q for q in quotas}
    children: dict[str, list[str]] = {}
    for name, q in by_name.items():
        parent = ((q["metadata"].get("labels") or {}).get(PARENT_LABEL) or "").strip() or ROOT_QUOTA
        if parent not in by_name or parent == name:
            parent = ROOT_QUOTA
        children.setdefault(parent, []).append(name)
    out: list[tuple[int, dict[str, Any]]] = []
    seen: set[str] = set()

    def walk(name: str, depth: int) -> None:
        for child in sorted(children.get(name, []), key=lambda n: (_implicit(by_name[n]), n)):
            if child in seen:  # a cycle: the server refuses them, but do not loop on one
                continue
            seen.add(child)
            out.append((depth, by_name[child]))
            walk(child, depth + 1)

    walk(ROOT_QUOTA, 0)
    out += [(0, by_name[n]) for n in sorted(by_name) if n not in seen]
    return out


def _covered(q: dict[str, Any]) -> str:
    names = list(q.get("spec", {}).get("namespaces") or [])
    raw = (q["metadata"].get("annotations") or {}).get(NAMESPACES_ANNOTATION)
    if raw:
        try:
            names += [n for n in json.loads(raw) if isinstance(n, str) and n not in names]
        except (ValueError, TypeError):
            pass
    return ",".join(names)


def _is_zero(value: Any) -> bool:
    try:
        return parse_quantity(value) == 0
    except QuantityError:
        return False  # shown as the server wrote it


def quota_rows(quotas: list[dict[str, Any]], *, wide: bool = False) -> list[list[Any]]:
    """Table rows of `get quotas`: one per (quota, resource), the name on the first row only.

    The resources shown are those the quota sets (`min` or `max`), uses (non-zero `used`) or is
    asked for by its pending jobs (non-zero `request`, as the dashboard's quota tree);
    `wide` shows every resource of the spec and status. MIN and MAX show only what the quota
    sets: `None` (printed `-`) where its `min` does not name the resource (no guarantee) or its
    `max` does not (no ceiling: unlimited). An implicit quota (the default quota nobody stored)
    shows `-` for the runtime only the scheduler knows.
    """
    rows: list[list[Any]] = []
    for depth, q in _ordered(quotas):
        spec, status = q.get("spec", {}), q.get("status", {})
        mins, maxs = spec.get("min") or {}, spec.get("max") or {}
        runtime, used, request = (status.get(k) or {} for k in ("runtime", "used", "request"))
        no_runtime = "-" if _implicit(q) else "0"
        if wide:
            resources = sorted({*mins, *maxs, *runtime, *used, *request}) or [""]
        else:  # what the quota sets, uses or is asked for: the status lists every resource, mostly 0
            wanted = {r for table in (used, request) for r, v in table.items() if not _is_zero(v)}
            resources = sorted({*mins, *maxs, *wanted}) or [""]
        for i, res in enumerate(resources):
            first = i == 0
            row = [
                "  " * depth + q["metadata"]["name"] if first else "",
                res or None,
                mins.get(res) if res else None,  # not set: no guarantee
                maxs.get(res) if res else None,  # not set: no ceiling
                runtime.get(res, no_runtime) if res else None,
                used.get(res, "0") if res else None,
            ]
            if wide:
                row += [
                    request.get(res, "0") if res else None,
                    q["metadata"].get("namespace") if first else "",
                    (_covered(q) or None) if first else "",
                ]
            rows.append(row)
    return rows


@get.command("quotas")
@client_options
def get_quotas(output: str, server: str | None, token: str | None) -> None:
    """Show the elastic quota tree: min / max / runtime / used of each resource.

    MIN or MAX is `-` where the quota does not set it: no min is no guarantee (0), no max no
    ceiling (unlimited, within what its parent and the cluster have)."""
    quotas = _list_all(ApiClient(server, token=token), "/api/v1/quotas")

    def table(wide: bool) -> None:
        headers = ["NAME", "RESOURCE", "MIN", "MAX", "RUNTIME", "USED"]
        if wide:
            headers += ["REQUEST", "NAMESPACE", "COVERS"]
        _table(headers, quota_rows(quotas, wide=wide))

    _emit(quotas, output, table)


@get.command("queues")
@client_options
def get_queues(output: str, server: str | None, token: str | None) -> None:
    """List queues: weight, queueing strategy, pending and running jobs, fair share, and whether a
    Queue object defines it or jobs name it implicitly (default settings)."""
    queues = _list_all(ApiClient(server, token=token), "/api/v1/queues")

    def table(wide: bool) -> None:
        rows = []
        for q in queues:
            spec, status = q.get("spec", {}), q.get("status", {})
            row = [
                q["metadata"]["name"],
                f"{float(spec.get('weight', 1)):g}",
                spec.get("queueingStrategy", "BestEffortFIFO"),
                status.get("pending", 0),
                status.get("running", 0),
                "-" if _implicit(q) else f"{float(status.get('share', 0.0)):.2f}",
                "implicit" if _implicit(q) else "defined",
            ]
            if wide:
                row += [spec.get("maxRunningJobs"), spec.get("description") or None]
            rows.append(row)
        headers = ["NAME", "WEIGHT", "STRATEGY", "PENDING", "RUNNING", "SHARE", "SOURCE"]
        _table(headers + (["MAX-RUNNING", "DESCRIPTION"] if wide else []), rows)

    _emit(queues, output, table)


def _implicit(queue: dict[str, Any]) -> bool:
    return (queue.get("metadata", {}).get("annotations") or {}).get("gpuyard.io/implicit") == "true"


@click.group(cls=LazyGroup)
def describe() -> None:
    """Show one object in detail."""


@describe.command("queue")
@click.argument("name")
@client_options
def describe_queue(name: str, output: str, server: str | None, token: str | None) -> None:
    """Show a queue: settings, status, and its waiting jobs in order with why each waits."""
    client = ApiClient(server, token=token)
    queue = call(client.request, "GET", f"/api/v1/queues/{name}")
    jobs = [
        j
        for j in call(client.request, "GET", "/api/v1/jobs", query={"queue": name}).get("items", [])
        if j.get("summary", {}).get("phase") in ("Queuing", "Created", "Restarting")
    ]

    def table(wide: bool) -> None:
        spec, status = queue.get("spec", {}), queue.get("status", {})
        click.echo(f"Name:        {name}")
        if _implicit(queue):
            click.echo("Source:      implicit (named by jobs, no Queue object: default settings)")
        else:
            click.echo("Source:      defined (Queue object)")
        click.echo(f"Weight:      {float(spec.get('weight', 1)):g}")
        click.echo(f"Strategy:    {spec.get('queueingStrategy', 'BestEffortFIFO')}")
        click.echo(f"Max running: {spec.get('maxRunningJobs') or '-'}")
        click.echo(f"Pending:     {status.get('pending', 0)}")
        click.echo(f"Running:     {status.get('running', 0)}")
        share = status.get("share")
        click.echo(f"Share:       {'-' if share is None else f'{float(share):.2f}'}")
        click.echo("\nWaiting jobs:")
        if not jobs:
            click.echo("  none")
            return
        rows = []
        for j in jobs:
            why = ""
            for c in j.get("status", {}).get("conditions", []):
                if c.get("type") == "Queuing" and c.get("status") == "True":
                    why = c.get("message", "")
            rows.append(
                [
                    f"{j['metadata']['namespace']}/{j['metadata']['name']}",
                    j["kind"],
                    why if wide else why[:100],
                ]
            )
        _table(["JOB", "KIND", "WHY PENDING"], rows)

    _emit({"queue": queue, "waiting": jobs}, output, table)


# --- mounting -----------------------------------------------------------------------------------


def register(root: click.Group) -> None:
    """Add `apply`, `get quotas|queues` and `describe queue` to the root group, merging into
    existing `get` / `describe` groups."""
    mount(root, commands=[apply], groups=[get, describe])
