"""Client commands for the cluster: `get nodes`, `get resourceclasses`, `top nodes`,
`watch jobs` and `events --job NS/NAME [--follow]`.

Every command takes `--server` / `--token` (else `$GPUYARD_SERVER` / `$GPUYARD_TOKEN`, else the
client config file `~/.config/gpuyard/config.yaml`, see `gpuyard.cli.client`) and
`-o table|wide|json|yaml`. Server errors are one line on stderr; exit code 2 for bad input
(a 4xx answer, bad flags), 1 for server or network errors.

`register(root)` mounts them, merging `nodes`/`resourceclasses` into an existing `get` group.
"""

from __future__ import annotations

import json
from typing import Any

import click
import yaml

from gpuyard.cli.client import ApiClient, ClientError
from gpuyard.cli.common import call, client_options, fail, mount, split_ref
from gpuyard.cli.lazy import LazyGroup
from gpuyard.cli.output import StreamRows
from gpuyard.cli.output import age as _age
from gpuyard.cli.output import emit as _emit
from gpuyard.cli.output import table as _table

__all__ = ["events", "get", "register", "top", "watch"]

GPU = "nvidia.com/gpu"


def _bytes(n: float) -> str:
    for unit in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 1024 or unit == "Ti":
            return f"{n:.0f}{unit}" if unit == "" or n == int(n) else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _pct(used: float, total: float) -> str:
    return f"{round(100 * used / total)}%" if total else "-"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


# --- get ----------------------------------------------------------------------------------------


@click.group(cls=LazyGroup)
def get() -> None:
    """List objects."""


@get.command("nodes")
@click.option("-l", "--selector", default=None, help="Label selector, e.g. gpuyard.io/gpu-model=v100.")
@client_options
def get_nodes(selector: str | None, output: str, server: str | None, token: str | None) -> None:
    """List nodes with their GPUs (model, allocated, free), CPU and memory."""
    from gpuyard.apis.devicematching import LABEL_BLOCK, LABEL_GPU_MODEL, LABEL_SPINE

    client = ApiClient(server, token=token)
    nodes = call(client.nodes, selector=selector).get("items", [])
    if output not in ("table", "wide"):
        _emit(nodes, output, lambda wide: None, kind="Node")
        return
    usage = {u["name"]: u for u in call(client.node_usage, selector=selector).get("items", [])}

    def table(wide: bool) -> None:
        rows = []
        for n in nodes:
            name = n["metadata"]["name"]
            u = usage.get(name, {})
            labels = n["metadata"].get("labels", {})
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in n["status"].get("conditions", [])
            )
            row = [
                name,
                "Ready" if ready else "NotReady",
                labels.get(LABEL_GPU_MODEL) if u.get("gpus") else "-",
                u.get("gpus", 0),
                u.get("gpusAllocated", 0),
                u.get("gpusFree", 0),
                _num(u.get("cpu", 0)),
                _bytes(u.get("memoryBytes", 0)),
                _age(n["metadata"].get("creationTimestamp")),
            ]
            if wide:
                taints = ",".join(
                    f"{t['key']}:{t.get('effect', '')}" for t in n.get("spec", {}).get("taints", [])
                )
                row += [
                    u.get("gpusUnhealthy", 0),
                    labels.get(LABEL_BLOCK) or labels.get("topology.kubernetes.io/zone"),
                    labels.get(LABEL_SPINE),
                    taints,
                ]
            rows.append(row)
        headers = ["NAME", "STATUS", "GPU-MODEL", "GPUS", "ALLOCATED", "FREE", "CPU", "MEMORY", "AGE"]
        _table(headers + (["UNHEALTHY", "BLOCK", "SPINE", "TAINTS"] if wide else []), rows)

    _emit(nodes, output, table)


@get.command("resourceclasses")
@client_options
def get_resourceclasses(output: str, server: str | None, token: str | None) -> None:
    """List resource classes (named GPU types: `resources.limits: {CLASS: n}` asks for n of them)."""
    items = call(ApiClient(server, token=token).resource_classes).get("items", [])

    def table(wide: bool) -> None:
        rows = []
        for c in items:
            spec = c.get("spec", {})
            row = [c["metadata"]["name"], spec.get("description", "")]
            if wide:
                row.append(json.dumps(spec.get("selector") or {}, separators=(",", ":")))
            rows.append(row)
        _table(["NAME", "DESCRIPTION"] + (["SELECTOR"] if wide else []), rows)

    _emit(items, output, table)


# --- top ----------------------------------------------------------------------------------------


@click.group(cls=LazyGroup)
def top() -> None:
    """Show resource use."""


@top.command("nodes")
@click.option("-l", "--selector", default=None, help="Label selector, e.g. gpuyard.io/gpu-model=v100.")
@client_options
def top_nodes(selector: str | None, output: str, server: str | None, token: str | None) -> None:
    """GPU, CPU and memory held by reservations on each node (and, wide, the job on each GPU)."""
    items = call(ApiClient(server, token=token).node_usage, selector=selector).get("items", [])

    def table(wide: bool) -> None:
        rows = []
        for u in items:
            row = [
                u["name"],
                f"{u['gpusAllocated']}/{u['gpus']}" if u["gpus"] else "-",
                _pct(u["gpusAllocated"], u["gpus"]),
                f"{_num(u['cpuRequested'])}/{_num(u['cpu'])}",
                _pct(u["cpuRequested"], u["cpu"]),
                f"{_bytes(u['memoryRequestedBytes'])}/{_bytes(u['memoryBytes'])}",
                _pct(u["memoryRequestedBytes"], u["memoryBytes"]),
            ]
            if wide:
                jobs = sorted({j for holders in u.get("holders", {}).values() for j in holders})
                row.append(",".join(jobs))
            rows.append(row)
        headers = ["NAME", "GPUS", "GPU%", "CPU", "CPU%", "MEMORY", "MEMORY%"]
        _table(headers + (["JOBS"] if wide else []), rows)

    _emit(items, output, table)


# --- watch and events ---------------------------------------------------------------------------


@click.group(cls=LazyGroup)
def watch() -> None:
    """Follow changes as they happen (Server-Sent Events)."""


def _job_row(event: str, obj: dict[str, Any], *, wide: bool) -> list[str]:
    meta = obj.get("metadata", {})
    status = obj.get("status", {}) or {}
    conds = status.get("conditions") or []
    last = conds[-1] if conds else {}
    row = [
        event,
        f"{meta.get('namespace')}/{meta.get('name')}",
        str(obj.get("kind") or "-"),
        status.get("phase") or "Created",
        last.get("type") or "-",
    ]
    if wide:
        row.append(last.get("message") or "-")
    return row


@watch.command("jobs")
@click.option("-n", "--namespace", default=None, help="Only this namespace.")
@click.option(
    "-A", "--all-namespaces", "all_namespaces", is_flag=True, help="Every namespace (wins over -n)."
)
@click.option(
    "--watch-only", is_flag=True, help="Only changes: do not print the jobs there are first (kubectl's)."
)
@click.option(
    "--max-events", type=click.IntRange(min=1), default=None, help="Stop after printing this many changes."
)
@client_options
def watch_jobs(
    namespace: str | None,
    all_namespaces: bool,
    watch_only: bool,
    max_events: int | None,
    output: str,
    server: str | None,
    token: str | None,
) -> None:
    """Print the jobs there are (as ADDED), then every change to a job (kind, phase, last
    condition; -o wide: its message) until interrupted. In a table, a change that alters none of
    the columns shown is not printed; `--max-events` counts changes only."""
    if all_namespaces:
        namespace = None
    client = ApiClient(server, token=token)
    seen = 0
    wide = output == "wide"
    rows: StreamRows | None = None
    if output in ("table", "wide"):
        headers = ["EVENT", "NAMESPACE/NAME", "KIND", "PHASE", "CONDITION"] + (["MESSAGE"] if wide else [])
        rows = StreamRows(headers, [8, 40, 10, 10, 10] + ([0] if wide else []))
    shown: dict[str, list[str]] = {}  # job -> the columns last printed for it (EVENT aside)

    def show(event: str, obj: dict[str, Any]) -> bool:
        if output == "json":
            click.echo(json.dumps({"type": event, "object": obj}, separators=(",", ":")))
        elif output == "yaml":
            click.echo(yaml.safe_dump([{"type": event, "object": obj}], sort_keys=False).rstrip())
        elif output in ("table", "wide"):
            assert rows is not None
            row = _job_row(event, obj, wide=wide)
            key = f"{obj.get('kind')}/{row[1]}"
            if event == "MODIFIED" and shown.get(key) == row[1:]:
                return False
            if event == "DELETED":
                shown.pop(key, None)
            else:
                shown[key] = row[1:]
            rows.echo(row)
        else:
            _emit(obj, output, lambda _wide: None, kind=obj.get("kind"))
        return True

    since = None
    if not watch_only:
        listed = call(client.list_all, "/api/v1/jobs", query={"namespace": namespace})
        since = (listed.get("metadata") or {}).get("resourceVersion")
        for obj in listed.get("items", []):
            obj = {k: v for k, v in obj.items() if k != "summary"}
            show("ADDED", obj)
    try:
        query = {"namespace": namespace, "resourceVersion": since}
        for event, obj in call(client.stream, "/api/v1/watch/jobs", query=query):
            if not show(event, obj):
                continue
            seen += 1
            if max_events is not None and seen >= max_events:
                return
    except ClientError as exc:
        fail(exc.message, exc.exit_code)
    except KeyboardInterrupt:  # pragma: no cover - interactive
        return


def _event_row(e: dict[str, Any]) -> list[Any]:
    return [
        e.get("lastTimestamp") or e.get("firstTimestamp"),
        e.get("type"),
        e.get("reason"),
        e.get("count", 1),
        e.get("message"),
    ]


@click.command()
@click.option("--job", "job_ref", required=True, metavar="NS/NAME", help="The job whose events to show.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events as they happen.")
@click.option(
    "--max-events", type=click.IntRange(min=1), default=None, help="With --follow: stop after this many."
)
@client_options
def events(
    job_ref: str, follow: bool, max_events: int | None, output: str, server: str | None, token: str | None
) -> None:
    """A job's events, oldest first; with --follow, then every new one (like `logs -f`) until the
    job is deleted."""
    ns, name = split_ref(job_ref, option="--job")
    client = ApiClient(server, token=token)
    job = call(client.job, ns, name)
    listed = call(client.job_events, ns, name)
    past = listed.get("items", [])
    headers = ["TIME", "TYPE", "REASON", "COUNT", "MESSAGE"]

    # The followed lines line up with the header: the columns are as wide as the listed events
    # need, at least a timestamp's and a usual reason's width, and widen when a value is longer.
    listed_rows = [_event_row(e) for e in past]
    widths = [max([w, *(len(str(r[i])) for r in listed_rows)]) for i, w in enumerate([20, 7, 18, 5, 0])]
    rows = StreamRows(headers, widths, header=False)

    def show(items: list[dict[str, Any]], *, header: bool) -> None:
        if output == "json":
            for e in items:
                click.echo(json.dumps(e, separators=(",", ":")))
        elif output == "yaml":
            if items:
                click.echo(yaml.safe_dump(items, sort_keys=False).rstrip())
        elif output in ("table", "wide"):
            if header:
                rows.echo(headers)
            for e in items:
                rows.echo(_event_row(e))
        else:
            _emit(items, output, lambda _wide: None, kind="Event")

    show(past, header=True)
    if not follow:
        return
    uid = job.get("metadata", {}).get("uid")
    shown = 0
    try:
        # The job's own changes come on the same stream: its deletion ends the command.
        since = (listed.get("metadata") or {}).get("resourceVersion")
        query = {"namespace": ns, "resourceVersion": since}
        for kind, e in call(client.stream, "/api/v1/watch/jobs,events", query=query):
            if e.get("kind") != "Event":
                if kind == "DELETED" and (e.get("metadata") or {}).get("uid") == uid:
                    if output in ("table", "wide"):
                        click.echo(f"job {ns}/{name} was deleted")
                    else:
                        click.echo(f"job {ns}/{name} was deleted", err=True)
                    return
                continue
            if kind == "DELETED" or (e.get("involvedObject") or {}).get("uid") != uid:
                continue
            show([e], header=False)
            shown += 1
            if max_events is not None and shown >= max_events:
                return
    except ClientError as exc:
        fail(exc.message, exc.exit_code)
    except KeyboardInterrupt:  # pragma: no cover - interactive
        return


# --- mounting -----------------------------------------------------------------------------------


def register(root: click.Group) -> None:
    """Add the cluster commands to the root group, merging into existing groups of the same name."""
    mount(root, commands=[events], groups=[get, top, watch])
