"""`gpuyard describe node NAME`: a node's device topology and which job holds each GPU and NIC.

Reads `GET /api/v1/nodes/{name}/topology` and draws the NodeTopology with
`gpuyard.devices.render.draw` (GPUs grouped by socket, NUMA node and PCIe switch, each GPU with its
holder), then lists the NIC holders and the GPU link matrix. `-o json|yaml` prints the answer as is.
Mount with `register(root)`; it merges into an existing `describe` group.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from gpuyard.apis.devices import NodeTopology
from gpuyard.cli.client import ApiClient
from gpuyard.cli.common import call, client_options, mount
from gpuyard.cli.output import emit
from gpuyard.devices.render import draw, format_topo_matrix

__all__ = ["describe", "describe_node", "register", "render_node"]


def _who(holders: list[dict[str, Any]]) -> str:
    jobs = []
    for h in holders:
        text = h.get("job") or h.get("pod") or "?"
        milli = h.get("gpuMilli")
        if milli and milli < 1000:
            text += f" ({milli}m)"
        if text not in jobs:
            jobs.append(text)
    return "+".join(jobs)


def render_node(data: dict[str, Any]) -> str:
    """The text `describe node` prints for one `/topology` answer."""
    topology = NodeTopology.model_validate(data["topology"])
    gpus = {int(i): _who(h) for i, h in (data.get("gpus") or {}).items() if h}
    lines = [draw(topology, holders=gpus), "", "NICs:"]
    nic_holders = data.get("nics") or {}
    for nic in topology.spec.nics:
        kind = "RDMA" if nic.rdma else "Ethernet"
        who = _who(nic_holders.get(nic.name) or []) or "free"
        lines.append(f"  {nic.name:<10} {kind:<8} switch {nic.pcie_switch or '-':<8} {who}")
    unhealthy = [g.index for g in topology.spec.gpus if g.health != "Healthy"]
    lines.append("")
    lines.append(f"Unhealthy GPUs: {', '.join(map(str, unhealthy)) if unhealthy else 'none'}")
    lines.append("")
    lines.append("Links:")
    lines.append(format_topo_matrix(topology))
    return "\n".join(lines)


@click.group()
def describe() -> None:
    """Show one object in detail."""


@describe.command("node")
@click.argument("name")
@client_options
def describe_node(name: str, output: str, server: str | None, token: str | None) -> None:
    """Show a node's GPUs, NVLinks, PCIe switches and NICs, and the job holding each device."""
    data = call(
        ApiClient(server, token=token).request, "GET", f"/api/v1/nodes/{quote(name, safe='')}/topology"
    )
    emit(data, output, lambda _wide: click.echo(render_node(data)))


def register(root: click.Group) -> None:
    """Add `describe node` to the root group, merging into an existing `describe` group."""
    mount(root, groups=[describe])
