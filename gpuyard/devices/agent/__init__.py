"""The node side of gpuyard: `gpuyard agent` (docs/node-agent.md).

- :mod:`.inventory` -- the node's NodeTopology from NVML + sysfs (:mod:`.rdma`), a file or a preset;
- :mod:`.health` -- which NVML events make a GPU unhealthy, and the event watcher;
- :mod:`.running` -- the long-running loop: publish the topology, keep it current, back off on faults;
- :mod:`.deviceplugin` -- the kubelet device-plugin API (gRPC) serving `gpuyard.io/gpu` / `gpuyard.io/rdma`
  with exactly the devices the scheduler chose;
- :mod:`.fakenvml`, :mod:`.fakekubelet` -- stand-ins for NVML and the kubelet, for tests and demos.

NVML (`pynvml`) and gRPC are optional (`gpuyard[agent]`) and imported only where used.
"""
