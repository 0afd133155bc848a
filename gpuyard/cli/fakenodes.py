"""`gpuyard fake-nodes`: a scenario's GPU nodes and their kubelets on any Kubernetes API server.

Registers the nodes of `--cluster` (with their GPU/RDMA capacity, labels and NodeTopology) on the
API server of `--kubeconfig` and plays their kubelets until interrupted (the work is done by
`gpuyard.kubecluster.fakenodes`, reached through the backend factory). With `--admin-port`, a small
HTTP endpoint on 127.0.0.1 takes fault injection:

    POST /nodes/{node}/fail            NotReady; its pods fail (NodeLost)
    POST /nodes/{node}/recover         Ready again
    POST /nodes/{node}/gpus/{i}/fail   GPU i unhealthy; the pods holding it fail (DeviceUnhealthy)
    POST /nodes/{node}/gpus/{i}/recover

each answering `{"podsFailed": n}` (404 with a JSON error naming the known nodes otherwise).

The nodes' kubelet port (the API server reads pod logs there: `kubectl logs`, `gpuyard logs` on
the Kubernetes backend) listens on `--kubelet-address` (default 127.0.0.1; also each Node's
InternalIP, so it must be an address the API server can reach) and `--kubelet-port` (default: a
free port; each Node names it), over HTTPS with a self-signed certificate; `--no-kubelet-port`
serves none.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

import click
from aiohttp import web

from gpuyard.apis.durations import parse_duration
from gpuyard.devices.scenarios import Scenario, ScenarioError, load_scenario
from gpuyard.state.backend import BackendError
from gpuyard.state.logs import configure_logging

__all__ = ["fake_nodes"]

NODES: web.AppKey[Any] = web.AppKey("fake_nodes", Any)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


async def _fault(request: web.Request) -> web.Response:
    nodes = request.app[NODES]
    node, action = request.match_info["node"], request.match_info["action"]
    gpu = request.match_info.get("gpu")
    try:
        if gpu is not None and action == "fail":
            failed = await nodes.fail_gpu(node, int(gpu))
        elif gpu is not None:
            await nodes.recover_gpu(node, int(gpu))
            failed = 0
        elif action == "fail":
            failed = await nodes.fail_node(node)
        else:
            await nodes.recover_node(node)
            failed = 0
    except KeyError as exc:
        return _error(404, str(exc.args[0]))
    return web.json_response({"podsFailed": failed})


def admin_app(nodes: Any) -> web.Application:
    """The fault-injection endpoint over `nodes` (a `FakeNodes`)."""
    app = web.Application()
    app[NODES] = nodes
    app.router.add_post("/nodes/{node}/{action:fail|recover}", _fault)
    app.router.add_post(r"/nodes/{node}/gpus/{gpu:\d+}/{action:fail|recover}", _fault)
    return app


DEFAULT_POD_DURATION = 30.0  # seconds a pod runs when neither its annotation nor the scenario says


def _with_duration(scenario: Scenario, pod_duration: str | None) -> Scenario:
    """The scenario with its kubelet's pod duration set: `--pod-duration` if given (`forever`: run
    until deleted), else the scenario's own, else DEFAULT_POD_DURATION, so a job submitted with
    kubectl as its project ships it (no `fake.gpuyard.io/duration` annotation) still finishes."""
    if pod_duration is None:
        if scenario.kubelet.duration is not None:
            return scenario
        duration: float | None = DEFAULT_POD_DURATION
    elif pod_duration.strip().lower() in ("forever", "inf", "none"):
        duration = None
    else:
        try:
            duration = parse_duration(pod_duration)
        except ValueError as exc:
            raise click.BadParameter(
                f"{exc}; e.g. 30s, 5m, 1h30m, or forever", param_hint="--pod-duration"
            ) from None
    kubelet = scenario.kubelet.model_copy(update={"duration": duration})
    return scenario.model_copy(update={"kubelet": kubelet})


async def _run(
    *,
    kubeconfig: str | None,
    cluster: str,
    admin_port: int | None,
    heartbeat: float,
    pod_duration: str | None,
    kubelet_address: str | None = "127.0.0.1",
    kubelet_port: int = 0,
) -> None:
    from gpuyard.cli.serving import resolve_path
    from gpuyard.platform.backends import start_fake_nodes

    scenario = _with_duration(load_scenario(resolve_path(cluster)), pod_duration)
    nodes = await start_fake_nodes(
        kubeconfig=kubeconfig,
        scenario=scenario,
        heartbeat=heartbeat,
        kubelet_address=kubelet_address,
        kubelet_port=kubelet_port,
    )
    runner = None
    if admin_port is not None:
        runner = web.AppRunner(admin_app(nodes))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", admin_port).start()
        click.echo(f"fake-nodes: faults at http://127.0.0.1:{admin_port}/nodes/NODE/fail", err=True)
    task = asyncio.create_task(nodes.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        if runner is not None:
            await runner.cleanup()
        await nodes.api.close()


@click.command("fake-nodes")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Kubeconfig of the API server.")
@click.option("--cluster", default="configs/clusters/demo.yaml", show_default=True, help="Scenario file.")
@click.option("--admin-port", type=click.IntRange(1, 65535), help="Serve fault injection on 127.0.0.1:PORT.")
@click.option("--heartbeat", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Seconds.")
@click.option(
    "--pod-duration",
    metavar="DURATION",
    help="How long a pod without a fake.gpuyard.io/duration annotation runs (30s, 5m, forever); "
    "default: the scenario's kubelet.duration, else 30s.",
)
@click.option(
    "--kubelet-address",
    default="127.0.0.1",
    show_default=True,
    help="Where the nodes' kubelet port (pod logs) listens; each Node's InternalIP, so the API server must reach it.",
)
@click.option(
    "--kubelet-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The kubelet port (HTTPS); 0: a free one. Each Node names it in status.daemonEndpoints.",
)
@click.option("--no-kubelet-port", is_flag=True, help="Serve no kubelet port (pod logs then fail).")
def fake_nodes(
    kubeconfig: str | None,
    cluster: str,
    admin_port: int | None,
    heartbeat: float,
    pod_duration: str | None,
    kubelet_address: str,
    kubelet_port: int,
    no_kubelet_port: bool,
) -> None:
    """Register a scenario's GPU nodes on an API server and play their kubelets (KWOK-like)."""
    configure_logging(level="info", fmt="auto")
    try:
        asyncio.run(
            _run(
                kubeconfig=kubeconfig,
                cluster=cluster,
                admin_port=admin_port,
                heartbeat=heartbeat,
                pod_duration=pod_duration,
                kubelet_address=None if no_kubelet_port else kubelet_address,
                kubelet_port=kubelet_port,
            )
        )
    except ScenarioError as exc:
        raise click.UsageError(str(exc)) from None
    except BackendError as exc:  # the kubeconfig cannot be loaded
        raise click.UsageError(str(exc)) from None
    except ImportError as exc:
        raise click.ClickException(
            f"fake-nodes needs the kubernetes extra (pip install 'gpuyard[kubernetes]'): {exc}"
        ) from None
