"""`gpuyard control-plane`: run a real Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) on loopback, built from Kubernetes' own Go modules by
`make k8s-bin`.

    make k8s-bin
    gpuyard control-plane --kubeconfig-out kc.yaml &
    kubectl --kubeconfig kc.yaml get --raw /version
    gpuyard fake-nodes --kubeconfig kc.yaml --scenario configs/clusters/small.yaml

It runs in the foreground and stops every component on Ctrl-C or SIGTERM. Not for production: one
etcd without fsync, certificates made at start. See docs/kubernetes-testing.md.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from gpuyard.cli.common import fail

__all__ = ["control_plane", "register"]


@click.command("control-plane")
@click.option(
    "--kubeconfig-out",
    required=True,
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write the admin kubeconfig (system:masters, certificates embedded) here.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep etcd's data, certificates and component logs here (default: a temporary folder, "
    "removed at exit).",
)
@click.option(
    "--bin-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder with etcd, kube-apiserver, kube-controller-manager, kube-scheduler "
    "(default: $GPUYARD_K8S_BIN, else the folder `make k8s-bin` builds into).",
)
@click.option(
    "--node-monitor-grace",
    type=click.FloatRange(min=1),
    default=8.0,
    show_default=True,
    help="Seconds without a node heartbeat before the node is NotReady (Kubernetes' default: 50).",
)
@click.option(
    "--eviction-toleration",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Seconds a pod tolerates a NotReady or unreachable node before the taint manager evicts it "
    "(Kubernetes' default: 300).",
)
def control_plane(
    kubeconfig_out: Path,
    data_dir: Path | None,
    bin_dir: Path | None,
    node_monitor_grace: float,
    eviction_toleration: int,
) -> None:
    """Run a real Kubernetes control plane for development and tests, in the foreground."""
    from gpuyard.testing.controlplane import KUBE_VERSION, BinariesMissing, find_binaries

    try:
        find_binaries(bin_dir)
    except BinariesMissing as exc:
        fail(str(exc), code=2)
    try:
        from gpuyard.testing.controlplane.running import ControlPlane, ControlPlaneError, Timings
    except ImportError as exc:
        fail(
            f"control-plane needs the 'kubernetes' extra ({exc.name}): pip install 'gpuyard[kubernetes]'",
            code=1,
        )
    timings = Timings(
        node_monitor_grace_period=node_monitor_grace,
        not_ready_toleration=eviction_toleration,
        unreachable_toleration=eviction_toleration,
    )
    plane = ControlPlane(data_dir=data_dir, bin_dir=bin_dir, timings=timings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        plane.start()
    except ControlPlaneError as exc:
        fail(str(exc), code=1)
    try:
        kubeconfig_out.parent.mkdir(parents=True, exist_ok=True)
        kubeconfig_out.write_bytes(plane.admin_kubeconfig.read_bytes())
        kubeconfig_out.chmod(0o600)
        click.echo(
            f"Kubernetes {KUBE_VERSION} control plane on {plane.url} (kubeconfig: {kubeconfig_out}; "
            f"logs: {plane.data_dir}/logs) — Ctrl-C to stop",
            err=True,
        )
        while not stop.wait(1.0):
            if gone := plane.dead():
                click.echo(f"error: {', '.join(gone)} exited; stopping (see {plane.data_dir}/logs)", err=True)
                raise SystemExit(1)
    finally:
        plane.stop()


def register(main: click.Group) -> None:
    main.add_command(control_plane)
