"""Client commands for jobs: `submit`, `get jobs`, `get pods --job`, `describe job`, `delete job`.

Each command talks to a running server (`--server`, `$GPUYARD_SERVER`, default
http://127.0.0.1:8080) and prints `-o table` (default), `json` or `yaml`. Exit codes: 0 success,
2 bad input (unreadable file, invalid job, 4xx from the server), 1 server or network errors;
errors are one line on stderr. `submit` sends every document of every file in one request and
names, for each problem the server reports, the file (and the document's index in that file when
it holds several): `error: invalid 3 documents: nothing was stored: a.yaml: spec.x: ...; b.yaml:
documents[1]: spec.y: ...`.

`register(root)` mounts the commands on the root `gpuyard` group, adding `jobs`/`pods`/`job`
subcommands to existing `get`/`describe`/`delete` groups when another module created them.
"""

from __future__ import annotations

import re
from typing import Any

import click

from gpuyard.cli.client import ApiClient, ClientError, join_error
from gpuyard.cli.common import (
    KUBELET_PICKS_GPUS,
    call,
    client_options,
    fail,
    mount,
    print_warnings,
    read_yaml_files,
    split_ref,
    validate_option,
)
from gpuyard.cli.lazy import LazyGroup
from gpuyard.cli.output import StreamRows, age, emit
from gpuyard.cli.output import table as print_table

__all__ = ["delete", "describe", "get", "register", "submit"]


def _replicas(summary: dict[str, Any]) -> str:
    return ",".join(f"{role}:{n}" for role, n in (summary.get("replicas") or {}).items())


# --- submit -------------------------------------------------------------------------------------

_DOC_FIELD = re.compile(r"documents\[(\d+)\]\.?(.*)", re.DOTALL)


def _locate(detail: tuple[str, str], origin: list[tuple[str, int, int]]) -> tuple[str, str]:
    """A detail of the server's answer with the file it is about (and the document's index in that
    file when it holds several) in front of its field: `bad.yaml: documents[1]: spec.x`."""
    field, reason = detail
    if len(origin) == 1:  # one document: the server's fields carry no document index
        return f"{origin[0][0]}: {field}", reason
    m = _DOC_FIELD.fullmatch(field)
    if m is None or int(m.group(1)) >= len(origin):
        return field, reason
    name, index, count = origin[int(m.group(1))]
    where = f"{name}: documents[{index}]" if count > 1 else name
    return (f"{where}: {m.group(2)}" if m.group(2) else where), reason


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@client_options
@validate_option
def submit(files: tuple[str, ...], output: str, server: str | None, token: str | None, validate: str) -> None:
    """Submit job files (KubeDL or Kubeflow YAML/JSON, multi-document); all or nothing."""
    from gpuyard.apis.jobs import JobValidationError, load_documents

    texts = []
    origin: list[tuple[str, int, int]] = []  # per document of the body: file, index in it, its count
    for f, text, _ in read_yaml_files(files):
        try:
            count = len(load_documents(text))  # as the server splits the body: lists and `List`s too
        except JobValidationError:
            fail(f"{f}: no job documents in the file")
        origin += [(f, i, count) for i in range(count)]
        texts.append(text)
    body = "\n---\n".join(texts)  # one request: every document of every file, all or nothing
    client = ApiClient(server, token=token)
    try:
        result = client.submit(body, validate=validate)
    except ClientError as exc:
        if not exc.details:
            fail(exc.message, exc.exit_code)
        fail(join_error(exc.summary, [_locate(d, origin) for d in exc.details]), exc.exit_code)
    print_warnings(client)
    items = result.get("items", [])

    def table(_wide: bool = False) -> None:
        for job in items:
            click.echo(
                f"{job['kind'].lower()}/{job['metadata']['name']} created in namespace {job['metadata']['namespace']}"
            )

    emit(items, output, table)


# --- get ----------------------------------------------------------------------------------------


@click.group(cls=LazyGroup)
def get() -> None:
    """List objects: jobs, or pods (of every job, or of one)."""


JOB_PHASES = ("Created", "Queuing", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
"""`gpuyard.apis.jobspecs.JobConditionType`'s values (a test holds them equal); spelled out here so
that listing jobs does not import the job models."""

JOB_HEADERS = ["NAMESPACE", "NAME", "KIND", "PHASE", "QUEUE", "REPLICAS", "RESTARTS", "AGE"]


def all_namespaces_option(fn: Any) -> Any:
    """kubectl's `-A` / `--all-namespaces` (gpuyard lists every namespace you may see by default;
    `-A` says so and wins over `-n`)."""
    return click.option(
        "-A", "--all-namespaces", "all_namespaces", is_flag=True, help="Every namespace (wins over -n)."
    )(fn)


def _replica_counts(job: dict[str, Any]) -> dict[str, Any]:
    """role -> replicas, from the list's summary or (a watched object) the spec's `*ReplicaSpecs`."""
    summary = job.get("summary") or {}
    if summary.get("replicas"):
        return dict(summary["replicas"])
    spec = job.get("spec") or {}
    for key, value in spec.items():
        if key.endswith("ReplicaSpecs") and isinstance(value, dict):
            return {role: (r or {}).get("replicas", 1) for role, r in value.items()}
    return {}


def job_row(job: dict[str, Any], *, queue: str | None = None) -> list[Any]:
    """One `get jobs` row, from a listed job (with `summary`) or a watched one (without)."""
    s = job.get("summary") or {}
    status = job.get("status") or {}
    meta = job.get("metadata") or {}
    return [
        meta.get("namespace"),
        meta.get("name"),
        job.get("kind"),
        s.get("phase") or status.get("phase") or "Created",
        s.get("queue") or queue,
        _replicas({"replicas": _replica_counts(job)}),
        s.get("restarts", status.get("restarts", 0)),
        age(meta.get("creationTimestamp")),
    ]


def _matches(job: dict[str, Any], names: tuple[str, ...], namespace: str | None) -> bool:
    if not names:
        return True
    meta = job.get("metadata") or {}
    for ref in names:
        ns, _, name = ref.rpartition("/")
        if name == meta.get("name") and (ns or namespace or meta.get("namespace")) == meta.get("namespace"):
            return True
    return False


@get.command("jobs")
@click.argument("names", nargs=-1, metavar="[NAME|NS/NAME]...")
@click.option("-n", "--namespace", default=None, help="Only this namespace (default: all you may see).")
@all_namespaces_option
@click.option(
    "--phase",
    default=None,
    type=click.Choice(JOB_PHASES, case_sensitive=False),
    help="Only jobs in this phase.",
)
@click.option("--queue", default=None, help="Only jobs of this queue.")
@click.option("-w", "--watch", "watch", is_flag=True, help="Print the jobs, then every change (kubectl -w).")
@click.option(
    "--max-events", type=click.IntRange(min=1), default=None, help="With -w: stop after this many changes."
)
@client_options
def get_jobs(
    names: tuple[str, ...],
    namespace: str | None,
    all_namespaces: bool,
    phase: str | None,
    queue: str | None,
    watch: bool,
    max_events: int | None,
    output: str,
    server: str | None,
    token: str | None,
) -> None:
    """List jobs of every kind (`get job`, `get jobs NAME`, `-o name|jsonpath=...`, `-w`)."""
    if all_namespaces:
        namespace = None
    client = ApiClient(server, token=token)
    result = call(client.jobs, namespace=namespace, phase=phase, queue=queue)
    items = [j for j in result.get("items", []) if _matches(j, names, namespace)]
    if names and not items and not watch:
        fail(
            f"no job named {', '.join(names)}{f' in namespace {namespace}' if namespace else ''} (gpuyard get jobs)"
        )
    rows = StreamRows(JOB_HEADERS, [0, 24, 10, 9, 8, 12, 8, 4], header=False)
    queues = {
        (j["metadata"]["namespace"], j["metadata"]["name"]): (j.get("summary") or {}).get("queue")
        for j in items
    }

    def table(_wide: bool = False) -> None:
        if not watch:
            print_table(JOB_HEADERS, [job_row(j) for j in items])
            return
        rows.echo(JOB_HEADERS)
        for job in items:
            rows.echo(job_row(job))

    emit(items, output, table)
    if not watch:
        return
    since = (result.get("metadata") or {}).get("resourceVersion") or result.get("resourceVersion")
    seen = 0
    try:
        for event, obj in call(
            client.stream, "/api/v1/watch/jobs", query={"namespace": namespace, "resourceVersion": since}
        ):
            if not _matches(obj, names, namespace):
                continue
            status = (obj.get("status") or {}).get("phase") or "Created"
            if phase and status.lower() != phase.lower():
                continue
            meta = obj.get("metadata") or {}
            key = (meta.get("namespace"), meta.get("name"))
            if output in ("table", "wide"):
                rows.echo(job_row(obj, queue=queues.get(key)))
            else:
                emit(
                    {"type": event, "object": obj} if output in ("json", "yaml") else obj,
                    output,
                    lambda _w: None,
                    kind=obj.get("kind"),
                )
            seen += 1
            if max_events is not None and seen >= max_events:
                return
    except ClientError as exc:
        fail(exc.message, exc.exit_code)
    except KeyboardInterrupt:  # pragma: no cover - interactive
        return


POD_HEADERS = ["NAME", "PHASE", "NODE", "HOST-PORT", "GPUS", "EXIT", "AGE"]


def pod_row(pod: dict[str, Any], *, across: bool) -> list[Any]:
    """One `get pods` row; `across` (pods of several jobs) adds NAMESPACE first and JOB after NAME."""
    s = pod.get("summary") or {}
    meta = pod.get("metadata") or {}
    row = [
        meta.get("name"),
        s.get("phase"),
        s.get("node"),
        s.get("hostPort"),
        ",".join(str(g) for g in s.get("gpus") or []),
        s.get("exitCode"),
        age(meta.get("creationTimestamp")),
    ]
    if across:
        row = [meta.get("namespace"), row[0], s.get("job"), *row[1:]]
    return row


@get.command("pods")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option("--job", "job_ref", default=None, metavar="NS/NAME", help="Only the pods of this job.")
@click.option(
    "-n", "--namespace", default=None, help="Only this namespace (and the namespace of --job NAME)."
)
@all_namespaces_option
@client_options
def get_pods(
    names: tuple[str, ...],
    job_ref: str | None,
    namespace: str | None,
    all_namespaces: bool,
    output: str,
    server: str | None,
    token: str | None,
) -> None:
    """List pods with node, host port and GPUs: of every job you may see, or of one (`--job`)."""
    client = ApiClient(server, token=token)
    if job_ref is not None:
        ns, name = split_ref(job_ref, None if all_namespaces else namespace, option="--job")
        items = call(client.job_pods, ns, name).get("items", [])
    else:
        items = call(client.pods, namespace=None if all_namespaces else namespace).get("items", [])
    if names:
        items = [p for p in items if (p.get("metadata") or {}).get("name") in names]
        if not items:
            fail(f"no pod named {', '.join(names)} (gpuyard get pods lists them)")
    across = job_ref is None

    def table(_wide: bool = False) -> None:
        headers = ["NAMESPACE", "NAME", "JOB", *POD_HEADERS[1:]] if across else POD_HEADERS
        print_table(headers, [pod_row(p, across=across) for p in items])

    emit(items, output, table, kind="Pod")


# --- describe -----------------------------------------------------------------------------------


@click.group(cls=LazyGroup)
def describe() -> None:
    """Show one object in detail."""


@describe.command("job")
@click.argument("ref", metavar="NS/NAME")
@click.option("-n", "--namespace", default=None, help="Namespace when REF is only a name.")
@client_options
def describe_job(ref: str, namespace: str | None, output: str, server: str | None, token: str | None) -> None:
    """Show a job: spec summary, conditions, replica statuses, who preempted or moved it, pods and events."""
    ns, name = split_ref(ref, namespace)
    client = ApiClient(server, token=token)
    job = call(client.job, ns, name)
    pods_body = call(client.job_pods, ns, name)
    pods = pods_body.get("items", [])
    picked_by = pods_body.get("gpusPickedBy") or "scheduler"
    events = call(client.job_events, ns, name).get("items", [])

    def table(_wide: bool = False) -> None:
        s = job.get("summary", {})
        status = job.get("status", {})
        click.echo(f"Name:        {name}")
        click.echo(f"Namespace:   {ns}")
        click.echo(f"Kind:        {job['kind']} ({job['apiVersion']})")
        click.echo(f"Phase:       {s.get('phase')}")
        click.echo(f"Queue:       {s.get('queue')}")
        click.echo(f"Replicas:    {_replicas(s)}")
        click.echo(f"Restarts:    {s.get('restarts', 0)}")
        click.echo(f"Host network: {'yes' if s.get('hostNetwork') else 'no'}")
        manager = s.get("managedBy") or "kubeflow.org/training-operator"
        if manager != "kubeflow.org/training-operator":
            manager += " (runPolicy.managedBy: gpuyard makes no pods and writes no status for this job)"
        click.echo(f"Managed by:  {manager}")
        click.echo(f"Start time:  {status.get('startTime', '-')}")
        click.echo(f"Completion:  {status.get('completionTime', '-')}")
        for ui in s.get("webUIs") or []:  # Tensorboard, Mars web UI (platform/api/webuis.py)
            state = "" if ui.get("ready") else " (not made yet, or gone)"
            click.echo(f"{ui['name'].capitalize() + ':':<13}{ui['address']}{state}")
        click.echo("")
        click.echo("Replica statuses:")
        print_table(
            ["  TYPE", "ACTIVE", "SUCCEEDED", "FAILED", "EVICTED", "RESTARTS"],
            [
                [
                    f"  {r}",
                    v.get("active", 0),
                    v.get("succeeded", 0),
                    v.get("failed", 0),
                    v.get("evicted", 0),
                    v.get("restarts", 0),
                ]
                for r, v in (status.get("replicaStatuses") or {}).items()
            ],
        )
        click.echo("")
        click.echo("Conditions:")
        print_table(
            ["  TYPE", "STATUS", "REASON", "MESSAGE"],
            [
                [f"  {c['type']}", c.get("status"), c.get("reason"), c.get("message")]
                for c in status.get("conditions") or []
            ],
        )
        disruptions = [e for e in events if e.get("reason") in DISRUPTION_REASONS]
        if disruptions:
            click.echo("")
            click.echo("Preempted or moved (who and why):")
            print_table(
                ["  WHEN", "REASON", "COUNT", "WHY"],
                [
                    [f"  {e.get('lastTimestamp', '-')}", e.get("reason"), e.get("count", 1), e.get("message")]
                    for e in disruptions
                ],
            )
        click.echo("")
        click.echo("Pods:")
        if picked_by == "kubelet":
            click.echo(f"  {KUBELET_PICKS_GPUS}.")
        print_table(
            ["  NAME", "PHASE", "NODE", "HOST-PORT", "GPUS"],
            [
                [
                    f"  {p['metadata']['name']}",
                    p["summary"].get("phase"),
                    p["summary"].get("node"),
                    p["summary"].get("hostPort"),
                    ",".join(str(g) for g in p["summary"].get("gpus") or []),
                ]
                for p in pods
            ],
        )
        click.echo("")
        click.echo("Events:")
        print_table(
            ["  TYPE", "REASON", "COUNT", "MESSAGE"],
            [[f"  {e.get('type')}", e.get("reason"), e.get("count", 1), e.get("message")] for e in events],
        )

    emit({"job": job, "pods": pods, "events": events, "gpusPickedBy": picked_by}, output, table)


DISRUPTION_REASONS = frozenset({"Preempted", "Preempting", "Reclaiming", "Migrated", "Migrating", "Evicted"})
"""Event reasons that say who stopped or moved a job, or whom it stopped or moved for."""


# --- delete -------------------------------------------------------------------------------------


@click.group(cls=LazyGroup)
def delete() -> None:
    """Delete an object."""


@delete.command("job")
@click.argument("ref", metavar="NS/NAME")
@click.option("-n", "--namespace", default=None, help="Namespace when REF is only a name.")
@client_options
def delete_job(ref: str, namespace: str | None, output: str, server: str | None, token: str | None) -> None:
    """Delete a job; its pods, services and reservations go with it."""
    ns, name = split_ref(ref, namespace)
    result = call(ApiClient(server, token=token).delete_job, ns, name)
    deleted = result.get("deleted", {})
    emit(
        result,
        output,
        lambda _wide: click.echo(f"{deleted.get('kind', 'job').lower()}/{name} deleted from namespace {ns}"),
    )


# --- mounting -----------------------------------------------------------------------------------


def register(root: click.Group) -> None:
    """Add the job commands to the root group, merging into existing get/describe/delete groups."""
    mount(root, commands=[submit], groups=[get, describe, delete])
