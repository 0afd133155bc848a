"""`gpuyard fake-apiserver`: run the test Kubernetes API server (a development tool).

    gpuyard fake-apiserver --port 6443 --kubeconfig-out kc.yaml
    kubectl --kubeconfig kc.yaml apply -f configs/deploy/crds/
    curl -X POST localhost:6443/_gpuyard/faults -d '{"action": "drop-watches"}'

It serves the REST and watch protocol of a Kubernetes API server from memory (gpuyard/testing/
apiserver/), so gpuyard's Kubernetes backend, `gpuyard fake-nodes` and kubectl can be tried without a
cluster. Not for production: no TLS, no authorization, no persistence. See docs/kubernetes-testing.md.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal

import click

from gpuyard.cli.common import fail

__all__ = ["fake_apiserver", "register"]


async def _run(
    *,
    host: str,
    port: int,
    kubeconfig_out: str | None,
    token: str | None,
    bookmark_interval: float,
    audit: bool,
    gpuyard_crds: bool,
    gang_crds: bool,
    graceful_pods: bool,
) -> None:
    from gpuyard.testing.apiserver import FakeApiServer
    from gpuyard.testing.apiserver.crds import gang_crds as gang_crd_list

    server = FakeApiServer(
        host=host,
        port=port,
        token=token,
        bookmark_interval=bookmark_interval,
        audit=audit,
        graceful_pods=graceful_pods,
    )
    if gpuyard_crds:
        server.install_gpuyard_crds()
    if gang_crds:
        server.install_crds(gang_crd_list())
    try:
        await server.start()
    except OSError as exc:
        fail(f"--port: cannot listen on {host}:{port}: {exc.strerror or exc}", code=1)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        where = ""
        if kubeconfig_out:
            where = f" (kubeconfig: {server.write_kubeconfig(kubeconfig_out)})"
        click.echo(f"fake Kubernetes API server on {server.url}{where} — Ctrl-C to stop", err=True)
        await stop.wait()
    finally:
        await server.stop()


@click.command("fake-apiserver")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=6443, show_default=True, help="Port (0: any free one)."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--kubeconfig-out",
    type=click.Path(dir_okay=False, writable=True),
    help="Write a kubeconfig for this server here (kubectl, kubernetes-asyncio, gpuyard --kubeconfig).",
)
@click.option("--token", help="Accept only this bearer token (default: any token, or none).")
@click.option(
    "--bookmark-interval",
    type=click.FloatRange(min=0.01),
    default=60.0,
    show_default=True,
    help="Seconds between BOOKMARK events on quiet watches (allowWatchBookmarks=true).",
)
@click.option("--audit", is_flag=True, help="Record every resource request (GET /_gpuyard/audit).")
@click.option(
    "--gpuyard-crds",
    is_flag=True,
    help="Start with minimal CRDs (open schemas) for gpuyard's custom resources already registered.",
)
@click.option(
    "--gang-crds",
    is_flag=True,
    help="Also register minimal CRDs for the PodGroups of Volcano, scheduler-plugins and Koordinator "
    "(to try scheduler.mode: delegate).",
)
@click.option(
    "--graceful-pod-deletion",
    "graceful_pods",
    is_flag=True,
    help="Deleting a running bound pod only marks it (deletionTimestamp) until its kubelet deletes it "
    "with gracePeriodSeconds=0, as on a real cluster (default: pods are deleted at once).",
)
@click.option("--insecure", is_flag=True, help="Allow a non-loopback --host without --token.")
def fake_apiserver(
    port: int,
    host: str,
    kubeconfig_out: str | None,
    token: str | None,
    bookmark_interval: float,
    audit: bool,
    gpuyard_crds: bool,
    gang_crds: bool,
    graceful_pods: bool,
    insecure: bool,
) -> None:
    """Run an in-memory Kubernetes API server for development and tests (no TLS, no RBAC)."""
    if not _is_loopback(host) and token is None and not insecure:
        fail(
            f"--host: {host} is not a loopback address and no --token is set (anyone who can reach it could "
            "change every object); pass --token, or --insecure to serve without one"
        )
    try:
        import kmock  # noqa: F401
    except ImportError:
        fail("fake-apiserver needs the 'kubernetes' extra: pip install 'gpuyard[kubernetes]'", code=1)
    asyncio.run(
        _run(
            host=host,
            port=port,
            kubeconfig_out=kubeconfig_out,
            token=token,
            bookmark_interval=bookmark_interval,
            audit=audit,
            gpuyard_crds=gpuyard_crds,
            gang_crds=gang_crds,
            graceful_pods=graceful_pods,
        )
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def register(main: click.Group) -> None:
    main.add_command(fake_apiserver)
