"""Render a NodeTopology for people: YAML, an `nvidia-smi topo -m` style matrix, a text drawing.

- :func:`to_yaml` / :func:`from_yaml`: the object as stored (camelCase, no nulls), and back.
- :func:`format_topo_matrix`: the link matrix in `nvidia-smi topo -m` layout, which
  :func:`gpuyard.devices.topo_import.import_topology` reads back (tests use the round trip).
- :func:`draw`: the plain-text picture used by `gpuyard describe node`: sockets, NUMA nodes, PCIe
  switches with their GPUs and NICs, NVLink peers, partitions; `holders` maps a GPU index to the
  label of whoever holds it (a pod or job name), free GPUs show `-`.
"""

from __future__ import annotations

from collections.abc import Mapping

import yaml

from gpuyard.apis.devices import GPUDevice, NICDevice, NodeTopology
from gpuyard.devices.tiers import Resolver, gpu_link, nic_link

__all__ = ["draw", "format_topo_matrix", "from_yaml", "to_yaml"]

_LEGEND = """\
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def to_yaml(topology: NodeTopology) -> str:
    """The topology as a YAML document (the stored, camelCase form)."""
    return yaml.safe_dump(topology.to_dict(), sort_keys=False)


def from_yaml(text: str) -> NodeTopology:
    """Read a NodeTopology YAML document; ValueError when it is another kind."""
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("a NodeTopology document must be a mapping with apiVersion, kind, metadata and spec")
    kind = data.get("kind", NodeTopology.KIND)
    if kind != NodeTopology.KIND:
        raise ValueError(f"kind is {kind!r}; allowed: {NodeTopology.KIND}")
    return NodeTopology.model_validate(data)


def _cell(label: str) -> str:
    return f" {label} " if label == "X" else label


def format_topo_matrix(topology: NodeTopology) -> str:
    """The topology as `nvidia-smi topo -m` prints it (tab-separated, with CPU and NUMA affinity)."""
    spec = topology.spec
    res = Resolver(topology)
    n, nics = len(spec.gpus), spec.nics
    numa_cpus = {node.id: node.cpus for node in spec.numa_nodes}
    names = [f"GPU{i}" for i in range(n)] + [nic.name for nic in nics]
    lines = ["\t" + "\t".join([*names, "CPU Affinity", "NUMA Affinity"])]
    for i, gpu in enumerate(spec.gpus):
        cells = [_cell(gpu_link(topology, i, j, resolver=res).label) for j in range(n)]
        cells += [nic_link(topology, i, k, resolver=res).label for k in range(len(nics))]
        numa = str(gpu.numa_node) if gpu.numa_node >= 0 else "N/A"
        lines.append("\t".join([f"GPU{i}", *cells, numa_cpus.get(gpu.numa_node) or "N/A", numa]))
    for k, nic in enumerate(nics):
        cells = [nic_link(topology, i, k, resolver=res).label for i in range(n)]
        cells += [" X " if k == m else res.pcie_tier(nic, other).name for m, other in enumerate(nics)]
        lines.append("\t".join([nic.name, *cells]))
    return "\n".join(lines) + "\n\n" + _LEGEND


def _gpu_text(gpu: GPUDevice, holders: Mapping[int, str] | None) -> str:
    text = f"GPU{gpu.index}"
    if gpu.health != "Healthy":
        text += " !Unhealthy"
    if holders is not None:
        text += f" [{holders.get(gpu.index, '-')}]"
    return text


def _nic_text(nic: NICDevice) -> str:
    kind = "RDMA" if nic.rdma else "eth"
    bad = " !Unhealthy" if nic.health != "Healthy" else ""
    return f"{nic.name} ({nic.bandwidth_gbps:g} Gb/s {kind}){bad}"


def draw(topology: NodeTopology, *, holders: Mapping[int, str] | None = None) -> str:
    """A plain-text picture of the node's topology (see the module doc)."""
    spec = topology.spec
    res = Resolver(topology)
    models = sorted({g.model for g in spec.gpus if g.model})
    head = f"NodeTopology {topology.metadata.name}"
    if spec.preset:
        head += f" (preset {spec.preset})"
    head += f": {len(spec.gpus)} GPUs"
    if models:
        head += f" {', '.join(models)}"
    head += f", {len(spec.nics)} NICs, {spec.sockets} socket(s)"
    out = [head]
    devices: dict[tuple[int, int], dict[str | None, list[str]]] = {}
    for gpu in spec.gpus:
        devices.setdefault((gpu.socket, gpu.numa_node), {}).setdefault(gpu.pcie_switch, []).append(
            _gpu_text(gpu, holders)
        )
    for nic in spec.nics:
        devices.setdefault((nic.socket, nic.numa_node), {}).setdefault(nic.pcie_switch, []).append(
            _nic_text(nic)
        )
    numa_cpus = {node.id: node.cpus for node in spec.numa_nodes}
    last_socket: int | None = None
    for socket, numa in sorted(devices, key=lambda sn: (sn[0] < 0, sn[0], sn[1] < 0, sn[1])):  # unknown last
        if socket != last_socket:
            out.append(f"socket {socket}" if socket >= 0 else "socket unknown")
            last_socket = socket
        cpus = numa_cpus.get(numa)
        out.append(f"  NUMA {numa}" + (f" (cpus {cpus})" if cpus else "") if numa >= 0 else "  NUMA unknown")
        # switches in the order their first device appears (GPUs, then NICs); "no switch" last
        for switch, items in sorted(devices[(socket, numa)].items(), key=lambda kv: kv[0] is None):
            if switch is None:
                where = "no PCIe switch"
            else:
                chain = res.ancestors(switch)
                where = " < ".join(chain)
                host = res.host_bridge(switch)
                if host:
                    where += f" @ {host}"
            out.append(f"    {where}: " + "  ".join(items))
    nv = [g for g in spec.gpus if g.nvlink_peers]
    if nv:
        if all(g.nvswitch for g in spec.gpus):
            counts = sorted({c for g in spec.gpus for c in g.nvlink_peers.values()})
            out.append(f"NVLink: NVSwitch, every pair {'/'.join(f'NV{c}' for c in counts)}")
        else:
            out.append("NVLink:")
            for gpu in nv:
                peers = "  ".join(f"NV{c}:GPU{p}" for p, c in sorted(gpu.nvlink_peers.items()))
                out.append(f"  GPU{gpu.index}  {peers}")
    else:
        out.append("NVLink: none")
    if spec.partitions is not None and spec.partition_policy is not None:
        sets = " ".join("{" + ",".join(map(str, p)) + "}" for p in spec.partitions)
        out.append(f"partitions ({spec.partition_policy}): {sets}")
    return "\n".join(out) + "\n"
