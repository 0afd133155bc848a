"""Device topology: link tiers, presets, the bandwidth model and O(1) best-GPU-subset tables.

This package is pure (it imports only `gpuyard.apis`, NumPy, pydantic and YAML) and is used by the
scheduler, the fake cluster and the CLI:

- :mod:`.tiers` -- `nvidia-smi topo -m` link labels (X, NV#, PIX, PXB, PHB, NODE, SYS) and locality;
- :mod:`.presets` -- synthetic DGX-1 V100, DGX A100, HGX H100, T4, K80 and P100 nodes;
- :mod:`.topo_import` -- read a real `nvidia-smi topo -m` matrix;
- :mod:`.discovery` -- read a real host through NVML;
- :mod:`.bandwidth` -- GB/s per link, ring all-reduce bandwidth in a node and across nodes;
- :mod:`.subsets` -- the precomputed (free mask, k) -> best GPU subset tables, the greedy
  fallback, and joint GPU + RDMA NIC selection;
- :mod:`.render` -- YAML, matrix and text drawings;
- :mod:`.dra` -- `resource.k8s.io/v1` ResourceSlices and ResourceClaims for a topology and a placement.

The node agent (:mod:`.agent`, `gpuyard agent`) is the exception to "pure": it talks to NVML, sysfs,
the kubelet (gRPC) and the gpuyard API (httpx), and is imported only by the CLI and tests.

See docs/topology.md for the model and the sources of every figure.
"""

from gpuyard.devices.bandwidth import (
    NodeShare,
    PlacementBandwidth,
    Ring,
    all_ring_bandwidths,
    bandwidth_matrix,
    best_ring,
    model_key,
    placement_bandwidth,
    ring_bandwidth,
)
from gpuyard.devices.discovery import DiscoveryError, discover
from gpuyard.devices.presets import GPU_MODELS, PRESET_MODELS, PRESETS, GPUModel, get_preset
from gpuyard.devices.render import draw, format_topo_matrix, from_yaml, to_yaml
from gpuyard.devices.subsets import (
    MAX_TABLE_GPUS,
    NICScope,
    Selection,
    SubsetTable,
    build_table,
    clear_table_cache,
    fingerprint,
    free_mask,
    greedy_pick,
    indices_of,
    mask_of,
    pick,
    pick_gpus,
    pick_many,
    pick_nics,
    select,
    table_for,
)
from gpuyard.devices.tiers import Link, LinkTier, Locality, gpu_link, link_matrix, nic_link, parse_link
from gpuyard.devices.topo_import import (
    TopologyParseError,
    import_topology,
    load_topology_file,
    parse_topo_matrix,
)

__all__ = [
    "GPU_MODELS",
    "MAX_TABLE_GPUS",
    "PRESETS",
    "PRESET_MODELS",
    "DiscoveryError",
    "GPUModel",
    "Link",
    "LinkTier",
    "Locality",
    "NICScope",
    "NodeShare",
    "PlacementBandwidth",
    "Ring",
    "Selection",
    "SubsetTable",
    "TopologyParseError",
    "all_ring_bandwidths",
    "bandwidth_matrix",
    "best_ring",
    "build_table",
    "clear_table_cache",
    "discover",
    "draw",
    "fingerprint",
    "format_topo_matrix",
    "free_mask",
    "from_yaml",
    "get_preset",
    "gpu_link",
    "greedy_pick",
    "import_topology",
    "indices_of",
    "link_matrix",
    "load_topology_file",
    "mask_of",
    "model_key",
    "nic_link",
    "parse_link",
    "parse_topo_matrix",
    "pick",
    "pick_gpus",
    "pick_many",
    "pick_nics",
    "placement_bandwidth",
    "ring_bandwidth",
    "select",
    "table_for",
    "to_yaml",
]
