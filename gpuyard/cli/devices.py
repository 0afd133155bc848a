"""`gpuyard devices ...`: import an `nvidia-smi topo -m` matrix, discover this host via NVML,
and show a preset, each as NodeTopology YAML (or a drawing with `--draw`)."""

from __future__ import annotations

import socket
import sys

import click

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices import PRESETS, DiscoveryError, discover, draw, get_preset, to_yaml
from gpuyard.devices.presets import GPU_MODELS
from gpuyard.devices.topo_import import TopologyParseError, TopologyWarning, load_topology_file

__all__ = ["devices"]


def _emit(topology: NodeTopology, as_drawing: bool) -> None:
    click.echo(draw(topology) if as_drawing else to_yaml(topology), nl=as_drawing)


@click.group()
def devices() -> None:
    """Device topology: import, discover, presets."""


@devices.command("import-topo")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--name", help="Node name (default: the file's stem).")
@click.option(
    "--gpu-model", type=click.Choice(sorted(GPU_MODELS)), help="GPU model (the matrix does not say)."
)
@click.option("--nic-gbps", type=float, default=100.0, show_default=True, help="NIC line rate, Gb/s.")
@click.option("--draw", "as_drawing", is_flag=True, help="Draw the topology instead of printing YAML.")
def import_topo(
    file: str, name: str | None, gpu_model: str | None, nic_gbps: float, as_drawing: bool
) -> None:
    """Parse `nvidia-smi topo -m` output in FILE into a NodeTopology YAML document.

    What cannot be read exits 2 naming line and column; what is read but not used is a warning on
    stderr naming line and column."""
    model = GPU_MODELS[gpu_model] if gpu_model else None
    kwargs = {
        "gpu_model": model.name if model else "",
        "memory_mib": model.memory_mib if model else 0,
        "nic_gbps": nic_gbps,
    }
    if name:
        kwargs["name"] = name

    def warn(warning: TopologyWarning) -> None:  # read, but not used: the import goes on
        click.echo(f"warning: {file}:{warning.line}:{warning.column}: {warning.message}", err=True)

    try:
        topology = load_topology_file(file, on_warning=warn, **kwargs)
    except OSError as exc:
        click.echo(f"error: {file}: cannot read: {exc.strerror or exc}", err=True)
        sys.exit(2)
    except TopologyParseError as exc:
        click.echo(f"error: {file}:{exc.line}:{exc.column}: {exc.message}", err=True)
        sys.exit(2)
    _emit(topology, as_drawing)


@devices.command("discover")
@click.option("--name", default=None, help="Node name (default: this host's name).")
@click.option("--draw", "as_drawing", is_flag=True, help="Draw the topology instead of printing YAML.")
def discover_cmd(name: str | None, as_drawing: bool) -> None:
    """Read this machine's GPUs, NVLinks and PCIe layout through NVML (`pip install gpuyard[nvml]`)."""
    try:
        topology = discover(name=name or socket.gethostname())
    except DiscoveryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    _emit(topology, as_drawing)


@devices.command("preset")
@click.argument("name", type=click.Choice(PRESETS))
@click.option("--draw", "as_drawing", is_flag=True, help="Draw the topology instead of printing YAML.")
def preset_cmd(name: str, as_drawing: bool) -> None:
    """Print a built-in topology preset."""
    _emit(get_preset(name), as_drawing)
