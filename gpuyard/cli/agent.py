"""`gpuyard agent`: the node agent (docs/node-agent.md).

Discovers the node's GPUs and RDMA NICs (NVML + sysfs, or `--preset` / `--topology` for testing),
writes its NodeTopology to a gpuyard server and keeps it current (health), and optionally serves the
kubelet device-plugin API. `--once --print` prints the topology and exits; `--dry-run` does
everything but write. Wiring only: the logic lives in `gpuyard.devices.agent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import click

from gpuyard.cli.common import fail
from gpuyard.devices.presets import PRESETS

__all__ = ["agent_command"]

RESOURCES = {"gpu": "gpuyard.io/gpu", "rdma": "gpuyard.io/rdma", "gpu-share": "gpuyard.io/gpu-share"}


def _node_name(node: str | None) -> str:
    return node or os.environ.get("NODE_NAME") or socket.gethostname()


@click.command("agent")
@click.option("--node", default=None, help="Node name (default $NODE_NAME, else the host name).")
@click.option(
    "--preset", type=click.Choice(PRESETS), default=None, help="Describe the node from a preset (testing)."
)
@click.option(
    "--topology",
    "topology_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Describe the node from a NodeTopology YAML or an `nvidia-smi topo -m` capture.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file whose `agent:` section gives the defaults of the flags below (configs/gpuyard.yaml).",
)
@click.option(
    "--sysfs",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="sysfs root: RDMA NICs, NUMA nodes (agent.sysfs, /sys).",
)
@click.option(
    "--partition-policy",
    type=click.Choice(["Honor", "Prefer"]),
    default=None,
    help="Apply the NVSwitch partition table (HGX H100) with this policy.",
)
@click.option("--once", is_flag=True, help="Discover once, write (unless --dry-run) and exit.")
@click.option("--print", "print_yaml", is_flag=True, help="Print the NodeTopology as YAML.")
@click.option("--dry-run", is_flag=True, help="Do everything but write to the server.")
@click.option(
    "--server", default=None, metavar="URL", help="gpuyard server to write to (default $GPUYARD_SERVER)."
)
@click.option("--token", default=None, help="Admin bearer token (default $GPUYARD_TOKEN).")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the NodeTopology custom resource to this Kubernetes API server instead of --server.",
)
@click.option(
    "--health-interval",
    type=click.FloatRange(min=0.01),
    default=None,
    help="Seconds; an unhealthy GPU is reported within one interval (agent.health_interval, 5).",
)
@click.option(
    "--resync",
    type=click.FloatRange(min=1),
    default=None,
    help="Seconds between rewrites of an unchanged topology (agent.resync, 300).",
)
@click.option("--device-plugin", "device_plugin", is_flag=True, help="Serve the kubelet device-plugin API.")
@click.option(
    "--plugin-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The kubelet's device-plugin directory (agent.plugin_dir, /var/lib/kubelet/device-plugins).",
)
@click.option(
    "--resources",
    default="gpu,rdma,gpu-share",
    show_default=True,
    help="Device-plugin resources to serve: gpu, rdma, gpu-share (MPS shares).",
)
@click.option(
    "--cdi/--no-cdi",
    default=None,
    help="Device plugin: answer with CDI device names instead of /dev nodes (agent.cdi, off).",
)
@click.option(
    "--mps-pipe-dir",
    "mps_pipe_directory",
    default=None,
    metavar="DIR",
    help="The node's MPS pipe directory, mounted into GPU-share pods (agent.mps_pipe_directory, /tmp/nvidia-mps).",
)
def agent_command(**opts: Any) -> None:
    """Discover this node's devices, publish its NodeTopology, watch GPU health."""
    from gpuyard.devices.agent.allocating import AllocationOptions
    from gpuyard.devices.agent.inventory import Inventory, Source
    from gpuyard.devices.agent.running import AgentTimings, nvml_module
    from gpuyard.state.config import ConfigError, load_settings

    try:
        settings = load_settings(
            opts["config_file"],
            agent={
                "health_interval": opts["health_interval"],
                "resync": opts["resync"],
                "sysfs": str(opts["sysfs"]) if opts["sysfs"] else None,
                "plugin_dir": str(opts["plugin_dir"]) if opts["plugin_dir"] else None,
                "cdi": opts["cdi"],
                "mps_pipe_directory": opts["mps_pipe_directory"],
            },
        ).agent
    except ConfigError as exc:
        fail(str(exc))

    if opts["preset"] and opts["topology_file"]:
        fail("--preset and --topology are exclusive; give one, or neither to read NVML")
    server = opts["server"] or os.environ.get("GPUYARD_SERVER")
    token = opts["token"] or os.environ.get("GPUYARD_TOKEN")
    kubeconfig = opts["kubeconfig"]
    if kubeconfig and opts["server"]:
        fail("--server and --kubeconfig are exclusive: the NodeTopology is written to one of them")
    writes = not opts["dry_run"] and not (
        opts["once"] and opts["print_yaml"] and not opts["server"] and not kubeconfig
    )
    if writes and not server and not kubeconfig:
        fail(
            "--server (or $GPUYARD_SERVER) or --kubeconfig is required to write the NodeTopology; "
            "or use --dry-run / --once --print"
        )
    wanted = [r.strip() for r in opts["resources"].split(",") if r.strip()]
    unknown = [r for r in wanted if r not in RESOURCES]
    if unknown:
        fail(f"--resources: unknown {unknown}; allowed: {', '.join(RESOURCES)}")
    if opts["device_plugin"] and not server:
        fail("--device-plugin needs --server (the pods bound to this node come from the gpuyard API)")
    source: Source = "preset" if opts["preset"] else "file" if opts["topology_file"] else "nvml"
    inventory = Inventory(
        node=_node_name(opts["node"]),
        source=source,
        nvml=nvml_module() if source == "nvml" else None,
        topology_file=opts["topology_file"],
        preset=opts["preset"],
        sysfs_root=Path(settings.sysfs),
        partition_policy=opts["partition_policy"],
    )
    timings = AgentTimings(
        health_interval_s=settings.health_interval,
        resync_s=settings.resync,
        backoff_max_s=settings.backoff_max,
    )
    code = asyncio.run(
        _run(
            inventory,
            timings=timings,
            server=server if (writes and not kubeconfig) or opts["device_plugin"] else None,
            token=token,
            kubeconfig=kubeconfig if writes else None,
            write=writes,
            once=opts["once"],
            print_yaml=opts["print_yaml"],
            plugin_dir=Path(settings.plugin_dir) if opts["device_plugin"] else None,
            resources=[RESOURCES[r] for r in wanted],
            options=AllocationOptions(
                cdi=settings.cdi, cdi_kind=settings.cdi_kind, mps_pipe_directory=settings.mps_pipe_directory
            ),
        )
    )
    sys.exit(code)


async def _run(
    inventory: Any,
    *,
    timings: Any,
    server: str | None,
    token: str | None,
    kubeconfig: str | None,
    write: bool,
    once: bool,
    print_yaml: bool,
    plugin_dir: Path | None,
    resources: list[str],
    options: Any,
) -> int:
    from gpuyard.devices.agent.running import Agent, HttpPodLookup, HttpSink, PrintSink, TopologySink
    from gpuyard.devices.discovery import DiscoveryError
    from gpuyard.platform.backends import agent_topology_sink

    http: HttpSink | Any = None
    if kubeconfig is not None:
        http = await agent_topology_sink(kubeconfig=kubeconfig)  # the NodeTopology custom resource
    elif server:
        http = HttpSink(server, token=token)
    printer = PrintSink(sys.stdout)
    sink: TopologySink = http if http is not None and write else printer
    agent = Agent(inventory, sink, timings=timings, write=write)
    try:
        if once:
            try:
                topology = await agent.discover()
            except DiscoveryError as exc:
                click.echo(f"error: {exc}", err=True)
                return 1
            if print_yaml:
                await printer.put(topology)
            if write and not await agent.publish():
                return 1
            return 0
        if print_yaml and sink is not printer:
            agent.listeners.append(lambda t: print(_yaml(t), end="", flush=True))
        return await _serve(
            agent,
            server=server,
            token=token,
            plugin_dir=plugin_dir,
            resources=resources,
            lookup_cls=HttpPodLookup,
            options=options,
        )
    finally:
        agent.close()
        if http is not None:
            await http.aclose()


def _yaml(topology: Any) -> str:
    from gpuyard.devices.render import to_yaml

    return to_yaml(topology)


async def _serve(
    agent: Any,
    *,
    server: str | None,
    token: str | None,
    plugin_dir: Path | None,
    resources: list[str],
    lookup_cls: Any,
    options: Any,
) -> int:
    from gpuyard.devices.agent.deviceplugin import DevicePlugin

    lookup = lookup_cls(server, token=token) if plugin_dir is not None and server else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    async def plugins() -> None:
        if lookup is None or plugin_dir is None:
            return
        await agent.ready.wait()  # devices to offer: after the first discovery
        async with asyncio.TaskGroup() as inner:
            for resource in resources:
                plugin = DevicePlugin(
                    node=agent.inventory.node,
                    resource=resource,
                    lookup=lookup,
                    plugin_dir=plugin_dir,
                    sysfs_root=agent.inventory.sysfs_root,
                    options=options,
                )
                plugin.update(agent.current)
                agent.listeners.append(plugin.update)
                inner.create_task(plugin.watch(), name=f"device-plugin {resource}")

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(agent.run(), name="agent"),
                tg.create_task(plugins(), name="device-plugins"),
            ]
            await stop.wait()
            for task in tasks:
                task.cancel()
    finally:
        if lookup is not None:
            await lookup.aclose()
    return 0
