"""`gpuyard logs POD` and `gpuyard logs job/NAME [--role R --index I] [-f] [--tail N]`: a pod's log.

Reads `GET /api/v1/namespaces/{ns}/pods/{name}/log` (`gpuyard.platform.api.pods`), which the
backend answers: on the fake cluster its kubelet keeps a short log per container (when and where
it started, its training environment: ranks, world size, master address, TF_CONFIG's task, GPUs;
how it exited); on Kubernetes it is the container's own output, read through the API server's
`pods/log` as `kubectl logs` reads it (`gpuyard fake-nodes` answers for its fake nodes with the
same short log).

`job/NAME` picks one of the job's pods, as `kubectl logs job/NAME` does: the pod of `--role` (a
replica type, any case) and `--index` (default 0); without `--role`, the first of the master,
chief, launcher or scheduler, else the first worker. `--tail N` prints the last N lines only. `-f`
streams new lines as they come until the container has finished (a pod not started yet is waited
for). Errors are one line on stderr; exit 2 for bad input (no such pod, role or index), 1 for
server or network trouble.
"""

from __future__ import annotations

from typing import Any

import click

from gpuyard.cli.client import ApiClient, ClientError
from gpuyard.cli.common import call, fail, split_ref

__all__ = ["logs", "pick_pod"]

LEADER_ROLES = ("master", "chief", "launcher", "scheduler", "ps")
"""Roles whose pod `logs job/NAME` shows first (then workers, by index)."""


def _role(pod: dict[str, Any]) -> str:
    return str((pod.get("summary") or {}).get("replicaType") or "")


def _index(pod: dict[str, Any]) -> int:
    try:
        return int((pod.get("summary") or {}).get("replicaIndex") or 0)
    except ValueError:
        return 0


def pick_pod(pods: list[dict[str, Any]], *, role: str | None, index: int | None, job: str) -> dict[str, Any]:
    """The pod of a job that `logs job/NAME` shows (see the module docstring); exits 2 naming the
    roles and indexes there are when none matches."""
    if not pods:
        fail(f"job {job} has no pods yet (gpuyard describe job {job} says why)")
    roles = sorted({_role(p) for p in pods})
    if role is not None:
        chosen = [p for p in pods if _role(p).lower() == role.lower()]
        if not chosen:
            fail(f"--role: job {job} has no {role!r} pods; its roles: {', '.join(roles)}")
    else:
        rank = {r: i for i, r in enumerate(LEADER_ROLES)}
        first = min(roles, key=lambda r: (rank.get(r.lower(), len(rank)), r))
        chosen = [p for p in pods if _role(p) == first]
    want = 0 if index is None else index
    for pod in sorted(chosen, key=_index):
        if _index(pod) == want:
            return pod
    have = ", ".join(str(_index(p)) for p in sorted(chosen, key=_index))
    fail(f"--index: job {job} has no {_role(chosen[0])} pod {want}; indexes: {have}")


@click.command("logs")
@click.argument("ref", metavar="POD | NS/POD | job/NAME | pod/NAME")
@click.option("-n", "--namespace", default=None, help="Namespace when REF gives none (default: default).")
@click.option("--role", default=None, help="job/NAME: the replica type (Worker, Master, PS, ...).")
@click.option(
    "--index", type=click.IntRange(min=0), default=None, help="job/NAME: the replica index (default 0)."
)
@click.option("-c", "--container", default=None, help="The container (default: the pod's first).")
@click.option("-f", "--follow", is_flag=True, help="Stream new lines until the container has finished.")
@click.option(
    "--tail",
    type=click.IntRange(min=-1),
    default=-1,
    show_default=True,
    help="Only the last N lines (-1: all).",
)
@click.option("--token", default=None, help="Bearer token (default $GPUYARD_TOKEN or the config file).")
@click.option(
    "--server",
    default=None,
    metavar="URL",
    help="gpuyard server (default $GPUYARD_SERVER or http://127.0.0.1:8080).",
)
def logs(
    ref: str,
    namespace: str | None,
    role: str | None,
    index: int | None,
    container: str | None,
    follow: bool,
    tail: int,
    token: str | None,
    server: str | None,
) -> None:
    """Print a pod's log: `gpuyard logs POD`, or one pod of a job: `gpuyard logs job/NAME --role Worker --index 1`."""
    client = ApiClient(server, token=token)
    kind, _, rest = ref.partition("/")
    if kind.lower() in ("job", "jobs") and rest:
        ns, name = split_ref(rest, namespace)
        pod = pick_pod(
            call(client.job_pods, ns, name).get("items", []), role=role, index=index, job=f"{ns}/{name}"
        )
        ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    else:
        if role is not None or index is not None:
            fail("--role and --index choose a pod of a job: gpuyard logs job/NAME --role R --index I")
        ns, pod_name = split_ref(rest if kind.lower() in ("pod", "pods", "po") and rest else ref, namespace)
    tail_lines = None if tail < 0 else tail
    if follow:
        try:
            for line in client.follow_log(ns, pod_name, container=container, tail_lines=tail_lines):
                click.echo(line)
        except ClientError as exc:
            fail(exc.message, exc.exit_code)
        except KeyboardInterrupt:  # pragma: no cover - interactive
            pass
        return
    answer = call(client.pod_log, ns, pod_name, container=container, tail_lines=tail_lines)
    lines = answer.get("lines") or []
    for line in lines:
        click.echo(line)
    if answer.get("truncated"):
        click.echo(f"(only the last {len(lines)} lines; --tail N for fewer)", err=True)
    if not lines and answer.get("phase") == "Pending":
        click.echo(f"pod {ns}/{pod_name} is Pending: it has not started yet (try -f)", err=True)
