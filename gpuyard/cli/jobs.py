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
from typing import Any, get_args

import click

from gpuyard.apis.jobs import JobValidationError, load_documents
from gpuyard.apis.jobspecs import JobConditionType
from gpuyard.cli.client import ApiClient, ClientError, join_error
from gpuyard.cli.common import (
    call,
    client_options,
    fail,
    mount,
    print_warnings,
    read_yaml_files,
    split_ref,
    validate_option,
)
from gpuyard.cli.output import age, emit
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


@click.group()
def get() -> None:
    """List objects: jobs, or the pods of a job."""


@get.command("jobs")
@click.option("-n", "--namespace", default=None, help="Only this namespace (default: all you may see).")
@click.option(
    "--phase",
    default=None,
    type=click.Choice(get_args(JobConditionType), case_sensitive=False),
    help="Only jobs in this phase.",
)
@click.option("--queue", default=None, help="Only jobs of this queue.")
@client_options
def get_jobs(
    namespace: str | None,
    phase: str | None,
    queue: str | None,
    output: str,
    server: str | None,
    token: str | None,
) -> None:
    """List jobs of every kind."""
    result = call(ApiClient(server, token=token).jobs, namespace=namespace, phase=phase, queue=queue)
    items = result.get("items", [])

    def table(_wide: bool = False) -> None:
        rows = []
        for job in items:
            s = job.get("summary", {})
            rows.append(
                [
                    job["metadata"]["namespace"],
                    job["metadata"]["name"],
                    job["kind"],
                    s.get("phase"),
                    s.get("queue"),
                    _replicas(s),
                    s.get("restarts", 0),
                    age(job["metadata"].get("creationTimestamp")),
                ]
            )
        print_table(["NAMESPACE", "NAME", "KIND", "PHASE", "QUEUE", "REPLICAS", "RESTARTS", "AGE"], rows)

    emit(items, output, table)


@get.command("pods")
@click.option("--job", "job_ref", required=True, metavar="NS/NAME", help="The job whose pods to list.")
@click.option("-n", "--namespace", default=None, help="Namespace when --job gives only a name.")
@client_options
def get_pods(job_ref: str, namespace: str | None, output: str, server: str | None, token: str | None) -> None:
    """List the pods of a job, with node, host port and GPUs."""
    ns, name = split_ref(job_ref, namespace)
    result = call(ApiClient(server, token=token).job_pods, ns, name)
    items = result.get("items", [])

    def table(_wide: bool = False) -> None:
        rows = []
        for pod in items:
            s = pod.get("summary", {})
            gpus = ",".join(str(g) for g in s.get("gpus") or [])
            rows.append(
                [
                    pod["metadata"]["name"],
                    s.get("phase"),
                    s.get("node"),
                    s.get("hostPort"),
                    gpus,
                    s.get("exitCode"),
                    age(pod["metadata"].get("creationTimestamp")),
                ]
            )
        print_table(["NAME", "PHASE", "NODE", "HOST-PORT", "GPUS", "EXIT", "AGE"], rows)

    emit(items, output, table)


# --- describe -----------------------------------------------------------------------------------


@click.group()
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
    pods = call(client.job_pods, ns, name).get("items", [])
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
        click.echo(f"Start time:  {status.get('startTime', '-')}")
        click.echo(f"Completion:  {status.get('completionTime', '-')}")
        click.echo("")
        click.echo("Replica statuses:")
        print_table(
            ["  TYPE", "ACTIVE", "SUCCEEDED", "FAILED", "RESTARTS"],
            [
                [
                    f"  {r}",
                    v.get("active", 0),
                    v.get("succeeded", 0),
                    v.get("failed", 0),
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

    emit({"job": job, "pods": pods, "events": events}, output, table)


DISRUPTION_REASONS = frozenset({"Preempted", "Preempting", "Reclaiming", "Migrated", "Migrating", "Evicted"})
"""Event reasons that say who stopped or moved a job, or whom it stopped or moved for."""


# --- delete -------------------------------------------------------------------------------------


@click.group()
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
