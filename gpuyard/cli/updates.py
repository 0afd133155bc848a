"""Client commands that change running work: `suspend job`, `resume job`, `patch job`,
`get priorityclasses` and `reschedule [--dry-run]`.

* `gpuyard suspend job NAME` / `gpuyard resume job NAME` send a JSON merge patch of the job's
  suspend field (`spec.runPolicy.suspend` when the job has a `runPolicy`, Kubeflow's place,
  else KubeDL's inline `spec.suspend`), with the job's resourceVersion as precondition;
* `gpuyard patch job NAME --type merge -p '{...}'` (kubectl's spelling) sends any merge patch;
  the server refuses changes of immutable fields (exit code 2 with its message);
* `gpuyard get priorityclasses` lists the built-in and applied PriorityClasses;
* `gpuyard reschedule [--dry-run]` asks the scheduler for a defragmentation plan
  (`POST /api/v1/scheduler:reschedule`) and prints it as a table: job, from, to, cost.

Exit codes as every client command: 0 success, 2 bad input or a 4xx answer, 1 server errors.
"""

from __future__ import annotations

import json
from typing import Any

import click

from gpuyard.cli.client import ApiClient
from gpuyard.cli.common import call, client_options, fail, mount, split_ref
from gpuyard.cli.lazy import LazyGroup
from gpuyard.cli.output import emit
from gpuyard.cli.output import table as print_table

__all__ = ["register"]


def suspend_patch(job: dict[str, Any], *, suspend: bool) -> dict[str, Any]:
    """The merge patch that sets the job's suspend field where its flavour keeps it."""
    spec = job.get("spec") or {}
    rv = (job.get("metadata") or {}).get("resourceVersion")
    meta = {"resourceVersion": rv} if rv else {}
    if "runPolicy" in spec or job.get("apiVersion") == "kubeflow.org/v1":
        return {"metadata": meta, "spec": {"runPolicy": {"suspend": suspend}}}
    return {"metadata": meta, "spec": {"suspend": suspend}}


def _toggle(
    ref: str, namespace: str | None, output: str, server: str | None, token: str | None, *, on: bool
) -> None:
    ns, name = split_ref(ref, namespace)
    client = ApiClient(server, token=token)
    job = call(client.job, ns, name)
    result = call(client.patch_job, ns, name, suspend_patch(job, suspend=on))
    word = "suspended" if on else "resumed"
    emit(result, output, lambda _wide: click.echo(f"{job['kind'].lower()}/{name} {word} in namespace {ns}"))


@click.group(cls=LazyGroup)
def suspend() -> None:
    """Suspend an object (its pods stop, its GPUs are released, it is kept)."""


@suspend.command("job")
@click.argument("ref", metavar="NS/NAME")
@click.option("-n", "--namespace", default=None, help="Namespace when REF is only a name.")
@client_options
def suspend_job(ref: str, namespace: str | None, output: str, server: str | None, token: str | None) -> None:
    """Suspend a job: its pods stop and its GPUs are released; `resume job` queues it again."""
    _toggle(ref, namespace, output, server, token, on=True)


@click.group(cls=LazyGroup)
def resume() -> None:
    """Resume a suspended object."""


@resume.command("job")
@click.argument("ref", metavar="NS/NAME")
@click.option("-n", "--namespace", default=None, help="Namespace when REF is only a name.")
@client_options
def resume_job(ref: str, namespace: str | None, output: str, server: str | None, token: str | None) -> None:
    """Resume a suspended job: it queues again for placement."""
    _toggle(ref, namespace, output, server, token, on=False)


@click.group(cls=LazyGroup)
def patch() -> None:
    """Change fields of an object (kubectl's `patch`)."""


@patch.command("job")
@click.argument("ref", metavar="NS/NAME")
@click.option("-n", "--namespace", default=None, help="Namespace when REF is only a name.")
@click.option(
    "--type",
    "patch_type",
    type=click.Choice(["merge"]),
    default="merge",
    show_default=True,
    help="Patch type.",
)
@click.option("-p", "--patch", "text", required=True, help="The JSON merge patch.")
@client_options
def patch_job(
    ref: str,
    namespace: str | None,
    patch_type: str,
    text: str,
    output: str,
    server: str | None,
    token: str | None,
) -> None:
    """Patch a job: labels, annotations, suspend, priority (class) or queue; other fields are immutable."""
    ns, name = split_ref(ref, namespace)
    try:
        body = json.loads(text)
    except ValueError as exc:
        fail(f"-p: not JSON: {exc}")
    if not isinstance(body, dict):
        fail("-p: a merge patch is a JSON object")
    result = call(ApiClient(server, token=token).patch_job, ns, name, body)
    emit(result, output, lambda _wide: click.echo(f"{result['kind'].lower()}/{name} patched"))


@click.group(cls=LazyGroup)
def get() -> None:
    """Display objects."""


@get.command("priorityclasses")
@client_options
def get_priority_classes(output: str, server: str | None, token: str | None) -> None:
    """List PriorityClasses (built-in and applied), highest value first."""
    result = call(ApiClient(server, token=token).request, "GET", "/api/v1/priorityclasses")
    items = result.get("items", [])
    emit(
        result,
        output,
        lambda _wide: print_table(
            ["NAME", "VALUE", "GLOBAL-DEFAULT", "PREEMPTION", "DESCRIPTION"],
            [
                [
                    c["metadata"]["name"],
                    c.get("value"),
                    "true" if c.get("globalDefault") else "false",
                    c.get("preemptionPolicy", "PreemptLowerPriority"),
                    c.get("description", ""),
                ]
                for c in items
            ],
        ),
    )


def _gpus(where: dict[str, Any]) -> str:
    return f"{where.get('node')}[{','.join(str(g) for g in where.get('gpus') or [])}]"


@click.command()
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@client_options
def reschedule(dry_run: bool, output: str, server: str | None, token: str | None) -> None:
    """Plan (and unless --dry-run, start) the migrations that free a block for a job waiting on fragmentation."""
    result = call(
        ApiClient(server, token=token).request,
        "POST",
        "/api/v1/scheduler:reschedule",
        query={"dryRun": "true" if dry_run else "false"},
    )

    def render(_wide: bool) -> None:
        moves = result.get("moves", [])
        if not moves:
            click.echo(f"nothing to move: {result.get('message', 'no job waits on fragmentation')}")
            return
        print_table(
            ["JOB", "POD", "FROM", "TO", "COST (GPU-h)"],
            [
                [m["job"], m["pod"], _gpus(m["from"]), _gpus(m["to"]), f"{m['costGpuHours']:.2f}"]
                for m in moves
            ],
        )
        verb = "would let" if result.get("dryRun") else "lets"
        click.echo(f"{verb} {', '.join(result.get('beneficiaries', []))} start")

    emit(result, output, render)


def register(root: click.Group) -> None:
    """Add the commands to the root group (merged into existing groups of the same name)."""
    mount(root, commands=[reschedule], groups=[suspend, resume, patch, get])
