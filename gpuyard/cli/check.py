"""`gpuyard check`: are the platform's invariants holding on a running server?

Asks `GET /api/v1/check` (admin token): no GPU, CPU, memory, NIC or host port over-allocated,
resourceVersions sound, quotas within max (and within runtime unless a reclaim is under way),
every pod and Reservation owned by a live job / PodGroup, every placed gang at its minimum.
Prints `ok` or one line per violation naming the objects (`-o json|yaml`: the answer as is).

Exit codes: 0 every invariant holds, 1 a violation was found (or the server could not be
asked), 2 bad input (a 4xx answer, e.g. a `--grace` out of range).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuyard.cli.client import ApiClient
from gpuyard.cli.common import call, client_options, mount
from gpuyard.cli.output import emit, table

__all__ = ["check", "register"]


@click.command("check")
@click.option(
    "--grace",
    type=click.FloatRange(0, 60),
    default=1.0,
    show_default=True,
    help="Seconds a settled invariant (owners, gang minimum, quota runtime) may stay broken "
    "while a change is in flight before it counts.",
)
@client_options
def check(grace: float, output: str, server: str | None, token: str | None) -> None:
    """Check the platform's invariants; exit 1 when one is broken."""
    answer: dict[str, Any] = call(
        ApiClient(server, token=token).request, "GET", "/api/v1/check", query={"grace": f"{grace:g}"}
    )
    violations = answer.get("violations") or []

    def render(wide: bool) -> None:
        if not violations:
            checked = ", ".join(f"{n} {k}" for k, n in (answer.get("checked") or {}).items())
            count = len(answer.get("invariants") or {})
            click.echo(
                f"ok: {count} invariants hold ({checked}; resourceVersion {answer.get('resourceVersion')})"
            )
            return
        rows = [[v.get("invariant"), v.get("family"), v.get("message")] for v in violations]
        table(["INVARIANT", "FAMILY", "VIOLATION"], rows)

    emit(answer, output, render)
    if violations:
        sys.exit(1)


def register(root: click.Group) -> None:
    """Add `check` to the root group."""
    mount(root, commands=[check])
