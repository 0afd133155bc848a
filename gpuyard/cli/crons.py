"""`gpuyard get crons` and `gpuyard describe cron NS/NAME`: KubeDL's Crons and their runs.

Crons are applied with `gpuyard apply -f` (`POST /api/v1/apply`); these read them through
`GET /api/v1/crons`, `GET /api/v1/namespaces/{ns}/crons/{name}` and its `/events`
(`platform/api/crons.py`).
"""

from __future__ import annotations

from typing import Any

import click

from gpuyard.cli.client import ApiClient
from gpuyard.cli.common import call, client_options, split_ref
from gpuyard.cli.output import age, emit
from gpuyard.cli.output import table as print_table

__all__ = ["describe_cron", "get_crons"]


@click.command("crons")
@click.option("-n", "--namespace", default=None, help="Only this namespace.")
@client_options
def get_crons(namespace: str | None, output: str, server: str | None, token: str | None) -> None:
    """List Crons: schedule, suspended, running jobs, last schedule time."""
    client = ApiClient(server, token=token)
    result = call(client.list_all, "/api/v1/crons", query={"namespace": namespace})
    items: list[dict[str, Any]] = result.get("items", [])

    def render(wide: bool) -> None:
        headers = ["NAMESPACE", "NAME", "SCHEDULE", "SUSPEND", "ACTIVE", "LAST SCHEDULE", "AGE"]
        if wide:
            headers += ["POLICY", "KIND"]
        rows = []
        for c in items:
            spec, status = c.get("spec", {}), c.get("status", {})
            row = [
                c["metadata"].get("namespace", ""),
                c["metadata"]["name"],
                spec.get("schedule", ""),
                "true" if spec.get("suspend") else "false",
                len(status.get("active") or []),
                age(status.get("lastScheduleTime")),
                age(c["metadata"].get("creationTimestamp")),
            ]
            if wide:
                row += [spec.get("concurrencyPolicy") or "Allow", spec.get("template", {}).get("kind", "")]
            rows.append(row)
        print_table(headers, rows)

    emit(items, output, render, kind="cron")


@click.command("cron")
@click.argument("ref", metavar="[NS/]NAME")
@client_options
def describe_cron(ref: str, output: str, server: str | None, token: str | None) -> None:
    """Show a Cron: its policy, the running jobs, the history of its runs and its Events."""
    ns, name = split_ref(ref)
    client = ApiClient(server, token=token)
    cron = call(client.request, "GET", f"/api/v1/namespaces/{ns}/crons/{name}")
    events = call(client.request, "GET", f"/api/v1/namespaces/{ns}/crons/{name}/events").get("items", [])

    def render(_wide: bool) -> None:
        spec, status = cron.get("spec", {}), cron.get("status", {})
        template = spec.get("template", {})
        click.echo(f"Name:               {ns}/{name}")
        click.echo(f"Schedule:           {spec.get('schedule', '')}")
        click.echo(f"Concurrency policy: {spec.get('concurrencyPolicy') or 'Allow'}")
        click.echo(f"Suspend:            {'true' if spec.get('suspend') else 'false'}")
        click.echo(f"Deadline:           {spec.get('deadline') or '-'}")
        click.echo(f"History limit:      {spec.get('historyLimit', '-')}")
        click.echo(f"Template:           {template.get('kind', '')} ({template.get('apiVersion', '')})")
        click.echo(f"Last schedule:      {status.get('lastScheduleTime') or '-'}")
        click.echo("\nActive:")
        active = status.get("active") or []
        if not active:
            click.echo("  none")
        for a in active:
            click.echo(f"  {a.get('kind', '')}/{a.get('name', '')}")
        click.echo("\nHistory:")
        history = status.get("history") or []
        if not history:
            click.echo("  none")
        else:
            print_table(
                ["JOB", "KIND", "STATUS", "CREATED", "FINISHED"],
                [
                    [
                        h.get("object", {}).get("name", ""),
                        h.get("object", {}).get("kind", ""),
                        h.get("status") or "-",
                        h.get("created") or "-",
                        h.get("finished") or "-",
                    ]
                    for h in history
                ],
            )
        click.echo("\nEvents:")
        if not events:
            click.echo("  none")
        else:
            print_table(
                ["TYPE", "REASON", "COUNT", "LAST SEEN", "MESSAGE"],
                [
                    [
                        e.get("type", ""),
                        e.get("reason", ""),
                        e.get("count", 1),
                        age(e.get("lastTimestamp")),
                        e.get("message", ""),
                    ]
                    for e in events
                ],
            )

    emit({"cron": cron, "events": events}, output, render)
