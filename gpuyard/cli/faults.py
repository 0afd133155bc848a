"""Fault injection on the fake backend: `gpuyard fault fail-node|recover-node|fail-gpu|recover-gpu|
crash-pod|fail-next-creates`, over the HTTP fault routes (`POST /api/v1/fake/...`, admin token).

A backend that cannot inject faults answers 501: the command prints why and exits 1. Bad input
(an unknown node or pod, a GPU index out of range, a pod that is not running) exits 2.
"""

from __future__ import annotations

from typing import Any

import click

from gpuyard.cli.client import ApiClient
from gpuyard.cli.common import call, client_options, fail, mount
from gpuyard.cli.output import emit

__all__ = ["fault", "register"]

CRASH_REASONS = ("Error", "OOMKilled", "Evicted")


@click.group()
def fault() -> None:
    """Inject faults into the fake cluster: lose nodes, fail GPUs, crash pods, fail pod creations."""


def _show(answer: Any, output: str, line: str) -> None:
    emit(answer, output, lambda wide: click.echo(line))


def _pods_failed(answer: dict[str, Any]) -> str:
    n = answer.get("podsFailed", 0)
    return f"{n} pod{'' if n == 1 else 's'} failed"


@fault.command("fail-node")
@click.argument("node")
@client_options
def fail_node(node: str, output: str, server: str | None, token: str | None) -> None:
    """Turn NODE NotReady and fail its pods (NodeLost)."""
    answer = call(ApiClient(server, token=token).fault_node, node, "fail")
    _show(answer, output, f"node {node} failed (NotReady): {_pods_failed(answer)}")


@fault.command("recover-node")
@click.argument("node")
@client_options
def recover_node(node: str, output: str, server: str | None, token: str | None) -> None:
    """Turn NODE Ready again."""
    answer = call(ApiClient(server, token=token).fault_node, node, "recover")
    _show(answer, output, f"node {node} recovered (Ready)")


@fault.command("fail-gpu")
@click.argument("node")
@click.argument("index", type=click.IntRange(min=0))
@client_options
def fail_gpu(node: str, index: int, output: str, server: str | None, token: str | None) -> None:
    """Mark GPU INDEX of NODE unhealthy and fail the pods using it (DeviceUnhealthy)."""
    answer = call(ApiClient(server, token=token).fault_gpu, node, index, "fail")
    _show(answer, output, f"GPU {index} of node {node} failed (unhealthy): {_pods_failed(answer)}")


@fault.command("recover-gpu")
@click.argument("node")
@click.argument("index", type=click.IntRange(min=0))
@client_options
def recover_gpu(node: str, index: int, output: str, server: str | None, token: str | None) -> None:
    """Mark GPU INDEX of NODE healthy again."""
    answer = call(ApiClient(server, token=token).fault_gpu, node, index, "recover")
    _show(answer, output, f"GPU {index} of node {node} recovered (healthy)")


@fault.command("crash-pod")
@click.argument("pod", metavar="NS/NAME")
@click.option("--exit-code", type=click.IntRange(0, 255), default=None, help="The exit code (0-255).")
@click.option(
    "--reason", type=click.Choice(CRASH_REASONS), default=None, help="Why it failed (default Error)."
)
@client_options
def crash_pod(
    pod: str, exit_code: int | None, reason: str | None, output: str, server: str | None, token: str | None
) -> None:
    """Fail a running pod now, with an exit code or a reason."""
    ns, sep, name = pod.partition("/")
    if not sep or not ns or not name or "/" in name:
        fail(f"POD: {pod!r} is not NAMESPACE/NAME")
    answer = call(ApiClient(server, token=token).crash_pod, ns, name, exit_code=exit_code, reason=reason)
    _show(
        answer,
        output,
        f"pod {ns}/{name} crashed: {answer.get('phase')}, exit code {answer.get('exitCode')}, "
        f"reason {answer.get('reason')}",
    )


@fault.command("fail-next-creates")
@click.argument("count", type=click.IntRange(1, 1000), default=1)
@client_options
def fail_next_creates(count: int, output: str, server: str | None, token: str | None) -> None:
    """Make the next COUNT pod creations fail (default 1; at most 1000)."""
    answer = call(ApiClient(server, token=token).fail_next_creates, count)
    _show(answer, output, f"the next {count} pod creation{'' if count == 1 else 's'} will fail")


def register(root: click.Group) -> None:
    """Add `fault` to the root group."""
    mount(root, groups=[fault])
