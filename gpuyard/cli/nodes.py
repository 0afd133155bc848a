"""`gpuyard describe node NAME`: a node in detail, like `kubectl describe node`.

Reads `GET /api/v1/nodes/{name}` (name, labels, annotations, taints, unschedulable, conditions,
capacity, allocatable), `.../pods` (the pods bound to it and what the non-terminated ones hold),
`.../events` (events about the node) and `.../topology`, drawn with `gpuyard.devices.render.draw`
(GPUs grouped by socket, NUMA node and PCIe switch, each GPU with its holder, then the NIC holders,
the unhealthy GPUs with the node agent's reason for each (an XID, MIG mode) and the GPU link matrix). A node without GPUs says so. `-o json|yaml` prints
`{"node", "pods", "allocated", "events", "topology", "gpusPickedBy"}` (`topology` null where there is
none; `gpusPickedBy` is `kubelet` in count-only mode, `backend.kubernetes.gpu_resource: nvidia.com/gpu`,
and the text then says under the GPUs held that the kubelet picks the GPUs, the indices being the
scheduler's).
Mount with `register(root)`; it merges into an existing `describe` group.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import click

from gpuyard.apis.core import GPU_RESOURCE
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.quantity import QuantityError, parse_quantity
from gpuyard.cli.client import ApiClient, ClientError
from gpuyard.cli.common import KUBELET_PICKS_GPUS, call, client_options, fail, mount
from gpuyard.cli.lazy import LazyGroup
from gpuyard.cli.output import emit
from gpuyard.devices.agent.health import ANNOTATION_UNHEALTHY_REASONS
from gpuyard.devices.render import draw, format_topo_matrix

__all__ = ["describe", "describe_node", "register", "render_describe", "render_node"]

RECENT_EVENTS = 20
"""How many of the node's latest events the text output shows."""


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
    lines += [f"  GPU {i}: {why}" for i, why in _unhealthy_reasons(topology, unhealthy)]
    lines.append("")
    lines.append("Links:")
    lines.append(format_topo_matrix(topology))
    return "\n".join(lines)


def _unhealthy_reasons(topology: NodeTopology, unhealthy: list[int]) -> list[tuple[int, str]]:
    """Why each unhealthy GPU is out, as the node agent annotated it (XID, MIG mode, ...)."""
    try:
        reasons = json.loads(topology.metadata.annotations.get(ANNOTATION_UNHEALTHY_REASONS, "{}"))
    except ValueError:
        return []
    if not isinstance(reasons, dict):
        return []
    return [(i, str(reasons[str(i)])) for i in unhealthy if str(i) in reasons]


def _cells(headers: list[str], rows: list[list[Any]], indent: str = "  ") -> list[str]:
    """Aligned, indented columns; `None` and `""` print as `-`."""
    cells = [["-" if c is None or c == "" else str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    return [
        (indent + "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
        for r in [headers, *cells]
    ]


def _pairs(title: str, items: list[str]) -> list[str]:
    """`Title:  first` then the rest aligned under it, or `<none>`."""
    head = f"{title + ':':<20}"
    if not items:
        return [f"{head}<none>"]
    return [f"{head}{items[0]}"] + [f"{'':<20}{item}" for item in items[1:]]


def _quantity(value: Any) -> Decimal | None:
    try:
        return parse_quantity(value)
    except (QuantityError, ValueError, TypeError):
        return None


def _with_pct(value: str | None, total: Any) -> str:
    if value is None:
        return "0"
    used, whole = _quantity(value), _quantity(total)
    if used is None or not whole:
        return value
    return f"{value} ({round(100 * used / whole)}%)"


def _gpu_count(node: dict[str, Any]) -> int:
    status = node.get("status") or {}
    q = _quantity((status.get("capacity") or {}).get(GPU_RESOURCE, 0))
    return int(q) if q is not None else 0


def _event_stamp(e: dict[str, Any]) -> str | None:
    return (
        e.get("lastTimestamp")
        or e.get("firstTimestamp")
        or (e.get("metadata") or {}).get("creationTimestamp")
    )


def render_describe(data: dict[str, Any]) -> str:
    """The text `describe node` prints for the combined answer (see the module doc)."""
    node = data["node"]
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    lines = [f"{'Name:':<20}{meta.get('name')}"]
    lines += _pairs("Labels", [f"{k}={v}" for k, v in sorted((meta.get("labels") or {}).items())])
    lines += _pairs("Annotations", [f"{k}: {v}" for k, v in sorted((meta.get("annotations") or {}).items())])
    taints = [
        f"{t.get('key')}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect')}"
        for t in spec.get("taints") or []
    ]
    lines += _pairs("Taints", taints)
    lines.append(f"{'Unschedulable:':<20}{str(bool(spec.get('unschedulable'))).lower()}")
    lines.append(f"{'CreationTimestamp:':<20}{meta.get('creationTimestamp') or '-'}")

    conditions = status.get("conditions") or []
    lines.append("Conditions:")
    if conditions:
        rows = [
            [c.get("type"), c.get("status"), c.get("reason"), c.get("message"), c.get("lastTransitionTime")]
            for c in conditions
        ]
        lines += _cells(["TYPE", "STATUS", "REASON", "MESSAGE", "LAST TRANSITION"], rows)
    else:
        lines.append("  <none>")

    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    for title, values in (("Capacity", capacity), ("Allocatable", allocatable)):
        lines.append(f"{title}:")
        if not values:
            lines.append("  <none>")
        width = max((len(k) for k in values), default=0) + 2
        lines += [f"  {k + ':':<{width}}{v}" for k, v in sorted(values.items())]

    allocated = data.get("allocated") or {}
    requests = allocated.get("requests") or {}
    limits = allocated.get("limits") or {}
    lines.append("Allocated resources:")
    lines.append(
        f"  (total requests and limits of the {allocated.get('pods', 0)} non-terminated pod(s);"
        " percentages of allocatable)"
    )
    names = sorted((set(allocatable) | set(requests) | set(limits)) - {"pods"})
    rows = [
        [n, _with_pct(requests.get(n), allocatable.get(n)), _with_pct(limits.get(n), allocatable.get(n))]
        for n in names
    ]
    lines += _cells(["RESOURCE", "REQUESTS", "LIMITS"], rows)
    gpus_by_job = allocated.get("gpusByJob") or {}
    gpu_total = _gpu_count(node)
    kubelet_picks = data.get("gpusPickedBy") == "kubelet"
    if gpu_total or gpus_by_job:
        held = sorted({g for gs in gpus_by_job.values() for g in gs})
        lines.append(f"  GPUs held: {len(held)} of {gpu_total}")
        if kubelet_picks:
            lines.append(f"  {KUBELET_PICKS_GPUS}.")
        rows = [[j, ",".join(map(str, gs))] for j, gs in gpus_by_job.items()]
        if rows:
            lines += _cells(["JOB", "GPUS"], rows, "    ")

    pods = data.get("pods") or []
    max_pods = allocatable.get("pods")
    lines.append(
        f"Pods: ({len(pods)} in total, {allocated.get('pods', 0)} non-terminated"
        + (f", at most {max_pods})" if max_pods is not None else ")")
    )
    if pods:
        rows = []
        for p in pods:
            pm = p.get("metadata") or {}
            summary = p.get("summary") or {}
            gpus = summary.get("gpus") or []
            rows.append(
                [
                    f"{pm.get('namespace')}/{pm.get('name')}",
                    summary.get("job"),
                    ",".join(map(str, gpus)),
                    summary.get("phase"),
                ]
            )
        lines += _cells(["NAMESPACE/NAME", "JOB", "GPUS", "PHASE"], rows)
    else:
        lines.append("  <none>")

    events = data.get("events") or []
    recent = events[-RECENT_EVENTS:]
    lines.append(
        "Events:" + (f" (the latest {len(recent)} of {len(events)})" if len(recent) < len(events) else "")
    )
    if recent:
        rows = [
            [_event_stamp(e), e.get("type"), e.get("reason"), e.get("count", 1), e.get("message")]
            for e in recent
        ]
        lines += _cells(["TIME", "TYPE", "REASON", "COUNT", "MESSAGE"], rows)
    else:
        lines.append("  <none>")

    lines.append("Devices:")
    topology = data.get("topology")
    if topology is not None and (topology.get("topology") or {}).get("spec", {}).get("gpus"):
        lines += ["  " + line if line else "" for line in render_node(topology).splitlines()]
    elif gpu_total == 0:
        lines.append("  This node has no GPUs (CPU only).")
    else:
        lines.append(f"  No device topology reported for its {gpu_total} GPU(s).")
    return "\n".join(lines)


@click.group(cls=LazyGroup)
def describe() -> None:
    """Show one object in detail."""


@describe.command("node")
@click.argument("name")
@client_options
def describe_node(name: str, output: str, server: str | None, token: str | None) -> None:
    """Show a node in detail: labels, taints, conditions, capacity, what its pods hold, its pods,
    its events, then its GPUs, NVLinks, PCIe switches and NICs with the job holding each device."""
    client = ApiClient(server, token=token)
    base = f"/api/v1/nodes/{quote(name, safe='')}"
    node = call(client.request, "GET", base)
    pods = call(client.request, "GET", f"{base}/pods")
    events = call(client.request, "GET", f"{base}/events")
    try:
        topology = client.request("GET", f"{base}/topology")
    except ClientError as exc:
        if exc.status != 404:
            fail(exc.message, exc.exit_code)
        topology = None  # no NodeTopology: a CPU-only node, or none reported yet
    data = {
        "node": node,
        "pods": pods.get("items", []),
        "allocated": pods.get("allocated", {}),
        "events": events.get("items", []),
        "topology": topology,
        "gpusPickedBy": pods.get("gpusPickedBy") or "scheduler",
    }
    emit(data, output, lambda _wide: click.echo(render_describe(data)))


def register(root: click.Group) -> None:
    """Add `describe node` to the root group, merging into an existing `describe` group."""
    mount(root, groups=[describe])
